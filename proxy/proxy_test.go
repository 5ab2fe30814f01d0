package proxy_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/httpidem"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/proxy"
)

// The rows of the contract's proxy-mode table, one subtest each.
func TestContractTable(t *testing.T) {
	up := newUpstream(t)
	be := newBackend(time.Second)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(be), func(c *proxy.Config) { c.RequireKey = false })

	t.Run("first request is forwarded with key and fencing token, stored and returned", func(t *testing.T) {
		rep := send(t, srv.URL, "POST", "/echo?a=1", `{"x":1}`, "Idempotency-Key", "first")
		if rep.Status != 200 || rep.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("first request: %v", rep)
		}
		for _, want := range []string{`"key":"first"`, `"body":"{\"x\":1}"`, `"query":"a=1"`, `"method":"POST"`, `"content_len":7`} {
			if !strings.Contains(rep.Body, want) {
				t.Errorf("upstream did not see %s: %s", want, rep.Body)
			}
		}
		toks := up.Tokens("first")
		if len(toks) != 1 || toks[0] == 0 || !strings.Contains(rep.Body, fmt.Sprintf(`"fencing_token":"%d"`, toks[0])) {
			t.Errorf("fencing tokens seen upstream %v; body %s", toks, rep.Body)
		}
		rec, ok := be.record(t, "default", "first")
		if !ok || rec.State != fsm.StateCompleted || rec.Response.Status != 200 || string(rec.Response.Body) != rep.Body {
			t.Errorf("stored record %+v, %v", rec, ok)
		}
	})

	t.Run("same key and request after completion replays", func(t *testing.T) {
		first := send(t, srv.URL, "POST", "/ok", "pay 10", "Idempotency-Key", "k-replay")
		again := send(t, srv.URL, "POST", "/ok", "pay 10", "Idempotency-Key", "k-replay")
		if first.Status != 201 || again.Status != 201 || again.Body != first.Body {
			t.Fatalf("first %v\nagain %v", first, again)
		}
		if again.Header.Get("Idempotent-Replayed") != "true" || first.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("Idempotent-Replayed: first %q, again %q", first.Header.Get("Idempotent-Replayed"), again.Header.Get("Idempotent-Replayed"))
		}
		for _, h := range []string{"Content-Type", "X-Custom", "Location", "Date"} {
			if again.Header.Get(h) != first.Header.Get(h) {
				t.Errorf("%s: first %q, replay %q", h, first.Header.Get(h), again.Header.Get(h))
			}
		}
		if got := again.Header.Get("X-Multi"); got != "a, b" {
			t.Errorf("X-Multi replayed as %q, want the values joined", got)
		}
		if first.Header.Get("Set-Cookie") == "" || again.Header.Get("Set-Cookie") != "" {
			t.Errorf("Set-Cookie: first %q, replay %q", first.Header.Get("Set-Cookie"), again.Header.Get("Set-Cookie"))
		}
		if n := up.Runs("k-replay"); n != 1 {
			t.Errorf("upstream ran %d times", n)
		}
	})

	t.Run("same key with another method, path, query or body is 422", func(t *testing.T) {
		send(t, srv.URL, "POST", "/ok?q=1", "body", "Idempotency-Key", "k-mismatch")
		for _, tc := range []struct{ method, path, body string }{
			{"PATCH", "/ok?q=1", "body"},
			{"POST", "/ok/other?q=1", "body"},
			{"POST", "/ok?q=2", "body"},
			{"POST", "/ok", "body"},
			{"POST", "/ok?q=1", "bodY"},
			{"POST", "/ok?q=1", ""},
		} {
			rep := send(t, srv.URL, tc.method, tc.path, tc.body, "Idempotency-Key", "k-mismatch")
			if slug := problem(t, rep, 422); slug != httpidem.ProblemFingerprintMismatch {
				t.Errorf("%s %s %q: problem %s", tc.method, tc.path, tc.body, slug)
			}
		}
		if n := up.Runs("k-mismatch"); n != 1 {
			t.Errorf("upstream ran %d times", n)
		}
	})

	t.Run("same key while the first runs is 409, another request 422", func(t *testing.T) {
		done := make(chan reply, 1)
		go func() {
			rep, _ := trySend(srv.URL, "POST", "/slow", "x", "Idempotency-Key", "k-running")
			done <- rep
		}()
		<-up.started
		rep := send(t, srv.URL, "POST", "/slow", "x", "Idempotency-Key", "k-running")
		problem(t, rep, 409)
		if ra, err := strconv.Atoi(rep.Header.Get("Retry-After")); err != nil || ra < 1 {
			t.Errorf("409 Retry-After %q", rep.Header.Get("Retry-After"))
		}
		problem(t, send(t, srv.URL, "POST", "/slow", "y", "Idempotency-Key", "k-running"), 422)
		close(up.gate)
		if first := <-done; first.Status != 201 {
			t.Errorf("first request: %v", first)
		}
		if n := up.Runs("k-running"); n != 1 {
			t.Errorf("upstream ran %d times", n)
		}
	})

	t.Run("key-less and other methods pass through untouched", func(t *testing.T) {
		for i := 1; i <= 2; i++ {
			rep := send(t, srv.URL, "POST", "/echo", "nokey")
			if rep.Status != 200 || !strings.Contains(rep.Body, `"fencing_token":""`) || !strings.Contains(rep.Body, fmt.Sprintf(`"run":%d`, i)) {
				t.Errorf("key-less POST #%d: %v", i, rep)
			}
		}
		for _, method := range []string{"GET", "PUT", "DELETE"} {
			for i := 1; i <= 2; i++ {
				rep := send(t, srv.URL, method, "/echo", "", "Idempotency-Key", "k-"+method)
				if rep.Status != 200 || rep.Header.Get("Idempotent-Replayed") != "" || !strings.Contains(rep.Body, `"fencing_token":""`) ||
					!strings.Contains(rep.Body, `"key":"k-`+method+`"`) {
					t.Errorf("%s #%d: %v", method, i, rep)
				}
			}
			if n := up.Runs("k-" + method); n != 2 {
				t.Errorf("%s ran %d times upstream, want 2 (not deduplicated)", method, n)
			}
			if _, ok := be.record(t, "default", "k-"+method); ok {
				t.Errorf("%s left a record in the store", method)
			}
		}
	})

	t.Run("upstream 5xx, 408, 425 and 429 are returned and released", func(t *testing.T) {
		for _, code := range []int{500, 502, 503, 504, 408, 425, 429} {
			key := "k-status-" + strconv.Itoa(code)
			for run := 1; run <= 2; run++ {
				rep := send(t, srv.URL, "POST", "/status/"+strconv.Itoa(code), "", "Idempotency-Key", key)
				if rep.Status != code || rep.Body != fmt.Sprintf("status %d run=%d", code, run) || rep.Header.Get("Idempotent-Replayed") != "" {
					t.Errorf("%d run %d: %v", code, run, rep)
				}
			}
			if _, ok := be.record(t, "default", key); ok {
				t.Errorf("%d: the key was not released", code)
			}
		}
	})

	t.Run("other upstream answers are stored as final", func(t *testing.T) {
		for _, code := range []int{200, 201, 202, 204, 302, 400, 404, 409, 422} {
			key := "k-final-" + strconv.Itoa(code)
			first := send(t, srv.URL, "POST", "/status/"+strconv.Itoa(code), "", "Idempotency-Key", key)
			again := send(t, srv.URL, "POST", "/status/"+strconv.Itoa(code), "", "Idempotency-Key", key)
			if first.Status != code || again.Status != code || again.Body != first.Body || again.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("%d: first %v, again %v", code, first, again)
			}
			if code == 302 && again.Header.Get("Location") != "/elsewhere" {
				t.Errorf("302 replayed without its Location: %v", again)
			}
			if n := up.Runs(key); n != 1 {
				t.Errorf("%d: upstream ran %d times", code, n)
			}
		}
	})
}

