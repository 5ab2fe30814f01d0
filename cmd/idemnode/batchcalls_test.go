package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/topology"
)

// TestBatchCallsAcrossShards: batch calls with keys of every shard and one
// bad item, sent to one node of a three-node region, which fans the items
// out to their shards' leaders: every item is answered as its single call
// (the same reservation again for the same owner token, the same error
// code for the bad item), and the bad item alone fails. Through gRPC
// (ReserveMany, CompleteMany) and JSON (keys:batch-reserve).
func TestBatchCallsAcrossShards(t *testing.T) {
	c := startCluster(t, launch.Spec{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	ring, err := topology.NewRing(c.Topology)
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	shards := map[string]bool{}
	reqs := make([]client.ReserveRequest, n)
	for i := range reqs {
		reqs[i] = client.ReserveRequest{Key: fmt.Sprintf("bx-%d", i), Fingerprint: "fp"}
		shards[ring.Locate("payments", reqs[i].Key).ID] = true
	}
	if len(shards) < 2 {
		t.Fatalf("%d keys fell in %d shard(s); the test needs several", n, len(shards))
	}

	// gRPC, to one endpoint only (no routing): the node fans out.
	node := c.Topology.Nodes()[0]
	cfg := client.DefaultConfig(node.GRPCAddr)
	cfg.DisableRouting = true
	cfg.RequestTimeout = 15 * time.Second
	cl, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	res := cl.ReserveMany(ctx, "payments", reqs)
	for i, r := range res {
		if r.Err != nil || r.Outcome != client.OutcomeAcquired {
			t.Fatalf("item %d (%s): %+v", i, reqs[i].Key, r)
		}
		single, err := cl.Reserve(ctx, client.ReserveRequest{Namespace: "payments", Key: reqs[i].Key, Fingerprint: "fp", OwnerToken: r.OwnerToken})
		if err != nil || single.Outcome != client.OutcomeAcquired || single.FencingToken != r.FencingToken {
			t.Fatalf("single reserve of item %d with its owner token: %+v %v, batch %+v", i, single, err, r)
		}
	}
	comps := make([]client.CompleteRequest, n)
	for i, r := range res {
		comps[i] = client.CompleteRequest{Key: reqs[i].Key, OwnerToken: r.OwnerToken, Response: client.Response{Status: 201, Body: []byte(reqs[i].Key)}}
	}
	const bad = 7
	comps[bad].OwnerToken = "somebody-else-entirely-01"
	done := cl.CompleteMany(ctx, "payments", comps)
	for i, d := range done {
		if i == bad {
			_, serr := cl.Complete(ctx, client.CompleteRequest{Namespace: "payments", Key: reqs[i].Key, OwnerToken: comps[i].OwnerToken, Response: comps[i].Response})
			if !errors.Is(d.Err, client.ErrNotOwner) || !errors.Is(serr, client.ErrNotOwner) {
				t.Fatalf("complete by a stranger: batch %v, single %v; want ErrNotOwner from both", d.Err, serr)
			}
			continue
		}
		if d.Err != nil || d.CompletedAt.IsZero() {
			t.Fatalf("complete %d: %+v", i, d)
		}
	}

	// JSON, to another node: replays, a fresh key, and one malformed item.
	api, err := c.API(c.HTTPAddr(c.Topology.Nodes()[1].ID), "")
	if err != nil {
		t.Fatal(err)
	}
	items := []map[string]any{}
	for i := range n {
		items = append(items, map[string]any{"key": reqs[i].Key, "fingerprint": "fp"})
	}
	items = append(items, map[string]any{"key": "bad key"}, map[string]any{"key": "bx-fresh"})
	r, err := api.Do(ctx, "POST", "/v1/namespaces/payments/keys:batch-reserve", map[string]any{"items": items})
	if err != nil || r.Status != 200 {
		t.Fatalf("JSON batch: %v %v", r, err)
	}
	results, _ := r.Body["results"].([]any)
	if len(results) != n+2 {
		t.Fatalf("JSON batch: %d results for %d items: %s", len(results), n+2, r)
	}
	for i := range n {
		m, _ := results[i].(map[string]any)
		want := "COMPLETED"
		if i == bad {
			want = "IN_PROGRESS"
		}
		if m["outcome"] != want {
			t.Fatalf("JSON item %d: %v, want %s", i, m, want)
		}
	}
	single := want(t, 400)(api.Reserve(ctx, "payments", "bad key", map[string]any{}))
	badRes, _ := results[n].(map[string]any)
	badErr, _ := badRes["error"].(map[string]any)
	if badErr["code"] != single.ErrCode() {
		t.Fatalf("bad item: %v; the single call answers %s", badRes, single)
	}
	if m, _ := results[n+1].(map[string]any); m["outcome"] != "ACQUIRED" {
		t.Fatalf("fresh key after the bad item: %v", m)
	}
}

// BenchmarkBatchVsSingle measures reserve+complete cycles per second
// (items/s) against three idemnode processes: single calls from 64
// concurrent callers (the client's routing and automatic batching on), and
// ReserveMany+CompleteMany of 100 items from 4 concurrent callers.
//
//	go test -run '^$' -bench BatchVsSingle -benchtime 5000x ./cmd/idemnode/
func BenchmarkBatchVsSingle(b *testing.B) {
	c := startCluster(b, launch.Spec{})
	var eps []string
	for _, n := range c.Topology.Nodes() {
		eps = append(eps, n.GRPCAddr)
	}
	cl, err := client.New(client.DefaultConfig(eps...))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cl.Close() })
	resp := client.Response{Status: 201, Body: make([]byte, 512)}
	var seq atomic.Int64
	run := func(b *testing.B, workers, per int, cycle func(ctx context.Context, keys []string) error) {
		ctx := b.Context()
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		b.ResetTimer()
		start := time.Now()
		for range workers {
			wg.Go(func() {
				for next.Add(int64(per)) <= int64(b.N) {
					keys := make([]string, per)
					for i := range keys {
						keys[i] = fmt.Sprintf("bench-%d", seq.Add(1))
					}
					if err := cycle(ctx, keys); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "items/s")
	}
	b.Run("single", func(b *testing.B) {
		run(b, 64, 1, func(ctx context.Context, keys []string) error {
			r, err := cl.Reserve(ctx, client.ReserveRequest{Namespace: "bench", Key: keys[0]})
			if err != nil || r.Outcome != client.OutcomeAcquired {
				return fmt.Errorf("reserve: %+v %v", r, err)
			}
			_, err = cl.Complete(ctx, client.CompleteRequest{Namespace: "bench", Key: keys[0], OwnerToken: r.OwnerToken, Response: resp})
			return err
		})
	})
	b.Run("batch100", func(b *testing.B) {
		run(b, 4, 100, func(ctx context.Context, keys []string) error {
			reqs := make([]client.ReserveRequest, len(keys))
			for i, k := range keys {
				reqs[i] = client.ReserveRequest{Key: k}
			}
			rs := cl.ReserveMany(ctx, "bench", reqs)
			comps := make([]client.CompleteRequest, len(keys))
			for i, r := range rs {
				if r.Err != nil || r.Outcome != client.OutcomeAcquired {
					return fmt.Errorf("batch reserve item %d: %+v", i, r)
				}
				comps[i] = client.CompleteRequest{Key: keys[i], OwnerToken: r.OwnerToken, Response: resp}
			}
			for i, d := range cl.CompleteMany(ctx, "bench", comps) {
				if d.Err != nil {
					return fmt.Errorf("batch complete item %d: %v", i, d.Err)
				}
			}
			return nil
		})
	})
}
