package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/topology"
)

// Multi-region tests on real processes:
// three regions of three idemnode processes each, two shards homed per
// region with three replicas, and one idemrouter per region, all on
// loopback.

var binaries cluster.Binaries

func TestMain(m *testing.M) { cluster.RunTests(m, &binaries, "idemnode", "idemrouter") }

var regions = []string{"us-east", "eu-west", "ap-south"}

// multiRegion is a running three-region cluster with a router per region.
type multiRegion struct {
	t       *testing.T
	c       *cluster.Cluster
	ring    *topology.Ring
	routers []*cluster.Router // routers[i] runs in regions[i]
	seed    uint64            // of every random choice the test makes (logged)
	rng     *rand.Rand        // from seed, for the test's own goroutine
	runs    uint64            // workloads started: each draws its own streams
}

func startMultiRegion(t *testing.T, survival string) *multiRegion {
	t.Helper()
	topo, err := launch.Topology(launch.Spec{Cluster: "mr", Regions: regions, NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3, Survival: survival})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	ring, err := topology.NewRing(topo)
	if err != nil {
		t.Fatal(err)
	}
	seed := testutil.Seed(t)
	m := &multiRegion{t: t, c: c, ring: ring, seed: seed, rng: testutil.Rand(seed, 0)}
	for _, r := range regions {
		rt, err := c.NewRouter(binaries.Path(t, "idemrouter"), "router-"+r, r)
		if err != nil {
			t.Fatal(err)
		}
		m.routers = append(m.routers, rt)
	}
	t.Cleanup(func() {
		if err := c.StopAll(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
		if t.Failed() {
			m.dumpLogs()
		}
	})
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	for _, rt := range m.routers {
		if err := rt.Start(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	for _, rt := range m.routers {
		if err := rt.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func (m *multiRegion) dumpLogs() {
	names := make([]string, 0)
	logs := map[string]string{}
	for id, p := range m.c.Nodes {
		names, logs[id] = append(names, id), p.Log
	}
	for _, rt := range m.routers {
		names, logs[rt.Name] = append(names, rt.Name), rt.Log
	}
	sort.Strings(names)
	for _, n := range names {
		data, _ := os.ReadFile(logs[n])
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		m.t.Logf("---- tail of %s log ----\n%s", n, data)
	}
}

// routerAPIs returns a JSON API client per router, in region order.
func (m *multiRegion) routerAPIs() []*cluster.API {
	out := make([]*cluster.API, len(m.routers))
	for i, rt := range m.routers {
		out[i] = rt.API()
	}
	return out
}

// nodeAPIs returns a JSON API client per running node.
func (m *multiRegion) nodeAPIs() []*cluster.API {
	var out []*cluster.API
	for _, n := range m.c.Topology.Nodes() {
		if m.c.Nodes[n.ID].Running() {
			out = append(out, cluster.NewAPI(n.HTTPAddr))
		}
	}
	return out
}

// keysIn returns n keys of namespace ns homed in region, spread over the
// region's shards.
func (m *multiRegion) keysIn(ns, region, prefix string, n int) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		key := fmt.Sprintf("%s:%d:%d", prefix, i, m.rng.IntN(1e9))
		if m.ring.Locate(ns, key).HomeRegion == region {
			keys = append(keys, key)
		}
	}
	return keys
}

func (m *multiRegion) home(ns, key string) string { return m.ring.Locate(ns, key).HomeRegion }

func check(t *testing.T, want int) func(cluster.Reply, error) cluster.Reply {
	return func(r cluster.Reply, err error) cluster.Reply {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != want {
			t.Fatalf("got %s, want status %d", r, want)
		}
		return r
	}
}

func reserveBody(owner, fingerprint string) map[string]any {
	return map[string]any{"owner_token": owner, "fingerprint": fingerprint, "lease_ms": 120000}
}

func completeBody(owner, body string) map[string]any {
	return map[string]any{"owner_token": owner, "response": map[string]any{
		"status": 201, "headers": map[string]string{"Content-Type": "text/plain", "X-Key": body},
		"body": base64.StdEncoding.EncodeToString([]byte(body))}}
}

// completedKey is a key completed and acknowledged, with what its replay
// must show.
type completedKey struct {
	key, body, fencing, fingerprint string
}

// retrying calls f on apis, rotating from start, until it gets an answer
// other than 503 or a transport error, or timeout passes. It returns the
// last reply and error.
func retrying(ctx context.Context, apis []*cluster.API, start int, timeout time.Duration, f func(*cluster.API) (cluster.Reply, error)) (cluster.Reply, error) {
	deadline := time.Now().Add(timeout)
	for attempt := 0; ; attempt++ {
		r, err := f(apis[(start+attempt)%len(apis)])
		if err == nil && r.Status != http.StatusServiceUnavailable {
			return r, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err == nil {
				err = fmt.Errorf("still %s after %s", r, timeout)
			}
			return r, err
		}
		time.Sleep(50 * time.Millisecond) // backoff between retries, as a client would
	}
}

// workload runs reserve+complete cycles on fresh keys through apis until
// stop closes. Each step retries with the same owner token (and the same
// response) across endpoints, as the contract tells clients to, so a
// router or node lost mid-request must never turn a retry into anything
// but the same reservation or completion. It reports every acknowledged
// completion on acked and every contract violation to violation (which must
// not block: a burst of violations must fail the test, not hang it).
func workload(ctx context.Context, seed, run uint64, ns string, apis []*cluster.API, workers int, stop <-chan struct{}, acked *ackLog, violation func(string)) {
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := testutil.Rand(seed, run<<32|uint64(w)) // stream 0 is the test's own
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("wl:%d:%d:%d", w, i, rng.Uint64())
				owner := "owner-" + strconv.Itoa(w) + "-" + strconv.Itoa(i) + "-abcdefghijk"
				start := w + i
				r, err := retrying(ctx, apis, start, 20*time.Second, func(a *cluster.API) (cluster.Reply, error) {
					return a.Reserve(ctx, ns, key, reserveBody(owner, "fp"))
				})
				if err != nil {
					continue // never acknowledged: nothing to check
				}
				if r.Status != http.StatusOK || r.Str("outcome") != "ACQUIRED" {
					violation(fmt.Sprintf("reserve of fresh key %s (retried with its owner token): %s; want ACQUIRED", key, r))
					continue
				}
				body := "done " + key
				c, err := retrying(ctx, apis, start+1, 20*time.Second, func(a *cluster.API) (cluster.Reply, error) {
					return a.Complete(ctx, ns, key, completeBody(owner, body))
				})
				if err != nil {
					continue
				}
				if c.Status != http.StatusOK {
					violation(fmt.Sprintf("complete of %s by its owner (retried with the same response): %s; want 200", key, c))
					continue
				}
				acked.add(completedKey{key: key, body: body, fencing: r.Str("fencing_token"), fingerprint: "fp"})
			}
		}()
	}
	wg.Wait()
}