func TestRequireKey(t *testing.T) {
	up := newUpstream(t)
	srv, p := startProxy(t, up.srv.URL, proxy.BackendStore(newBackend(time.Second)), func(c *proxy.Config) { c.RequireKey = true })
	for _, method := range []string{"POST", "PATCH"} {
		if slug := problem(t, send(t, srv.URL, method, "/echo", "x"), 400); slug != httpidem.ProblemMissingKey {
			t.Errorf("%s without key: %s", method, slug)
		}
	}
	if rep := send(t, srv.URL, "GET", "/echo", ""); rep.Status != 200 {
		t.Errorf("GET without key: %v", rep)
	}
	if n := up.TotalRuns(); n != 1 {
		t.Errorf("upstream ran %d requests, want only the GET", n)
	}
	if s := p.Stats(); s.MissingKey != 2 || s.Passthrough != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestInvalidKeys(t *testing.T) {
	up := newUpstream(t)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(newBackend(time.Second)))
	for _, key := range []string{`"a b"`, strings.Repeat("k", 256), `"unterminated`, "clé"} {
		if slug := problem(t, send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", key), 400); slug != httpidem.ProblemInvalidKey {
			t.Errorf("key %q: %s", key, slug)
		}
	}
	problem(t, send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "a", "Idempotency-Key", "b"), 400)
	if n := up.TotalRuns(); n != 0 {
		t.Errorf("upstream ran %d requests", n)
	}
	// A structured-field string and the bare token are the same key.
	first := send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", `"sf-key"`)
	again := send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "sf-key")
	if first.Status != 201 || again.Header.Get("Idempotent-Replayed") != "true" || again.Body != first.Body {
		t.Errorf("\"sf-key\" then sf-key: %v / %v", first, again)
	}
}

func TestConcurrentIdenticalRequestsRunOnce(t *testing.T) {
	up := newUpstream(t)
	srv, p := startProxy(t, up.srv.URL, proxy.BackendStore(newBackend(time.Second)))
	const n = 30
	replies := make(chan reply, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			rep, err := trySend(srv.URL, "POST", "/slow", "same body", "Idempotency-Key", "k-30")
			if err != nil {
				rep = reply{Body: err.Error()}
			}
			replies <- rep
		})
	}
	<-up.started
	// Let some of the others be refused while it runs, then let it finish
	// while the rest are still arriving.
	var got []reply
	for len(got) < 10 {
		got = append(got, <-replies)
	}
	close(up.gate)
	wg.Wait()
	close(replies)
	for rep := range replies {
		got = append(got, rep)
	}
	var created, conflicts int
	var body string
	for _, rep := range got {
		switch rep.Status {
		case 201:
			created++
			if body == "" {
				body = rep.Body
			}
			if rep.Body != body {
				t.Errorf("two different 201 bodies: %q and %q", body, rep.Body)
			}
		case 409:
			conflicts++
			problem(t, rep, 409)
		default:
			t.Errorf("unexpected answer %v", rep)
		}
	}
	if runs := up.Runs("k-30"); runs != 1 {
		t.Fatalf("upstream ran %d times for 30 identical requests", runs)
	}
	if created < 1 || created+conflicts != n {
		t.Errorf("%d created, %d conflicts of %d", created, conflicts, n)
	}
	s := p.Stats()
	if s.Forwarded != 1 || s.Replayed != uint64(created-1) || s.Conflict != uint64(conflicts) {
		t.Errorf("stats %+v for %d created, %d conflicts", s, created, conflicts)
	}
	t.Logf("30 identical requests: 1 upstream run, %d replays, %d conflicts", created-1, conflicts)
}

