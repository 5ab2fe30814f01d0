package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/internal/wire"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// fakeClock is a settable wall clock in Unix nanoseconds.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	// A start with fractional seconds, so that time formatting is exercised.
	c.ns.Store(time.Date(2025, 1, 2, 3, 4, 5, 500_000_000, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) Now() int64              { return c.ns.Load() }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// newMemBackend is the one in-memory Backend (backend.Mem) on the test's
// clock, with a one-second skew margin.
func newMemBackend(clock *fakeClock) *backend.Mem {
	return backend.NewMem(backend.MemConfig{Now: clock.Now, SkewMargin: time.Second})
}

// errBackend fails every call with err, or answers result, or panics.
type errBackend struct {
	err    error
	result fsm.Result
	panics bool
}

func (b *errBackend) Apply(context.Context, *fsm.Command) (fsm.Result, error) {
	if b.panics {
		panic("errBackend: boom")
	}
	return b.result, b.err
}

func (b *errBackend) Get(context.Context, string, string) (fsm.Record, bool, error) {
	if b.panics {
		panic("errBackend: boom")
	}
	return fsm.Record{}, false, b.err
}

func (b *errBackend) Ready(context.Context) error { return b.err }

func (b *errBackend) List(context.Context, backend.ListQuery) (backend.ListPage, error) {
	if b.panics {
		panic("errBackend: boom")
	}
	return backend.ListPage{}, b.err
}

// grpcBackend forwards to an idem gRPC server, as a router does: it shows
// that codes survive a hop.
type grpcBackend struct{ c idemv1.IdempotencyClient }

func (b grpcBackend) Apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, error) {
	var res fsm.Result
	var err error
	switch cmd.Op {
	case fsm.OpReserve:
		var r *idemv1.ReserveResponse
		r, err = b.c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: cmd.Namespace, Key: cmd.Key,
			Fingerprint: cmd.Fingerprint, LeaseMs: cmd.Lease / 1e6, OwnerToken: cmd.OwnerToken})
		if err == nil {
			res = wire.ReserveFromProto(r)
		}
	case fsm.OpHeartbeat:
		var r *idemv1.HeartbeatResponse
		r, err = b.c.Heartbeat(ctx, &idemv1.HeartbeatRequest{Namespace: cmd.Namespace, Key: cmd.Key,
			OwnerToken: cmd.OwnerToken, LeaseMs: cmd.Lease / 1e6})
		if err == nil {
			res = fsm.Result{Outcome: fsm.OutcomeOK, LeaseExpiresAt: idemv1.TimeFromProto(r.GetLeaseExpiresAt())}
		}
	case fsm.OpComplete:
		var r *idemv1.CompleteResponse
		r, err = b.c.Complete(ctx, &idemv1.CompleteRequest{Namespace: cmd.Namespace, Key: cmd.Key, OwnerToken: cmd.OwnerToken,
			Response: wire.ResponseToProto(cmd.Response), RetentionS: cmd.Retention / 1e9})
		if err == nil {
			res = fsm.Result{Outcome: fsm.OutcomeOK, CompletedAt: idemv1.TimeFromProto(r.GetCompletedAt()), ExpiresAt: idemv1.TimeFromProto(r.GetExpiresAt())}
		}
	case fsm.OpRelease:
		_, err = b.c.Release(ctx, &idemv1.ReleaseRequest{Namespace: cmd.Namespace, Key: cmd.Key, OwnerToken: cmd.OwnerToken})
		res = fsm.Result{Outcome: fsm.OutcomeOK}
	default:
		return fsm.Result{Outcome: fsm.OutcomeInvalid}, nil
	}
	if err != nil {
		return fsm.Result{}, wire.BackendError(err)
	}
	return res, nil
}

func (b grpcBackend) Get(ctx context.Context, namespace, key string) (fsm.Record, bool, error) {
	r, err := b.c.Get(ctx, &idemv1.GetRequest{Namespace: namespace, Key: key})
	if status.Code(err) == codes.NotFound {
		return fsm.Record{}, false, nil
	}
	if err != nil {
		return fsm.Record{}, false, wire.BackendError(err)
	}
	return wire.RecordFromProto(r), true, nil
}

func (b grpcBackend) Ready(context.Context) error { return nil }

