package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/internal/cluster"
)

// TestClientBatchesAgainstNodes: 64 concurrent callers of one routing
// client against three idemnode processes: the client coalesces their calls
// into Batch RPCs, the nodes answer each operation (every reserve of a
// fresh key ACQUIRED, every complete accepted), and 16 concurrent reserves
// of one key, batched or not, make exactly one winner; after its complete
// all 16 replay the winner's response.
func TestClientBatchesAgainstNodes(t *testing.T) {
	c := startCluster(t, cluster.Spec{})
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
	if n := metricOf(t, c, nodeIDs(c), "idem_api_requests_total", `api="grpc"`, `endpoint="batch"`); n != float64(s.BatchRPCs) {
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
