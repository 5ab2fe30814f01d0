package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
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
