package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/topology"
)

// TestBatchCallsThroughRouter: batch calls with keys of every shard and one
// bad item, through an idemrouter in front of a three-node region: each
// item is answered as its single call through the router, the bad item
// alone failing (gRPC: a complete by a stranger, NOT_OWNER; JSON: a
// malformed key, INVALID_ARGUMENT).
func TestBatchCallsThroughRouter(t *testing.T) {
	topo, err := launch.Topology(launch.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := c.NewRouter(binaries.Path(t, "idemrouter"), "router-r1", "r1")
	if err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rt.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	ring, err := topology.NewRing(topo)
	if err != nil {
		t.Fatal(err)
	}
	const n, bad = 30, 4
	shards := map[string]bool{}
	reqs := make([]client.ReserveRequest, n)
	for i := range reqs {
		reqs[i] = client.ReserveRequest{Key: fmt.Sprintf("rb-%d", i)}
		shards[ring.Locate("orders", reqs[i].Key).ID] = true
	}
	if len(shards) < 2 {
		t.Fatalf("%d keys fell in %d shard(s); the test needs several", n, len(shards))
	}
	cfg := client.DefaultConfig(rt.GRPCAddr)
	cfg.RequestTimeout = 15 * time.Second
	cl, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })

	res := cl.ReserveMany(ctx, "orders", reqs)
	comps := make([]client.CompleteRequest, n)
	for i, r := range res {
		if r.Err != nil || r.Outcome != client.OutcomeAcquired {
			t.Fatalf("item %d: %+v", i, r)
		}
		comps[i] = client.CompleteRequest{Key: reqs[i].Key, OwnerToken: r.OwnerToken, Response: client.Response{Status: 200, Body: []byte(reqs[i].Key)}}
	}
	comps[bad].OwnerToken = "a-stranger-owner-token-1"
	for i, d := range cl.CompleteMany(ctx, "orders", comps) {
		switch {
		case i == bad:
			_, serr := cl.Complete(ctx, client.CompleteRequest{Namespace: "orders", Key: comps[i].Key, OwnerToken: comps[i].OwnerToken, Response: comps[i].Response})
			if !errors.Is(d.Err, client.ErrNotOwner) || !errors.Is(serr, client.ErrNotOwner) {
				t.Fatalf("complete by a stranger: batch %v, single %v; want ErrNotOwner from both", d.Err, serr)
			}
		case d.Err != nil:
			t.Fatalf("complete %d: %v", i, d.Err)
		}
	}
	again := cl.ReserveMany(ctx, "orders", reqs)
	for i, r := range again {
		single, err := cl.Reserve(ctx, client.ReserveRequest{Namespace: "orders", Key: reqs[i].Key})
		if r.Err != nil || err != nil || r.Outcome != single.Outcome {
			t.Fatalf("item %d: batch %+v, single %+v %v", i, r, single, err)
		}
		if i != bad && (r.Outcome != client.OutcomeCompleted || string(r.Response.Body) != reqs[i].Key) {
			t.Fatalf("item %d after complete: %+v", i, r)
		}
	}

	api := rt.API()
	body := map[string]any{"items": []map[string]any{{"key": "rb-0"}, {"key": "bad key"}, {"key": "rb-fresh"}}}
	r, err := api.Do(ctx, "POST", "/v1/namespaces/orders/keys:batch-reserve", body)
	if err != nil || r.Status != 200 {
		t.Fatalf("JSON batch through the router: %v %v", r, err)
	}
	results, _ := r.Body["results"].([]any)
	if len(results) != 3 {
		t.Fatalf("JSON batch: %s", r)
	}
	single := check(t, 400)(api.Reserve(ctx, "orders", "bad key", map[string]any{}))
	first, _ := results[0].(map[string]any)
	badRes, _ := results[1].(map[string]any)
	badErr, _ := badRes["error"].(map[string]any)
	fresh, _ := results[2].(map[string]any)
	if first["outcome"] != "COMPLETED" || badErr["code"] != single.ErrCode() || fresh["outcome"] != "ACQUIRED" {
		t.Fatalf("JSON batch through the router: %s; the single bad call answers %s", r, single)
	}
}
