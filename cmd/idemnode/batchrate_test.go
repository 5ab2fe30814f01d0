package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/launch"
)

// TestRateLimitedBatchesPayEveryItem performs, on a secure node, the batch
// flood of a principal limited to 5 requests per second: batch-reserve
// calls of 1000 invalid items. Before, the call was free and items were
// charged only once valid, so 200 such calls went through in 0.69 s
// without a 429 and the principal's bucket stayed full. Now each call is
// charged its 1000 items before any is parsed: every one is refused whole
// with 429 and Retry-After, a batch of 5 invalid items takes the whole
// bucket, and the next single call is refused too.
func TestRateLimitedBatchesPayEveryItem(t *testing.T) {
	c := startSecureCluster(t, launch.Spec{Cluster: "batchrate", Regions: []string{"east"}, NodesPerRegion: 1, ShardsPerRegion: 1, Replicas: 1},
		"principals:\n  - {name: limited, namespaces: [pay], role: writer, rate_per_s: 5}\n", "limited")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	api, err := c.API(c.Topology.Nodes()[0].HTTPAddr, "limited")
	if err != nil {
		t.Fatal(err)
	}
	invalid := func(n int) string {
		items := make([]string, n)
		for i := range items {
			items[i] = `{"key":"","lease_ms":-1}`
		}
		return `{"items":[` + strings.Join(items, ",") + `]}`
	}
	big := invalid(1000)
	start := time.Now()
	counts := map[int]int{}
	for range 200 {
		r, err := api.Do(ctx, "POST", "/v1/namespaces/pay/keys:batch-reserve", big)
		if err != nil {
			t.Fatal(err)
		}
		counts[r.Status]++
		if r.Status == http.StatusTooManyRequests && r.Header.Get("Retry-After") == "" {
			t.Fatalf("429 without Retry-After: %s", r)
		}
	}
	t.Logf("200 batch-reserve calls of 1000 invalid items: %v in %v (status: calls)", counts, time.Since(start).Round(time.Millisecond))
	if counts[http.StatusTooManyRequests] != 200 {
		t.Fatalf("batches of 1000 items over a rate of 5/s: %v, want 429 for all 200", counts)
	}

	// Wait until the bucket refilled (one second of the rate), then a
	// batch of 5 invalid items takes all of it.
	var status int
	deadline := time.Now().Add(10 * time.Second)
	for {
		rep, err := api.Do(ctx, "POST", "/v1/namespaces/pay/keys:batch-reserve", invalid(5))
		if err != nil {
			t.Fatal(err)
		}
		if status = rep.Status; status == http.StatusOK || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // the bucket refills at 5/s
	}
	if status != http.StatusOK {
		t.Fatalf("a batch of 5 after the bucket refilled: %d", status)
	}
	charged := time.Now()
	rep, err := api.Reserve(ctx, "pay", "single", nil)
	if err != nil {
		t.Fatal(err)
	}
	// The bucket gains a token every 200 ms: only a reserve sent sooner
	// must find it empty (a loaded machine may take longer between the two).
	if gap := time.Since(charged); rep.Status != http.StatusTooManyRequests && gap < 200*time.Millisecond {
		t.Fatalf("a single reserve %v after 5 invalid items were charged: %s, want 429", gap, rep)
	} else if rep.Status != http.StatusTooManyRequests {
		t.Logf("the single reserve came %v after the batch, past a token's refill: not checked", gap)
	}
	t.Logf("single reserve after the batch of 5: %d, Retry-After %s", rep.Status, rep.Header.Get("Retry-After"))
}
