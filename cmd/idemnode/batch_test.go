package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
)

// TestClientBatchesAgainstNodes: 64 concurrent callers of one routing
// client against three idemnode processes: the client coalesces their calls
// into Batch RPCs, the nodes answer each operation (every reserve of a
// fresh key ACQUIRED, every complete accepted), and 16 concurrent reserves
// of one key, batched or not, make exactly one winner; after its complete
// all 16 replay the winner's response.
func TestClientBatchesAgainstNodes(t *testing.T) {
	c := startCluster(t, launch.Spec{})
	cl := routingClient(t, c, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	const callers, perCaller = 64, 20
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perCaller {
				k := fmt.Sprintf("batch-%d-%d", g, i)
				res, err := cl.Reserve(ctx, client.ReserveRequest{Namespace: "payments", Key: k, Fingerprint: "fp"})
				if err != nil || res.Outcome != client.OutcomeAcquired {
					errs <- fmt.Errorf("reserve %s: %+v, %v", k, res, err)
					return
				}
				if _, err := cl.Complete(ctx, client.CompleteRequest{Namespace: "payments", Key: k, OwnerToken: res.OwnerToken,
					Response: client.Response{Status: 201, Body: []byte(k)}}); err != nil {
					errs <- fmt.Errorf("complete %s: %v", k, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s := cl.Stats()
	t.Logf("%d cycles: %d Batch RPCs answered %d calls, %d fallbacks; %d attempts at leaders, %d at endpoints",
		callers*perCaller, s.BatchRPCs, s.BatchedCalls, s.BatchFallbacks, s.LeaderAttempts, s.EndpointAttempts)
	if s.BatchRPCs == 0 || s.BatchedCalls <= s.BatchRPCs {
		t.Fatalf("64 concurrent callers were never coalesced: %+v", s)
	}
	if s.BatchFallbacks != 0 {
		t.Fatalf("%d calls fell back to unary RPCs against nodes that serve Batch", s.BatchFallbacks)
	}
	// The nodes served the client's batches, and perhaps some of their
	// own: a call the client sent to an endpoint that does not lead its
	// shard is forwarded, possibly in a batch between nodes.
	if n := metricOf(t, c, nodeIDs(c), "idem_api_requests_total", `api="grpc"`, `endpoint="batch"`); n < float64(s.BatchRPCs) {
		t.Fatalf("the nodes served %v Batch RPCs, the client sent %d", n, s.BatchRPCs)
	}

	// Exactly one winner per key under 16 concurrent reserves.
	const contenders = 16
	for round := range 10 {
		key := fmt.Sprintf("contended-%d", round)
		results := make([]client.Reservation, contenders)
		rerrs := make([]error, contenders)
		var wg sync.WaitGroup
		for i := range contenders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], rerrs[i] = cl.Reserve(ctx, client.ReserveRequest{Namespace: "payments", Key: key, Fingerprint: "fp"})
			}()
		}
		wg.Wait()
		winner := -1
		for i, r := range results {
			if rerrs[i] != nil {
				t.Fatalf("%s: reserve %d: %v", key, i, rerrs[i])
			}
			switch r.Outcome {
			case client.OutcomeAcquired:
				if winner >= 0 {
					t.Fatalf("%s: two winners: %+v and %+v", key, results[winner], r)
				}
				winner = i
			case client.OutcomeInProgress:
			default:
				t.Fatalf("%s: reserve %d answered %v", key, i, r.Outcome)
			}
		}
		if winner < 0 {
			t.Fatalf("%s: no winner among %d reserves", key, contenders)
		}
		body := []byte("won by " + results[winner].OwnerToken)
		if _, err := cl.Complete(ctx, client.CompleteRequest{Namespace: "payments", Key: key, OwnerToken: results[winner].OwnerToken,
			Response: client.Response{Status: 200, Body: body}}); err != nil {
			t.Fatal(err)
		}
		for i := range contenders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], rerrs[i] = cl.Reserve(ctx, client.ReserveRequest{Namespace: "payments", Key: key, Fingerprint: "fp"})
			}()
		}
		wg.Wait()
		for i, r := range results {
			if rerrs[i] != nil || r.Outcome != client.OutcomeCompleted || string(r.Response.Body) != string(body) {
				t.Fatalf("%s: replay %d: %+v, %v", key, i, r, rerrs[i])
			}
		}
	}
}

// TestJSONForwardingBatches: JSON calls sent round-robin to the three
// nodes are forwarded (2/3 of them) to their shard's leader, and the
// forwarded calls that leave one node for one leader together share Batch
// RPCs; every cycle still succeeds, and 16 concurrent JSON reserves of one
// key through all three nodes make exactly one winner.
func TestJSONForwardingBatches(t *testing.T) {
	c := startCluster(t, launch.Spec{})
	ids := nodeIDs(c)
	apis := make([]*cluster.API, len(ids))
	for i, id := range ids {
		apis[i] = cluster.NewAPI(c.HTTPAddr(id))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	batches0 := metricOf(t, c, ids, "idem_api_requests_total", `api="grpc"`, `endpoint="batch"`)

	const callers, perCaller = 48, 10
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perCaller {
				k := fmt.Sprintf("json-%d-%d", g, i)
				owner := "owner-token-" + k
				r, err := cluster.Decided(ctx, func() (cluster.Reply, error) {
					return apis[(g+i)%3].Do(ctx, "POST", cluster.KeyPath("payments", k)+":reserve", map[string]any{"owner_token": owner})
				})
				if err != nil || r.Str("outcome") != "ACQUIRED" {
					errs <- fmt.Errorf("reserve %s: %v %v", k, r, err)
					return
				}
				r, err = cluster.Decided(ctx, func() (cluster.Reply, error) {
					return apis[(g+i+1)%3].Do(ctx, "POST", cluster.KeyPath("payments", k)+":complete",
						map[string]any{"owner_token": owner, "response": map[string]any{"status": 201}})
				})
				if err != nil || r.Status != 200 {
					errs <- fmt.Errorf("complete %s: %v %v", k, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	batches := metricOf(t, c, ids, "idem_api_requests_total", `api="grpc"`, `endpoint="batch"`) - batches0
	forwarded := forwards(t, c)
	t.Logf("%d JSON cycles: %v forwarded calls, %v Batch RPCs between the nodes", callers*perCaller, forwarded, batches)
	if batches == 0 {
		t.Fatalf("%v forwarded calls of 48 concurrent callers never shared a Batch RPC", forwarded)
	}

	for round := range 5 {
		key := fmt.Sprintf("json-contended-%d", round)
		outcomes := make([]string, 16)
		var wg sync.WaitGroup
		for i := range outcomes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				owner := fmt.Sprintf("owner-token-%s-%d", key, i)
				r, err := cluster.Decided(ctx, func() (cluster.Reply, error) {
					return apis[i%3].Do(ctx, "POST", cluster.KeyPath("payments", key)+":reserve", map[string]any{"owner_token": owner})
				})
				if err != nil {
					outcomes[i] = err.Error()
					return
				}
				outcomes[i] = r.Str("outcome")
			}()
		}
		wg.Wait()
		winners := 0
		for _, o := range outcomes {
			switch o {
			case "ACQUIRED":
				winners++
			case "IN_PROGRESS":
			default:
				t.Fatalf("%s: outcomes %v", key, outcomes)
			}
		}
		if winners != 1 {
			t.Fatalf("%s: %d winners among %v", key, winners, outcomes)
		}
	}
}
