package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/testutil"
)

// heldKey is a key reserved before a change and still IN_PROGRESS when its
// partition moves: its owner must keep it (nobody else acquires it), and
// heartbeat and complete it at its new shard.
type heldKey struct {
	key, owner, token string
}

// A loaded three-node region goes from 2 to 4 shards per region and back to
// 2, online: partitions move between Raft groups (new groups created,
// removed groups emptied) while 8 writers run, the apply is interrupted by
// killing the meta leader and resumed, and a router started with the first
// file serves throughout. Every acknowledged completion replays with its
// token, keys held IN_PROGRESS across the moves stay with their owners,
// and a key reclaimed after a move gets a larger fencing token.
func TestTopologyReshardUnderLoad(t *testing.T) {
	topo, err := cluster.Topology(cluster.Spec{Cluster: "reshard", NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Cleanup(func() {
		if t.Failed() {
			exec.Command("cp", "-r", dir, "/tmp/reshard-debug").Run()
		}
	})
	c, err := cluster.NewNodes(topo, dir, binaries["idemnode"])
	if err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	rt, err := c.NewRouter(binaries["idemrouter"], "router", "r1")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(); err != nil {
		t.Fatal(err)
	}
	if err := rt.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	v1 := c.TopologyPath
	node := cluster.NewAPI(c.HTTPAddr("r1-2"))
	router := cluster.NewAPI(rt.HTTPAddr)

	// Keys held in progress across the moves (long lease), and one with a
	// short lease that is reclaimed after the first move.
	var held []heldKey
	for i := range 40 {
		k := heldKey{key: fmt.Sprintf("held-%d", i), owner: fmt.Sprintf("holder-token-%06d", i)}
		r := check(t, 200)(node.Reserve(ctx, "payments", k.key, map[string]any{"owner_token": k.owner, "lease_ms": 600000}))
		k.token = r.Str("fencing_token")
		held = append(held, k)
	}
	short := check(t, 200)(node.Reserve(ctx, "payments", "short-lease", map[string]any{"owner_token": "short-owner-token-1", "lease_ms": 1000}))

	l := startLoad(ctx, []string{c.HTTPAddr("r1-1"), rt.HTTPAddr}, 8)
	testutil.Until(t, 30*time.Second, "writes before the change", func() bool { return l.count() >= 200 })

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
	mustCtl(t, "--config", v1, "topology", "apply", v2, "--no-wait")
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
	testutil.Until(t, 30*time.Second, "writes after growing", func() bool { return l.count() >= n+100 })

	checkHeld := func(stage string) {
		t.Helper()
		for _, k := range held {
			r, err := router.Reserve(ctx, "payments", k.key, map[string]any{"owner_token": "intruder-token-0001"})
			if err != nil || r.Status != 200 || r.Str("outcome") != "IN_PROGRESS" {
				t.Fatalf("%s: %s held by its owner, another reserve answered %v %v", stage, k.key, r, err)
			}
			r = check(t, 200)(node.Heartbeat(ctx, "payments", k.key, map[string]any{"owner_token": k.owner, "lease_ms": 600000}))
			if r.Str("fencing_token") != "" && r.Str("fencing_token") != k.token {
				t.Fatalf("%s: heartbeat of %s changed its token: %s", stage, k.key, r)
			}
		}
	}
	checkHeld("after growing")
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
	testutil.Until(t, 30*time.Second, "writes after shrinking", func() bool { return l.count() >= n+100 })
	l.finish()
	if len(l.failures) > 0 {
		t.Fatalf("%d calls failed with an answer other than 200 or 503, first: %s", len(l.failures), l.failures[0])
	}
	checkHeld("after shrinking")
	for _, k := range held {
		check(t, 200)(node.Complete(ctx, "payments", k.key, map[string]any{"owner_token": k.owner, "response": map[string]any{"status": 201, "body": ""}}))
		if r := check(t, 200)(router.Reserve(ctx, "payments", k.key, map[string]any{})); r.Str("outcome") != "COMPLETED" || r.Str("fencing_token") != k.token {
			t.Fatalf("%s completed by its owner after two moves: %s (token %s)", k.key, r, k.token)
		}
	}

	// Every acknowledged completion replays with its token, through the
	// router (started with version 1) and through a node.
	for _, api := range []*cluster.API{router, node} {
		for key, a := range l.acked {
			r, err := api.Reserve(ctx, "payments", key, map[string]any{"owner_token": "another-owner-token-0001"})
			if err != nil {
				t.Fatal(err)
			}
			resp, _ := r.Body["response"].(map[string]any)
			if r.Status != 200 || r.Str("outcome") != "COMPLETED" || resp["body"] != a.body || r.Str("fencing_token") != a.token {
				t.Fatalf("acknowledged completion of %s (token %s) after the changes: %s", key, a.token, r)
			}
		}
	}
	moved := 0
	for _, p := range c.Nodes {
		data, _ := os.ReadFile(p.Log)
		for _, m := range regexp.MustCompile(`partitions moved.* records=(\d+)`).FindAllStringSubmatch(string(data), -1) {
			r, _ := strconv.Atoi(m[1])
			moved += r
		}
	}
	if moved == 0 {
		t.Fatal("no node logged a record moved")
	}
	total := l.ok.Load() + l.u503.Load()
	t.Logf("2 -> 4 shards took %v, 4 -> 2 took %v; %d records moved; %d acknowledged completions and %d held keys kept; %d calls answered 200, %d answered 503 (retried): availability %.2f%%",
		grow.Round(time.Millisecond), shrink.Round(time.Millisecond), moved, len(l.acked), len(held), l.ok.Load(), l.u503.Load(), 100*float64(l.ok.Load())/float64(total))
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
