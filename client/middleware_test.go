package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemtest"
	"github.com/idem-dev/idem/internal/testutil"
)

// mwReply is a response read in full.
type mwReply struct {
	Status int
	Header http.Header
	Body   string
}

func post(t *testing.T, url, key, body string, headers ...string) mwReply {
	t.Helper()
	rep, err := tryPost(t.Context(), url, key, body, headers...)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return rep
}

func tryPost(ctx context.Context, url, key, body string, headers ...string) (mwReply, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		return mwReply{}, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return mwReply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return mwReply{}, err
	}
	return mwReply{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}, nil
}

// serve runs h on a loopback test server whose panic logs go to the test.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(t.Output(), "http: ", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

func isProblem(t *testing.T, rep mwReply, status int) string {
	t.Helper()
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	if rep.Status != status || rep.Header.Get("Content-Type") != "application/problem+json" ||
		json.Unmarshal([]byte(rep.Body), &p) != nil || p.Status != status {
		t.Fatalf("want a %d problem, got %d %q %q", status, rep.Status, rep.Header.Get("Content-Type"), rep.Body)
	}
	return strings.TrimPrefix(p.Type, "https://idem.dev/problems/")
}

// counter counts handler runs per idempotency key.
type counter struct {
	mu   sync.Mutex
	runs map[string]int
}

func (c *counter) inc(r *http.Request) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = make(map[string]int)
	}
	c.runs[r.Header.Get("Idempotency-Key")]++
	return c.runs[r.Header.Get("Idempotency-Key")]
}

func (c *counter) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[key]
}

// Every way a handler can write gives the response it gives without the
// middleware, stored once and replayed identically.
func TestMiddlewareWriteStyles(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	big := strings.Repeat("0123456789abcdef", 4096) // 64 KiB
	for _, tc := range []struct {
		name   string
		status int
		write  func(t *testing.T, w http.ResponseWriter)
	}{
		{"Write", 200, func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte("hello"))
		}},
		{"WriteHeader then Write", 201, func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("X-Custom", "custom")
			w.Header().Set("Location", "/things/1")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":1}`))
			w.Header().Set("X-Too-Late", "ignored") // after WriteHeader: not sent, not stored
		}},
		{"Flush", 202, func(t *testing.T, w http.ResponseWriter) {
			w.WriteHeader(http.StatusAccepted)
			_, _ = w.Write([]byte("part1,"))
			w.(http.Flusher).Flush()
			_, _ = w.Write([]byte("part2"))
			if err := http.NewResponseController(w).Flush(); err != nil {
				t.Errorf("ResponseController.Flush: %v", err)
			}
		}},
		{"ReadFrom", 200, func(t *testing.T, w http.ResponseWriter) {
			rf, ok := w.(io.ReaderFrom)
			if !ok {
				t.Fatal("the writer is not an io.ReaderFrom")
			}
			w.Header().Set("Content-Type", "application/octet-stream")
			if n, err := rf.ReadFrom(strings.NewReader(big)); err != nil || n != int64(len(big)) {
				t.Errorf("ReadFrom: %d, %v", n, err)
			}
		}},
		{"io.Copy", 200, func(t *testing.T, w http.ResponseWriter) {
			_, _ = io.Copy(w, io.LimitReader(strings.NewReader(big), 1000))
		}},
		{"many small writes, sniffed type", 200, func(t *testing.T, w http.ResponseWriter) {
			for i := range 100 {
				fmt.Fprintf(w, "<p>%d</p>", i)
			}
		}},
		{"WriteHeader only", 204, func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("X-Custom", "none")
			w.WriteHeader(http.StatusNoContent)
		}},
		{"nothing written", 200, func(t *testing.T, w http.ResponseWriter) {}},
		{"1xx first", 201, func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("after hints"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs counter
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.inc(r)
				tc.write(t, w)
			})
			plain := post(t, serve(t, handler), "", "body")
			url := serve(t, client.Middleware(c)(handler))
			key := "write-" + strings.ReplaceAll(tc.name, " ", "-")
			first := post(t, url, key, "body")
			again := post(t, url, key, "body")
			if first.Status != tc.status || plain.Status != tc.status {
				t.Fatalf("status: plain %d, middleware %d, want %d", plain.Status, first.Status, tc.status)
			}
			if first.Body != plain.Body || again.Body != first.Body || again.Status != first.Status {
				t.Errorf("bodies: plain %d bytes, first %d, replay %d (status %d)", len(plain.Body), len(first.Body), len(again.Body), again.Status)
			}
			for _, h := range []string{"Content-Type", "X-Custom", "Location", "X-Too-Late"} {
				if p, f, a := plain.Header.Get(h), first.Header.Get(h), again.Header.Get(h); p != f || f != a {
					t.Errorf("%s: plain %q, first %q, replay %q", h, p, f, a)
				}
			}
			if first.Header.Get("Idempotent-Replayed") != "" || again.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("Idempotent-Replayed: first %q, replay %q", first.Header.Get("Idempotent-Replayed"), again.Header.Get("Idempotent-Replayed"))
			}
			exp, err := http.ParseTime(again.Header.Get("Idempotency-Key-Expires"))
			if err != nil || !exp.After(time.Now()) {
				t.Errorf("replay's Idempotency-Key-Expires %q: %v", again.Header.Get("Idempotency-Key-Expires"), err)
			}
			if f := first.Header.Get("Idempotency-Key-Expires"); f != "" && f != again.Header.Get("Idempotency-Key-Expires") {
				t.Errorf("Idempotency-Key-Expires: first %q, replay %q", f, again.Header.Get("Idempotency-Key-Expires"))
			}
			if n := runs.get(key); n != 1 {
				t.Errorf("handler ran %d times", n)
			}
		})
	}
}