func TestUpstreamFailingOnceIsRetried(t *testing.T) {
	up := newUpstream(t)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(newBackend(time.Second)))
	first := send(t, srv.URL, "POST", "/fail-once", "x", "Idempotency-Key", "k-flaky")
	second := send(t, srv.URL, "POST", "/fail-once", "x", "Idempotency-Key", "k-flaky")
	third := send(t, srv.URL, "POST", "/fail-once", "x", "Idempotency-Key", "k-flaky")
	if first.Status != 503 || first.Body != "try again" {
		t.Errorf("first: %v", first)
	}
	if second.Status != 201 || second.Body != "done run=2" || second.Header.Get("Idempotent-Replayed") != "" {
		t.Errorf("retry: %v", second)
	}
	if third.Status != 201 || third.Body != "done run=2" || third.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("after success: %v", third)
	}
	if toks := up.Tokens("k-flaky"); len(toks) != 2 || toks[1] <= toks[0] {
		t.Errorf("fencing tokens %v: the retry must get a larger one", toks)
	}
}

func TestUpstreamUnreachableIs502AndReleases(t *testing.T) {
	be := newBackend(time.Second)
	srv, p := startProxy(t, deadURL(t), proxy.BackendStore(be))
	for range 2 { // not 409 the second time: the key was released
		if slug := problem(t, send(t, srv.URL, "POST", "/ok", "x", "Idempotency-Key", "k-502"), 502); slug != httpidem.ProblemUpstreamUnreachable {
			t.Errorf("problem %s", slug)
		}
	}
	if _, ok := be.record(t, "default", "k-502"); ok {
		t.Error("the key was not released")
	}
	if s := p.Stats(); s.Released != 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestUpstreamTooSlowIs504AndReleases(t *testing.T) {
	up := newUpstream(t)
	be := newBackend(time.Second)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(be), func(c *proxy.Config) {
		c.UpstreamTimeout = 200 * time.Millisecond
		c.ReleaseStatuses = "503" // the proxy's own 504 releases whatever this says
	})
	for _, path := range []string{"/hang", "/stall"} { // no answer; or a status, a little body, then nothing
		key := "k-504" + path
		for run := 1; run <= 2; run++ {
			if slug := problem(t, send(t, srv.URL, "POST", path, "x", "Idempotency-Key", key), 504); slug != httpidem.ProblemUpstreamTimeout {
				t.Errorf("%s: problem %s", path, slug)
			}
			if n := up.Runs(key); n != run {
				t.Errorf("%s: upstream ran %d times after %d requests", path, n, run)
			}
		}
		if _, ok := be.record(t, "default", key); ok {
			t.Errorf("%s: the key was not released", path)
		}
	}
}

func TestStoreUnavailableIs503AndNothingRuns(t *testing.T) {
	up := newUpstream(t)
	be := newBackend(time.Second)
	be.failAll.Store(true)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(be))
	rep := send(t, srv.URL, "POST", "/ok", "x", "Idempotency-Key", "k-503")
	if slug := problem(t, rep, 503); slug != httpidem.ProblemStoreUnavailable {
		t.Errorf("problem %s", slug)
	}
	if rep.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	if n := up.TotalRuns(); n != 0 {
		t.Errorf("upstream ran %d times without a reservation", n)
	}
	if n := be.Calls(fsm.OpReserve); n != 3 {
		t.Errorf("reserve tried %d times, want 3", n)
	}
	be.failAll.Store(false)
	if rep := send(t, srv.URL, "POST", "/ok", "x", "Idempotency-Key", "k-503"); rep.Status != 201 {
		t.Errorf("once the store is back: %v", rep)
	}
}

func TestHeartbeatsKeepTheLease(t *testing.T) {
	up := newUpstream(t)
	be := newBackend(10 * time.Millisecond)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(be), func(c *proxy.Config) {
		c.Lease = 2 * time.Second
		c.HeartbeatInterval = 200 * time.Millisecond
	})
	done := make(chan reply, 1)
	go func() {
		rep, _ := trySend(srv.URL, "POST", "/slow", "x", "Idempotency-Key", "k-hb")
		done <- rep
	}()
	<-up.started
	// Wait past the lease (15 heartbeats 200 ms apart are 3 s > 2 s): only
	// heartbeats keep the key. A 2 s lease leaves a loaded box ample slack
	// for a late heartbeat.
	testutil.Eventually(t, 30*time.Second, "heartbeats past the lease", func() (bool, string) {
		n := be.Calls(fsm.OpHeartbeat)
		return n >= 15, fmt.Sprintf("%d heartbeats", n)
	})
	problem(t, send(t, srv.URL, "POST", "/slow", "x", "Idempotency-Key", "k-hb"), 409)
	close(up.gate)
	if rep := <-done; rep.Status != 201 {
		t.Fatalf("first: %v", rep)
	}
	if n := up.Runs("k-hb"); n != 1 {
		t.Errorf("upstream ran %d times: the lease was reclaimed despite heartbeats", n)
	}
}

