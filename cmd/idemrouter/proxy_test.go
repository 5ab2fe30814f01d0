package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
)

// TestProxyModeEndToEnd runs idemrouter --upstream in front of a real
// upstream HTTP server, over a real three-node region, and walks the
// contract's proxy table as a client would.
func TestProxyModeEndToEnd(t *testing.T) {
	var executions sync.Map  // key -> *atomic.Int32
	var fencingSeen sync.Map // key -> every header the upstream got that a framework could read as the fencing token
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := strings.Trim(r.Header.Get("Idempotency-Key"), `"`)
		var fencing []string
		for name, values := range r.Header {
			if strings.EqualFold(strings.ReplaceAll(name, "_", "-"), "Idempotency-Fencing-Token") {
				fencing = append(fencing, name+": "+strings.Join(values, ","))
			}
		}
		fencingSeen.Store(key, fencing)
		n, _ := executions.LoadOrStore(key, new(atomic.Int32))
		count := n.(*atomic.Int32).Add(1)
		body, _ := io.ReadAll(r.Body)
		if strings.HasPrefix(key, "slow-") {
			<-release
		}
		if strings.HasPrefix(key, "flaky-") && count == 1 {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "session=abc")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charged":%q,"fencing":%q,"run":%d}`, body, r.Header.Get("Idempotency-Fencing-Token"), count)
	}))
	defer upstream.Close()
	defer close(release)

	topo, err := launch.Topology(launch.Spec{Regions: []string{"r1"}, ShardsPerRegion: 2})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	ports, err := launch.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	proxyAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	r, err := c.NewRouter(binaries.Path(t, "idemrouter"), "edge", "r1", "--upstream", upstream.URL, "--proxy-addr", proxyAddr,
		"--require-key", "--namespace-header", "X-Api-Key-Id")
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
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	send := func(method, path, key, caller, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, "http://"+proxyAddr+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		if caller != "" {
			req.Header.Set("X-Api-Key-Id", caller)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	read := func(resp *http.Response) string {
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	runs := func(key string) int32 {
		n, ok := executions.Load(key)
		if !ok {
			return 0
		}
		return n.(*atomic.Int32).Load()
	}

	// First request runs upstream with the fencing token; the retry replays.
	first := send("POST", "/charges?x=1", `"order-1"`, "tenant-a", "100 EUR")
	firstBody := read(first)
	if first.StatusCode != 201 || first.Header.Get("Idempotent-Replayed") != "" || first.Header.Get("Set-Cookie") == "" ||
		!strings.Contains(firstBody, `"fencing":"`) || strings.Contains(firstBody, `"fencing":""`) {
		t.Fatalf("first: %d %v %s", first.StatusCode, first.Header, firstBody)
	}
	replay := send("POST", "/charges?x=1", "order-1", "tenant-a", "100 EUR")
	if body := read(replay); replay.StatusCode != 201 || replay.Header.Get("Idempotent-Replayed") != "true" || body != firstBody ||
		replay.Header.Get("Set-Cookie") != "" {
		t.Fatalf("replay: %d %v %s", replay.StatusCode, replay.Header, body)
	}
	// Both carry Idempotency-Key-Expires: the stored response's expires_at.
	rec, err := r.API().Get(ctx, "tenant-a", "order-1")
	if err != nil || rec.Status != 200 {
		t.Fatalf("GET of the stored key: %v %v", rec, err)
	}
	expiresAt, err := time.Parse(time.RFC3339Nano, rec.Str("expires_at"))
	if err != nil {
		t.Fatalf("expires_at %q: %v", rec.Str("expires_at"), err)
	}
	wantExpires := expiresAt.UTC().Format(http.TimeFormat)
	if first.Header.Get("Idempotency-Key-Expires") != wantExpires || replay.Header.Get("Idempotency-Key-Expires") != wantExpires {
		t.Fatalf("Idempotency-Key-Expires: first %q, replay %q, want %q (expires_at %s)", first.Header.Get("Idempotency-Key-Expires"),
			replay.Header.Get("Idempotency-Key-Expires"), wantExpires, rec.Str("expires_at"))
	}
	// A namespace whose policy keeps responses for one second: the proxy
	// stores for that long (its header says so), then answers 410 Gone from
	// the tombstone and nothing reaches the upstream.
	if pol, err := r.API().Do(ctx, "PUT", "/v1/namespaces/tenant-c/policy", map[string]any{"default_retention_s": 1}); err != nil || pol.Status != 200 {
		t.Fatalf("PUT policy: %v %v", pol, err)
	}
	short := send("POST", "/charges", "order-2", "tenant-c", "5 EUR")
	read(short)
	shortExpires, err := http.ParseTime(short.Header.Get("Idempotency-Key-Expires"))
	if short.StatusCode != 201 || err != nil || time.Until(shortExpires) > 2*time.Second {
		t.Fatalf("first answer under a one-second retention: %d %v", short.StatusCode, short.Header)
	}
	var gone *http.Response
	testutil.Until(t, 20*time.Second, "410 once the retention ended", func() bool {
		gone = send("POST", "/charges", "order-2", "tenant-c", "5 EUR")
		read(gone)
		return gone.StatusCode == http.StatusGone
	})
	if gone.Header.Get("Content-Type") != "application/problem+json" || gone.Header.Get("Idempotency-Key-Expires") != "" || runs("order-2") != 1 {
		t.Fatalf("410: %v, upstream runs %d", gone.Header, runs("order-2"))
	}
	// Same key, another body or path: 422 problem+json.
	for _, tc := range []struct{ path, body string }{{"/charges?x=1", "999 EUR"}, {"/refunds?x=1", "100 EUR"}, {"/charges?x=2", "100 EUR"}} {
		resp := send("POST", tc.path, "order-1", "tenant-a", tc.body)
		if read(resp); resp.StatusCode != 422 || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("mismatch %v: %d %s", tc, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	// Another caller with the same key string runs on its own.
	other := send("POST", "/charges?x=1", "order-1", "tenant-b", "100 EUR")
	if read(other); other.StatusCode != 201 || other.Header.Get("Idempotent-Replayed") != "" || runs("order-1") != 2 {
		t.Fatalf("other tenant: %d replayed=%q runs=%d", other.StatusCode, other.Header.Get("Idempotent-Replayed"), runs("order-1"))
	}
	// No key under --require-key: 400; no caller header: 401; nothing reaches the upstream.
	if resp := send("POST", "/charges", "", "tenant-a", "x"); read(resp) == "" || resp.StatusCode != 400 {
		t.Fatalf("missing key: %d", resp.StatusCode)
	}
	if resp := send("POST", "/charges", "order-9", "", "x"); read(resp) == "" || resp.StatusCode != 401 || runs("order-9") != 0 {
		t.Fatalf("missing caller: %d", resp.StatusCode)
	}
	// GET passes through untouched.
	if resp := send("GET", "/charges", "", "", ""); read(resp) == "" || resp.StatusCode != 201 {
		t.Fatalf("passthrough: %d", resp.StatusCode)
	}
	// A 503 upstream releases the key: the retry runs again and succeeds.
	if resp := send("POST", "/charges", "flaky-1", "tenant-a", "x"); read(resp) == "" || resp.StatusCode != 503 || resp.Header.Get("Idempotency-Key-Expires") != "" {
		t.Fatalf("flaky first: %d %v (a released answer has no expiry)", resp.StatusCode, resp.Header)
	}
	if resp := send("POST", "/charges", "flaky-1", "tenant-a", "x"); !strings.Contains(read(resp), `"run":2`) || resp.StatusCode != 201 {
		t.Fatalf("flaky retry: %d", resp.StatusCode)
	}
	// 30 concurrent identical requests while the first is running: one
	// upstream execution, the others 409 problem+json.
	var wg sync.WaitGroup
	statuses := make(chan int, 30)
	for i := 0; i < 30; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := send("POST", "/charges", "slow-1", "tenant-a", "x")
			read(resp)
			statuses <- resp.StatusCode
		}()
	}
	testutil.Until(t, 20*time.Second, "one upstream run and 29 answers", func() bool { return runs("slow-1") == 1 && len(statuses) == 29 })
	release <- struct{}{}
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	if count[201] != 1 || count[409] != 29 || runs("slow-1") != 1 {
		t.Fatalf("concurrent identical requests: statuses %v, upstream runs %d", count, runs("slow-1"))
	}

	// The upstream gets exactly one fencing token, the router's, whatever
	// the client sends: a Connection header naming it cannot strip it
	// (hop-by-hop processing comes first), and no variant of its name
	// reaches the upstream beside it.
	for i, hdr := range [][2]string{
		{"Connection", "Idempotency-Fencing-Token"},
		{"Connection", "idempotency-fencing-token, keep-alive"},
		{"Idempotency_Fencing_Token", "999"},
		{"IDEMPOTENCY-FENCING-TOKEN", "999"},
		{"idempotency_fencing-token", "999"},
	} {
		key := "fence-" + strconv.Itoa(i)
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+proxyAddr+"/charges", strings.NewReader("1 EUR"))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Api-Key-Id", "tenant-a")
		req.Header[hdr[0]] = []string{hdr[1]} // as written: no canonicalisation
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := read(resp)
		v, _ := fencingSeen.Load(key)
		got, _ := v.([]string)
		if resp.StatusCode != 201 || len(got) != 1 || !strings.HasPrefix(got[0], "Idempotency-Fencing-Token: ") ||
			strings.Contains(got[0], "999") || !strings.Contains(body, `"fencing":"`+strings.TrimPrefix(got[0], "Idempotency-Fencing-Token: ")+`"`) {
			t.Fatalf("client header %s: %s: status %d, the upstream got fencing headers %q (want exactly the router's one)", hdr[0], hdr[1], resp.StatusCode, got)
		}
	}
	// Nor on a request without a key, which gets none at all.
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+proxyAddr+"/charges", nil)
	req.Header["Idempotency_Fencing_Token"] = []string{"999"}
	req.Header["Idempotency-Fencing-Token"] = []string{"999"}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	read(resp)
	if v, _ := fencingSeen.Load(""); resp.StatusCode != 201 || len(v.([]string)) != 0 {
		t.Fatalf("key-less request: status %d, the upstream got fencing headers %q (want none)", resp.StatusCode, v)
	}
}