func TestMiddlewarePanicReleasesAndRepanics(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	for i, value := range []any{"boom", http.ErrAbortHandler} {
		t.Run(fmt.Sprint(value), func(t *testing.T) {
			var runs counter
			h := client.Middleware(c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.inc(r) == 1 {
					_, _ = w.Write([]byte("half a response"))
					panic(value)
				}
				w.WriteHeader(http.StatusCreated)
			}))
			key := fmt.Sprintf("panic-%d", i)
			// Called directly: the same panic value comes out.
			func() {
				defer func() {
					if got := recover(); got != value {
						t.Errorf("recovered %v, want %v", got, value)
					}
				}()
				req := httptest.NewRequest("POST", "/", strings.NewReader("x"))
				req.Header.Set("Idempotency-Key", key)
				h.ServeHTTP(httptest.NewRecorder(), req)
			}()
			// The key was released: the retry runs, then replays.
			url := serve(t, h)
			if rep := post(t, url, key, "x"); rep.Status != 201 || rep.Header.Get("Idempotent-Replayed") != "" {
				t.Errorf("retry after the panic: %d %v", rep.Status, rep.Header)
			}
			if rep := post(t, url, key, "x"); rep.Status != 201 || rep.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("after the retry: %d %v", rep.Status, rep.Header)
			}
			if n := runs.get(key); n != 2 {
				t.Errorf("handler ran %d times, want 2", n)
			}
		})
	}
	// Through a real server, the caller of the panicking request gets no
	// response, and the key is not left reserved.
	var runs counter
	url := serve(t, client.Middleware(c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.inc(r) == 1 {
			panic("boom over the wire")
		}
	})))
	if _, err := tryPost(t.Context(), url, "panic-wire", "x"); err == nil {
		t.Error("a panicking handler produced a response")
	}
	if rep := post(t, url, "panic-wire", "x"); rep.Status != 200 || runs.get("panic-wire") != 2 {
		t.Errorf("retry: %d, %d runs", rep.Status, runs.get("panic-wire"))
	}
}

