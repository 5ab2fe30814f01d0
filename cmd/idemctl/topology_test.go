package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/topology"
)

// load runs writers that reserve and complete fresh keys through the given
// nodes until stop, retrying a 503 with the same owner token, and records
// every acknowledged completion with its fencing token. Any answer other
// than 200 or 503 is a failure.
type load struct {
	mu       sync.Mutex
	acked    map[string]ackedKey
	ok, u503 atomic.Int64
	failures []string
	stop     chan struct{}
	wg       sync.WaitGroup
}

type ackedKey struct {
	body  string
	token string
}

func startLoad(ctx context.Context, addrs []string, writers int) *load {
	l := &load{acked: map[string]ackedKey{}, stop: make(chan struct{})}
	for w := range writers {
		api := cluster.NewAPI(addrs[w%len(addrs)])
		l.wg.Go(func() {
			for i := 0; i < 1_000_000; i++ {
				select {
				case <-l.stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d", w, i)
				owner := fmt.Sprintf("owner-token-%04d-%06d", w, i)
				body := bodyOf(key)
				var token string
				if !l.call(ctx, func() (cluster.Reply, error) {
					r, err := api.Reserve(ctx, "payments", key, map[string]any{"owner_token": owner})
					if err == nil && r.Status == 200 {
						if r.Str("outcome") != "ACQUIRED" {
							return r, fmt.Errorf("reserve of a fresh key %s: %s", key, r)
						}
						token = r.Str("fencing_token")
					}
					return r, err
				}) {
					return
				}
				if !l.call(ctx, func() (cluster.Reply, error) {
					return api.Complete(ctx, "payments", key, map[string]any{"owner_token": owner,
						"response": map[string]any{"status": 200, "body": body}})
				}) {
					return
				}
				l.mu.Lock()
				l.acked[key] = ackedKey{body: body, token: token}
				l.mu.Unlock()
			}
		})
	}
	return l
}

// call retries f on 503 (and on a transport error: the node may be the
// one being stopped) for up to 30 s.
func (l *load) call(ctx context.Context, f func() (cluster.Reply, error)) bool {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		r, err := f()
		switch {
		case err == nil && r.Status == 200:
			l.ok.Add(1)
			return true
		case err == nil && r.Status == 503:
			l.u503.Add(1)
		case err != nil && ctx.Err() != nil:
			return false
		case err == nil:
			l.mu.Lock()
			l.failures = append(l.failures, r.String())
			l.mu.Unlock()
			return false
		default:
			if strings.Contains(err.Error(), "reserve of a fresh key") {
				l.mu.Lock()
				l.failures = append(l.failures, err.Error())
				l.mu.Unlock()
				return false
			}
			l.u503.Add(1)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
	l.mu.Lock()
	l.failures = append(l.failures, "a call was not answered 200 within 30 s")
	l.mu.Unlock()
	return false
}

// replays checks that every acknowledged completion of l replays through
// api, with its body and fencing token, to another owner's reserve: it
// must answer COMPLETED, never acquire. A 503 (a leader moving on a loaded
// box) is retried, as the contract tells a client to, for up to a minute
// per key. The keys (thousands after a run under load) are checked by
// replayWorkers at once, as many clients would ask; the first wrong answer
// stops the check and fails the test with it.
func (l *load) replays(t *testing.T, ctx context.Context, api *cluster.API, when string) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	keys := make(chan string)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		failure error
	)
	for range replayWorkers {
		wg.Go(func() {
			for key := range keys {
				if err := l.replay(ctx, api, key, when); err != nil {
					mu.Lock()
					if failure == nil {
						failure = err
					}
					mu.Unlock()
					cancel()
				}
			}
		})
	}
	start, checked := time.Now(), 0
	for key := range l.acked {
		if ctx.Err() != nil {
			break
		}
		keys <- key
		checked++
	}
	close(keys)
	wg.Wait()
	if failure != nil {
		t.Fatal(failure)
	}
	if checked != len(l.acked) {
		t.Fatalf("replays %s: %d of %d acknowledged completions checked: %v", when, checked, len(l.acked), ctx.Err())
	}
	t.Logf("%d acknowledged completions replayed through %s %s in %v", checked, api.Base, when, time.Since(start).Round(time.Millisecond))
}

