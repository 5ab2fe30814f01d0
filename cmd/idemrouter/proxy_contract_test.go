package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
)

// TestProxyContractThroughTheBinary checks promises of proxy mode through
// the real idemrouter over a real region: the 1 MiB default of
// --max-request-bytes and a configured limit, that --proxy-addr sends every
// path upstream (the router's own /v1, /healthz and /metrics stay on
// --http-addr), and 422 for a running key reused with another method, path
// or query.
func TestProxyContractThroughTheBinary(t *testing.T) {
	var mu sync.Mutex
	paths := map[string]int{}
	hold := make(chan struct{})
	started := make(chan struct{}, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		mu.Lock()
		paths[r.URL.Path]++
		mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/slow") {
			started <- struct{}{}
			<-hold
		}
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "upstream saw "+r.Method+" "+r.URL.RequestURI()+" "+strconv.FormatInt(n, 10)+" bytes")
	}))
	defer upstream.Close()
	var holdOnce sync.Once
	release := func() { holdOnce.Do(func() { close(hold) }) }
	defer release()
	seen := func(path string) int {
		mu.Lock()
		defer mu.Unlock()
		return paths[path]
	}

	topo, err := launch.Topology(launch.Spec{Regions: []string{"r1"}, ShardsPerRegion: 2})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	ports, err := launch.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	defaultProxy := "127.0.0.1:" + strconv.Itoa(ports[0])
	smallProxy := "127.0.0.1:" + strconv.Itoa(ports[1])
	def, err := c.NewRouter(binaries.Path(t, "idemrouter"), "edge-default", "r1", "--upstream", upstream.URL, "--proxy-addr", defaultProxy)
	if err != nil {
		t.Fatal(err)
	}
	small, err := c.NewRouter(binaries.Path(t, "idemrouter"), "edge-small", "r1", "--upstream", upstream.URL, "--proxy-addr", smallProxy,
		"--max-request-bytes", "100")
	if err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*cluster.Router{def, small} {
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*cluster.Router{def, small} {
		if err := r.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}

	send := func(addr, method, path, key, body string) (int, http.Header, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}

	// --max-request-bytes: 1 MiB by default, as configured otherwise; a
	// keyed body over it is 413 problem+json and never reaches the upstream.
	const mib = 1 << 20
	for _, tc := range []struct {
		addr, key string
		size      int
		want      int
	}{
		{defaultProxy, "limit-default-at", mib, 201},
		{defaultProxy, "limit-default-over", mib + 1, 413},
		{smallProxy, "limit-small-at", 100, 201},
		{smallProxy, "limit-small-over", 101, 413},
	} {
		path := "/charges/" + tc.key
		status, hdr, body := send(tc.addr, "POST", path, tc.key, strings.Repeat("x", tc.size))
		if status != tc.want {
			t.Fatalf("%s: %d-byte body: %d %s, want %d", tc.key, tc.size, status, body, tc.want)
		}
		if tc.want == 413 && (hdr.Get("Content-Type") != "application/problem+json" || seen(path) != 0) {
			t.Fatalf("%s: 413 with %q, upstream saw it %d times", tc.key, hdr.Get("Content-Type"), seen(path))
		}
	}

	// Everything on --proxy-addr goes upstream, the router's own paths too.
	for _, path := range []string{"/v1/namespaces/payments/keys/order-1", "/healthz", "/readyz", "/metrics"} {
		status, hdr, body := send(defaultProxy, "GET", path, "", "")
		if status != 201 || hdr.Get("X-Upstream") != "yes" || seen(path) != 1 {
			t.Fatalf("GET %s on --proxy-addr: %d %q (upstream saw it %d times), want the upstream's answer", path, status, body, seen(path))
		}
	}
	// ... while --http-addr keeps the router's own.
	if status, _, body := send(def.HTTPAddr, "GET", "/metrics", "", ""); status != 200 || !strings.Contains(body, "idem_") {
		t.Fatalf("router's own /metrics on --http-addr: %d", status)
	}
	// The router's few MiB of live heap get --gc-headroom-bytes of room
	// (internal/gctune): GOGC above Go's 100.
	if g, err := cluster.MetricSum(t.Context(), def.HTTPAddr, "go_gc_gogc_percent"); err != nil || g <= 100 {
		t.Fatalf("router's go_gc_gogc_percent %v (%v), want above 100", g, err)
	}
	// It runs as Go runs it: no re-execution with GODEBUG's schedtrace, so
	// nothing said of Go's system monitor (internal/cli, sysmon.go).
	if data, _ := os.ReadFile(def.Log); bytes.Contains(data, []byte("system monitor")) && os.Getenv("GODEBUG") == "" {
		t.Fatalf("the router's log speaks of the system monitor although nothing asked for it:\n%s", data)
	}
	if status, _, _ := send(def.HTTPAddr, "GET", "/healthz", "", ""); status != 200 {
		t.Fatalf("router's own /healthz: %d", status)
	}

	// A running key reused with another method, path or query: 422; the
	// same request: 409; nothing of them reaches the upstream.
	done := make(chan int, 1)
	go func() {
		status, _, _ := send(defaultProxy, "POST", "/slow/charge?amount=1", "running-1", "pay")
		done <- status
	}()
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the first request never reached the upstream")
	}
	for _, tc := range []struct{ method, path string }{
		{"PATCH", "/slow/charge?amount=1"},
		{"POST", "/slow/refund?amount=1"},
		{"POST", "/slow/charge?amount=2"},
	} {
		if status, hdr, body := send(defaultProxy, tc.method, tc.path, "running-1", "pay"); status != 422 || hdr.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("running key with %s %s: %d %s, want 422 problem+json", tc.method, tc.path, status, body)
		}
	}
	if status, _, body := send(defaultProxy, "POST", "/slow/charge?amount=1", "running-1", "pay"); status != 409 {
		t.Fatalf("the same request while it runs: %d %s, want 409", status, body)
	}
	release()
	if status := <-done; status != 201 {
		t.Fatalf("the first request: %d", status)
	}
	if n := seen("/slow/charge"); n != 1 {
		t.Fatalf("upstream ran /slow/charge %d times, want 1", n)
	}
	if n := seen("/slow/refund"); n != 0 {
		t.Fatalf("upstream ran /slow/refund %d times, want 0", n)
	}
}