type ackLog struct {
	mu   sync.Mutex
	keys []completedKey
	n    atomic.Int64
}

func (a *ackLog) add(k completedKey) {
	a.mu.Lock()
	a.keys = append(a.keys, k)
	a.mu.Unlock()
	a.n.Add(1)
}

func (a *ackLog) all() []completedKey {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]completedKey(nil), a.keys...)
}

// runWorkload starts a workload and returns a function that stops it and
// fails the test on any violation.
func (m *multiRegion) runWorkload(t *testing.T, ns string, apis []*cluster.API, workers int, acked *ackLog) (stop func()) {
	stopc := make(chan struct{})
	var mu sync.Mutex
	var violations []string
	violation := func(v string) {
		mu.Lock()
		violations = append(violations, v)
		mu.Unlock()
	}
	done := make(chan struct{})
	m.runs++
	go func() { workload(t.Context(), m.seed, m.runs, ns, apis, workers, stopc, acked, violation); close(done) }()
	return func() {
		t.Helper()
		close(stopc)
		<-done
		mu.Lock()
		defer mu.Unlock()
		for i, v := range violations {
			if i == 20 {
				t.Errorf("... and %d more violations", len(violations)-i)
				break
			}
			t.Error(v)
		}
	}
}

// verifyCompleted reads every completion through the given APIs (spread
// over them): each must be COMPLETED with its body and fencing token.
func verifyCompleted(t *testing.T, ns string, apis []*cluster.API, keys []completedKey) {
	t.Helper()
	ctx := t.Context()
	for i, k := range keys {
		r := check(t, http.StatusOK)(apis[i%len(apis)].Get(ctx, ns, k.key))
		resp, _ := r.Body["response"].(map[string]any)
		body, _ := base64.StdEncoding.DecodeString(fmt.Sprint(resp["body"]))
		if r.Str("state") != "COMPLETED" || string(body) != k.body || r.Str("fencing_token") != k.fencing {
			t.Fatalf("acknowledged completion of %s changed or lost: %s", k.key, r)
		}
	}
}