func TestMiddlewareFencingTokenAndLease(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	url := serve(t, client.Middleware(c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := client.FencingToken(r.Context())
		l, lok := client.LeaseFromContext(r.Context())
		fmt.Fprintf(w, "%v %d %s %v %d", ok, tok, r.Header.Get("Idempotency-Fencing-Token"), lok, l.FencingToken)
	})))
	rep := post(t, url, "fence", "x", "Idempotency-Fencing-Token", "999999") // a caller cannot choose its token
	var ok, lok bool
	var tok, ltok uint64
	var hdr string
	if _, err := fmt.Sscanf(rep.Body, "%t %d %s %t %d", &ok, &tok, &hdr, &lok, &ltok); err != nil {
		t.Fatalf("%q: %v", rep.Body, err)
	}
	if !ok || !lok || tok == 0 || tok == 999999 || hdr != strconv.FormatUint(tok, 10) || ltok != tok {
		t.Errorf("handler saw %q", rep.Body)
	}
	rec, err := c.Get(t.Context(), "default", "fence")
	if err != nil || rec.FencingToken != tok {
		t.Errorf("stored record %+v, %v; handler's token %d", rec, err, tok)
	}
	if rep := post(t, url, "", "x"); !strings.HasPrefix(rep.Body, "false 0  false 0") {
		t.Errorf("key-less request saw %q", rep.Body)
	}
}

func TestMiddlewareKeysAndNamespaces(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	var runs counter
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "run %d for %s", runs.inc(r), r.Header.Get("X-Tenant"))
	})
	url := serve(t, client.Middleware(c, client.RequireKey(), client.NamespaceHeader("X-Tenant"))(handler))
	isProblem(t, post(t, url, "", "x", "X-Tenant", "acme"), 400)
	isProblem(t, post(t, url, "k", "x"), 401)
	isProblem(t, post(t, url, "k", "x", "X-Tenant", "ACME"), 400)
	isProblem(t, post(t, url, "a b", "x", "X-Tenant", "acme"), 400)
	if n := runs.get("k") + runs.get(""); n != 0 {
		t.Fatalf("handler ran %d times", n)
	}
	a1 := post(t, url, "k", "x", "X-Tenant", "acme")
	b1 := post(t, url, "k", "x", "X-Tenant", "globex")
	a2 := post(t, url, "k", "x", "X-Tenant", "acme")
	b2 := post(t, url, "k", "x", "X-Tenant", "globex")
	if a1.Body != "run 1 for acme" || b1.Body != "run 2 for globex" || a2.Body != a1.Body || b2.Body != b1.Body {
		t.Errorf("two callers, one key: %q %q %q %q", a1.Body, b1.Body, a2.Body, b2.Body)
	}
	if slug := isProblem(t, post(t, url, "k", "other body", "X-Tenant", "acme"), 422); slug != "idempotency-key-reused" {
		t.Errorf("reused key: %s", slug)
	}
	// A namespace function overrides the header.
	url2 := serve(t, client.Middleware(c, client.NamespaceFunc(func(r *http.Request) (string, error) {
		if u, _, ok := r.BasicAuth(); ok {
			return u, nil
		}
		return "", errors.New("no credentials")
	}))(handler))
	isProblem(t, post(t, url2, "k2", "x"), 401)
	if rep := post(t, url2, "k2", "x", "Authorization", "Basic dXNlcjpwdw=="); rep.Status != 200 { // user:pw
		t.Errorf("with credentials: %d %q", rep.Status, rep.Body)
	}
	if _, err := c.Get(t.Context(), "user", "k2"); err != nil {
		t.Errorf("record in namespace user: %v", err)
	}
}

func TestMiddlewareReleasesNonFinalStatuses(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	var runs counter
	url := serve(t, client.Middleware(c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch runs.inc(r) {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	})))
	for i, want := range []int{503, 429, 201, 201} {
		if rep := post(t, url, "flaky", "x"); rep.Status != want {
			t.Errorf("request %d: %d, want %d", i+1, rep.Status, want)
		}
	}
	if n := runs.get("flaky"); n != 3 {
		t.Errorf("handler ran %d times, want 3", n)
	}
}

