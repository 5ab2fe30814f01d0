package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
)

// Tests in this file run real idemnode processes on loopback.

var binaries cluster.Binaries

func TestMain(m *testing.M) { cluster.RunTests(m, &binaries, "idemnode", "idemctl") }

// startCluster starts a three-node, one-region cluster and stops it when the test ends.
func startCluster(t testing.TB, spec launch.Spec, extraArgs ...string) *cluster.Cluster {
	t.Helper()
	topo, err := launch.Topology(spec)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"), extraArgs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// startSecureCluster is startCluster in secure mode: a CA, node
// certificates, a client certificate for each of clients, and the auth file
// policy (YAML) on every node.
func startSecureCluster(t testing.TB, spec launch.Spec, policy string, clients ...string) *cluster.Cluster {
	t.Helper()
	topo, err := launch.Topology(spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c, err := cluster.NewNodes(topo, dir, binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SecureWithPolicy(policy, clients...); err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func nodeIDs(c *cluster.Cluster) []string {
	var ids []string
	for _, n := range c.Topology.Nodes() {
		ids = append(ids, n.ID)
	}
	return ids
}

// want returns a checker that fails the test unless the call answered status.
func want(t *testing.T, status int) func(cluster.Reply, error) cluster.Reply {
	return func(r cluster.Reply, err error) cluster.Reply {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != status {
			t.Fatalf("got %s, want status %d", r, status)
		}
		return r
	}
}

// TestSharedCluster runs the tests that leave the cluster as they found it
// (no kills, no restarts) on one three-node cluster, which they share to
// save its start-up. The skew margin is short for the lease test; the other
// test's leases are long enough never to expire.
func TestSharedCluster(t *testing.T) {
	c := startCluster(t, launch.Spec{}, "--clock-skew-margin", "300ms")
	t.Run("ConcurrentReservesOneOwner", func(t *testing.T) { testConcurrentReservesOneOwner(t, c) })
	t.Run("LeaseExpiryAndReclaim", func(t *testing.T) { testLeaseExpiryAndReclaim(t, c) })
}

// testConcurrentReservesOneOwner: 48 concurrent reserves of the same key,
// spread over all three nodes, give exactly one ACQUIRED; over many keys.
func testConcurrentReservesOneOwner(t *testing.T, c *cluster.Cluster) {
	ids := nodeIDs(c)
	apis := make([]*cluster.API, len(ids))
	for i, id := range ids {
		apis[i] = cluster.NewAPI(c.HTTPAddr(id))
		// A retried reserve keeps its owner token, so it cannot make a
		// second owner: exactly one ACQUIRED still holds.
		apis[i].RetryUnavailable = 30 * time.Second
	}
	ctx := t.Context()
	rng := testutil.Rand(testutil.Seed(t), 0)
	for k := 0; k < 25; k++ {
		key := fmt.Sprintf("charge-%d-%d", k, rng.Uint64())
		var acquired, inProgress atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, 48)
		for g := 0; g < 48; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := apis[g%len(apis)].Reserve(ctx, "payments", key, map[string]any{"owner_token": fmt.Sprintf("worker-%04d-abcdefgh", g)})
				if err != nil || r.Status != http.StatusOK {
					errs <- fmt.Errorf("reserve: %v %v", r, err)
					return
				}
				switch r.Str("outcome") {
				case "ACQUIRED":
					acquired.Add(1)
				case "IN_PROGRESS":
					inProgress.Add(1)
				default:
					errs <- fmt.Errorf("unexpected outcome %s", r)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if acquired.Load() != 1 || inProgress.Load() != 47 {
			t.Fatalf("key %s: %d ACQUIRED, %d IN_PROGRESS; want exactly 1 and 47", key, acquired.Load(), inProgress.Load())
		}
	}
}

// leaderCounts asks every running node which shards it leads.
func shardLeaders(t *testing.T, c *cluster.Cluster) map[string]string {
	t.Helper()
	leaders, err := c.ShardLeaders(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return leaders
}

type completion struct {
	key, body string
	fencing   string
}

// workload runs reserve+complete cycles on fresh keys through rotating
// nodes until stop closes, and reports the acknowledged completions on
// acked. Each step is retried with the same owner token (and the same
// response) on the next running node while the answer is undecided (a
// transport error or 503), as the contract tells clients to. A decided answer
// must be the contract's: ACQUIRED for a fresh key, 200 for its owner's
// complete; anything else fails the test with the key and the answer.
func workload(t *testing.T, c *cluster.Cluster, seed uint64, workers int, stop <-chan struct{}, acked chan<- completion, okAfter *atomic.Int64) {
	ctx := t.Context()
	ids := nodeIDs(c)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			rng := testutil.Rand(seed, uint64(w))
			api := cluster.NewAPI(c.HTTPAddr(ids[w%len(ids)]))
			api.Client.Timeout = 3 * time.Second
			// decided retries call on running nodes, rotating from start,
			// until the answer is neither a transport error nor a 503, for at
			// most 20 s (two elections and more). ok=false: stop closed or
			// the budget ran out with the answer undecided.
			decided := func(start int, call func() (cluster.Reply, error)) (r cluster.Reply, ok bool) {
				deadline := time.Now().Add(20 * time.Second)
				for attempt := start; time.Now().Before(deadline); attempt++ {
					select {
					case <-stop:
						return r, false
					default:
					}
					id := ids[attempt%len(ids)]
					if !c.Nodes[id].Running() {
						continue
					}
					api.Base = "http://" + c.HTTPAddr(id)
					r, err := call()
					if err == nil && r.Status != http.StatusServiceUnavailable {
						return r, true
					}
					time.Sleep(20 * time.Millisecond) // backoff between retries, as a client would
				}
				return r, false
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d-%d", w, i, rng.Uint64())
				owner := "owner-token-" + key
				r, ok := decided(w+i, func() (cluster.Reply, error) {
					return api.Reserve(ctx, "ledger", key, map[string]any{"owner_token": owner})
				})
				if !ok {
					continue // never decided: nothing was acknowledged
				}
				if r.Status != http.StatusOK || r.Str("outcome") != "ACQUIRED" || r.Str("owner_token") != owner {
					t.Errorf("reserve of fresh key %s with owner token %s (retried with it): %s; want ACQUIRED for that owner", key, owner, r)
					return
				}
				body := fmt.Sprintf("charge %s", key)
				cr, ok := decided(w+i+1, func() (cluster.Reply, error) {
					return api.Complete(ctx, "ledger", key, map[string]any{"owner_token": owner,
						"response": map[string]any{"status": 201, "body": base64.StdEncoding.EncodeToString([]byte(body))}})
				})
				if !ok {
					continue
				}
				if cr.Status != http.StatusOK {
					t.Errorf("complete of %s by its owner %s (retried with the same response): %s; want 200", key, owner, cr)
					return
				}
				acked <- completion{key: key, body: body, fencing: r.Str("fencing_token")}
				if okAfter != nil {
					okAfter.Add(1)
				}
			}
		})
	}
	wg.Wait()
}

// TestLeaderKillLosesNothing: SIGKILL the node leading the most shards
// during a concurrent workload; every acknowledged completion survives and
// writes resume after the election.
func TestLeaderKillLosesNothing(t *testing.T) {
	killLeaderUnderLoad(t, startCluster(t, launch.Spec{}))
}

// killLeaderUnderLoad kills the node leading most shards while 12 workers
// complete keys, restarts it, and checks every acknowledged completion.
func killLeaderUnderLoad(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	ctx := t.Context()
	acked := make(chan completion, 100000)
	stop := make(chan struct{})
	var okCount atomic.Int64
	done := make(chan struct{})
	seed := testutil.Seed(t)
	go func() { workload(t, c, seed, 12, stop, acked, &okCount); close(done) }()

	testutil.Until(t, 20*time.Second, "completions before the kill", func() bool { return okCount.Load() >= 200 })
	counts := map[string]int{}
	for _, id := range shardLeaders(t, c) {
		counts[id]++
	}
	victim, most := "", -1
	for id, n := range counts {
		if n > most {
			victim, most = id, n
		}
	}
	t.Logf("killing %s, leader of %d shards, after %d completions", victim, most, okCount.Load())
	c.Nodes[victim].Kill()
	before := okCount.Load()
	testutil.Until(t, 30*time.Second, "completions after the kill", func() bool { return okCount.Load() >= before+200 })
	close(stop)
	<-done
	close(acked)

	if err := c.Nodes[victim].Start(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := c.WaitReady(rctx); err != nil {
		t.Fatal(err)
	}
	var all []completion
	for a := range acked {
		all = append(all, a)
	}
	t.Logf("%d acknowledged completions to verify", len(all))
	checkCompleted(t, c, all)
}

// checkCompleted reads every completion from every node: it must be there,
// COMPLETED, with the same body and fencing token.
func checkCompleted(t *testing.T, c *cluster.Cluster, all []completion) {
	t.Helper()
	ctx := t.Context()
	for i, id := range nodeIDs(c) {
		api := cluster.NewAPI(c.HTTPAddr(id))
		api.RetryUnavailable = 30 * time.Second // leaders may still be moving after the restart
		for j, a := range all {
			if j%3 != i { // spread the reads; every node serves linearizable reads of every key
				continue
			}
			r := want(t, http.StatusOK)(api.Get(ctx, "ledger", a.key))
			resp, _ := r.Body["response"].(map[string]any)
			body, _ := base64.StdEncoding.DecodeString(fmt.Sprint(resp["body"]))
			if r.Str("state") != "COMPLETED" || string(body) != a.body || r.Str("fencing_token") != a.fencing {
				t.Fatalf("acknowledged completion of %s changed or lost: %s", a.key, r)
			}
		}
	}
}

// TestRestartKeepsEveryRecord: stop (or crash) all three nodes and restart
// them on their data dirs: completed records replay byte for byte and
// reservations keep their owner, fencing token and lease. The snapshot
// variant forces frequent snapshots so the restart restores a snapshot plus
// a log tail.
func TestRestartKeepsEveryRecord(t *testing.T) {
	for _, tc := range []struct {
		name  string
		crash bool
		args  []string
	}{
		{name: "graceful"},
		{name: "crash-with-snapshots", crash: true, args: []string{"--raft-snapshot-threshold", "40", "--raft-snapshot-interval", "200ms", "--raft-trailing-logs", "10"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startCluster(t, launch.Spec{}, tc.args...)
			ctx := t.Context()
			ids := nodeIDs(c)
			rng := testutil.Rand(testutil.Seed(t), 0)
			type held struct{ key, owner, fencing, lease string }
			var completed []completion
			var reserved []held
			for i := 0; i < 150; i++ {
				api := cluster.NewAPI(c.HTTPAddr(ids[i%3]))
				api.RetryUnavailable = 30 * time.Second // the new cluster hands leaderships to their preferred voters
				key := "order:" + strconv.Itoa(i) + "/" + strconv.Itoa(rng.IntN(1e9))
				owner := fmt.Sprintf("owner-token-%06d", i)
				r := want(t, 200)(api.Reserve(ctx, "ledger", key, map[string]any{"owner_token": owner, "lease_ms": 600000, "fingerprint": "fp-" + key}))
				if i%5 == 4 {
					reserved = append(reserved, held{key, owner, r.Str("fencing_token"), r.Str("lease_expires_at")})
					continue
				}
				body := make([]byte, 64+rng.IntN(2048))
				for j := range body {
					body[j] = byte(rng.Uint32())
				}
				want(t, 200)(api.Complete(ctx, "ledger", key, map[string]any{"owner_token": owner,
					"response": map[string]any{"status": 200 + i%3, "headers": map[string]string{"X-Order": key}, "body": base64.StdEncoding.EncodeToString(body)}}))
				completed = append(completed, completion{key: key, body: string(body), fencing: r.Str("fencing_token")})
			}
			for _, id := range ids {
				if tc.crash {
					c.Nodes[id].Kill()
				} else if err := c.Nodes[id].Stop(15 * time.Second); err != nil {
					t.Fatalf("graceful stop of %s: %v", id, err)
				}
			}
			if tc.crash {
				snaps, _ := filepath.Glob(filepath.Join(c.Dir, "data", "*", "raft", "shards", "*", "snapshots", "*", "state.bin"))
				if len(snaps) == 0 {
					t.Fatal("no snapshot was taken before the crash; the test would not exercise snapshot restore")
				}
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
			api := cluster.NewAPI(c.HTTPAddr(ids[1]))
			api.RetryUnavailable = 30 * time.Second
			for _, h := range reserved {
				r := want(t, 200)(api.Reserve(ctx, "ledger", h.key, map[string]any{"owner_token": "someone-else-0000", "fingerprint": "fp-" + h.key}))
				if r.Str("outcome") != "IN_PROGRESS" || r.Str("lease_expires_at") != h.lease {
					t.Fatalf("reservation of %s after restart: %s (lease was %s)", h.key, r, h.lease)
				}
				g := want(t, 200)(api.Get(ctx, "ledger", h.key))
				if g.Str("fencing_token") != h.fencing || g.Str("state") != "IN_PROGRESS" {
					t.Fatalf("get %s after restart: %s", h.key, g)
				}
				// The owner still owns it and can complete.
				want(t, 200)(api.Complete(ctx, "ledger", h.key, map[string]any{"owner_token": h.owner, "response": map[string]any{"status": 204}}))
			}
		})
	}
}

// testLeaseExpiryAndReclaim: an expired lease is reclaimed only after the
// clock-skew margin (300 ms, TestSharedCluster's), with a larger fencing
// token, and the stale owner is fenced out of complete, heartbeat and release.
func testLeaseExpiryAndReclaim(t *testing.T, c *cluster.Cluster) {
	ctx := t.Context()
	ids := nodeIDs(c)
	a, b := cluster.NewAPI(c.HTTPAddr(ids[0])), cluster.NewAPI(c.HTTPAddr(ids[2]))
	a.RetryUnavailable, b.RetryUnavailable = 30*time.Second, 30*time.Second
	first := want(t, 200)(a.Reserve(ctx, "jobs", "job-1", map[string]any{"owner_token": "stale-owner-00001", "lease_ms": 200}))
	oldLease, _ := time.Parse(time.RFC3339Nano, first.Str("lease_expires_at"))
	var re cluster.Reply
	testutil.Until(t, 10*time.Second, "RECLAIMED", func() bool {
		re = want(t, 200)(b.Reserve(ctx, "jobs", "job-1", map[string]any{"owner_token": "new-owner-000001", "lease_ms": 5000}))
		if o := re.Str("outcome"); o != "IN_PROGRESS" && o != "RECLAIMED" {
			t.Fatalf("unexpected %s", re)
		}
		return re.Str("outcome") == "RECLAIMED"
	})
	newLease, _ := time.Parse(time.RFC3339Nano, re.Str("lease_expires_at"))
	reclaimedAt := newLease.Add(-5000 * time.Millisecond)
	if reclaimedAt.Before(oldLease.Add(300 * time.Millisecond)) {
		t.Fatalf("reclaimed at %s, before lease end %s plus the 300ms margin", reclaimedAt, oldLease)
	}
	f1, _ := strconv.ParseUint(first.Str("fencing_token"), 10, 64)
	f2, _ := strconv.ParseUint(re.Str("fencing_token"), 10, 64)
	if f2 <= f1 || re.Str("previous_fencing_token") != first.Str("fencing_token") {
		t.Fatalf("fencing: first %s, reclaim %s", first, re)
	}
	stale := map[string]any{"owner_token": "stale-owner-00001"}
	r := want(t, 409)(a.Heartbeat(ctx, "jobs", "job-1", stale))
	if r.ErrCode() != "NOT_OWNER" {
		t.Fatalf("stale heartbeat: %s", r)
	}
	want(t, 409)(a.Complete(ctx, "jobs", "job-1", map[string]any{"owner_token": "stale-owner-00001", "response": map[string]any{"status": 200}}))
	want(t, 409)(a.Release(ctx, "jobs", "job-1", stale))
	// The new owner is unaffected.
	want(t, 200)(b.Complete(ctx, "jobs", "job-1", map[string]any{"owner_token": "new-owner-000001", "response": map[string]any{"status": 200}}))
}