func TestLeaseLostCancelsTheUpstream(t *testing.T) {
	up := newUpstream(t)
	be := newBackend(10 * time.Millisecond)
	be.failHeartbeats.Store(true)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(be), func(c *proxy.Config) {
		c.Lease = 150 * time.Millisecond
		c.HeartbeatInterval = 30 * time.Millisecond
	})
	rep := send(t, srv.URL, "POST", "/hang", "x", "Idempotency-Key", "k-lost")
	if slug := problem(t, rep, 503); slug != httpidem.ProblemLeaseLost {
		t.Errorf("problem %s", slug)
	}
	// Nobody else took the key, so the release went through.
	if _, ok := be.record(t, "default", "k-lost"); ok {
		t.Error("the key stayed reserved")
	}
}

func TestRequestBodyOverLimitIs413(t *testing.T) {
	up := newUpstream(t)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(newBackend(time.Second)), func(c *proxy.Config) { c.MaxRequestBytes = 1000 })
	big := strings.Repeat("b", 1001)
	if slug := problem(t, send(t, srv.URL, "POST", "/echo", big, "Idempotency-Key", "k-413"), 413); slug != httpidem.ProblemRequestTooLarge {
		t.Errorf("problem %s", slug)
	}
	// Without a Content-Length (chunked), the bound holds while reading.
	req, _ := http.NewRequest("POST", srv.URL+"/echo", struct{ *strings.Reader }{strings.NewReader(big)})
	req.Header.Set("Idempotency-Key", "k-413-chunked")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("chunked: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if n := up.TotalRuns(); n != 0 {
		t.Errorf("upstream ran %d times", n)
	}
	if rep := send(t, srv.URL, "POST", "/echo", big[:1000], "Idempotency-Key", "k-1000"); rep.Status != 200 {
		t.Errorf("a body at the limit: %v", rep)
	}
	if rep := send(t, srv.URL, "POST", "/echo", big); rep.Status != 200 {
		t.Errorf("a key-less body over the limit passes through: %v", rep)
	}
}

func TestSpooledBodyReachesUpstream(t *testing.T) {
	up := newUpstream(t)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(newBackend(time.Second)), func(c *proxy.Config) {
		c.SpoolThresholdBytes = 100
		c.SpoolDir = t.TempDir()
	})
	body := strings.Repeat("0123456789", 500)
	rep := send(t, srv.URL, "POST", "/echo", body, "Idempotency-Key", "k-spool")
	if rep.Status != 200 || !strings.Contains(rep.Body, `"body":"`+body+`"`) || !strings.Contains(rep.Body, `"content_len":5000`) {
		t.Errorf("spooled body did not arrive intact: %.200s", rep.Body)
	}
}

func TestOversizeResponseStoredWithoutBody(t *testing.T) {
	up := newUpstream(t)
	be := newBackend(time.Second)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(be), func(c *proxy.Config) { c.MaxStoredBodyBytes = 1000 })
	for _, n := range []int{1000, 5000} {
		key := "k-big-" + strconv.Itoa(n)
		first := send(t, srv.URL, "POST", "/big?n="+strconv.Itoa(n), "", "Idempotency-Key", key)
		again := send(t, srv.URL, "POST", "/big?n="+strconv.Itoa(n), "", "Idempotency-Key", key)
		if first.Status != 200 || len(first.Body) != n || first.Header.Get("Idempotent-Body-Omitted") != "" {
			t.Errorf("n=%d: first caller got %d bytes, %v", n, len(first.Body), first.Header)
		}
		omitted := n > 1000
		if again.Status != 200 || again.Header.Get("Idempotent-Replayed") != "true" || again.Header.Get("Content-Type") != "application/octet-stream" {
			t.Errorf("n=%d: replay %v", n, again.Header)
		}
		// A body over the limit streams to the first caller before it is
		// stored: only the replays can say when it expires.
		if (first.Header.Get("Idempotency-Key-Expires") == "") != omitted || again.Header.Get("Idempotency-Key-Expires") == "" {
			t.Errorf("n=%d: Idempotency-Key-Expires first %q, replay %q", n, first.Header.Get("Idempotency-Key-Expires"), again.Header.Get("Idempotency-Key-Expires"))
		}
		if omitted && (again.Body != "" || again.Header.Get("Idempotent-Body-Omitted") != "true") {
			t.Errorf("n=%d: replay has %d bytes, Idempotent-Body-Omitted %q", n, len(again.Body), again.Header.Get("Idempotent-Body-Omitted"))
		}
		if !omitted && (again.Body != first.Body || again.Header.Get("Idempotent-Body-Omitted") != "") {
			t.Errorf("n=%d: replay has %d bytes", n, len(again.Body))
		}
		if runs := up.Runs(key); runs != 1 {
			t.Errorf("n=%d: upstream ran %d times", n, runs)
		}
	}
	// A store whose limit is below MaxStoredBodyBytes refuses the body: it
	// is stored without it all the same.
	be.maxBody = 500
	send(t, srv.URL, "POST", "/big?n=800", "", "Idempotency-Key", "k-refused")
	again := send(t, srv.URL, "POST", "/big?n=800", "", "Idempotency-Key", "k-refused")
	if again.Header.Get("Idempotent-Replayed") != "true" || again.Header.Get("Idempotent-Body-Omitted") != "true" || again.Body != "" {
		t.Errorf("body refused by the store: replay %v", again)
	}
}

