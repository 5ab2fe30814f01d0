package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
)

// TestReplaceNodeUnderLoad: on a three-node region under a write load, a
// node is killed and loses its Raft log. Started on that dir it refuses with
// one line naming the dir and replace-node. replace-node refuses while the
// node runs, then empties the dir and has the leaders replace the voter;
// started again, the node catches up by snapshot (the leaders compacted
// their logs), becomes ready, clears its rejoin marker, can lead every
// shard, and every completion acknowledged before, during and after is
// readable through it, served by it as leader.
func TestReplaceNodeUnderLoad(t *testing.T) {
	topo, err := launch.Topology(launch.Spec{Cluster: "replace", NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	// Small trailing logs: after a snapshot the leaders' logs no longer
	// reach back to the start, so the new replica needs the snapshot.
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"), "--raft-trailing-logs", "8", "--raft-snapshot-interval", "1s")
	if err != nil {
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
	cfg := c.TopologyPath
	victim := topo.Nodes()[2].ID
	// replace-node refuses a running node and leaves its dir alone.
	running := topo.Nodes()[0].ID
	runningDir := filepath.Join(c.Dir, "data", running)
	if _, err := ctl(t, "--config", cfg, "replace-node", "--id", running, "--data-dir", runningDir); err == nil || !strings.Contains(err.Error(), "is running") {
		t.Fatalf("replace-node on a running node: %v", err)
	}
	if _, err := os.Stat(filepath.Join(runningDir, "raft", "raftlog", "LOCK")); err != nil {
		t.Fatalf("replace-node touched a running node's dir: %v", err)
	}
	var survivors []string
	for _, n := range topo.Nodes() {
		if n.ID != victim {
			survivors = append(survivors, n.ID)
		}
	}

	// The load: writers reserve and complete through the survivors,
	// recording every acknowledged completion; a failed call (503 while a
	// leader moves) is retried with the same owner token.
	var mu sync.Mutex
	acked := map[string]string{} // key -> body
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		api := cluster.NewAPI(c.HTTPAddr(survivors[w%2]))
		wg.Go(func() {
			for i := 0; i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d", w, i)
				owner := fmt.Sprintf("owner-token-%04d-%06d", w, i)
				body := base64.StdEncoding.EncodeToString([]byte("paid " + key))
				if !retry(ctx, func() bool {
					r, err := api.Reserve(ctx, "payments", key, map[string]any{"owner_token": owner})
					return err == nil && r.Status == 200
				}) {
					return
				}
				if !retry(ctx, func() bool {
					r, err := api.Complete(ctx, "payments", key, map[string]any{"owner_token": owner,
						"response": map[string]any{"status": 200, "body": body}})
					return err == nil && r.Status == 200
				}) {
					return
				}
				mu.Lock()
				acked[key] = body
				mu.Unlock()
			}
		})
	}
	ackedCount := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	testutil.Until(t, 20*time.Second, "writes before the loss", func() bool { return ackedCount() >= 100 })

	// The node crashes and loses its Raft log; its identity file stays.
	p := c.Nodes[victim]
	p.Kill()
	dataDir := filepath.Join(c.Dir, "data", victim)
	if err := os.RemoveAll(filepath.Join(dataDir, "raft")); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(p.Log)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	err = p.Wait(wctx)
	wcancel()
	after, _ := os.ReadFile(p.Log)
	out := strings.TrimSpace(string(after[len(before):]))
	last := out[strings.LastIndex(out, "\n")+1:]
	if err == nil || !strings.Contains(last, dataDir) || !strings.Contains(last, "idemctl replace-node") {
		t.Fatalf("start on a lost log: exit %v, last line %q", err, last)
	}
	t.Logf("refusal: %s", last)

	// More writes while it is out, then every leader snapshots and
	// compacts its log.
	n := ackedCount()
	testutil.Until(t, 20*time.Second, "writes while the node is out", func() bool { return ackedCount() >= n+100 })
	// Every surviving voter compacts, not only the leader: a leadership
	// that moves before the replica joins must not find the log whole.
	for _, s := range topo.Shards() {
		for _, v := range s.Voters {
			if v != victim {
				mustCtl(t, "--config", cfg, "snapshot", s.ID, "--node", v)
			}
		}
	}

	out2 := mustCtl(t, "--config", cfg, "replace-node", "--id", victim, "--data-dir", dataDir, "--json")
	t.Logf("replace-node: %s", out2)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
	defer rcancel()
	if err := launch.WaitHTTP(rctx, "http://"+c.HTTPAddr(victim)+"/readyz"); err != nil {
		t.Fatal(err)
	}
	testutil.Until(t, 20*time.Second, "the rejoin marker cleared", func() bool {
		data, _ := os.ReadFile(filepath.Join(dataDir, "idem-identity.json"))
		return len(data) > 0 && !strings.Contains(string(data), "rejoining")
	})
	n = ackedCount()
	testutil.Until(t, 20*time.Second, "writes after the rejoin", func() bool { return ackedCount() >= n+50 })
	close(stop)
	wg.Wait()

	// It caught up by snapshot.
	api := cluster.NewAPI(c.HTTPAddr(victim))
	m, err := api.Do(t.Context(), "GET", "/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	restores := 0.0
	for _, mm := range regexp.MustCompile(`(?m)^idem_raft_snapshot_restores_total\{[^}]*\} (\S+)$`).FindAllStringSubmatch(string(m.Raw), -1) {
		v, _ := strconv.ParseFloat(mm[1], 64)
		restores += v
	}
	if restores == 0 {
		t.Fatalf("the replaced node restored no snapshot:\n%s", m.Raw)
	}

	// It leads every shard and serves every acknowledged completion itself.
	for _, s := range topo.Shards() {
		mustCtl(t, "--config", cfg, "--timeout", "15s", "transfer-leader", s.ID, victim)
	}
	for key, body := range acked {
		kctx, kcancel := context.WithTimeout(t.Context(), time.Minute)
		r, err := cluster.Decided(kctx, func() (cluster.Reply, error) { return api.Get(kctx, "payments", key) })
		kcancel()
		if err != nil {
			t.Fatal(err)
		}
		resp, _ := r.Body["response"].(map[string]any)
		if r.Status != 200 || r.Str("state") != "COMPLETED" || resp["body"] != body {
			t.Fatalf("acknowledged completion of %s through the replaced node: %s", key, r)
		}
	}
	leaders, err := c.ShardLeaders(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range topo.Shards() {
		if leaders[s.ID] != victim {
			t.Fatalf("shard %s led by %s after the reads, want %s (the reads must have been its own)", s.ID, leaders[s.ID], victim)
		}
	}
	t.Logf("%d acknowledged completions readable through the replaced node; %v snapshot restores", len(acked), restores)
}

// retry calls f until it reports success, at most 50 times, or ctx ends.
func retry(ctx context.Context, f func() bool) bool {
	for range 50 {
		if f() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
	return false
}
