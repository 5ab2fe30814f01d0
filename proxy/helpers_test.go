package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/proxy"
)

// fsmBackend is the one in-memory Backend (backend.Mem) with the faults the
// proxy's tests inject: it fails calls as a store that cannot decide, and
// refuses bodies over maxBody as the API's validation does.
type fsmBackend struct {
	*backend.Mem
	maxBody int

	failAll        atomic.Bool // every Apply: UNAVAILABLE
	failHeartbeats atomic.Bool // heartbeats: UNAVAILABLE
}

// newBackend returns a Mem that stamps skew as the clock-skew margin (0:
// none).
func newBackend(skew time.Duration) *fsmBackend {
	if skew == 0 {
		skew = -1
	}
	b := &fsmBackend{Mem: backend.NewMem(backend.MemConfig{SkewMargin: skew})}
	b.SetApplyError(func(cmd *fsm.Command) error {
		if b.failAll.Load() || (cmd.Op == fsm.OpHeartbeat && b.failHeartbeats.Load()) {
			return &backend.UnavailableError{Reason: "test: no leader"}
		}
		if cmd.Op == fsm.OpComplete && b.maxBody > 0 && len(cmd.Response.Body) > b.maxBody {
			return &backend.Error{Code: contract.CodePayloadTooLarge, Message: "payload too large"}
		}
		return nil
	})
	return b
}

func (b *fsmBackend) record(t *testing.T, namespace, key string) (fsm.Record, bool) {
	t.Helper()
	rec, ok, _ := b.Get(t.Context(), namespace, key)
	return rec, ok
}

// upstream is the service behind the proxy. It counts executions per
// Idempotency-Key (per path for key-less requests) and answers by path.
type upstream struct {
	srv *httptest.Server

	mu      sync.Mutex
	runs    map[string]int
	tokens  map[string][]uint64
	started chan string   // /slow: one send per execution
	gate    chan struct{} // /slow: closed to let them finish
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{runs: make(map[string]int), tokens: make(map[string][]uint64),
		started: make(chan string, 100), gate: make(chan struct{})}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) count(r *http.Request) int {
	id := r.Header.Get("Idempotency-Key")
	if id == "" {
		id = r.Method + " " + r.URL.Path
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.runs[id]++
	if tok, err := strconv.ParseUint(r.Header.Get("Idempotency-Fencing-Token"), 10, 64); err == nil {
		u.tokens[id] = append(u.tokens[id], tok)
	}
	return u.runs[id]
}

// Runs reports how often requests with key (or "METHOD /path" for
// key-less ones) reached the upstream.
func (u *upstream) Runs(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[key]
}

func (u *upstream) Tokens(key string) []uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]uint64(nil), u.tokens[key]...)
}

func (u *upstream) TotalRuns() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, c := range u.runs {
		n += c
	}
	return n
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	run := u.count(r)
	switch {
	case r.URL.Path == "/ok" || strings.HasPrefix(r.URL.Path, "/ok/"):
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Custom", "custom")
		w.Header().Add("X-Multi", "a")
		w.Header().Add("X-Multi", "b")
		w.Header().Set("Set-Cookie", "session="+strconv.Itoa(run))
		w.Header().Set("Location", "/things/"+strconv.Itoa(run))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "created run=%d tenant=%s len=%d", run, r.Header.Get("X-Tenant"), len(body))
	case strings.HasPrefix(r.URL.Path, "/status/"):
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/status/"))
		if code == http.StatusFound {
			w.Header().Set("Location", "/elsewhere")
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, "status %d run=%d", code, run)
	case r.URL.Path == "/fail-once":
		if run == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, "try again")
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "done run=%d", run)
	case r.URL.Path == "/slow":
		u.started <- r.Header.Get("Idempotency-Key")
		select {
		case <-u.gate:
		case <-r.Context().Done():
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "slow run=%d", run)
	case r.URL.Path == "/sleep":
		d, _ := time.ParseDuration(r.URL.Query().Get("d"))
		time.Sleep(d) // the work itself takes this long; no condition is awaited
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "slept run=%d", run)
	case r.URL.Path == "/hang":
		<-r.Context().Done()
	case r.URL.Path == "/stall":
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "partial")
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	case r.URL.Path == "/big":
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(strings.Repeat("x", n)))
	case r.URL.Path == "/events":
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: run %d\n\n", run)
		http.NewResponseController(w).Flush()
		select {
		case <-u.gate:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: end\n\n")
	case r.URL.Path == "/trailer":
		w.Header().Set("Trailer", "X-Checksum")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "with trailer run=%d", run)
		w.Header().Set("X-Checksum", "abc")
	case r.URL.Path == "/echo":
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"method":        r.Method,
			"path":          r.URL.Path,
			"query":         r.URL.RawQuery,
			"key":           r.Header.Get("Idempotency-Key"),
			"fencing_token": r.Header.Get("Idempotency-Fencing-Token"),
			"forwarded_for": r.Header.Get("X-Forwarded-For"),
			"body":          string(body),
			"content_len":   r.ContentLength,
			"run":           run,
		})
	default:
		http.NotFound(w, r)
	}
}

// startProxy serves a Proxy to upstream URL target over store b on a
// loopback test server.
func startProxy(t *testing.T, target string, store proxy.Store, adjust ...func(*proxy.Config)) (*httptest.Server, *proxy.Proxy) {
	t.Helper()
	cfg := proxy.DefaultConfig()
	cfg.Upstream = target
	cfg.Store = store
	cfg.Logger = testutil.Logger(t, slog.LevelDebug)
	cfg.StoreTimeout = 5 * time.Second
	for _, f := range adjust {
		f(&cfg)
	}
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv, p
}

// reply is a response read in full.
type reply struct {
	Status int
	Header http.Header
	Body   string
}

func (r reply) String() string { return fmt.Sprintf("%d %v %q", r.Status, r.Header, r.Body) }

var httpClient = &http.Client{
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Timeout:       30 * time.Second,
}

// send makes one request; headers are name, value pairs.
func send(t *testing.T, base, method, path, body string, headers ...string) reply {
	t.Helper()
	rep, err := trySend(base, method, path, body, headers...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return rep
}

func trySend(base, method, path, body string, headers ...string) (reply, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		return reply{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}, nil
}

// problem checks that rep is an RFC 9457 problem with status and returns
// its type slug.
func problem(t *testing.T, rep reply, status int) string {
	t.Helper()
	if rep.Status != status {
		t.Fatalf("status %d, want %d: %v", rep.Status, status, rep)
	}
	if ct := rep.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json: %v", ct, rep)
	}
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal([]byte(rep.Body), &p); err != nil {
		t.Fatalf("problem body: %v: %q", err, rep.Body)
	}
	if p.Status != status || p.Title == "" || p.Detail == "" || !strings.HasPrefix(p.Type, "https://idem.dev/problems/") {
		t.Fatalf("incomplete problem: %+v", p)
	}
	return strings.TrimPrefix(p.Type, "https://idem.dev/problems/")
}

// deadURL is an http URL nobody listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	return "http://" + addr
}