func TestMiddlewareStoreUnavailable(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()}, func(cfg *client.Config) { cfg.MaxAttempts = 2 })
	var runs counter
	url := serve(t, client.Middleware(c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.inc(r) })))
	srv.FailNext(idemtest.MethodReserve, -1, codes.Unavailable)
	rep := post(t, url, "down", "x")
	if slug := isProblem(t, rep, 503); slug != "store-unavailable" || rep.Header.Get("Retry-After") == "" {
		t.Errorf("store down: %s, Retry-After %q", slug, rep.Header.Get("Retry-After"))
	}
	if runs.get("down") != 0 {
		t.Error("the handler ran without a reservation")
	}
	srv.FailNext(idemtest.MethodReserve, 0, codes.OK)
	if rep := post(t, url, "down", "x"); rep.Status != 200 || runs.get("down") != 1 {
		t.Errorf("store back: %d", rep.Status)
	}
}

// A caller that hangs up does not abort the work: its retry gets the answer.
func TestMiddlewareCallerGoneStillStores(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	var runs counter
	started, gate, finished := make(chan struct{}), make(chan struct{}), make(chan struct{})
	url := serve(t, client.Middleware(c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(finished)
		runs.inc(r)
		close(started)
		<-gate
		if err := r.Context().Err(); err != nil {
			t.Errorf("handler context ended with the caller: %v", err)
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("done"))
	})))
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := tryPost(ctx, url, "gone", "x")
		errc <- err
	}()
	<-started
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the cancelled request got an answer")
	}
	close(gate)
	<-finished
	testutil.Eventually(t, 10*time.Second, "the response to be stored", func() (bool, string) {
		rec, err := c.Get(t.Context(), "default", "gone")
		return err == nil && rec.State == client.StateCompleted, fmt.Sprintf("%+v %v", rec, err)
	})
	if rep := post(t, url, "gone", "x"); rep.Status != 201 || rep.Body != "done" || rep.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: %d %q %v", rep.Status, rep.Body, rep.Header)
	}
	if runs.get("gone") != 1 {
		t.Errorf("handler ran %d times", runs.get("gone"))
	}
}

func TestMiddlewareOversizeBodyAndCookies(t *testing.T) {
	srv := startServer(t, idemtest.Config{MaxResponseBytes: 300})
	c := newClient(t, []string{srv.Addr()})
	url := serve(t, client.Middleware(c, func(m *client.MiddlewareConfig) { m.MaxStoredBodyBytes = 200 })(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			http.SetCookie(w, &http.Cookie{Name: "s", Value: "1"})
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			_, _ = w.Write([]byte(strings.Repeat("y", n)))
		})))
	for _, n := range []int{200, 250} { // 250: over ours, under the store's
		key := "big-" + strconv.Itoa(n)
		first := post(t, url+"?n="+strconv.Itoa(n), key, "")
		again := post(t, url+"?n="+strconv.Itoa(n), key, "")
		if len(first.Body) != n || first.Header.Get("Set-Cookie") == "" {
			t.Errorf("n=%d first: %d bytes, Set-Cookie %q", n, len(first.Body), first.Header.Get("Set-Cookie"))
		}
		if again.Header.Get("Set-Cookie") != "" || again.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("n=%d replay headers %v", n, again.Header)
		}
		if omitted := n > 200; omitted != (again.Header.Get("Idempotent-Body-Omitted") == "true") || omitted != (again.Body == "") {
			t.Errorf("n=%d replay: %d bytes, Idempotent-Body-Omitted %q", n, len(again.Body), again.Header.Get("Idempotent-Body-Omitted"))
		}
	}
}

func TestNewMiddlewareValidates(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	_, err := client.NewMiddleware(c, func(m *client.MiddlewareConfig) {
		m.Lease = time.Hour
		m.ReleaseStatuses = "5xx,abc"
		m.NamespaceHeader = "bad header"
	})
	if !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("NewMiddleware: %v", err)
	}
	for _, want := range []string{"Lease", "ReleaseStatuses", "NamespaceHeader"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, err)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("Middleware did not panic on invalid options")
		}
	}()
	client.Middleware(c, client.NamespaceHeader("bad header"))
}
