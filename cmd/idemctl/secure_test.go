package main

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/topology"
)

// TestIdemctlSecure runs idemctl against a secure one-region cluster:
// --certs-dir with the default user root is allowed the Admin service,
// --user bob (a writer) is refused it, --token authenticates, and no
// credentials at all (plaintext) reach nothing.
func TestIdemctlSecure(t *testing.T) {
	topo, err := launch.Topology(launch.Spec{Cluster: "ctls", Regions: []string{"east"}, NodesPerRegion: 3, ShardsPerRegion: 1, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c, err := cluster.NewNodes(topo, dir, binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("ops-token"))
	authFile := filepath.Join(dir, "auth.yaml")
	if err := os.WriteFile(authFile, []byte(`principals:
  - {name: root, namespaces: ["*"], role: admin}
  - {name: bob, namespaces: [bob], role: writer}
  - {name: ops, token_sha256: `+hex.EncodeToString(sum[:])+`, namespaces: ["*"], role: admin}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Secure(authFile, "root", "bob"); err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if out := mustCtl(t, "--config", c.TopologyPath, "--certs-dir", c.CADir, "status"); !strings.Contains(out, "east-1") {
		t.Fatalf("status as root: %s", out)
	}
	// Authenticated by the token, the get reaches the key's shard.
	if _, err := ctl(t, "--config", c.TopologyPath, "--certs-dir", c.CADir, "--token", "ops-token", "get", "bob", "k"); err == nil || !strings.Contains(err.Error(), "no record") {
		t.Fatalf("get with a token: %v, want no record", err)
	}
	if _, err := ctl(t, "--config", c.TopologyPath, "--certs-dir", c.CADir, "--token", "wrong", "get", "bob", "k"); err == nil || strings.Contains(err.Error(), "no record") {
		t.Fatalf("get with a wrong token: %v, want a refusal", err)
	}
	if _, err := ctl(t, "--config", c.TopologyPath, "--certs-dir", c.CADir, "--user", "bob", "snapshot", "east-0", "--node", "east-1"); err == nil || !strings.Contains(err.Error(), "admin") {
		t.Fatalf("snapshot as bob: %v, want a refusal", err)
	}
	if _, err := ctl(t, "--config", c.TopologyPath, "--certs-dir", c.CADir, "--user", "bob", "get", "root-only", "k"); err == nil || !strings.Contains(err.Error(), "namespace") {
		t.Fatalf("get of another namespace as bob: %v, want a refusal", err)
	}
	if _, err := ctl(t, "--config", c.TopologyPath, "get", "bob", "k"); err == nil {
		t.Fatal("plaintext get against a secure cluster succeeded")
	}
}

// TestSecureTopologyChange: on a secure region (mTLS, an auth file), a
// change that both adds a node and a shard runs to its end. Its driver,
// the meta group's leader, takes every step (ChangeMember, Handoff,
// ExportPartitions) on other nodes with its node certificate, which they
// check against the committed topology and the meta leader they know; a
// node that joins is authorized once the target naming it is committed.
// Every record written before the change is still there after it.
func TestSecureTopologyChange(t *testing.T) {
	topo, err := launch.Topology(launch.Spec{Cluster: "sechange", NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c, err := cluster.NewNodes(topo, dir, binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SecureWithPolicy("principals:\n  - {name: root, namespaces: [\"*\"], role: admin}\n", "root"); err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	api, err := c.API(c.HTTPAddr("r1-1"), "root")
	if err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{}
	for i := range 60 {
		key := fmt.Sprintf("k-%d", i)
		r, err := cluster.Decided(ctx, func() (cluster.Reply, error) { return api.Reserve(ctx, "pay", key, nil) })
		if err != nil || r.Status != 200 {
			t.Fatalf("reserve %s: %v %v", key, r, err)
		}
		tokens[key] = r.Str("owner_token")
		r, err = cluster.Decided(ctx, func() (cluster.Reply, error) {
			return api.Complete(ctx, "pay", key, map[string]any{"owner_token": tokens[key], "response": map[string]any{"status": 201, "body": base64.StdEncoding.EncodeToString([]byte(key))}})
		})
		if err != nil || r.Status != 200 {
			t.Fatalf("complete %s: %v %v", key, r, err)
		}
	}

	ports, err := launch.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	grown := topo.Clone()
	grown.ShardsPerRegion = 3
	grown.Regions[0].Nodes = append(grown.Regions[0].Nodes, topology.Node{ID: "r1-4", Region: "r1",
		RaftAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), GRPCAddr: fmt.Sprintf("127.0.0.1:%d", ports[1]), HTTPAddr: fmt.Sprintf("127.0.0.1:%d", ports[2])})
	v2 := nextVersion(t, grown, 2, dir)
	certs, err := c.NodeCertsDir("r1-4")
	if err != nil {
		t.Fatal(err)
	}
	c.Nodes["r1-4"] = &launch.Process{Name: "r1-4", Bin: binaries.Path(t, "idemnode"), Log: filepath.Join(dir, "r1-4.log"),
		Args: []string{"--config", v2, "--id", "r1-4", "--data-dir", filepath.Join(dir, "data", "r1-4"), "--log-level", "debug",
			"--certs-dir", certs, "--auth-file", c.AuthFile}}
	if err := c.Nodes["r1-4"].Start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out := mustCtlWithin(t, 3*time.Minute, "--config", c.TopologyPath, "--certs-dir", c.CADir, "--timeout", "10s", "topology", "apply", v2)
	t.Logf("secure apply of v2 (one node and one shard more) took %v:\n%s", time.Since(start).Round(time.Millisecond), out)
	st := mustCtl(t, "--config", v2, "--certs-dir", c.CADir, "topology", "status")
	if !strings.Contains(st, "active version: 2") || !strings.Contains(st, "no change running") {
		t.Fatalf("status after the change:\n%s", st)
	}
	for _, id := range []string{"r1-1", "r1-4"} {
		nd, _ := grown.NodeByID(id)
		via, err := c.API(nd.HTTPAddr, "root")
		if err != nil {
			t.Fatal(err)
		}
		for key, owner := range tokens {
			r, err := cluster.Decided(ctx, func() (cluster.Reply, error) {
				return via.Reserve(ctx, "pay", key, map[string]any{"owner_token": owner})
			})
			if err != nil || r.Status != 200 || r.Str("outcome") != "COMPLETED" {
				t.Fatalf("%s after the change, through %s: %v %v", key, id, r, err)
			}
		}
	}
}
