package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/topology"
)

// TestIdemctlNamespacePolicies sets and reads a namespace's policy with
// idemctl against a secure cluster of real processes (three nodes, two
// shards, a router): the policy set by an admin is in force on every shard
// when set-policy returns (a reserve over max_lease_ms gets 400
// INVALID_ARGUMENT naming the limit, whichever shard holds the key), a
// reader reads it, and a principal without role admin on the namespace is
// refused.
func TestIdemctlNamespacePolicies(t *testing.T) {
	topo, err := launch.Topology(launch.Spec{Cluster: "pol", Regions: []string{"east"}, NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c, err := cluster.NewNodes(topo, dir, binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	authFile := filepath.Join(dir, "auth.yaml")
	if err := os.WriteFile(authFile, []byte(`principals:
  - {name: root, namespaces: ["*"], role: admin}
  - {name: bob, namespaces: [pay], role: writer}
  - {name: eve, namespaces: [audit], role: reader}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Secure(authFile, "root", "bob", "eve"); err != nil {
		t.Fatal(err)
	}
	rt := startWithRouter(t, c, "east")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	as := func(user string) []string {
		return []string{"--config", c.TopologyPath, "--certs-dir", c.CADir, "--user", user}
	}

	// Built-in policy before any set.
	builtIn := decode[policyView](t, mustCtl(t, append(as("bob"), "namespaces", "get-policy", "pay", "--json")...))
	if builtIn.MaxLeaseMs != contract.MaxLeaseMs || builtIn.TombstoneS != contract.DefaultTombstoneS {
		t.Fatalf("built-in policy: %+v", builtIn)
	}

	set := decode[policyView](t, mustCtl(t, append(as("root"), "namespaces", "set-policy", "pay",
		"--default-lease-ms", "1000", "--max-lease-ms", "5000", "--max-retention-s", "3600", "--tombstone-s", "0", "--json")...))
	want := policyView{Namespace: "pay", EffectivePolicy: contract.EffectivePolicy{DefaultLeaseMs: 1000, MaxLeaseMs: 5000,
		DefaultRetentionS: 3600, MaxRetentionS: 3600, TombstoneS: 0}}
	if set != want {
		t.Fatalf("set-policy printed %+v, want %+v", set, want)
	}
	// Read back through the router, as a writer of the namespace, as a table.
	out := mustCtl(t, "--certs-dir", c.CADir, "--user", "bob", "namespaces", "get-policy", "pay", "--addr", rt.GRPCAddr)
	for _, line := range []string{"max lease ms         5000", "default retention s  3600", "tombstone s          0"} {
		if !strings.Contains(out, line) {
			t.Fatalf("get-policy table lacks %q:\n%s", line, out)
		}
	}

	// In force on both shards when set-policy returned.
	ring, err := topology.NewRing(topo)
	if err != nil {
		t.Fatal(err)
	}
	bob, err := c.API(rt.HTTPAddr, "bob")
	if err != nil {
		t.Fatal(err)
	}
	shards := map[string]bool{}
	for i := 0; len(shards) < 2; i++ {
		if i == 200 {
			t.Fatalf("200 keys fell on shards %v only", shards)
		}
		key := fmt.Sprintf("order-%d", i)
		if shard := ring.Locate("pay", key).ID; !shards[shard] {
			shards[shard] = true
			r, err := bob.Reserve(ctx, "pay", key, map[string]any{"lease_ms": 6000})
			if err != nil || r.Status != 400 || r.ErrCode() != "INVALID_ARGUMENT" || !strings.Contains(r.Str("message")+string(r.Raw), "max_lease_ms 5000") {
				t.Fatalf("reserve over max_lease_ms on shard %s: %v %v", shard, r, err)
			}
			if r, err := bob.Reserve(ctx, "pay", key, map[string]any{"lease_ms": 5000}); err != nil || r.Str("outcome") != "ACQUIRED" {
				t.Fatalf("reserve at max_lease_ms on shard %s: %v %v", shard, r, err)
			}
		}
	}
	// Another namespace keeps the built-in policy.
	rootAPI, err := c.API(c.HTTPAddr(topo.Nodes()[0].ID), "root")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := rootAPI.Reserve(ctx, "other", "k", map[string]any{"lease_ms": 6000}); err != nil || r.Str("outcome") != "ACQUIRED" {
		t.Fatalf("reserve in a namespace without a policy: %v %v", r, err)
	}

	// Refusals: a writer may not set a policy, a reader may not read another
	// namespace's, and a policy whose default exceeds its max is refused.
	if _, err := ctl(t, append(as("bob"), "namespaces", "set-policy", "pay", "--max-lease-ms", "600000")...); err == nil || !strings.Contains(err.Error(), "PERMISSION_DENIED") {
		t.Fatalf("set-policy as a writer: %v, want PERMISSION_DENIED", err)
	}
	if _, err := ctl(t, append(as("eve"), "namespaces", "get-policy", "pay")...); err == nil || !strings.Contains(err.Error(), "PERMISSION_DENIED") {
		t.Fatalf("get-policy of another namespace as a reader: %v, want PERMISSION_DENIED", err)
	}
	if out := mustCtl(t, append(as("eve"), "namespaces", "get-policy", "audit")...); !strings.Contains(out, "max lease ms         600000") {
		t.Fatalf("get-policy as a reader of the namespace:\n%s", out)
	}
	if _, err := ctl(t, append(as("root"), "namespaces", "set-policy", "pay", "--default-lease-ms", "6000", "--max-lease-ms", "5000")...); err == nil || !strings.Contains(err.Error(), "INVALID_ARGUMENT") {
		t.Fatalf("set-policy with default over max: %v", err)
	}
	if got := decode[policyView](t, mustCtl(t, append(as("root"), "namespaces", "get-policy", "pay", "--json")...)); got != want {
		t.Fatalf("policy after refused changes: %+v, want %+v", got, want)
	}
}