// An event stream flushes through to the first caller as it comes; replays
// get it whole.
func TestEventStreamStreams(t *testing.T) {
	up := newUpstream(t)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(newBackend(time.Second)))
	req, _ := http.NewRequest("POST", srv.URL+"/events", nil)
	req.Header.Set("Idempotency-Key", "k-sse")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len("data: run 1\n\n"))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "data: run 1\n\n" {
		t.Fatalf("first event before the upstream finished: %q, %v", first, err)
	}
	close(up.gate)
	rest, _ := io.ReadAll(resp.Body)
	if string(rest) != "data: end\n\n" {
		t.Errorf("rest of the stream %q", rest)
	}
	again := send(t, srv.URL, "POST", "/events", "", "Idempotency-Key", "k-sse")
	if again.Body != "data: run 1\n\ndata: end\n\n" || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay %v", again)
	}
}

// Trailers reach the first caller and are not stored.
func TestTrailersReachTheFirstCaller(t *testing.T) {
	up := newUpstream(t)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(newBackend(time.Second)))
	get := func() (string, http.Header, http.Header) {
		req, _ := http.NewRequest("POST", srv.URL+"/trailer", nil)
		req.Header.Set("Idempotency-Key", "k-trailer")
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b), resp.Header, resp.Trailer
	}
	body, _, trailer := get()
	if body != "with trailer run=1" || trailer.Get("X-Checksum") != "abc" {
		t.Errorf("first: %q, trailer %v", body, trailer)
	}
	body, header, trailer := get()
	if body != "with trailer run=1" || header.Get("Idempotent-Replayed") != "true" || trailer.Get("X-Checksum") != "" {
		t.Errorf("replay: %q, %v, trailer %v", body, header, trailer)
	}
}

func TestStoredHeadersExcludeCookiesAndHopByHop(t *testing.T) {
	be := newBackend(time.Second)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-Hop", "hop")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Add("Set-Cookie", "a=1")
		w.Header().Add("Set-Cookie", "b=2")
		w.Header().Set("X-Kept", "kept")
		w.Header().Set("X-Denied", "denied")
		w.WriteHeader(201)
		fmt.Fprint(w, "ok")
	})
	upSrv := startUpstreamHandler(t, up)
	srv, _ := startProxy(t, upSrv, proxy.BackendStore(be), func(c *proxy.Config) { c.StoredHeaderDeny = []string{"X-Denied"} })
	first := send(t, srv.URL, "POST", "/", "", "Idempotency-Key", "k-hdr")
	again := send(t, srv.URL, "POST", "/", "", "Idempotency-Key", "k-hdr")
	if len(first.Header.Values("Set-Cookie")) != 2 || first.Header.Get("X-Denied") != "denied" {
		t.Errorf("first caller: %v", first.Header)
	}
	if again.Header.Get("Set-Cookie") != "" || again.Header.Get("X-Denied") != "" || again.Header.Get("X-Kept") != "kept" {
		t.Errorf("replay: %v", again.Header)
	}
	rec, _ := be.record(t, "default", "k-hdr")
	for name := range rec.Response.Headers {
		switch http.CanonicalHeaderKey(name) {
		case "Set-Cookie", "Connection", "X-Hop", "Keep-Alive", "Content-Length", "Transfer-Encoding", "X-Denied":
			t.Errorf("stored %s", name)
		}
	}
	if rec.Response.Headers["X-Kept"] != "kept" {
		t.Errorf("stored headers %v", rec.Response.Headers)
	}
}

func TestNamespacesFromHeader(t *testing.T) {
	up := newUpstream(t)
	be := newBackend(time.Second)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(be), func(c *proxy.Config) { c.NamespaceHeader = "X-Tenant" })

	rep := send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "shared")
	if slug := problem(t, rep, 401); slug != httpidem.ProblemMissingIdentity || !strings.Contains(rep.Header.Get("WWW-Authenticate"), "X-Tenant") {
		t.Errorf("no tenant: %s %v", slug, rep.Header)
	}
	for _, bad := range []string{"Acme", "-acme", "a b", strings.Repeat("a", 64)} {
		if slug := problem(t, send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "shared", "X-Tenant", bad), 400); slug != httpidem.ProblemInvalidNamespace {
			t.Errorf("tenant %q: %s", bad, slug)
		}
	}
	if n := up.TotalRuns(); n != 0 {
		t.Errorf("upstream ran %d times", n)
	}
	if rep := send(t, srv.URL, "POST", "/echo", ""); rep.Status != 200 {
		t.Errorf("a key-less request needs no tenant: %v", rep)
	}

	// Two callers, one key string: two executions, each replays its own.
	a1 := send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "shared", "X-Tenant", "acme")
	b1 := send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "shared", "X-Tenant", "globex")
	a2 := send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "shared", "X-Tenant", "acme")
	b2 := send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "shared", "X-Tenant", "globex")
	if a1.Body != "created run=1 tenant=acme len=0" || b1.Body != "created run=2 tenant=globex len=0" {
		t.Errorf("first requests: %q, %q", a1.Body, b1.Body)
	}
	if a2.Body != a1.Body || b2.Body != b1.Body || a2.Header.Get("Idempotent-Replayed") != "true" || b2.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replays crossed callers: acme %q, globex %q", a2.Body, b2.Body)
	}
	// A different request under the same key string is each caller's own
	// business: no 422 across namespaces.
	if rep := send(t, srv.URL, "POST", "/echo", "other", "Idempotency-Key", "shared", "X-Tenant", "initech"); rep.Status != 200 {
		t.Errorf("third caller: %v", rep)
	}
	for _, ns := range []string{"acme", "globex", "initech"} {
		if _, ok := be.record(t, ns, "shared"); !ok {
			t.Errorf("no record in namespace %s", ns)
		}
	}
}

