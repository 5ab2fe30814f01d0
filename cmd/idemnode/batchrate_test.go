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
// flood of a principal limited to 50 requests per second: batch-reserve
// calls of 1000 invalid items. Before, the call was free and items were
// charged only once valid, so 200 such calls went through in 0.69 s
// without a 429 and the principal's bucket stayed full. Now each call is
// charged its 1000 items before any is parsed: every one is refused whole
// with 429 and Retry-After, a batch of 50 invalid items takes the whole
// bucket, and the next single call is refused too.
func TestRateLimitedBatchesPayEveryItem(t *testing.T) {
	c := startSecureCluster(t, launch.Spec{Cluster: "batchrate", Regions: []string{"east"}, NodesPerRegion: 1, ShardsPerRegion: 1, Replicas: 1},
		"principals:\n  - {name: limited, namespaces: [pay], role: writer, rate_per_s: 50}\n", "limited")
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
		t.Fatalf("batches of 1000 items over a rate of 50/s: %v, want 429 for all 200", counts)
	}

	// Wait until the bucket refilled (one second of the rate), then a
	// batch of 50 invalid items takes all of it.
	var status int
	deadline := time.Now().Add(10 * time.Second)
	for {
		rep, err := api.Do(ctx, "POST", "/v1/namespaces/pay/keys:batch-reserve", invalid(50))
		if err != nil {
			t.Fatal(err)
		}
		if status = rep.Status; status == http.StatusOK || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // the bucket refills at 50/s
	}
	if status != http.StatusOK {
		t.Fatalf("a batch of 50 after the bucket refilled: %d", status)
	}
	rep, err := api.Reserve(ctx, "pay", "single", nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != http.StatusTooManyRequests {
		t.Fatalf("a single reserve right after 50 invalid items were charged: %s, want 429", rep)
	}
	t.Logf("single reserve after the batch of 50: %d, Retry-After %s", rep.Status, rep.Header.Get("Retry-After"))
}
