package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
)

// Waiting reserves starve no one: 1,100 reserves of one IN_PROGRESS key
// with a 20 s wait go through a router to the key's leader. The router
// carries the waits on a connection of their own (1,024 streams wait, the
// rest queue for a stream there), so reserves of other keys meanwhile are
// answered as usual. Before, the waits filled the router's one connection
// to the leader and the other reserves waited for a stream until the waits
// ended. (--max-waiters, the node's own bound, is TestMaxWaiters in
// cmd/idemnode.)
func TestWaitingReservesStarveNoOne(t *testing.T) {
	topo, err := launch.Topology(launch.Spec{Cluster: "waiters", NodesPerRegion: 1, ShardsPerRegion: 1, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.NewRouter(binaries.Path(t, "idemrouter"), "edge", "r1")
	if err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	// The router's gRPC server takes 1,024 streams per connection: the
	// waiters come over two.
	var clients []idemv1.IdempotencyClient
	for range 3 {
		conn, err := grpc.NewClient(r.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		clients = append(clients, idemv1.NewIdempotencyClient(conn))
	}
	owner := "owner-token-waiters-0001"
	if res, err := clients[2].Reserve(ctx, &idemv1.ReserveRequest{Namespace: "pay", Key: "hot", OwnerToken: owner, LeaseMs: 60000}); err != nil || res.GetOutcome() != idemv1.Outcome_ACQUIRED {
		t.Fatalf("reserve hot: %v %v", res, err)
	}

	const waiters = 1100
	var wg sync.WaitGroup
	var completed, inProgress, failed atomic.Int64
	for i := range waiters {
		wg.Go(func() {
			res, err := clients[i%2].Reserve(ctx, &idemv1.ReserveRequest{Namespace: "pay", Key: "hot", WaitMs: 20000}, grpc.WaitForReady(true))
			switch {
			case err != nil:
				failed.Add(1)
				t.Logf("waiter %d: %v", i, err)
			case res.GetOutcome() == idemv1.Outcome_COMPLETED:
				completed.Add(1)
			case res.GetOutcome() == idemv1.Outcome_IN_PROGRESS:
				inProgress.Add(1)
			}
		})
	}
	node := topo.Nodes()[0]
	testutil.Until(t, 30*time.Second, "1,024 reserves waiting on the node (a connection's streams)", func() bool {
		w, err := cluster.MetricSum(ctx, node.HTTPAddr, "idem_keys_waiting_reserves")
		return err == nil && w >= 1024
	})

	// Other keys, meanwhile: each answered within 5 s (they took until the
	// waits ended, 20 s, when the waits shared their connection).
	for i := range 50 {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := clients[2].Reserve(cctx, &idemv1.ReserveRequest{Namespace: "pay", Key: fmt.Sprintf("other-%d", i)})
		ccancel()
		if err != nil || res.GetOutcome() != idemv1.Outcome_ACQUIRED {
			t.Fatalf("reserve of another key while 1,100 waited: %v %v", res, err)
		}
	}

	if _, err := clients[2].Complete(ctx, &idemv1.CompleteRequest{Namespace: "pay", Key: "hot", OwnerToken: owner,
		Response: &idemv1.StoredResponse{Status: 200, Body: []byte("paid")}}); err != nil {
		t.Fatalf("complete hot: %v", err)
	}
	wg.Wait()
	if completed.Load() != waiters || failed.Load() != 0 {
		t.Fatalf("waiters: %d COMPLETED, %d IN_PROGRESS, %d failed; want all %d COMPLETED", completed.Load(), inProgress.Load(), failed.Load(), waiters)
	}
}
