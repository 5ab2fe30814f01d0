package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
)

// A node whose data dir was emptied while its peers kept their state never
// bootstraps next to them: it exits non-zero with one line naming a peer
// that holds state and the way back, the peers keep serving every record,
// and idemctl replace-node brings it back. Before, it bootstrapped fresh
// groups beside voters that held state: a replica without its log and vote
// among them.
func TestEmptiedDataDirIsRefused(t *testing.T) {
	c := startCluster(t, launch.Spec{Cluster: "emptied", NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3})
	nodes := c.Topology.Nodes()
	victim, survivor := nodes[2].ID, nodes[0].ID
	api := cluster.NewAPI(c.HTTPAddr(survivor))
	api.RetryUnavailable = 10 * time.Second
	ctx := t.Context()
	const keys = 20
	for i := range keys {
		key, owner := fmt.Sprintf("k%02d", i), fmt.Sprintf("owner-token-emptied-%04d", i)
		want(t, 200)(api.Reserve(ctx, "pay", key, map[string]any{"owner_token": owner}))
		want(t, 200)(api.Complete(ctx, "pay", key, map[string]any{"owner_token": owner, "response": map[string]any{"status": 201}}))
	}

	p := c.Nodes[victim]
	if err := p.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(c.Dir, "data", victim)
	entries, err := os.ReadDir(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dataDir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	line := lastLine(mustRefuse(t, p))
	for _, part := range []string{"already holds Raft state", dataDir, "idemctl replace-node", "topology change"} {
		if !strings.Contains(line, part) {
			t.Fatalf("refusal line lacks %q: %s", part, line)
		}
	}
	t.Logf("refusal: %s", line)
	if left, _ := os.ReadDir(dataDir); len(left) != 0 {
		t.Fatalf("the refused node wrote into its data dir: %v", left)
	}

	// The peers serve every record and take new ones.
	for _, id := range []string{nodes[0].ID, nodes[1].ID} {
		a := cluster.NewAPI(c.HTTPAddr(id))
		a.RetryUnavailable = 10 * time.Second
		for i := range keys {
			if r := want(t, 200)(a.Get(ctx, "pay", fmt.Sprintf("k%02d", i))); r.Str("state") != "COMPLETED" {
				t.Fatalf("k%02d through %s: %s", i, id, r)
			}
		}
	}
	want(t, 200)(api.Reserve(ctx, "pay", "after-refusal", nil))

	// replace-node brings it back: it joins as a fresh replica and catches
	// up on every shard (its rejoin marker is cleared).
	ctl := exec.CommandContext(ctx, binaries.Path(t, "idemctl"), "--config", c.TopologyPath, "replace-node", "--id", victim, "--data-dir", dataDir)
	if out, err := ctl.CombinedOutput(); err != nil {
		t.Fatalf("idemctl replace-node: %v\n%s", err, out)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := launch.WaitHTTP(rctx, "http://"+c.HTTPAddr(victim)+"/readyz"); err != nil {
		t.Fatal(err)
	}
	testutil.Until(t, 30*time.Second, "the rejoin marker cleared", func() bool {
		data, _ := os.ReadFile(filepath.Join(dataDir, "idem-identity.json"))
		return len(data) > 0 && !strings.Contains(string(data), "rejoining")
	})
	back := cluster.NewAPI(c.HTTPAddr(victim))
	back.RetryUnavailable = 10 * time.Second
	for i := range keys {
		if r := want(t, 200)(back.Get(ctx, "pay", fmt.Sprintf("k%02d", i))); r.Str("state") != "COMPLETED" {
			t.Fatalf("k%02d through the replaced node: %s", i, r)
		}
	}
}

// A new cluster's nodes that come up seconds apart still make one cluster:
// the first waits, saying every 10 s which nodes have not answered (and
// answering /healthz, with /readyz 503 naming them), and bootstraps once
// all of them have.
func TestFirstStartWaitsForEveryNode(t *testing.T) {
	topo, err := launch.Topology(launch.Spec{Cluster: "apart", NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	nodes := topo.Nodes()
	logHas := func(id, text string) bool {
		data, _ := os.ReadFile(c.Nodes[id].Log)
		return strings.Contains(string(data), text)
	}
	first := nodes[0].ID
	if err := c.Nodes[first].Start(); err != nil {
		t.Fatal(err)
	}
	others := nodes[1].ID + "," + nodes[2].ID
	testutil.Until(t, 30*time.Second, first+" saying whom it waits for", func() bool {
		return logHas(first, "waiting_for="+others)
	})
	if logHas(first, "every other node answered") {
		t.Fatalf("%s bootstrapped alone", first)
	}
	// A supervisor sees it alive, and not ready for a reason.
	probe := cluster.NewAPI(c.HTTPAddr(first))
	if r, err := probe.Do(t.Context(), "GET", "/healthz", nil); err != nil || r.Status != 200 {
		t.Fatalf("/healthz while waiting: %v %v", r, err)
	}
	if r, err := probe.Do(t.Context(), "GET", "/readyz", nil); err != nil || r.Status != 503 || !strings.Contains(string(r.Raw), others) {
		t.Fatalf("/readyz while waiting: %v %v", r, err)
	}
	if err := c.Nodes[nodes[1].ID].Start(); err != nil {
		t.Fatal(err)
	}
	testutil.Until(t, 30*time.Second, first+" waiting for the last node only", func() bool {
		return logHas(first, "waiting_for="+nodes[2].ID+"\n")
	})
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	api := cluster.NewAPI(c.HTTPAddr(nodes[2].ID))
	api.RetryUnavailable = 10 * time.Second
	if r := want(t, 200)(api.Reserve(ctx, "pay", "apart", nil)); r.Str("outcome") != "ACQUIRED" {
		t.Fatalf("reserve: %s", r)
	}
}