func TestEveryProxyErrorIsProblemJSON(t *testing.T) {
	up := newUpstream(t)
	be := newBackend(time.Second)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(be), func(c *proxy.Config) {
		c.RequireKey = true
		c.NamespaceHeader = "X-Tenant"
		c.MaxRequestBytes = 10
	})
	dead, _ := startProxy(t, deadURL(t), proxy.BackendStore(be))
	send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "k-done", "X-Tenant", "t")
	for _, tc := range []struct {
		name    string
		base    string
		status  int
		body    string
		headers []string
	}{
		{"missing key", srv.URL, 400, "", []string{"X-Tenant", "t"}},
		{"invalid key", srv.URL, 400, "", []string{"Idempotency-Key", "a b", "X-Tenant", "t"}},
		{"missing namespace", srv.URL, 401, "", []string{"Idempotency-Key", "k"}},
		{"invalid namespace", srv.URL, 400, "", []string{"Idempotency-Key", "k", "X-Tenant", "T"}},
		{"body too large", srv.URL, 413, "01234567890", []string{"Idempotency-Key", "k", "X-Tenant", "t"}},
		{"fingerprint mismatch", srv.URL, 422, "x", []string{"Idempotency-Key", "k-done", "X-Tenant", "t"}},
		{"upstream unreachable", dead.URL, 502, "", []string{"Idempotency-Key", "k"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			problem(t, send(t, tc.base, "POST", "/ok", tc.body, tc.headers...), tc.status)
		})
	}
}

func TestMetrics(t *testing.T) {
	up := newUpstream(t)
	reg := prometheus.NewRegistry()
	srv, p := startProxy(t, up.srv.URL, proxy.BackendStore(newBackend(time.Second)), func(c *proxy.Config) {
		c.Registry = reg
		c.MaxStoredBodyBytes = 100
	})
	send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "m1")         // forwarded
	send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "m1")         // replayed
	send(t, srv.URL, "POST", "/ok", "x", "Idempotency-Key", "m1")        // mismatch
	send(t, srv.URL, "POST", "/status/500", "", "Idempotency-Key", "m2") // released
	send(t, srv.URL, "POST", "/big?n=500", "", "Idempotency-Key", "m3")  // forwarded, body omitted
	send(t, srv.URL, "GET", "/echo", "")                                 // passthrough
	send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "a b")        // error
	s := p.Stats()
	if s != (proxy.Stats{Forwarded: 2, Replayed: 1, Mismatch: 1, Released: 1, Passthrough: 1, Error: 1}) {
		t.Errorf("stats %+v", s)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]bool{}
	for _, mf := range mfs {
		byName[mf.GetName()] = true
		if mf.GetName() == "idem_proxy_stored_response_bytes" {
			h := mf.GetMetric()[0].GetHistogram()
			if h.GetSampleCount() != 2 || h.GetSampleSum() != float64(len("created run=1 tenant= len=0")) {
				t.Errorf("stored bytes: %d samples, sum %v", h.GetSampleCount(), h.GetSampleSum())
			}
		}
		if mf.GetName() == "idem_proxy_upstream_duration_seconds" && mf.GetMetric()[0].GetHistogram().GetSampleCount() != 4 {
			t.Errorf("upstream duration samples %d, want 4", mf.GetMetric()[0].GetHistogram().GetSampleCount())
		}
	}
	for _, name := range []string{"idem_proxy_requests_total", "idem_proxy_upstream_duration_seconds", "idem_proxy_stored_response_bytes"} {
		if !byName[name] {
			t.Errorf("metric %s missing", name)
		}
	}
	want := map[string]float64{"forwarded": 2, "replayed": 1, "conflict": 0, "mismatch": 1, "expired": 0, "missing_key": 0, "released": 1, "passthrough": 1, "error": 1}
	for _, mf := range mfs {
		if mf.GetName() != "idem_proxy_requests_total" {
			continue
		}
		if len(mf.GetMetric()) != len(want) {
			t.Errorf("idem_proxy_requests_total has %d series, want %d", len(mf.GetMetric()), len(want))
		}
		for _, m := range mf.GetMetric() {
			outcome := m.GetLabel()[0].GetValue()
			if got := m.GetCounter().GetValue(); got != want[outcome] {
				t.Errorf("idem_proxy_requests_total{outcome=%q} = %v, want %v", outcome, got, want[outcome])
			}
		}
	}
}

