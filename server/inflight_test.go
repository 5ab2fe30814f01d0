package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestInflightBytesBound: with MaxInflightBytes set, a request that would
// take the bytes held past the bound while others are in flight gets 503
// UNAVAILABLE with Retry-After; one alone always passes; released bytes
// admit the next; requests without a body are never refused.
func TestInflightBytesBound(t *testing.T) {
	f := &inflight{max: 1000}
	rel1, e := f.acquire(5000)
	if e != nil {
		t.Fatalf("a request alone over the bound: %v", e)
	}
	if _, e := f.acquire(1); e == nil || e.Code != CodeUnavailable || e.RetryAfter <= 0 {
		t.Fatalf("a second request past the bound: %v, want UNAVAILABLE with a retry hint", e)
	}
	if _, e := f.acquire(0); e != nil {
		t.Fatalf("a request without a body: %v", e)
	}
	rel1()
	rel2, e := f.acquire(600)
	if e != nil {
		t.Fatal(e)
	}
	if _, e := f.acquire(500); e == nil {
		t.Fatal("600 + 500 bytes passed a bound of 1000")
	}
	rel3, e := f.acquire(400)
	if e != nil {
		t.Fatalf("600 + 400 bytes within a bound of 1000: %v", e)
	}
	rel2()
	rel3()
	if got := f.bytes.Load(); got != 0 {
		t.Fatalf("%d bytes left in flight after every release", got)
	}

	cfg := DefaultConfig()
	cfg.Backend = newMemBackend(newFakeClock())
	cfg.MaxInflightBytes = 4096
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.HTTPHandler())
	t.Cleanup(hs.Close)
	post := func() *http.Response {
		resp, err := http.Post(hs.URL+"/v1/namespaces/pay/keys/k:reserve", "application/json", strings.NewReader(`{"lease_ms": 1000}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	held, e := srv.inflight.acquire(4090) // another request's body, not answered yet
	if e != nil {
		t.Fatal(e)
	}
	if resp := post(); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("JSON reserve past --max-inflight-bytes: %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	held()
	if resp := post(); resp.StatusCode != http.StatusOK {
		t.Fatalf("JSON reserve once the bytes drained: %d", resp.StatusCode)
	}
}