// List is not forwarded by grpcBackend: its tests are about the
// Idempotency service's codes.
func (b grpcBackend) List(context.Context, backend.ListQuery) (backend.ListPage, error) {
	return backend.ListPage{}, &backend.Error{Code: CodeInternal, Message: "grpcBackend does not list"}
}

// testLogWriter routes the server's log to t.Log.
type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// harness is a Server over backend, served on real loopback sockets: HTTP
// through httptest, gRPC on 127.0.0.1:0.
type harness struct {
	t        *testing.T
	srv      *Server
	cfg      Config
	reg      *prometheus.Registry
	httpURL  string
	grpcAddr string
	grpc     idemv1.IdempotencyClient
	admin    idemv1.AdminClient
	logs     *testutil.Buffer
}

func newHarness(t *testing.T, backend Backend, mod func(*Config)) *harness {
	t.Helper()
	logs := &testutil.Buffer{}
	cfg := DefaultConfig()
	cfg.Backend = backend
	cfg.Registry = prometheus.NewRegistry()
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(testLogWriter{t}, logs), &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Version = "test-1.2.3"
	if mod != nil {
		mod(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	hs := httptest.NewServer(srv.HTTPHandler())
	t.Cleanup(hs.Close)

	lis := listenLoopback(t)
	gs := srv.NewGRPCServer()
	idemv1.RegisterAdminServer(gs, srv.KeysAdmin())
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.GracefulStop)
	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(cfg.GRPCMaxMessageBytes()), grpc.MaxCallRecvMsgSize(cfg.GRPCMaxMessageBytes())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &harness{t: t, srv: srv, cfg: cfg, reg: cfg.Registry, httpURL: hs.URL, grpcAddr: lis.Addr().String(),
		grpc: idemv1.NewIdempotencyClient(conn), admin: idemv1.NewAdminClient(conn), logs: logs}
}

// reply is one HTTP answer.
type reply struct {
	status int
	header http.Header
	raw    []byte
	body   map[string]any
}

func (r reply) String() string { return string(r.raw) }

// errCode is the error code of an error body ("" if none).
func (r reply) errCode() string {
	e, _ := r.body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func (r reply) errMessage() string {
	e, _ := r.body["error"].(map[string]any)
	msg, _ := e["message"].(string)
	return msg
}

func (h *harness) do(method, path, body string) reply {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	return h.doReader(method, path, rd)
}

func (h *harness) doReader(method, path string, body io.Reader) reply {
	h.t.Helper()
	req, err := http.NewRequestWithContext(h.t.Context(), method, h.httpURL+path, body)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("%s %s: read: %v", method, path, err)
	}
	r := reply{status: resp.StatusCode, header: resp.Header, raw: raw}
	if len(raw) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&r.body); err != nil {
			h.t.Fatalf("%s %s: answer is not a JSON object: %v: %s", method, path, err, raw)
		}
	}
	return r
}

// expectError checks an error answer: status, code, the JSON error body and
// a message that says something.
func (h *harness) expectError(r reply, status int, code Code) {
	h.t.Helper()
	if r.status != status || r.errCode() != string(code) {
		h.t.Fatalf("got %d %s, want %d %s: %s", r.status, r.errCode(), status, code, r)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		h.t.Fatalf("Content-Type %q, want application/json", ct)
	}
	if len(r.body) != 1 || len(r.body["error"].(map[string]any)) != 2 || r.errMessage() == "" {
		h.t.Fatalf("error body is not {\"error\":{\"code\",\"message\"}} with a message: %s", r)
	}
}

// expectServing checks that the server still answers a good request.
func (h *harness) expectServing() {
	h.t.Helper()
	if r := h.do("GET", "/healthz", ""); r.status != http.StatusOK {
		h.t.Fatalf("/healthz after a bad request: %d %s", r.status, r)
	}
	if r := h.do("POST", "/v1/namespaces/alive/keys/k:reserve", ""); r.status != http.StatusOK {
		h.t.Fatalf("reserve after a bad request: %d %s", r.status, r)
	}
}

// keys returns the sorted field names of a JSON object.
func keys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }

func str(t *testing.T, m map[string]any, field string) string {
	t.Helper()
	s, ok := m[field].(string)
	if !ok {
		t.Fatalf("field %q is %T (%v), want a string; body %v", field, m[field], m[field], m)
	}
	return s
}

// rfc3339 formats Unix nanoseconds the way the API must.
func rfc3339(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}