func TestConfigValidate(t *testing.T) {
	err := proxy.Config{
		Upstream:        "ftp://x",
		UpstreamTimeout: -1,
		Policy: proxy.Policy{
			Lease:              time.Hour,
			ReleaseStatuses:    "5xx,abc",
			FingerprintHeaders: []string{"bad header"},
		},
	}.Validate()
	if !errors.Is(err, proxy.ErrInvalidConfig) {
		t.Fatalf("Validate: %v", err)
	}
	for _, want := range []string{"Upstream", "Store", "Lease", "UpstreamTimeout", "ReleaseStatuses", "FingerprintHeaders"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate does not report %s: %v", want, err)
		}
	}
	for _, bad := range []string{"", "127.0.0.1:9000", "http://", "http://h/#frag", "://x"} {
		cfg := proxy.DefaultConfig()
		cfg.Upstream, cfg.Store = bad, proxy.BackendStore(newBackend(0))
		if _, err := proxy.New(cfg); !errors.Is(err, proxy.ErrInvalidConfig) {
			t.Errorf("Upstream %q: %v", bad, err)
		}
	}
	cfg := proxy.DefaultConfig()
	cfg.Upstream, cfg.Store = "https://api.internal:8443/v2", proxy.BackendStore(newBackend(0))
	if err := cfg.Validate(); err != nil {
		t.Errorf("DefaultConfig: %v", err)
	}
}

func startUpstreamHandler(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestForwardingHeaders(t *testing.T) {
	up := newUpstream(t)
	edge, _ := startProxy(t, up.srv.URL, proxy.BackendStore(newBackend(time.Second)))
	inner, _ := startProxy(t, up.srv.URL, proxy.BackendStore(newBackend(time.Second)), func(c *proxy.Config) { c.XForwarded = false })
	for _, tc := range []struct {
		name, base, want string
	}{
		{"XForwarded replaces the caller's claim", edge.URL, `"forwarded_for":"127.0.0.1"`},
		{"without XForwarded it passes untouched", inner.URL, `"forwarded_for":"203.0.113.9"`},
	} {
		for _, key := range []string{"", "k-xff-" + tc.base[len(tc.base)-5:]} {
			headers := []string{"X-Forwarded-For", "203.0.113.9"}
			if key != "" {
				headers = append(headers, "Idempotency-Key", key)
			}
			if rep := send(t, tc.base, "POST", "/echo", "x", headers...); !strings.Contains(rep.Body, tc.want) {
				t.Errorf("%s (key %q): %s", tc.name, key, rep.Body)
			}
		}
	}
}

// TestNamespacesFromAuthorization: without a namespace header or a client
// certificate, callers are named by a keyed hash of their Authorization, so
// alice's replay never reaches mallory; only callers with no Authorization
// share "default".
func TestNamespacesFromAuthorization(t *testing.T) {
	up := newUpstream(t)
	be := newBackend(time.Second)
	key := []byte("0123456789abcdef0123456789abcdef")
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(be), func(c *proxy.Config) { c.AuthorizationKey = key })

	alice1 := send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "abc", "Authorization", "Bearer alice")
	mallory := send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "abc", "Authorization", "Bearer mallory")
	alice2 := send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "abc", "Authorization", "Bearer alice")
	if alice1.Status != 201 || mallory.Status != 201 || mallory.Header.Get("Idempotent-Replayed") == "true" || mallory.Body == alice1.Body {
		t.Fatalf("mallory got alice's response: alice %v, mallory %v", alice1, mallory)
	}
	if alice2.Body != alice1.Body || alice2.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("alice's retry did not replay her response: %v then %v", alice1, alice2)
	}
	anon1 := send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "abc")
	anon2 := send(t, srv.URL, "POST", "/ok", "", "Idempotency-Key", "abc")
	if anon2.Body != anon1.Body || anon2.Header.Get("Idempotent-Replayed") != "true" || anon1.Body == alice1.Body || anon1.Body == mallory.Body {
		t.Fatalf("callers without Authorization: %v then %v", anon1, anon2)
	}
	ns := httpidem.AuthorizationNamespace(key, []string{"Bearer alice"})
	if !httpidem.ValidNamespace(ns) || strings.Contains(ns, "alice") {
		t.Fatalf("namespace %q", ns)
	}
	for _, n := range []string{ns, httpidem.AuthorizationNamespace(key, []string{"Bearer mallory"}), "default"} {
		if _, ok := be.record(t, n, "abc"); !ok {
			t.Errorf("no record in namespace %s", n)
		}
	}
	if other := httpidem.AuthorizationNamespace([]byte("another key of thirty-two bytes!"), []string{"Bearer alice"}); other == ns {
		t.Error("the namespace does not depend on the key")
	}
}

// TestClientFencingTokenNeverReachesUpstream: the proxy removes a
// client-sent Idempotency-Fencing-Token from key-less requests and replaces
// it with its own on keyed ones.
func TestClientFencingTokenNeverReachesUpstream(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	target := startUpstreamHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, strings.Join(r.Header.Values("Idempotency-Fencing-Token"), ","))
		mu.Unlock()
		w.WriteHeader(200)
	}))
	srv, _ := startProxy(t, target, proxy.BackendStore(newBackend(time.Second)))
	forged := "18446744073709551615"
	send(t, srv.URL, "POST", "/x", "", "Idempotency-Fencing-Token", forged)
	send(t, srv.URL, "GET", "/x", "", "Idempotency-Fencing-Token", forged)
	send(t, srv.URL, "POST", "/x", "", "Idempotency-Key", "k1", "Idempotency-Fencing-Token", forged)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 || seen[0] != "" || seen[1] != "" || seen[2] == "" || seen[2] == forged || strings.Contains(seen[2], ",") {
		t.Fatalf("fencing tokens the upstream saw: %q (want none, none, the proxy's own)", seen)
	}
}

