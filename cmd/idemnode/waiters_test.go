package main

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/testutil"
)

// TestMaxWaiters: with --max-waiters 5, five reserves of an IN_PROGRESS key
// wait on the node and the others are answered at once (IN_PROGRESS, as with
// wait_ms 0, counted in idem_node_wait_refusals_total); once the key
// completes, the five that waited replay it.
func TestMaxWaiters(t *testing.T) {
	httpAddr, _ := startDev(t, nil, "--max-waiters", "5")
	api := cluster.NewAPI(httpAddr)
	ctx := t.Context()
	owner := "owner-token-maxwait-0001"
	if r, err := api.Reserve(ctx, "pay", "hot", map[string]any{"owner_token": owner, "lease_ms": 60000}); err != nil || r.Str("outcome") != "ACQUIRED" {
		t.Fatalf("reserve: %v %v", r, err)
	}
	const n = 8
	var completed, inProgress atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			r, err := api.Reserve(ctx, "pay", "hot", map[string]any{"wait_ms": 20000})
			switch {
			case err != nil || r.Status != 200:
				t.Errorf("waiting reserve: %v %v", r, err)
			case r.Str("outcome") == "COMPLETED":
				completed.Add(1)
			case r.Str("outcome") == "IN_PROGRESS":
				inProgress.Add(1)
			}
		})
	}
	testutil.Until(t, 15*time.Second, "five waiting and three answered at once", func() bool {
		w, err := cluster.MetricSum(ctx, httpAddr, "idem_keys_waiting_reserves")
		return err == nil && w == 5 && inProgress.Load() == n-5
	})
	if v, err := cluster.MetricSum(ctx, httpAddr, "idem_node_wait_refusals_total"); err != nil || v != n-5 {
		t.Fatalf("idem_node_wait_refusals_total %v (%v), want %d", v, err, n-5)
	}
	if r, err := api.Complete(ctx, "pay", "hot", map[string]any{"owner_token": owner, "response": map[string]any{"status": 200}}); err != nil || r.Status != 200 {
		t.Fatalf("complete: %v %v", r, err)
	}
	wg.Wait()
	if completed.Load() != 5 || inProgress.Load() != n-5 {
		t.Fatalf("%d COMPLETED, %d IN_PROGRESS; want 5 and %d", completed.Load(), inProgress.Load(), n-5)
	}
}