// replayWorkers is how many keys replays checks at once.
const replayWorkers = 8

// replay checks one acknowledged completion (see replays).
func (l *load) replay(ctx context.Context, api *cluster.API, key, when string) error {
	a := l.acked[key]
	kctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	r, err := cluster.Decided(kctx, func() (cluster.Reply, error) {
		return api.Reserve(kctx, "payments", key, map[string]any{"owner_token": "another-owner-token-0001"})
	})
	if err != nil {
		return fmt.Errorf("replay of %s %s: %w", key, when, err)
	}
	resp, _ := r.Body["response"].(map[string]any)
	if r.Status != 200 || r.Str("outcome") != "COMPLETED" || resp["body"] != a.body || r.Str("fencing_token") != a.token {
		return fmt.Errorf("acknowledged completion of %s (token %s) %s: %s", key, a.token, when, r)
	}
	return nil
}

func (l *load) count() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.acked) }

func (l *load) finish() { close(l.stop); l.wg.Wait() }

// writesStall is how long await lets the writers go without an
// acknowledged completion before it fails: on a loaded box writes through
// a change are slow, and only writes that stopped are a failure.
const writesStall = time.Minute

// await waits until l acknowledged n completions, and fails the test once
// none was acknowledged for writesStall.
func (l *load) await(t *testing.T, n int, what string) {
	t.Helper()
	seen, since := l.count(), time.Now()
	for {
		got := l.count()
		if got >= n {
			return
		}
		if got != seen {
			seen, since = got, time.Now()
		} else if time.Since(since) > writesStall {
			t.Fatalf("waiting for %s: %d of %d completions acknowledged, none for %s", what, got, n, writesStall)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("waiting for %s: %d of %d completions acknowledged when the test ended", what, got, n)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// mustCtlWithin is mustCtl for apply, which follows a change until it is
// done and prints a line at each step: it fails once the command printed
// nothing new for d (a change that is stuck), not at a fixed total, since
// on a loaded box a change takes as long as its steps take.
func mustCtlWithin(t *testing.T, d time.Duration, args ...string) string {
	t.Helper()
	out, err := ctlUntilStalled(t.Context(), d, args...)
	if err != nil {
		t.Fatalf("%v; so far:\n%s", err, out)
	}
	return out
}

// nextVersion writes t at version v to dir/topology-vN.yaml.
func nextVersion(t *testing.T, topo *topology.Topology, v int, dir string) string {
	t.Helper()
	topo.Version = v
	path := filepath.Join(dir, "topology-v"+strconv.Itoa(v)+".yaml")
	if err := launch.WriteTopology(topo, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// metaLeader finds the node that leads the meta group.
func metaLeader(t *testing.T, c *cluster.Cluster, topo *topology.Topology) string {
	t.Helper()
	var leader string
	testutil.Until(t, 20*time.Second, "a meta group leader", func() bool {
		for _, n := range topo.Nodes() {
			if p := c.Nodes[n.ID]; p == nil || !p.Running() {
				continue
			}
			conn, err := (&env{}).dial(n.GRPCAddr)
			if err != nil {
				continue
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			st, err := idemv1.NewTopologyClient(conn).ShardState(ctx, &idemv1.ShardStateRequest{Shard: "meta"})
			cancel()
			conn.Close()
			if err == nil && st.GetLeader() {
				leader = n.ID
				return true
			}
		}
		return false
	})
	return leader
}

// A loaded three-node region grows to four nodes and shrinks back to three
// (a different three), online: the apply is interrupted by killing the
// meta group's leader and resumed by running it again; the load sees no
// answer but 200 and 503, every acknowledged completion replays, and the
// new node serves its seats.
func TestTopologyGrowAndShrinkUnderLoad(t *testing.T) {
	topo, err := launch.Topology(launch.Spec{Cluster: "elastic", NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Cleanup(func() {
		if t.Failed() {
			exec.Command("cp", "-r", dir, "/tmp/el-debug").Run()
		}
	})
	c, err := cluster.NewNodes(topo, dir, binaries.Path(t, "idemnode"), "--raft-trailing-logs", "64", "--raft-snapshot-interval", "1s")
	if err != nil {
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
	v1 := c.TopologyPath

	// The load goes through r1-2 and r1-3, which stay throughout.
	l := startLoad(ctx, []string{c.HTTPAddr("r1-2"), c.HTTPAddr("r1-3")}, 8)
	l.await(t, 100, "writes before the change")

	// Version 2: r1-4 joins. It starts with the new file before the apply
	// and waits to be added (not ready until then).
	ports, err := launch.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	grown := topo.Clone()
	grown.Regions[0].Nodes = append(grown.Regions[0].Nodes, topology.Node{ID: "r1-4", Region: "r1",
		RaftAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), GRPCAddr: fmt.Sprintf("127.0.0.1:%d", ports[1]), HTTPAddr: fmt.Sprintf("127.0.0.1:%d", ports[2])})
	v2 := nextVersion(t, grown, 2, dir)
	c.Nodes["r1-4"] = &launch.Process{Name: "r1-4", Bin: binaries.Path(t, "idemnode"), Log: filepath.Join(dir, "r1-4.log"),
		Args: []string{"--config", v2, "--id", "r1-4", "--data-dir", filepath.Join(dir, "data", "r1-4"), "--log-level", "debug", "--raft-trailing-logs", "64", "--raft-snapshot-interval", "1s"}}
	if err := c.Nodes["r1-4"].Start(); err != nil {
		t.Fatal(err)
	}

	plan := mustCtl(t, "--config", v1, "topology", "plan", v2)
	t.Logf("plan:\n%s", plan)
	if !strings.Contains(plan, "joining: r1-4") || !strings.Contains(plan, "version 1 -> 2") {
		t.Fatalf("plan does not show the joining node:\n%s", plan)
	}
	if out, err := ctl(t, "--config", v1, "topology", "plan", v1); err == nil {
		t.Fatalf("plan of the active version succeeded:\n%s", out)
	}

	// Apply without waiting, interrupt by killing the meta leader, restart
	// it, and resume with the same apply.
	start := time.Now()
	mustCtl(t, "--config", v1, "--timeout", "30s", "topology", "apply", v2, "--no-wait")
	if out, err := ctl(t, "--config", v1, "--timeout", "30s", "topology", "apply", nextVersion(t, topo.Clone(), 2, t.TempDir()), "--no-wait"); err == nil ||
		!(strings.Contains(err.Error(), "FAILED_PRECONDITION") && strings.Contains(err.Error(), "version 2") ||
			// the first change may already be done: refused as stale, by
			// idemctl's own plan against the active version or by the node
			// (INVALID_ARGUMENT) if it finished in between
			strings.Contains(err.Error(), "the active version is 2: a change must say version: 3")) {
		t.Fatalf("a second, different change while one runs: %v\n%s", err, out)
	}
	leader := metaLeader(t, c, topo)
	time.Sleep(500 * time.Millisecond) // let it take a step or two
	t.Logf("killing the meta leader %s mid-change", leader)
	if err := c.Nodes[leader].Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Nodes[leader].Start(); err != nil {
		t.Fatal(err)
	}
	out := mustCtlWithin(t, 90*time.Second, "--config", v1, "--timeout", "10s", "topology", "apply", v2)
	grow := time.Since(start)
	t.Logf("apply v2 (resumed) after %v:\n%s", grow, out)
	if err := launch.WaitHTTP(ctx, "http://"+grown.Regions[0].Nodes[3].HTTPAddr+"/readyz"); err != nil {
		t.Fatal(err)
	}
	st := mustCtl(t, "--config", v2, "topology", "status")
	if !strings.Contains(st, "active version: 2") || !strings.Contains(st, "no change running") {
		t.Fatalf("status after the change:\n%s", st)
	}
	// r1-4 votes in the shards placement gives it.
	c.Topology = grown
	for _, s := range grown.Shards() {
		if !s.HasVoter("r1-4") {
			continue
		}
		mustCtl(t, "--config", v2, "--timeout", "15s", "transfer-leader", s.ID, "r1-4")
	}
	n := l.count()
	l.await(t, n+100, "writes after growing")

	// Version 3: r1-1 leaves (it may lead shards and the meta group).
	shrunk := grown.Clone()
	shrunk.Regions[0].Nodes = slices.DeleteFunc(shrunk.Regions[0].Nodes, func(nd topology.Node) bool { return nd.ID == "r1-1" })
	v3 := nextVersion(t, shrunk, 3, dir)
	start = time.Now()
	out = mustCtlWithin(t, 90*time.Second, "--config", v2, "--timeout", "10s", "topology", "apply", v3)
	shrink := time.Since(start)
	t.Logf("apply v3 took %v:\n%s", shrink, out)
	if !strings.Contains(out, "may be stopped: r1-1") {
		t.Fatalf("apply does not say the removed node may be stopped:\n%s", out)
	}
	if err := c.Nodes["r1-1"].Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	n = l.count()
	l.await(t, n+100, "writes after shrinking")
	l.finish()
	if len(l.failures) > 0 {
		t.Fatalf("%d calls failed with an answer other than 200 or 503, first: %s", len(l.failures), l.failures[0])
	}

	// Every acknowledged completion replays, through the new node, with
	// its fencing token; a new reserve of the key replays, never acquires.
	api := cluster.NewAPI(grown.Regions[0].Nodes[3].HTTPAddr)
	l.replays(t, t.Context(), api, "after the changes")
	var doc topologyDoc
	if err := json.Unmarshal([]byte(mustCtl(t, "--config", v3, "--json", "topology", "status")), &doc); err != nil || doc.ActiveVersion != 3 {
		t.Fatalf("status --json: %+v %v", doc, err)
	}

	// A node restarted on the version-1 file follows the cluster's
	// version 3 and serves.
	p := c.Nodes["r1-2"]
	if err := p.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if err := launch.WaitHTTP(ctx, "http://"+c.HTTPAddr("r1-2")+"/readyz"); err != nil {
		t.Fatal(err)
	}
	testutil.Until(t, 20*time.Second, "r1-2 following version 3", func() bool {
		data, _ := os.ReadFile(p.Log)
		return regexp.MustCompile(`following the cluster's topology version.* file_version=1 active_version=3`).Match(data)
	})
	if r, err := cluster.NewAPI(c.HTTPAddr("r1-2")).Get(t.Context(), "payments", "w0-0"); err != nil || r.Status != 200 {
		t.Fatalf("read through the node on the old file: %v %v", r, err)
	}
	total := l.ok.Load() + l.u503.Load()
	t.Logf("grow 3->4 nodes took %v, shrink 4->3 took %v; %d acknowledged completions all replay; %d calls answered 200, %d answered 503 (retried): availability %.2f%%",
		grow.Round(time.Millisecond), shrink.Round(time.Millisecond), len(l.acked), l.ok.Load(), l.u503.Load(), 100*float64(l.ok.Load())/float64(total))
}

// A five-node region behind a router started with the first file: replicas
// go 3 -> 5 -> 3, then a node dies for good and is replaced by a new one
// (--dead). The router follows every version without a restart and
// answers every request with 200 or 503 only; every acknowledged
// completion replays through it.
func TestTopologyReplicasAndDeadNodeThroughRouter(t *testing.T) {
	c, rt, dir, ctx := routedCluster(t, launch.Spec{Cluster: "elastic5", NodesPerRegion: 5, ShardsPerRegion: 2, Replicas: 3}, "el-debug2", 4*time.Minute, nil)
	topo := c.Topology
	// A namespace policy set before the changes holds after them, on every
	// shard, whichever voters lead then.
	mustCtl(t, "--config", c.TopologyPath, "namespaces", "set-policy", "capped", "--max-lease-ms", "5000")
	ring, err := topology.NewRing(topo)
	if err != nil {
		t.Fatal(err)
	}
	cappedKeys := map[string]string{} // shard -> a key of it
	for i := 0; len(cappedKeys) < 2 && i < 200; i++ {
		key := fmt.Sprintf("capped-%d", i)
		if id := ring.Locate("capped", key).ID; cappedKeys[id] == "" {
			cappedKeys[id] = key
		}
	}
	l := startLoad(ctx, []string{rt.HTTPAddr}, 8)
	l.await(t, 100, "writes before the changes")

	active := c.TopologyPath
	step := func(next *topology.Topology, v int, extra ...string) {
		t.Helper()
		path := nextVersion(t, next, v, dir)
		start := time.Now()
		out := mustCtlWithin(t, 2*time.Minute, append([]string{"--config", active, "--timeout", "10s", "topology", "apply", path}, extra...)...)
		t.Logf("apply v%d took %v:\n%s", v, time.Since(start).Round(time.Millisecond), out)
		active = path
		n := l.count()
		testutil.Until(t, 30*time.Second, fmt.Sprintf("writes through the router after v%d", v), func() bool { return l.count() >= n+50 })
	}
	five := topo.Clone()
	five.Replicas = 5
	step(five, 2)
	three := five.Clone()
	three.Replicas = 3
	step(three, 3)

	// r1-5 dies for good; r1-6 replaces it under a new id.
	if err := c.Nodes["r1-5"].Kill(); err != nil {
		t.Fatal(err)
	}
	ports, err := launch.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	replaced := three.Clone()
	nodes := slices.DeleteFunc(replaced.Regions[0].Nodes, func(nd topology.Node) bool { return nd.ID == "r1-5" })
	replaced.Regions[0].Nodes = append(nodes, topology.Node{ID: "r1-6", Region: "r1",
		RaftAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), GRPCAddr: fmt.Sprintf("127.0.0.1:%d", ports[1]), HTTPAddr: fmt.Sprintf("127.0.0.1:%d", ports[2])})
	replaced.Version = 4
	v4 := nextVersion(t, replaced, 4, dir)
	c.Nodes["r1-6"] = &launch.Process{Name: "r1-6", Bin: binaries.Path(t, "idemnode"), Log: filepath.Join(dir, "r1-6.log"),
		Args: []string{"--config", v4, "--id", "r1-6", "--data-dir", filepath.Join(dir, "data", "r1-6"), "--log-level", "debug"}}
	if err := c.Nodes["r1-6"].Start(); err != nil {
		t.Fatal(err)
	}
	step(replaced, 4, "--dead", "r1-5")
	if err := launch.WaitHTTP(ctx, "http://"+replaced.Regions[0].Nodes[4].HTTPAddr+"/readyz"); err != nil {
		t.Fatal(err)
	}
	l.finish()
	if len(l.failures) > 0 {
		t.Fatalf("%d calls through the router failed with an answer other than 200 or 503, first: %s", len(l.failures), l.failures[0])
	}
	// The router learnt every version without a restart.
	testutil.Until(t, 20*time.Second, "the router following version 4", func() bool {
		data, _ := os.ReadFile(rt.Log)
		return regexp.MustCompile(`msg="following the cluster's topology".* active_version=4 target_version=0`).Match(data)
	})
	api := rt.API()
	if p := decode[policyView](t, mustCtl(t, "--config", active, "namespaces", "get-policy", "capped", "--json")); p.MaxLeaseMs != 5000 {
		t.Fatalf("policy after the changes: %+v", p)
	}
	if len(cappedKeys) != 2 {
		t.Fatalf("capped keys fell on %d shards", len(cappedKeys))
	}
	for shard, key := range cappedKeys {
		r, err := api.Reserve(t.Context(), "capped", key, map[string]any{"lease_ms": 6000})
		if err != nil || r.Status != 400 || !strings.Contains(string(r.Raw), "max_lease_ms 5000") {
			t.Fatalf("reserve over the policy's max on shard %s after the changes: %v %v", shard, r, err)
		}
	}
	l.replays(t, t.Context(), api, "after the changes")
	total := l.ok.Load() + l.u503.Load()
	t.Logf("replicas 3->5->3 and a dead node replaced through a router on the first file: %d acknowledged completions replay; %d calls 200, %d 503 (retried): availability %.2f%%",
		len(l.acked), l.ok.Load(), l.u503.Load(), 100*float64(l.ok.Load())/float64(total))
}

// Three one-node regions with one copy of each shard (replicas 1, survival
// zone) become replicas 3 with survival region: every shard gains a voter
// in each other region, online, under load. Afterwards any one region can
// die and every key stays writable.
func TestTopologySurvivalZoneToRegion(t *testing.T) {
	c, dir, ctx := startNodes(t, launch.Spec{Cluster: "survive", Regions: []string{"r1", "r2", "r3"}, NodesPerRegion: 1, ShardsPerRegion: 1, Replicas: 1}, "", 3*time.Minute, nil)
	topo := c.Topology
	l := startLoad(ctx, []string{c.HTTPAddr("r1-1"), c.HTTPAddr("r2-1")}, 6)
	l.await(t, 100, "writes before the change")

	region := topo.Clone()
	region.Replicas, region.Survival = 3, topology.SurvivalRegion
	path := nextVersion(t, region, 2, dir)
	out := mustCtlWithin(t, 2*time.Minute, "--config", c.TopologyPath, "--timeout", "10s", "topology", "apply", path)
	t.Logf("apply:\n%s", out)
	n := l.count()
	l.await(t, n+50, "writes after the change")
	l.finish()
	if len(l.failures) > 0 {
		t.Fatalf("%d calls failed with an answer other than 200 or 503, first: %s", len(l.failures), l.failures[0])
	}

	// Region r3 dies: every shard (r3's own included) keeps a majority.
	if err := c.Nodes["r3-1"].Kill(); err != nil {
		t.Fatal(err)
	}
	api := cluster.NewAPI(c.HTTPAddr("r1-1"))
	var err error
	for key, a := range l.acked {
		var r cluster.Reply
		ok := retry(ctx, func() bool {
			r, err = api.Reserve(ctx, "payments", key, map[string]any{"owner_token": "another-owner-token-0001"})
			return err == nil && r.Status == 200
		})
		resp, _ := r.Body["response"].(map[string]any)
		if !ok || r.Str("outcome") != "COMPLETED" || resp["body"] != a.body || r.Str("fencing_token") != a.token {
			t.Fatalf("acknowledged completion of %s with region r3 down: %s (%v)", key, r, err)
		}
	}
	for i := range 30 { // keys of every shard, r3's included
		key := fmt.Sprintf("after-%d", i)
		var r cluster.Reply
		if !retry(ctx, func() bool {
			r, err = api.Reserve(ctx, "payments", key, map[string]any{})
			return err == nil && r.Status == 200
		}) || r.Str("outcome") != "ACQUIRED" {
			t.Fatalf("reserve of %s with region r3 down: %s (%v)", key, r, err)
		}
	}
	t.Logf("zone -> region survival online: %d acknowledged completions replay with a region down; 30 new keys of every shard reserved", len(l.acked))
}

// routedCluster starts spec's nodes (startNodes) and a router for region
// r1 started with the same (first) file, and waits until all are ready.
func routedCluster(t *testing.T, spec launch.Spec, debug string, timeout time.Duration, args map[string][]string) (c *cluster.Cluster, rt *cluster.Router, dir string, ctx context.Context) {
	t.Helper()
	c, dir, ctx = startNodes(t, spec, debug, timeout, args)
	var err error
	if rt, err = c.NewRouter(binaries.Path(t, "idemrouter"), "router", "r1"); err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(); err != nil {
		t.Fatal(err)
	}
	if err := rt.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c, rt, dir, ctx
}

// startNodes starts spec's nodes in a temporary dir (copied to /tmp/<debug>
// when the test fails; no copy with debug ""), each with the flags args
// gives its id besides the usual ones, and waits until they are ready. ctx
// bounds the test (timeout).
func startNodes(t *testing.T, spec launch.Spec, debug string, timeout time.Duration, args map[string][]string) (c *cluster.Cluster, dir string, ctx context.Context) {
	t.Helper()
	topo, err := launch.Topology(spec)
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	if debug != "" {
		t.Cleanup(func() {
			if t.Failed() {
				exec.Command("cp", "-r", dir, "/tmp/"+debug).Run()
			}
		})
	}
	if c, err = cluster.NewNodes(topo, dir, binaries.Path(t, "idemnode")); err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	for id, extra := range args {
		c.Nodes[id].Args = append(c.Nodes[id].Args, extra...)
		if slices.ContainsFunc(extra, func(a string) bool { return strings.HasPrefix(a, "--testing-") }) {
			c.Nodes[id].Env = append(c.Nodes[id].Env, launch.FaultInjectionEnv)
		}
	}
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c, dir, ctx
}