// A namespace whose policy caps leases below the proxy's own: the proxy
// reserves with the policy's max and heartbeats within it, so a slow
// request keeps its key past that max and runs once. Both ways the store
// can refuse the longer lease are covered: the state machine's answer (an
// in-process backend) and a node's INVALID_ARGUMENT forwarded as text (a
// router's backend).
func TestPolicyMaxLeaseCapsTheProxyLease(t *testing.T) {
	for _, forwarded := range []bool{false, true} {
		t.Run(fmt.Sprintf("forwarded=%v", forwarded), func(t *testing.T) {
			up := newUpstream(t)
			be := newBackend(10 * time.Millisecond)
			maxLease := time.Second
			if _, err := be.SetPolicy(t.Context(), &fsm.Command{Op: fsm.OpSetPolicy, Namespace: "acme",
				Policy: &fsm.Policy{MaxLease: int64(maxLease)}}); err != nil {
				t.Fatal(err)
			}
			if forwarded {
				be.SetApplyError(func(cmd *fsm.Command) error {
					if cmd.Op == fsm.OpReserve && cmd.Lease > int64(maxLease) {
						return &backend.Error{Code: contract.CodeInvalidArgument, Message: fmt.Sprintf(
							"lease_ms %d exceeds the max_lease_ms %d of namespace %q's policy: ask for at most that, or leave lease_ms out for the namespace's default",
							cmd.Lease/1e6, maxLease.Milliseconds(), cmd.Namespace)}
					}
					return nil
				})
			}
			srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(be), func(c *proxy.Config) { c.NamespaceHeader = "X-Tenant" })
			done := make(chan reply, 1)
			go func() {
				rep, _ := trySend(srv.URL, "POST", "/slow", "x", "Idempotency-Key", "k-cap", "X-Tenant", "acme")
				done <- rep
			}()
			<-up.started
			// Past three of the policy's leases, only heartbeats within it
			// keep the key.
			testutil.Eventually(t, 30*time.Second, "heartbeats past the policy's max lease", func() (bool, string) {
				n := be.Calls(fsm.OpHeartbeat)
				return n >= 9, fmt.Sprintf("%d heartbeats", n)
			})
			problem(t, send(t, srv.URL, "POST", "/slow", "x", "Idempotency-Key", "k-cap", "X-Tenant", "acme"), 409)
			close(up.gate)
			if rep := <-done; rep.Status != 201 {
				t.Fatalf("first: %v", rep)
			}
			if n := up.Runs("k-cap"); n != 1 {
				t.Errorf("upstream ran %d times", n)
			}
		})
	}
}

// TestReplayLeavesOutPerResponseHeaders: a replay is a new message, so the
// server dates and frames it; a stored Date, Content-Length,
// Transfer-Encoding or Connection (and what it names) is never replayed,
// even from a record that holds them (completed through the JSON API).
func TestReplayLeavesOutPerResponseHeaders(t *testing.T) {
	const stale = "Mon, 01 Jan 2001 00:00:00 GMT"
	be := newBackend(time.Second)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Date", stale)
		w.Header().Set("X-Kept", "kept")
		w.WriteHeader(201)
		fmt.Fprint(w, "ok")
	})
	srv, _ := startProxy(t, startUpstreamHandler(t, up), proxy.BackendStore(be))
	first := send(t, srv.URL, "POST", "/", "", "Idempotency-Key", "k-date")
	rec, _ := be.record(t, "default", "k-date")
	if first.Status != 201 || rec.Response == nil {
		t.Fatalf("first: %d %v", first.Status, rec)
	}
	if _, ok := rec.Response.Headers["Date"]; ok {
		t.Errorf("Date stored: %v", rec.Response.Headers)
	}
	// The same request's record, completed by another producer with the
	// per-response headers in it.
	ctx := t.Context()
	apply := func(cmd *fsm.Command) {
		t.Helper()
		if _, err := be.Apply(ctx, cmd); err != nil {
			t.Fatal(err)
		}
	}
	apply(&fsm.Command{Op: fsm.OpDelete, Namespace: "default", Key: "k-date"})
	owner := "owner-token-replay-1"
	apply(&fsm.Command{Op: fsm.OpReserve, Namespace: "default", Key: "k-date", Fingerprint: rec.Fingerprint, OwnerToken: owner, Lease: int64(time.Minute)})
	apply(&fsm.Command{Op: fsm.OpComplete, Namespace: "default", Key: "k-date", OwnerToken: owner, Retention: int64(time.Hour),
		Response: &fsm.Response{Status: 201, Body: []byte("ok"), Headers: map[string]string{
			"Date": stale, "Content-Length": "999", "Transfer-Encoding": "chunked", "Connection": "X-Hop", "X-Hop": "1", "X-Kept": "kept",
		}}})
	again := send(t, srv.URL, "POST", "/", "", "Idempotency-Key", "k-date")
	if again.Status != 201 || again.Body != "ok" || again.Header.Get("Idempotent-Replayed") != "true" || again.Header.Get("X-Kept") != "kept" {
		t.Fatalf("replay: %d %q %v", again.Status, again.Body, again.Header)
	}
	if d := again.Header.Values("Date"); len(d) != 1 || d[0] == stale {
		t.Errorf("replay Date %q, want one, the replay's own", d)
	}
	if again.Header.Get("X-Hop") != "" || again.Header.Get("Content-Length") == "999" {
		t.Errorf("replay headers %v", again.Header)
	}
}