// adminStatus asks every running node for its shard view and returns, per
// shard, the node that reports itself leader.
func (m *multiRegion) leaders() map[string]string {
	t := m.t
	t.Helper()
	leaders, err := m.c.ShardLeaders(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return leaders
}

// TestMultiRegionZone runs the zone-survival scenarios on one cluster, in
// order: cross-region visibility and identical replay, a three-region race
// for one key, routers restarted mid-workload, one node per region killed,
// and a whole region lost and returned.
func TestMultiRegionZone(t *testing.T) {
	m := startMultiRegion(t, "zone")
	const ns = "payments"
	var completed []completedKey // keys whose replay every later step checks

	t.Run("visible everywhere and identical replay", func(t *testing.T) {
		ctx := t.Context()
		routers := m.routerAPIs()
		nodes := m.nodeAPIs()
		perRegion := 6
		if testing.Short() {
			perRegion = 3
		}
		var keys []string
		for _, r := range regions {
			keys = append(keys, m.keysIn(ns, r, "vis", perRegion)...)
		}
		for i, key := range keys {
			owner := fmt.Sprintf("first-owner-%04d-xyz", i)
			first := check(t, 200)(routers[i%3].Reserve(ctx, ns, key, reserveBody(owner, "fp-"+key)))
			if first.Str("outcome") != "ACQUIRED" {
				t.Fatalf("first reserve of %s via %s: %s", key, m.routers[i%3].Name, first)
			}
			// Every other router and every node sees the reservation.
			for j, api := range append([]*cluster.API{routers[(i+1)%3], routers[(i+2)%3]}, nodes...) {
				r := check(t, 200)(api.Reserve(ctx, ns, key, reserveBody(fmt.Sprintf("other-owner-%04d-%02d", i, j), "fp-"+key)))
				if r.Str("outcome") != "IN_PROGRESS" || r.Str("lease_expires_at") != first.Str("lease_expires_at") {
					t.Fatalf("reserve of %s (home %s) via %s: %s; want IN_PROGRESS with the first lease", key, m.home(ns, key), api.Base, r)
				}
			}
			// Complete in a third region.
			check(t, 200)(routers[(i+2)%3].Complete(ctx, ns, key, completeBody(owner, "body of "+key)))
			completed = append(completed, completedKey{key: key, body: "body of " + key, fencing: first.Str("fencing_token"), fingerprint: "fp-" + key})
			// Replays are byte-identical everywhere, reserves and reads.
			var replay, read []byte
			for j, api := range append(append([]*cluster.API{}, routers...), nodes...) {
				r := check(t, 200)(api.Reserve(ctx, ns, key, reserveBody(fmt.Sprintf("late-owner-%04d-%02d", i, j), "fp-"+key)))
				if r.Str("outcome") != "COMPLETED" || r.Str("fencing_token") != first.Str("fencing_token") {
					t.Fatalf("replay of %s via %s: %s", key, api.Base, r)
				}
				g := check(t, 200)(api.Get(ctx, ns, key))
				if replay == nil {
					replay, read = r.Raw, g.Raw
					continue
				}
				if !bytes.Equal(r.Raw, replay) || !bytes.Equal(g.Raw, read) {
					t.Fatalf("replay of %s differs between endpoints:\n%s\n%s\nreads:\n%s\n%s", key, replay, r.Raw, read, g.Raw)
				}
			}
		}
	})

	t.Run("one owner when three regions race", func(t *testing.T) {
		ctx := t.Context()
		routers := m.routerAPIs()
		const goroutines = 45 // 15 per router
		var keys []string
		for _, r := range regions {
			keys = append(keys, m.keysIn(ns, r, "race", 3)...)
		}
		for _, key := range keys {
			var acquired, inProgress atomic.Int32
			var wg sync.WaitGroup
			errs := make(chan string, goroutines)
			startGate := make(chan struct{})
			for g := 0; g < goroutines; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-startGate
					r, err := routers[g%3].Reserve(ctx, ns, key, reserveBody(fmt.Sprintf("racer-%03d-abcdefghij", g), "fp"))
					if err != nil || r.Status != 200 {
						errs <- fmt.Sprintf("reserve: %v %v", r, err)
						return
					}
					switch r.Str("outcome") {
					case "ACQUIRED":
						acquired.Add(1)
					case "IN_PROGRESS":
						inProgress.Add(1)
					default:
						errs <- "unexpected " + r.String()
					}
				}()
			}
			close(startGate)
			wg.Wait()
			close(errs)
			for e := range errs {
				t.Fatal(e)
			}
			if acquired.Load() != 1 || inProgress.Load() != goroutines-1 {
				t.Fatalf("key %s (home %s): %d ACQUIRED, %d IN_PROGRESS; want exactly 1 and %d",
					key, m.home(ns, key), acquired.Load(), inProgress.Load(), goroutines-1)
			}
		}
	})

	var acked ackLog
	t.Run("routers restarted mid-workload lose nothing", func(t *testing.T) {
		stop := m.runWorkload(t, ns, m.routerAPIs(), 6, &acked)
		testutil.Until(t, 30*time.Second, "completions before the restarts", func() bool { return acked.n.Load() >= 60 })
		for i, rt := range m.routers {
			if i == 0 {
				rt.Kill() // a crash
			} else {
				begin := time.Now()
				if err := rt.Stop(15 * time.Second); err != nil {
					t.Fatalf("%s on SIGTERM: %v; want exit 0 within 15s", rt.Name, err)
				}
				t.Logf("%s drained and exited 0 in %s", rt.Name, time.Since(begin).Round(time.Millisecond))
			}
			before := acked.n.Load()
			if err := rt.Start(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			err := rt.WaitReady(ctx)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			testutil.Until(t, 30*time.Second, "completions after restarting "+rt.Name, func() bool { return acked.n.Load() >= before+20 })
		}
		stop()
		all := acked.all()
		t.Logf("%d acknowledged completions to verify", len(all))
		verifyCompleted(t, ns, m.routerAPIs(), all)
	})

	t.Run("one node per region killed", func(t *testing.T) {
		leaders := m.leaders()
		var victims []string
		for _, r := range regions {
			count := map[string]int{}
			for shard, id := range leaders {
				if home, _, _ := topology.ParseShardID(shard); home == r {
					count[id]++
				}
			}
			victim := m.c.NodesIn(r)[0]
			for id, n := range count {
				if n > count[victim] {
					victim = id
				}
			}
			victims = append(victims, victim)
		}
		var killAcked ackLog
		apis := append(m.routerAPIs(), m.nodeAPIs()...)
		stop := m.runWorkload(t, ns, apis, 6, &killAcked)
		testutil.Until(t, 30*time.Second, "completions before the kills", func() bool { return killAcked.n.Load() >= 60 })
		t.Logf("killing %v (leaders: %v)", victims, leaders)
		for _, id := range victims {
			m.c.Nodes[id].Kill()
		}
		before := killAcked.n.Load()
		// Every shard takes writes again after its election.
		ctx := t.Context()
		live := append(m.routerAPIs(), m.nodeAPIs()...)
		for _, r := range regions {
			for i, key := range m.keysIn(ns, r, "after-kill", 6) {
				owner := fmt.Sprintf("after-kill-owner-%02d-xyz", i)
				res, err := retrying(ctx, live, i, 30*time.Second, func(a *cluster.API) (cluster.Reply, error) {
					return a.Reserve(ctx, ns, key, reserveBody(owner, "fp"))
				})
				if err != nil || res.Str("outcome") != "ACQUIRED" {
					t.Fatalf("reserve of %s (home %s) after the kills: %s %v", key, r, res, err)
				}
				res, err = retrying(ctx, live, i+1, 30*time.Second, func(a *cluster.API) (cluster.Reply, error) {
					return a.Complete(ctx, ns, key, completeBody(owner, "after "+key))
				})
				if err != nil || res.Status != 200 {
					t.Fatalf("complete of %s after the kills: %s %v", key, res, err)
				}
			}
		}
		testutil.Until(t, 30*time.Second, "workload completions after the kills", func() bool { return killAcked.n.Load() >= before+60 })
		stop()
		all := killAcked.all()
		t.Logf("%d acknowledged completions across the kills", len(all))
		verifyCompleted(t, ns, m.routerAPIs(), all)
		acked.mu.Lock()
		acked.keys = append(acked.keys, all...)
		acked.mu.Unlock()
		for _, id := range victims {
			if err := m.c.Nodes[id].Start(); err != nil {
				t.Fatal(err)
			}
		}
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := m.c.WaitReady(rctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("whole region lost and returned", func(t *testing.T) {
		ctx := t.Context()
		lost := regions[2]
		everything := append(append([]completedKey(nil), completed...), acked.all()...)
		var lostKeys, liveKeys []completedKey
		for _, k := range everything {
			if m.home(ns, k.key) == lost {
				lostKeys = append(lostKeys, k)
			} else {
				liveKeys = append(liveKeys, k)
			}
		}
		if len(lostKeys) == 0 || len(liveKeys) == 0 {
			t.Fatalf("%d keys homed in %s and %d elsewhere; the test needs both", len(lostKeys), lost, len(liveKeys))
		}
		t.Logf("killing region %s: %d of %d completed keys are homed there", lost, len(lostKeys), len(everything))
		m.c.KillRegion(lost)
		began := time.Now()
		others := m.routerAPIs()[:2]
		for i, k := range lostKeys {
			if i >= 40 && testing.Short() {
				break
			}
			api := others[i%2]
			r, err := api.Reserve(ctx, ns, k.key, reserveBody("intruder-owner-000001", "fp"))
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != http.StatusServiceUnavailable || r.ErrCode() != "UNAVAILABLE" || r.Header.Get("Retry-After") == "" {
				t.Fatalf("reserve of completed key %s of the lost region via %s: %s (Retry-After %q); want 503 UNAVAILABLE with Retry-After",
					k.key, api.Base, r, r.Header.Get("Retry-After"))
			}
			g := check(t, http.StatusServiceUnavailable)(api.Get(ctx, ns, k.key))
			if g.Header.Get("Retry-After") == "" {
				t.Fatalf("get of %s of the lost region: no Retry-After", k.key)
			}
		}
		t.Logf("%s: lost keys answered 503", time.Since(began))
		// The other keys keep working, through every router (the lost
		// region's own router too) and new keys can be written.
		verifyCompleted(t, ns, m.routerAPIs(), liveKeys)
		for i, r := range regions[:2] {
			for j, key := range m.keysIn(ns, r, "during-loss", 3) {
				api := m.routerAPIs()[(i+j)%3]
				owner := fmt.Sprintf("during-loss-owner-%d%d-abc", i, j)
				if res := check(t, 200)(api.Reserve(ctx, ns, key, reserveBody(owner, "fp"))); res.Str("outcome") != "ACQUIRED" {
					t.Fatalf("new key %s during the loss: %s", key, res)
				}
				check(t, 200)(api.Complete(ctx, ns, key, completeBody(owner, "x")))
			}
		}
		for _, rt := range m.routers {
			check(t, 200)(cluster.NewAPI(rt.HTTPAddr).Do(ctx, http.MethodGet, "/readyz", nil))
		}
		t.Logf("%s: live keys checked", time.Since(began))
		// The region returns: every completed key replays, through every router.
		if err := m.c.StartRegion(lost); err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := m.c.WaitReady(rctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: region ready again", time.Since(began))
		routers := m.routerAPIs()
		for i := range routers {
			api := routers[i : i+1]
			_, err := retrying(ctx, api, 0, 30*time.Second, func(a *cluster.API) (cluster.Reply, error) {
				return a.Get(ctx, ns, lostKeys[0].key)
			})
			if err != nil {
				t.Fatalf("%s does not reach the returned region: %v", m.routers[i].Name, err)
			}
		}
		t.Logf("%s: routers reach the region", time.Since(began))
		verifyCompleted(t, ns, routers, everything)
		for i, k := range lostKeys {
			r := check(t, 200)(routers[i%3].Reserve(ctx, ns, k.key, reserveBody("late-owner-after-return", k.fingerprint)))
			if r.Str("outcome") != "COMPLETED" || r.Str("fencing_token") != k.fencing {
				t.Fatalf("reserve of %s after the region returned: %s", k.key, r)
			}
		}
	})
}

// TestMultiRegionRegionSurvival: with survival region (three replicas over
// three regions), losing a whole region keeps every key available after the
// election, and reservations made before the loss are still held: others
// get IN_PROGRESS, their owners' retries get the same reservation back.
func TestMultiRegionRegionSurvival(t *testing.T) {
	m := startMultiRegion(t, "region")
	const ns = "orders"
	ctx := t.Context()
	routers := m.routerAPIs()
	type held struct {
		key, owner, fencing, lease string
	}
	var inflight []held
	var completed []completedKey
	replays := map[string][]byte{}
	perRegion := 6
	if testing.Short() {
		perRegion = 3
	}
	for ri, r := range regions {
		for i, key := range m.keysIn(ns, r, "rs", 2*perRegion) {
			owner := fmt.Sprintf("owner-%d-%03d-abcdefgh", ri, i)
			api := routers[(ri+i)%3]
			res := check(t, 200)(api.Reserve(ctx, ns, key, reserveBody(owner, "fp")))
			if res.Str("outcome") != "ACQUIRED" {
				t.Fatalf("reserve %s: %s", key, res)
			}
			if i%2 == 0 {
				inflight = append(inflight, held{key, owner, res.Str("fencing_token"), res.Str("lease_expires_at")})
				continue
			}
			check(t, 200)(routers[(ri+i+1)%3].Complete(ctx, ns, key, completeBody(owner, "body "+key)))
			completed = append(completed, completedKey{key: key, body: "body " + key, fencing: res.Str("fencing_token")})
			replays[key] = check(t, 200)(api.Reserve(ctx, ns, key, reserveBody("replay-owner-000001", "fp"))).Raw
		}
	}

	lost := regions[0]
	t.Logf("killing region %s", lost)
	m.c.KillRegion(lost)
	survivors := routers[1:]
	// Every key is available again after the elections; nothing answers
	// anything but the state from before the loss.
	for i, h := range inflight {
		r, err := retrying(ctx, survivors, i, 30*time.Second, func(a *cluster.API) (cluster.Reply, error) {
			return a.Reserve(ctx, ns, h.key, reserveBody("another-owner-000001", "fp"))
		})
		if err != nil || r.Str("outcome") != "IN_PROGRESS" || r.Str("lease_expires_at") != h.lease {
			t.Fatalf("in-flight %s (home %s) after losing %s: %s %v; want IN_PROGRESS with lease %s", h.key, m.home(ns, h.key), lost, r, err, h.lease)
		}
		// The owner's retry is the same reservation.
		r = check(t, 200)(survivors[(i+1)%2].Reserve(ctx, ns, h.key, reserveBody(h.owner, "fp")))
		if r.Str("outcome") != "ACQUIRED" || r.Str("fencing_token") != h.fencing {
			t.Fatalf("owner's retry of %s after the loss: %s; want ACQUIRED with fencing token %s", h.key, r, h.fencing)
		}
		check(t, 200)(survivors[i%2].Complete(ctx, ns, h.key, completeBody(h.owner, "body "+h.key)))
		completed = append(completed, completedKey{key: h.key, body: "body " + h.key, fencing: h.fencing})
	}
	for i, k := range completed {
		if _, ok := replays[k.key]; !ok {
			continue
		}
		r, err := retrying(ctx, survivors, i, 30*time.Second, func(a *cluster.API) (cluster.Reply, error) {
			return a.Reserve(ctx, ns, k.key, reserveBody("replay-owner-000001", "fp"))
		})
		if err != nil || !bytes.Equal(r.Raw, replays[k.key]) {
			t.Fatalf("replay of %s after losing %s: %s %v; want the same bytes as before:\n%s", k.key, lost, r, err, replays[k.key])
		}
	}
	// New keys homed in the lost region are writable.
	for i, key := range m.keysIn(ns, lost, "new-after-loss", 4) {
		owner := fmt.Sprintf("new-owner-%02d-abcdefgh", i)
		r, err := retrying(ctx, survivors, i, 30*time.Second, func(a *cluster.API) (cluster.Reply, error) {
			return a.Reserve(ctx, ns, key, reserveBody(owner, "fp"))
		})
		if err != nil || r.Str("outcome") != "ACQUIRED" {
			t.Fatalf("new key %s homed in the lost region: %s %v", key, r, err)
		}
		check(t, 200)(survivors[i%2].Complete(ctx, ns, key, completeBody(owner, "body "+key)))
		completed = append(completed, completedKey{key: key, body: "body " + key, fencing: r.Str("fencing_token")})
	}

	// The region returns and catches up: everything replays everywhere.
	if err := m.c.StartRegion(lost); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := m.c.WaitReady(rctx); err != nil {
		t.Fatal(err)
	}
	verifyCompleted(t, ns, routers, completed)
	verifyCompleted(t, ns, m.nodeAPIs(), completed)
}
