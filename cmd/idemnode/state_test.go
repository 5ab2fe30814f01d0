package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
)

// metricSum scrapes a node's /metrics and sums the samples of name.
func metricSum(t testing.TB, c *cluster.Cluster, id, name string) float64 {
	t.Helper()
	v, err := cluster.MetricSum(t.Context(), c.HTTPAddr(id), name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestKilledNodesRestartWithoutRestore: every node SIGKILLed after writes
// and snapshots restarts on its data dir with every acknowledged record,
// and without restoring a snapshot: the records are in the state engine,
// with the index they cover.
func TestKilledNodesRestartWithoutRestore(t *testing.T) {
	c := startCluster(t, launch.Spec{}, "--raft-snapshot-threshold", "40", "--raft-snapshot-interval", "200ms", "--raft-trailing-logs", "10")
	ctx := t.Context()
	ids := nodeIDs(c)
	var completed []completion
	for i := range 120 {
		api := cluster.NewAPI(c.HTTPAddr(ids[i%3]))
		key := fmt.Sprintf("kill:%d", i)
		owner := fmt.Sprintf("owner-token-%06d", i)
		r := want(t, 200)(api.Reserve(ctx, "ledger", key, map[string]any{"owner_token": owner, "lease_ms": 600000}))
		body := fmt.Sprintf("body of %s", key)
		want(t, 200)(api.Complete(ctx, "ledger", key, map[string]any{"owner_token": owner,
			"response": map[string]any{"status": 200, "body": base64.StdEncoding.EncodeToString([]byte(body))}}))
		completed = append(completed, completion{key: key, body: body, fencing: r.Str("fencing_token")})
	}
	testutil.Until(t, 30*time.Second, "a snapshot on every node", func() bool {
		for _, id := range ids {
			snaps, _ := filepath.Glob(filepath.Join(c.Dir, "data", id, "raft", "shards", "*", "snapshots", "*", "state.bin"))
			if len(snaps) == 0 {
				return false
			}
		}
		return true
	})
	for _, id := range ids {
		// The default log store: the pebble log.
		if _, err := os.Stat(filepath.Join(c.Dir, "data", id, "raft", "raftlog", "LOCK")); err != nil {
			t.Fatalf("%s has no pebble log: %v", id, err)
		}
		c.Nodes[id].Kill()
	}
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := c.WaitReady(rctx); err != nil {
		t.Fatal(err)
	}
	checkCompleted(t, c, completed)
	for _, id := range ids {
		if n := metricSum(t, c, id, "idem_raft_snapshot_restores_total"); n != 0 {
			t.Errorf("%s restored %v snapshots on restart; the state engine should have made that unnecessary", id, n)
		}
	}
}

// TestStateFullAnswers429: at --max-state-bytes a reserve of a new key and
// a complete get 429 RESOURCE_EXHAUSTED with Retry-After; reads, replays,
// heartbeats and releases keep working and the node stays ready; once the
// sweep drops expired records, writes resume by themselves.
func TestStateFullAnswers429(t *testing.T) {
	c := startCluster(t, launch.Spec{ShardsPerRegion: 1}, "--max-state-bytes", "8000")
	ctx := t.Context()
	api := cluster.NewAPI(c.HTTPAddr(nodeIDs(c)[0]))
	body := base64.StdEncoding.EncodeToString(make([]byte, 700))
	var first string
	full := false
	for i := 0; i < 100 && !full; i++ {
		key := fmt.Sprintf("fill:%d", i)
		owner := fmt.Sprintf("owner-token-%06d", i)
		r, err := api.Reserve(ctx, "ledger", key, map[string]any{"owner_token": owner, "lease_ms": 60000})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status == 429 {
			full = true
			break
		}
		if r.Status != 200 {
			t.Fatalf("reserve %s: %s", key, r)
		}
		if i == 0 {
			first = key
		}
		// Long enough that no sweep drops them before the checks at the
		// limit below are done, even on a loaded machine (a sweep in
		// between made idem_state_full 0 in one run at load 8).
		retention := 20
		if i == 0 {
			retention = 3600 // kept, to replay at the limit
		}
		r, err = api.Complete(ctx, "ledger", key, map[string]any{"owner_token": owner, "retention_s": retention,
			"response": map[string]any{"status": 200, "body": body}})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status == 429 {
			full = true
			if r.ErrCode() != "RESOURCE_EXHAUSTED" {
				t.Fatalf("complete at the limit: %s", r)
			}
			// The reservation stays; its owner may still heartbeat and release.
			want(t, 200)(api.Heartbeat(ctx, "ledger", key, map[string]any{"owner_token": owner, "lease_ms": 60000}))
			want(t, 200)(api.Release(ctx, "ledger", key, map[string]any{"owner_token": owner}))
			break
		}
		if r.Status != 200 {
			t.Fatalf("complete %s: %s", key, r)
		}
	}
	if !full {
		t.Fatal("100 records of 700 bytes never reached --max-state-bytes 8000")
	}
	r, err := http.Post("http://"+c.HTTPAddr(nodeIDs(c)[1])+"/v1/namespaces/ledger/keys/"+"new-key"+":reserve", "application/json",
		strings.NewReader(`{"owner_token":"owner-token-new-1"}`))
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != 429 || r.Header.Get("Retry-After") == "" {
		t.Fatalf("reserve of a new key at the limit (via another node): %d, Retry-After %q", r.StatusCode, r.Header.Get("Retry-After"))
	}
	// A replay and a read still work.
	if g := want(t, 200)(api.Get(ctx, "ledger", first)); g.Str("state") != "COMPLETED" {
		t.Fatalf("get at the limit: %s", g)
	}
	if rp := want(t, 200)(api.Reserve(ctx, "ledger", first, map[string]any{"owner_token": "owner-token-replayer"})); rp.Str("outcome") != "COMPLETED" {
		t.Fatalf("replay at the limit: %s", rp)
	}
	resp, err := http.Get("http://" + c.HTTPAddr(nodeIDs(c)[0]) + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("readyz at the limit: %d", resp.StatusCode)
	}
	if n := metricSum(t, c, nodeIDs(c)[0], "idem_state_full"); n != 1 {
		t.Errorf("idem_state_full = %v at the limit", n)
	}
	// The records expire after 20 s; the leader's sweep (every 10 s) drops
	// them and writes resume without anyone doing anything.
	testutil.Until(t, 60*time.Second, "writes to resume after the sweep", func() bool {
		r, err := api.Reserve(ctx, "ledger", "after-sweep", map[string]any{"owner_token": "owner-token-after"})
		return err == nil && r.Status == 200
	})
}
