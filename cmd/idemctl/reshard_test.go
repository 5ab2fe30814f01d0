package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/topology"
)

// heldKey is a key reserved before a change and still IN_PROGRESS when its
// partition moves: its owner must keep it (nobody else acquires it), and
// heartbeat and complete it at its new shard.
type heldKey struct {
	key, owner, token string
}

// changeTestBudget bounds a whole test that applies two topology changes
// under load (its context; each phase has its own, shorter bound). It must
// exceed the sum of what its phases take on a loaded box: under go test
// -race on two cores at load ~17, one reshard's two applies took 2m2s and
// 1m22s, and the acknowledged completions' replays after them ~30 s.
const changeTestBudget = 8 * time.Minute

// A loaded three-node region goes from 2 to 4 shards per region and back to
// 2, online: partitions move between Raft groups (new groups created,
// removed groups emptied) while 8 writers run, the apply is interrupted by
// killing the meta leader and resumed, and a router started with the first
// file serves throughout. Every acknowledged completion replays with its
// token, keys held IN_PROGRESS across the moves stay with their owners,
// and a key reclaimed after a move gets a larger fencing token.
func TestTopologyReshardUnderLoad(t *testing.T) {
	// Every node fails the first drops it sends as the change's driver, as
	// if the source's leader were lost right after a batch moved: the
	// change must drop those copies before it activates.
	failDrops := map[string][]string{}
	for _, id := range []string{"r1-1", "r1-2", "r1-3"} {
		failDrops[id] = []string{"--testing-fail-drops", "3"}
	}
	c, rt, dir, ctx := routedCluster(t, launch.Spec{Cluster: "reshard", NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3}, "reshard-debug", changeTestBudget, failDrops)
	topo := c.Topology.Clone()
	v1 := c.TopologyPath
	node := cluster.NewAPI(c.HTTPAddr("r1-2"))
	router := cluster.NewAPI(rt.HTTPAddr)

	// Keys held in progress across the moves (long lease), and one with a
	// short lease that is reclaimed after the first move.
	var held []heldKey
	for i := range 40 {
		k := heldKey{key: fmt.Sprintf("held-%d", i), owner: fmt.Sprintf("holder-token-%06d", i)}
		r := check(t, 200)(cluster.Decided(ctx, func() (cluster.Reply, error) {
			return node.Reserve(ctx, "payments", k.key, map[string]any{"owner_token": k.owner, "lease_ms": 600000})
		}))
		k.token = r.Str("fencing_token")
		held = append(held, k)
	}
	short := check(t, 200)(cluster.Decided(ctx, func() (cluster.Reply, error) {
		return node.Reserve(ctx, "payments", "short-lease", map[string]any{"owner_token": "short-owner-token-1", "lease_ms": 1000})
	}))

	// A Go client that keeps the first version's routing throughout (it
	// routes to the leaders of the shards it knows; the nodes take each
	// call to the key's current shard).
	var grpcAddrs []string
	for _, nd := range topo.Nodes() {
		grpcAddrs = append(grpcAddrs, nd.GRPCAddr)
	}
	cl, err := client.New(client.Config{Endpoints: grpcAddrs, RoutingRefresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	runs := map[string]int{}
	once := func(stage string, from, to int, wantRan bool) {
		t.Helper()
		for i := from; i < to; i++ {
			id := fmt.Sprintf("event-%d", i)
			ran, err := cl.Once(ctx, "events", id, func(context.Context, uint64) error { runs[id]++; return nil })
			if err != nil || ran != wantRan || runs[id] != 1 {
				t.Fatalf("%s: Once(%s) ran=%v (want %v), %d runs, %v", stage, id, ran, wantRan, runs[id], err)
			}
		}
	}
	once("before the change", 0, 50, true)

	l := startLoad(ctx, []string{c.HTTPAddr("r1-1"), rt.HTTPAddr}, 8)
	l.await(t, 200, "writes before the change")

	// Version 2: four shards per region.
	grown := topo.Clone()
	grown.ShardsPerRegion = 4
	v2 := nextVersion(t, grown, 2, dir)
	plan := mustCtl(t, "--config", v1, "topology", "plan", v2)
	t.Logf("plan:\n%s", plan)
	if !strings.Contains(plan, "shards created: r1-2, r1-3") || !regexp.MustCompile(`keys changing home shard: [3-6][0-9]\.[0-9]%`).MatchString(plan) {
		t.Fatalf("plan does not show the new shards and about half the keys moving:\n%s", plan)
	}
	start := time.Now()
	mustCtl(t, "--config", v1, "--timeout", "30s", "topology", "apply", v2, "--no-wait")
	leader := metaLeader(t, c, topo)
	testutil.Until(t, 60*time.Second, "the first partitions moved", func() bool {
		data, _ := os.ReadFile(c.Nodes[leader].Log)
		return strings.Contains(string(data), "partitions moved")
	})
	t.Logf("killing the meta leader %s mid-move", leader)
	if err := c.Nodes[leader].Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Nodes[leader].Start(); err != nil {
		t.Fatal(err)
	}
	out := mustCtlWithin(t, 3*time.Minute, "--config", v1, "--timeout", "10s", "topology", "apply", v2)
	grow := time.Since(start)
	t.Logf("apply v2 (resumed) after %v:\n%s", grow, out)
	n := l.count()
	l.await(t, n+100, "writes after growing")

	checkHeld := func(stage string) {
		t.Helper()
		for _, k := range held {
			r, err := router.Reserve(ctx, "payments", k.key, map[string]any{"owner_token": "intruder-token-0001"})
			if err != nil || r.Status != 200 || r.Str("outcome") != "IN_PROGRESS" {
				t.Fatalf("%s: %s held by its owner, another reserve answered %v %v", stage, k.key, r, err)
			}
			r = check(t, 200)(cluster.Decided(ctx, func() (cluster.Reply, error) {
				return node.Heartbeat(ctx, "payments", k.key, map[string]any{"owner_token": k.owner, "lease_ms": 600000})
			}))
			if r.Str("fencing_token") != "" && r.Str("fencing_token") != k.token {
				t.Fatalf("%s: heartbeat of %s changed its token: %s", stage, k.key, r)
			}
		}
	}
	checkHeld("after growing")
	listedOnce(t, v2, "payments", "after growing")
	once("after growing: events run before", 0, 50, false)
	once("after growing: new events", 50, 100, true)
	// The short lease ran out: a reclaim after the move gets a token above
	// every token the key had.
	rec := check(t, 200)(router.Reserve(ctx, "payments", "short-lease", map[string]any{"owner_token": "second-owner-token-1"}))
	before, _ := strconv.ParseUint(short.Str("fencing_token"), 10, 64)
	after, _ := strconv.ParseUint(rec.Str("fencing_token"), 10, 64)
	if rec.Str("outcome") != "RECLAIMED" || after <= before || rec.Str("previous_fencing_token") != short.Str("fencing_token") {
		t.Fatalf("reclaim after the move: %s (first token %d)", rec, before)
	}

	// Version 3: back to two shards per region (r1-2 and r1-3 removed).
	v3 := nextVersion(t, topo.Clone(), 3, dir)
	start = time.Now()
	out = mustCtlWithin(t, 3*time.Minute, "--config", v2, "--timeout", "10s", "topology", "apply", v3)
	shrink := time.Since(start)
	t.Logf("apply v3 took %v:\n%s", shrink, out)
	n = l.count()
	l.await(t, n+100, "writes after shrinking")
	l.finish()
	if len(l.failures) > 0 {
		t.Fatalf("%d calls failed with an answer other than 200 or 503, first: %s", len(l.failures), l.failures[0])
	}
	checkHeld("after shrinking")
	listedOnce(t, v3, "payments", "after shrinking")
	once("after shrinking", 0, 100, false)
	for _, k := range held {
		check(t, 200)(cluster.Decided(ctx, func() (cluster.Reply, error) {
			return node.Complete(ctx, "payments", k.key, map[string]any{"owner_token": k.owner, "response": map[string]any{"status": 201, "body": ""}})
		}))
		if r := check(t, 200)(cluster.Decided(ctx, func() (cluster.Reply, error) { return router.Reserve(ctx, "payments", k.key, map[string]any{}) })); r.Str("outcome") != "COMPLETED" || r.Str("fencing_token") != k.token {
			t.Fatalf("%s completed by its owner after two moves: %s (token %s)", k.key, r, k.token)
		}
	}

	// Every acknowledged completion replays with its token, through the
	// router (started with version 1) and through a node.
	for _, api := range []*cluster.API{router, node} {
		l.replays(t, ctx, api, "after the changes")
	}
	hs := handoffStats(t, c)
	total := l.ok.Load() + l.u503.Load()
	t.Logf("2 -> 4 shards took %v, 4 -> 2 took %v; %s; %d acknowledged completions and %d held keys kept; %d calls answered 200, %d answered 503 (retried): availability %.2f%%",
		grow.Round(time.Millisecond), shrink.Round(time.Millisecond), hs, len(l.acked), len(held), l.ok.Load(), l.u503.Load(), 100*float64(l.ok.Load())/float64(total))
}

// listedOnce lists every key of ns and fails the test if one is listed
// twice: after a change activated, no source keeps a copy of a key it
// handed off.
func listedOnce(t *testing.T, topoPath, ns, stage string) {
	t.Helper()
	v := decode[listView](t, mustCtl(t, "--config", topoPath, "--timeout", "30s", "keys", "list", ns, "--limit", "1000000", "--json"))
	seen := map[string]int{}
	var twice []string
	for _, k := range v.Keys {
		if seen[k.Key]++; seen[k.Key] == 2 {
			twice = append(twice, k.Key)
		}
	}
	if len(v.Keys) == 0 || len(twice) > 0 {
		t.Fatalf("%s: %d keys listed, %d of them more than once (a source kept its copy), first %q", stage, len(v.Keys), len(twice), twice[:min(len(twice), 5)])
	}
	t.Logf("%s: %d keys listed, each once", stage, len(v.Keys))
}

// handoffStats sums what the nodes' logs say of the partition batches they
// moved: records, bytes, and how long each batch paused its keys.
func handoffStats(t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	var records, bytes int
	var pauses []time.Duration
	re := regexp.MustCompile(`partitions moved.* records=(\d+) bytes=(\d+) paused=(\S+)`)
	for _, p := range c.Nodes {
		data, _ := os.ReadFile(p.Log)
		for _, m := range re.FindAllStringSubmatch(string(data), -1) {
			r, _ := strconv.Atoi(m[1])
			b, _ := strconv.Atoi(m[2])
			d, _ := time.ParseDuration(m[3])
			records, bytes = records+r, bytes+b
			pauses = append(pauses, d)
		}
	}
	if records == 0 || len(pauses) == 0 {
		t.Fatal("no node logged a record moved")
	}
	slices.Sort(pauses)
	return fmt.Sprintf("%d batches moved %d records (%d bytes); pause per batch p50 %v, p99 %v, max %v", len(pauses), records, bytes,
		pauses[len(pauses)/2].Round(time.Microsecond), pauses[len(pauses)*99/100].Round(time.Microsecond), pauses[len(pauses)-1].Round(time.Microsecond))
}

// check fails the test unless a call answered with status want.
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

// A two-region cluster gains a third region under load (its nodes start
// with the new file, a node of the cluster is killed mid-move and
// restarted), then loses it again: the third region's keys are re-homed to
// the other two before its nodes may stop. A router started with the first
// file serves throughout; every acknowledged completion replays.
func TestTopologyAddAndRemoveRegion(t *testing.T) {
	c, rt, dir, ctx := routedCluster(t, launch.Spec{Cluster: "regions", Regions: []string{"r1", "r2"}, NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3}, "region-debug", changeTestBudget+time.Minute, nil)
	topo := c.Topology.Clone()
	v1 := c.TopologyPath
	l := startLoad(ctx, []string{c.HTTPAddr("r2-1"), rt.HTTPAddr}, 8)
	l.await(t, 200, "writes before the change")

	// Version 2: region r3 with three nodes, which start with the new file.
	ports, err := launch.FreePorts(9)
	if err != nil {
		t.Fatal(err)
	}
	three := topo.Clone()
	r3 := topology.Region{Name: "r3"}
	for i := range 3 {
		r3.Nodes = append(r3.Nodes, topology.Node{ID: fmt.Sprintf("r3-%d", i+1), Region: "r3", RaftAddr: fmt.Sprintf("127.0.0.1:%d", ports[3*i]),
			GRPCAddr: fmt.Sprintf("127.0.0.1:%d", ports[3*i+1]), HTTPAddr: fmt.Sprintf("127.0.0.1:%d", ports[3*i+2])})
	}
	three.Regions = append(three.Regions, r3)
	v2 := nextVersion(t, three, 2, dir)
	for _, nd := range r3.Nodes {
		c.Nodes[nd.ID] = &launch.Process{Name: nd.ID, Bin: binaries.Path(t, "idemnode"), Log: filepath.Join(dir, nd.ID+".log"),
			Args: []string{"--config", v2, "--id", nd.ID, "--data-dir", filepath.Join(dir, "data", nd.ID), "--log-level", "debug"}}
		if err := c.Nodes[nd.ID].Start(); err != nil {
			t.Fatal(err)
		}
	}
	plan := mustCtl(t, "--config", v1, "topology", "plan", v2)
	t.Logf("plan:\n%s", plan)
	if !strings.Contains(plan, "shards created: r3-0, r3-1") || !strings.Contains(plan, "joining: r3-1, r3-2, r3-3") {
		t.Fatalf("plan does not show the new region:\n%s", plan)
	}
	start := time.Now()
	mustCtl(t, "--config", v1, "--timeout", "30s", "topology", "apply", v2, "--no-wait")
	leader := metaLeader(t, c, topo)
	victim := "r1-1"
	if leader == victim {
		victim = "r1-2"
	}
	testutil.Until(t, 90*time.Second, "the first partitions moved", func() bool {
		data, _ := os.ReadFile(c.Nodes[leader].Log)
		return strings.Contains(string(data), "partitions moved")
	})
	t.Logf("killing %s (a voter of the source shards) mid-move", victim)
	if err := c.Nodes[victim].Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Nodes[victim].Start(); err != nil {
		t.Fatal(err)
	}
	out := mustCtlWithin(t, 3*time.Minute, "--config", v1, "--timeout", "10s", "topology", "apply", v2)
	add := time.Since(start)
	t.Logf("apply v2 took %v:\n%s", add, out)
	for _, nd := range r3.Nodes {
		if err := launch.WaitHTTP(ctx, "http://"+nd.HTTPAddr+"/readyz"); err != nil {
			t.Fatal(err)
		}
	}
	n := l.count()
	l.await(t, n+100, "writes after adding a region")
	// The new region serves keys it is now home to.
	via3 := cluster.NewAPI(r3.Nodes[0].HTTPAddr)
	r := check(t, 200)(cluster.Decided(ctx, func() (cluster.Reply, error) {
		return via3.Reserve(ctx, "payments", "after-the-move", map[string]any{"owner_token": "late-owner-token-01"})
	}))
	if r.Str("outcome") != "ACQUIRED" {
		t.Fatalf("a fresh key through the new region: %s", r)
	}

	// Version 3: r3 goes again; its keys are re-homed to r1 and r2.
	v3 := nextVersion(t, topo.Clone(), 3, dir)
	start = time.Now()
	out = mustCtlWithin(t, 3*time.Minute, "--config", v2, "--timeout", "10s", "topology", "apply", v3)
	remove := time.Since(start)
	t.Logf("apply v3 took %v:\n%s", remove, out)
	if !strings.Contains(out, "may be stopped: r3-1, r3-2, r3-3") {
		t.Fatalf("apply does not say the removed region's nodes may stop:\n%s", out)
	}
	for _, nd := range r3.Nodes {
		if err := c.Nodes[nd.ID].Stop(20 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	n = l.count()
	l.await(t, n+100, "writes after removing the region")
	l.finish()
	if len(l.failures) > 0 {
		t.Fatalf("%d calls failed with an answer other than 200 or 503, first: %s", len(l.failures), l.failures[0])
	}
	router := cluster.NewAPI(rt.HTTPAddr)
	l.replays(t, ctx, router, "after the changes")
	if r := check(t, 200)(cluster.Decided(ctx, func() (cluster.Reply, error) {
		return router.Reserve(ctx, "payments", "after-the-move", map[string]any{"owner_token": "late-owner-token-01"})
	})); r.Str("outcome") != "ACQUIRED" {
		t.Fatalf("the key reserved in the removed region, by its owner, after the region left: %s", r)
	}
	hs := handoffStats(t, c)
	total := l.ok.Load() + l.u503.Load()
	t.Logf("adding a region took %v, removing it %v; %s; %d acknowledged completions all replay; %d calls answered 200, %d answered 503 (retried): availability %.2f%%",
		add.Round(time.Millisecond), remove.Round(time.Millisecond), hs, len(l.acked), l.ok.Load(), l.u503.Load(), 100*float64(l.ok.Load())/float64(total))
}

// A change that creates shards completes while the preferred leader of a
// created shard is down: every target voter of a created shard bootstraps
// it with the same voters, so the two that are up elect a leader and take
// their partitions. The keys written before keep their records, new keys
// land on every shard of the new version, and the node that was down
// catches up when it comes back.
func TestCreatedShardStartsWithoutItsPreferredLeader(t *testing.T) {
	c, dir, ctx := startNodes(t, launch.Spec{Cluster: "created", NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3}, "created-debug", changeTestBudget, nil)
	topo := c.Topology.Clone()
	v1 := c.TopologyPath
	grown := topo.Clone()
	grown.ShardsPerRegion = 4
	v2 := nextVersion(t, grown, 2, dir)
	created, ok := grown.ShardByID("r1-2")
	if _, existed := topo.ShardByID("r1-2"); !ok || existed {
		t.Fatalf("shard r1-2: in version 2 %v, in version 1 %v; want a shard the change creates", ok, existed)
	}
	down := created.Voters[0]
	var up string
	for _, nd := range topo.Nodes() {
		if nd.ID != down {
			up = nd.ID
			break
		}
	}
	node := cluster.NewAPI(c.HTTPAddr(up))

	// Partitions move only at cluster version 3, which needs every node's
	// word: reach it before the node goes down.
	testutil.Until(t, 90*time.Second, "cluster version 3", func() bool {
		return decode[clusterView](t, mustCtl(t, "--config", v1, "status", "--json")).ClusterVersion >= 3
	})
	keys := make([]string, 60)
	for i := range keys {
		keys[i] = fmt.Sprintf("before-%d", i)
		r := check(t, 200)(cluster.Decided(ctx, func() (cluster.Reply, error) {
			return node.Reserve(ctx, "payments", keys[i], map[string]any{"owner_token": fmt.Sprintf("owner-token-%08d", i)})
		}))
		if r.Str("outcome") != "ACQUIRED" {
			t.Fatalf("reserve %s: %s", keys[i], r)
		}
		check(t, 200)(cluster.Decided(ctx, func() (cluster.Reply, error) {
			return node.Complete(ctx, "payments", keys[i], map[string]any{"owner_token": fmt.Sprintf("owner-token-%08d", i), "response": map[string]any{"status": 201, "body": bodyOf(keys[i])}})
		}))
	}

	t.Logf("stopping %s, the preferred leader of the shard %s the change creates (voters %v)", down, created.ID, created.Voters)
	if err := c.Nodes[down].Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	mustCtl(t, "--config", v1, "--timeout", "30s", "topology", "apply", v2, "--no-wait")
	var status string
	testutil.Until(t, 4*time.Minute, "version 2 active with "+down+" down", func() bool {
		status = mustCtl(t, "--config", v1, "--timeout", "10s", "topology", "status")
		return strings.Contains(status, "active version: 2") && strings.Contains(status, "no change running")
	})
	t.Logf("topology status with %s down:\n%s", down, status)

	// Every record written before the change replays its response, and new
	// keys are decided on every shard of version 2, with the node down.
	replayAll := func(api *cluster.API, stage string) {
		t.Helper()
		for _, k := range keys {
			r := check(t, 200)(cluster.Decided(ctx, func() (cluster.Reply, error) { return api.Reserve(ctx, "payments", k, map[string]any{}) }))
			resp, _ := r.Body["response"].(map[string]any)
			if r.Str("outcome") != "COMPLETED" || resp == nil || resp["body"] != bodyOf(k) {
				t.Fatalf("%s: %s does not replay its response: %s", stage, k, r)
			}
		}
	}
	replayAll(node, "with "+down+" down")
	ring, err := topology.NewRing(grown)
	if err != nil {
		t.Fatal(err)
	}
	onShard := map[string]int{}
	for i := 0; len(onShard) < 4 && i < 2000; i++ {
		k := fmt.Sprintf("after-%d", i)
		s := ring.Locate("payments", k).ID
		if onShard[s] > 0 {
			continue
		}
		r := check(t, 200)(cluster.Decided(ctx, func() (cluster.Reply, error) { return node.Reserve(ctx, "payments", k, map[string]any{}) }))
		if r.Str("outcome") != "ACQUIRED" {
			t.Fatalf("new key %s on shard %s: %s", k, s, r)
		}
		onShard[s]++
	}
	if len(onShard) != 4 {
		t.Fatalf("new keys reached shards %v, want all four of version 2", onShard)
	}

	// The node comes back and serves the new version's records.
	if err := c.Nodes[down].Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	replayAll(cluster.NewAPI(c.HTTPAddr(down)), down+" back")
}

// bodyOf is the response body (base64, as the API takes it) the tests
// complete key with.
func bodyOf(key string) string { return base64.StdEncoding.EncodeToString([]byte("paid " + key)) }
