package httpidem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/httpidem"
	"github.com/idem-dev/idem/proxy"
)

// TestKeyExpiresHeader: a stored response carries Idempotency-Key-Expires,
// the store's end of its retention as an HTTP-date, on the first answer and
// on every replay; a response that was not stored (released) carries none,
// and neither does the 410 once the retention ended.
func TestKeyExpiresHeader(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC).UnixNano())
	mem := backend.NewMem(backend.MemConfig{Now: now.Load, SkewMargin: -1})
	runs := 0
	eng, err := httpidem.New(httpidem.Config{Store: proxy.BackendStore(mem), Policy: httpidem.Policy{Retention: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	h := eng.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.Header().Set(httpidem.HeaderKeyExpires, "set by the handler")
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done")
	}))
	do := func(path, key string) *http.Response {
		req := httptest.NewRequest("POST", path, strings.NewReader("{}"))
		req.Header.Set(httpidem.HeaderKey, key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Result()
	}

	first := do("/pay", "k1")
	rec, ok, err := mem.Get(t.Context(), httpidem.DefaultNamespace, "k1")
	if err != nil || !ok {
		t.Fatalf("record: %v %v", ok, err)
	}
	want := time.Unix(0, rec.ExpiresAt).UTC().Format(http.TimeFormat)
	if want != "Sun, 01 Mar 2026 11:00:00 GMT" {
		t.Fatalf("stored expires_at %s, want completed_at + 1h", want)
	}
	if first.StatusCode != 201 || first.Header.Get(httpidem.HeaderKeyExpires) != want || first.Header.Get(httpidem.HeaderReplayed) != "" {
		t.Fatalf("first answer: %d %v, want %s: %s", first.StatusCode, first.Header, httpidem.HeaderKeyExpires, want)
	}
	if got := rec.Response.Headers[httpidem.HeaderKeyExpires]; got != "" {
		t.Fatalf("the engine's header was stored: %q", got)
	}
	now.Add(int64(30 * time.Minute))
	again := do("/pay", "k1")
	if again.StatusCode != 201 || again.Header.Get(httpidem.HeaderReplayed) != "true" || again.Header.Values(httpidem.HeaderKeyExpires)[0] != want ||
		len(again.Header.Values(httpidem.HeaderKeyExpires)) != 1 || runs != 1 {
		t.Fatalf("replay: %d %v (runs %d), want %s: %s", again.StatusCode, again.Header, runs, httpidem.HeaderKeyExpires, want)
	}

	// Not stored: released, no expiry.
	if r := do("/fail", "k2"); r.StatusCode != 503 || r.Header.Get(httpidem.HeaderKeyExpires) != "" {
		t.Fatalf("released answer: %d %v", r.StatusCode, r.Header)
	}
	// Past retention: 410 from the tombstone, nothing to replay.
	now.Add(int64(31 * time.Minute))
	if r := do("/pay", "k1"); r.StatusCode != http.StatusGone || r.Header.Get(httpidem.HeaderKeyExpires) != "" || runs != 2 {
		t.Fatalf("after retention: %d %v (runs %d)", r.StatusCode, r.Header, runs)
	}
}

// TestZeroRetentionIsTheNamespaceDefault: an engine without a Retention
// completes with the namespace's default retention (its policy's, here
// 60 s), which Idempotency-Key-Expires reports; an explicit one is sent as
// is.
func TestZeroRetentionIsTheNamespaceDefault(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC).UnixNano())
	mem := backend.NewMem(backend.MemConfig{Now: now.Load, SkewMargin: -1})
	if _, err := mem.SetPolicy(t.Context(), &fsm.Command{Op: fsm.OpSetPolicy, Namespace: httpidem.DefaultNamespace,
		Policy: &fsm.Policy{DefaultRetention: int64(time.Minute), MaxRetention: int64(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		retention time.Duration
		want      string
	}{{0, "Sun, 01 Mar 2026 10:01:00 GMT"}, {time.Hour, "Sun, 01 Mar 2026 11:00:00 GMT"}} {
		eng, err := httpidem.New(httpidem.Config{Store: proxy.BackendStore(mem), Policy: httpidem.Policy{Retention: tc.retention}})
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest("POST", "/pay", strings.NewReader("{}"))
		req.Header.Set(httpidem.HeaderKey, "key-"+tc.retention.String())
		rec := httptest.NewRecorder()
		eng.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })).ServeHTTP(rec, req)
		if got := rec.Result().Header.Get(httpidem.HeaderKeyExpires); rec.Code != 201 || got != tc.want {
			t.Fatalf("Retention %v: %d, %s %q, want %q", tc.retention, rec.Code, httpidem.HeaderKeyExpires, got, tc.want)
		}
	}
}
