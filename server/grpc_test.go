package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/wire"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func contextDeadline() error    { return context.DeadlineExceeded }
func resultInvalid() fsm.Result { return fsm.Result{Outcome: fsm.OutcomeInvalid} }

// expectStatus checks a gRPC error's code and, for idem errors, its
// ErrorInfo reason.
func expectStatus(t *testing.T, err error, code codes.Code, reason Code) *status.Status {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code {
		t.Fatalf("got %v, want code %v", err, code)
	}
	if st.Message() == "" {
		t.Fatalf("status %v has no message", st.Code())
	}
	var gotReason string
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			gotReason = info.GetReason()
		}
	}
	if gotReason != string(reason) {
		t.Fatalf("ErrorInfo reason %q, want %q (%v)", gotReason, reason, err)
	}
	return st
}

// TestGRPCOutcomes runs every RPC through every outcome.
func TestGRPCOutcomes(t *testing.T) {
	clock := newFakeClock()
	b := newMemBackend(clock)
	h := newHarness(t, b, nil)
	ctx := t.Context()
	c := h.grpc
	start := clock.Now()

	r, err := c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "payments", Key: "g:1", Fingerprint: "fp"})
	if err != nil || r.Outcome != idemv1.Outcome_ACQUIRED {
		t.Fatalf("reserve: %v %v", r, err)
	}
	owner, fence := r.OwnerToken, r.FencingToken
	if len(owner) != 22 || fence == 0 || r.LeaseExpiresAt.AsTime().UnixNano() != start+int64(30*time.Second) {
		t.Fatalf("ACQUIRED owner %q fence %d lease %v (want default 30 s)", owner, fence, r.LeaseExpiresAt.AsTime())
	}
	if r.PreviousFencingToken != 0 || r.Response != nil || r.CompletedAt != nil || r.RetryAfterMs != 0 {
		t.Fatalf("ACQUIRED carries fields of other outcomes: %v", r)
	}

	r, err = c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "payments", Key: "g:1", Fingerprint: "fp", OwnerToken: "someone-else-000000"})
	if err != nil || r.Outcome != idemv1.Outcome_IN_PROGRESS || r.RetryAfterMs != 1000 || r.LeaseExpiresAt == nil || r.OwnerToken != "" || r.FencingToken != 0 {
		t.Fatalf("IN_PROGRESS: %v %v", r, err)
	}
	r, err = c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "payments", Key: "g:1", Fingerprint: "other"})
	if err != nil || r.Outcome != idemv1.Outcome_FINGERPRINT_MISMATCH || r.LeaseExpiresAt != nil || r.FencingToken != 0 {
		t.Fatalf("FINGERPRINT_MISMATCH: %v %v", r, err)
	}

	hb, err := c.Heartbeat(ctx, &idemv1.HeartbeatRequest{Namespace: "payments", Key: "g:1", OwnerToken: owner, LeaseMs: 200})
	if err != nil || hb.LeaseExpiresAt.AsTime().UnixNano() != clock.Now()+int64(200*time.Millisecond) {
		t.Fatalf("heartbeat: %v %v", hb, err)
	}
	_, err = c.Heartbeat(ctx, &idemv1.HeartbeatRequest{Namespace: "payments", Key: "g:1", OwnerToken: "someone-else-000000"})
	expectStatus(t, err, codes.FailedPrecondition, CodeNotOwner)

	clock.Advance(200*time.Millisecond + time.Second)
	r, err = c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "payments", Key: "g:1", Fingerprint: "fp", OwnerToken: "someone-else-000000", LeaseMs: 0})
	if err != nil || r.Outcome != idemv1.Outcome_RECLAIMED || r.PreviousFencingToken != fence || r.FencingToken <= fence || r.OwnerToken != "someone-else-000000" {
		t.Fatalf("RECLAIMED: %v %v", r, err)
	}
	fence2 := r.FencingToken
	if b.LastCommand().Lease != int64(30*time.Second) {
		t.Fatalf("lease_ms 0 became %d ns, want the default", b.LastCommand().Lease)
	}
	// The old owner lost the key.
	_, err = c.Complete(ctx, &idemv1.CompleteRequest{Namespace: "payments", Key: "g:1", OwnerToken: owner, Response: &idemv1.StoredResponse{Status: 200}})
	expectStatus(t, err, codes.FailedPrecondition, CodeNotOwner)

	resp := &idemv1.StoredResponse{Status: 201, Headers: map[string]string{"Location": "/orders/1"}, Body: []byte{0, 1, 2, 0xff}}
	cr, err := c.Complete(ctx, &idemv1.CompleteRequest{Namespace: "payments", Key: "g:1", OwnerToken: "someone-else-000000", Response: resp})
	if err != nil || cr.CompletedAt.AsTime().UnixNano() != clock.Now() || cr.ExpiresAt.AsTime().UnixNano() != clock.Now()+int64(86400*time.Second) {
		t.Fatalf("complete (default retention): %v %v", cr, err)
	}
	r, err = c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "payments", Key: "g:1", Fingerprint: "fp"})
	if err != nil || r.Outcome != idemv1.Outcome_COMPLETED || r.FencingToken != fence2 || r.OwnerToken != "" ||
		r.Response.GetStatus() != 201 || string(r.Response.GetBody()) != string(resp.Body) || !maps.Equal(r.Response.GetHeaders(), resp.Headers) ||
		!r.CompletedAt.AsTime().Equal(cr.CompletedAt.AsTime()) || !r.ExpiresAt.AsTime().Equal(cr.ExpiresAt.AsTime()) {
		t.Fatalf("COMPLETED: %v %v", r, err)
	}

	g, err := c.Get(ctx, &idemv1.GetRequest{Namespace: "payments", Key: "g:1"})
	if err != nil || g.State != idemv1.State_STATE_COMPLETED || g.Fingerprint != "fp" || g.FencingToken != fence2 ||
		g.Response.GetStatus() != 201 || g.LeaseExpiresAt != nil || g.CompletedAt == nil || g.ExpiresAt == nil {
		t.Fatalf("Get COMPLETED: %v %v", g, err)
	}
	_, err = c.Release(ctx, &idemv1.ReleaseRequest{Namespace: "payments", Key: "g:1", OwnerToken: "someone-else-000000"})
	expectStatus(t, err, codes.FailedPrecondition, CodeNotOwner)

	// Release, then Get: NotFound.
	r, _ = c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "payments", Key: "g:2"})
	g, err = c.Get(ctx, &idemv1.GetRequest{Namespace: "payments", Key: "g:2"})
	if err != nil || g.State != idemv1.State_STATE_IN_PROGRESS || g.LeaseExpiresAt == nil || g.Response != nil {
		t.Fatalf("Get IN_PROGRESS: %v %v", g, err)
	}
	if _, err := c.Release(ctx, &idemv1.ReleaseRequest{Namespace: "payments", Key: "g:2", OwnerToken: r.OwnerToken}); err != nil {
		t.Fatalf("release: %v", err)
	}
	_, err = c.Get(ctx, &idemv1.GetRequest{Namespace: "payments", Key: "g:2"})
	expectStatus(t, err, codes.NotFound, CodeNotFound)

	// The same metrics as HTTP, api="grpc".
	families, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range families {
		if f.GetName() != "idem_api_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["api"] == "grpc" && labels["endpoint"] == "reserve" && labels["outcome"] == "RECLAIMED" && m.GetCounter().GetValue() == 1 {
				found = true
			}
		}
	}
	if !found {
		t.Fatalf("no idem_api_requests_total{api=grpc,endpoint=reserve,outcome=RECLAIMED} 1")
	}
}

// TestGRPCErrors: the shared validation and the contract's code mapping.
func TestGRPCErrors(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), func(c *Config) { c.MaxResponseBytes = 1000 })
	ctx := t.Context()
	c := h.grpc
	const owner = "owner-token-aaaaaaaa"
	if _, err := c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "ns", Key: "k", OwnerToken: owner}); err != nil {
		t.Fatal(err)
	}
	okResp := &idemv1.StoredResponse{Status: 200}
	cases := []struct {
		name   string
		call   func() error
		code   codes.Code
		reason Code
	}{
		{"bad namespace", func() error {
			_, err := c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "NS", Key: "k"})
			return err
		}, codes.InvalidArgument, CodeInvalidArgument},
		{"empty key", func() error {
			_, err := c.Get(ctx, &idemv1.GetRequest{Namespace: "ns"})
			return err
		}, codes.InvalidArgument, CodeInvalidArgument},
		{"key with space", func() error {
			_, err := c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "ns", Key: "a b"})
			return err
		}, codes.InvalidArgument, CodeInvalidArgument},
		{"lease out of range", func() error {
			_, err := c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "ns", Key: "k", LeaseMs: 600001})
			return err
		}, codes.InvalidArgument, CodeInvalidArgument},
		{"fingerprint too long", func() error {
			_, err := c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "ns", Key: "k", Fingerprint: strings.Repeat("f", 257)})
			return err
		}, codes.InvalidArgument, CodeInvalidArgument},
		{"bad owner token", func() error {
			_, err := c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "ns", Key: "k", OwnerToken: "short"})
			return err
		}, codes.InvalidArgument, CodeInvalidArgument},
		{"heartbeat no token", func() error {
			_, err := c.Heartbeat(ctx, &idemv1.HeartbeatRequest{Namespace: "ns", Key: "k"})
			return err
		}, codes.InvalidArgument, CodeInvalidArgument},
		{"release no token", func() error {
			_, err := c.Release(ctx, &idemv1.ReleaseRequest{Namespace: "ns", Key: "k"})
			return err
		}, codes.InvalidArgument, CodeInvalidArgument},
		{"complete no response", func() error {
			_, err := c.Complete(ctx, &idemv1.CompleteRequest{Namespace: "ns", Key: "k", OwnerToken: owner})
			return err
		}, codes.InvalidArgument, CodeInvalidArgument},
		{"complete bad status", func() error {
			_, err := c.Complete(ctx, &idemv1.CompleteRequest{Namespace: "ns", Key: "k", OwnerToken: owner, Response: &idemv1.StoredResponse{Status: 600}})
			return err
		}, codes.InvalidArgument, CodeInvalidArgument},
		{"complete bad header", func() error {
			_, err := c.Complete(ctx, &idemv1.CompleteRequest{Namespace: "ns", Key: "k", OwnerToken: owner,
				Response: &idemv1.StoredResponse{Status: 200, Headers: map[string]string{"A": "x\ny"}}})
			return err
		}, codes.InvalidArgument, CodeInvalidArgument},
		{"complete retention", func() error {
			_, err := c.Complete(ctx, &idemv1.CompleteRequest{Namespace: "ns", Key: "k", OwnerToken: owner, Response: okResp, RetentionS: -1})
			return err
		}, codes.InvalidArgument, CodeInvalidArgument},
		{"complete too large", func() error {
			_, err := c.Complete(ctx, &idemv1.CompleteRequest{Namespace: "ns", Key: "k", OwnerToken: owner,
				Response: &idemv1.StoredResponse{Status: 200, Body: make([]byte, 1001)}})
			return err
		}, codes.ResourceExhausted, CodePayloadTooLarge},
		{"heartbeat not owner", func() error {
			_, err := c.Heartbeat(ctx, &idemv1.HeartbeatRequest{Namespace: "ns", Key: "k", OwnerToken: "stranger-token-000000"})
			return err
		}, codes.FailedPrecondition, CodeNotOwner},
		{"get absent", func() error {
			_, err := c.Get(ctx, &idemv1.GetRequest{Namespace: "ns", Key: "absent"})
			return err
		}, codes.NotFound, CodeNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			expectStatus(t, tc.call(), tc.code, tc.reason)
			// Still serving, and the key still belongs to owner.
			if _, err := c.Heartbeat(ctx, &idemv1.HeartbeatRequest{Namespace: "ns", Key: "k", OwnerToken: owner}); err != nil {
				t.Fatalf("heartbeat after %s: %v", tc.name, err)
			}
		})
	}
	// A body of exactly MaxResponseBytes is accepted.
	if _, err := c.Complete(ctx, &idemv1.CompleteRequest{Namespace: "ns", Key: "k", OwnerToken: owner,
		Response: &idemv1.StoredResponse{Status: 200, Body: make([]byte, 1000)}}); err != nil {
		t.Fatalf("max-size complete: %v", err)
	}
}

// TestGRPCMaxMessage: a max-size response with max-size headers fits in one
// gRPC message at the default MaxResponseBytes.
func TestGRPCMaxMessage(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), nil)
	ctx := t.Context()
	r, err := h.grpc.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "ns", Key: "big"})
	if err != nil {
		t.Fatal(err)
	}
	headers := map[string]string{}
	for i := range 8 {
		headers[fmt.Sprintf("X-H%d", i)] = strings.Repeat("v", 8000)
	}
	resp := &idemv1.StoredResponse{Status: 200, Headers: headers, Body: make([]byte, DefaultMaxResponseBytes)}
	if _, err := h.grpc.Complete(ctx, &idemv1.CompleteRequest{Namespace: "ns", Key: "big", OwnerToken: r.OwnerToken, Response: resp}); err != nil {
		t.Fatalf("max-size complete: %v", err)
	}
	g, err := h.grpc.Get(ctx, &idemv1.GetRequest{Namespace: "ns", Key: "big"})
	if err != nil || len(g.Response.GetBody()) != DefaultMaxResponseBytes {
		t.Fatalf("max-size get: %v", err)
	}
}

// TestGRPCBackendErrors: backend failures map to gRPC codes, with RetryInfo
// on Unavailable, and a panic never kills the server.
func TestGRPCBackendErrors(t *testing.T) {
	cases := []struct {
		name    string
		backend *errBackend
		code    codes.Code
		reason  Code
		retry   time.Duration
	}{
		{"unavailable", &errBackend{err: &UnavailableError{RetryAfter: 3 * time.Second, Reason: "home region lost"}}, codes.Unavailable, CodeUnavailable, 3 * time.Second},
		{"deadline", &errBackend{err: context.DeadlineExceeded}, codes.Unavailable, CodeUnavailable, time.Second},
		{"permission", &errBackend{err: &backend.Error{Code: CodePermissionDenied, Message: "no"}}, codes.PermissionDenied, CodePermissionDenied, 0},
		{"internal", &errBackend{err: errors.New("disk on fire at /secret")}, codes.Internal, CodeInternal, 0},
		{"invalid outcome", &errBackend{result: resultInvalid()}, codes.Internal, CodeInternal, 0},
		{"panic", &errBackend{panics: true}, codes.Internal, CodeInternal, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.backend, nil)
			_, err := h.grpc.Reserve(t.Context(), &idemv1.ReserveRequest{Namespace: "ns", Key: "k"})
			st := expectStatus(t, err, tc.code, tc.reason)
			if strings.Contains(st.Message(), "secret") || strings.Contains(st.Message(), "boom") {
				t.Fatalf("message leaks internals: %q", st.Message())
			}
			var retry time.Duration
			for _, d := range st.Details() {
				if ri, ok := d.(*errdetails.RetryInfo); ok {
					retry = ri.GetRetryDelay().AsDuration()
				}
			}
			if retry != tc.retry {
				t.Fatalf("RetryInfo %v, want %v", retry, tc.retry)
			}
			// The server still serves.
			if _, err := h.grpc.Reserve(t.Context(), &idemv1.ReserveRequest{Namespace: "NS", Key: "k"}); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("after %s: %v", tc.name, err)
			}
		})
	}
}

// TestGRPCPanicInterceptor: a panic in any service on the server (here one
// registered without the service's own recovery) becomes Internal.
func TestGRPCPanicInterceptor(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), nil)
	gs := grpc.NewServer(h.srv.GRPCServerOptions()...)
	idemv1.RegisterAdminServer(gs, panickyAdmin{})
	lis := listenLoopback(t)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.GracefulStop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := idemv1.NewAdminClient(conn)
	for range 2 {
		_, err = admin.Status(t.Context(), &idemv1.StatusRequest{})
		expectStatus(t, err, codes.Internal, CodeInternal)
	}
	if r := h.do("GET", "/metrics", ""); !strings.Contains(r.String(), `idem_api_requests_total{api="grpc",endpoint="admin_status",outcome="INTERNAL"} 2`) {
		t.Fatalf("admin panic not counted:\n%s", r)
	}
}

type panickyAdmin struct {
	idemv1.UnimplementedAdminServer
}

func (panickyAdmin) Status(context.Context, *idemv1.StatusRequest) (*idemv1.StatusResponse, error) {
	panic("admin boom")
}

// TestForwardedErrors: a server whose backend forwards over gRPC (a router)
// gives its clients the codes the storage server chose, over both APIs.
func TestForwardedErrors(t *testing.T) {
	cases := []struct {
		name       string
		err        error
		status     int
		code       Code
		retryAfter string
	}{
		{"unavailable", &UnavailableError{RetryAfter: 3 * time.Second, Reason: "no leader"}, 503, CodeUnavailable, "3"},
		{"unauthenticated", &backend.Error{Code: CodeUnauthenticated, Message: "log in"}, 401, CodeUnauthenticated, ""},
		{"permission", &backend.Error{Code: CodePermissionDenied, Message: "not yours"}, 403, CodePermissionDenied, ""},
		{"resource exhausted", &backend.Error{Code: CodeResourceExhausted, Message: "too many requests"}, 429, CodeResourceExhausted, ""},
		{"payload too large", &backend.Error{Code: CodePayloadTooLarge, Message: "payload too large: 5 bytes"}, 413, CodePayloadTooLarge, ""},
		{"not owner", &backend.Error{Code: CodeNotOwner, Message: "not the owner"}, 409, CodeNotOwner, ""},
		{"internal", errors.New("bolt exploded"), 500, CodeInternal, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			back := newHarness(t, &errBackend{err: tc.err}, nil)
			conn, err := grpc.NewClient(back.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			front := newHarness(t, grpcBackend{idemv1.NewIdempotencyClient(conn)}, nil)
			r := front.do("POST", ns+"k:reserve", "")
			front.expectError(r, tc.status, tc.code)
			if got := r.header.Get("Retry-After"); got != tc.retryAfter {
				t.Fatalf("Retry-After %q, want %q", got, tc.retryAfter)
			}
			_, err = front.grpc.Reserve(t.Context(), &idemv1.ReserveRequest{Namespace: "ns", Key: "k"})
			expectStatus(t, err, idemv1.GRPCCode(tc.code), tc.code)
		})
	}

	// Success also survives the hop: the whole flow through a forwarder.
	clock := newFakeClock()
	back := newHarness(t, newMemBackend(clock), nil)
	conn, err := grpc.NewClient(back.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	front := newHarness(t, grpcBackend{idemv1.NewIdempotencyClient(conn)}, nil)
	r := front.do("POST", ns+"fwd:reserve", `{"owner_token":"owner-token-aaaaaaaa"}`)
	if r.body["outcome"] != "ACQUIRED" || r.body["owner_token"] != "owner-token-aaaaaaaa" {
		t.Fatalf("forwarded reserve: %s", r)
	}
	front.expectError(front.do("POST", ns+"fwd:release", `{"owner_token":"stranger-token-00000"}`), 409, CodeNotOwner)
	front.expectError(front.do("GET", ns+"absent", ""), 404, CodeNotFound)
	if r := front.do("GET", ns+"fwd", ""); r.status != 200 || r.body["state"] != "IN_PROGRESS" {
		t.Fatalf("forwarded get: %s", r)
	}
}

// TestStatusWithoutDetails: a gRPC status from a backend that is not idem
// (no ErrorInfo) maps by code, and by message for ResourceExhausted.
func TestStatusWithoutDetails(t *testing.T) {
	cases := []struct {
		err    error
		status int
		code   Code
	}{
		{status.Error(codes.Unavailable, "connection refused"), 503, CodeUnavailable},
		{status.Error(codes.DeadlineExceeded, "deadline"), 503, CodeUnavailable},
		{status.Error(codes.InvalidArgument, "bad key"), 400, CodeInvalidArgument},
		{status.Error(codes.NotFound, "nope"), 404, CodeNotFound},
		{status.Error(codes.FailedPrecondition, "not owner"), 409, CodeNotOwner},
		{status.Error(codes.ResourceExhausted, "Payload too large: body"), 413, CodePayloadTooLarge},
		{status.Error(codes.ResourceExhausted, "grpc: received message larger than max (9 vs. 4)"), 413, CodePayloadTooLarge},
		{status.Error(codes.ResourceExhausted, "quota"), 429, CodeResourceExhausted},
		{status.Error(codes.Unauthenticated, "who"), 401, CodeUnauthenticated},
		{status.Error(codes.PermissionDenied, "no"), 403, CodePermissionDenied},
		{status.Error(codes.Internal, "stack trace here"), 500, CodeInternal},
		{status.Error(codes.Unimplemented, "old node"), 500, CodeInternal},
		{fmt.Errorf("forward: %w", status.Error(codes.Unavailable, "wrapped")), 503, CodeUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.err.Error(), func(t *testing.T) {
			h := newHarness(t, &errBackend{err: wire.BackendError(tc.err)}, nil)
			r := h.do("POST", ns+"k:reserve", "")
			h.expectError(r, tc.status, tc.code)
			if tc.code == CodeUnavailable && r.header.Get("Retry-After") != "1" {
				t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
			}
			if tc.code == CodeInternal && strings.Contains(r.errMessage(), "stack trace") {
				t.Fatalf("internal message leaked: %q", r.errMessage())
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	err := Config{MaxResponseBytes: -1, ReadyTimeout: -1, ExtraRoutes: map[string]http.Handler{"/x": nil}}.Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Validate: %v", err)
	}
	for _, want := range []string{"Backend", "MaxResponseBytes", "ReadyTimeout", "ExtraRoutes"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("Validate does not report %s: %v", want, err)
		}
	}
	cfg := DefaultConfig()
	cfg.Backend = &errBackend{}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("DefaultConfig with a Backend: %v", err)
	}
	cfg.MaxRequestBytes = 1000
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "MaxRequestBytes") {
		t.Fatalf("a MaxRequestBytes too small for MaxResponseBytes: %v", err)
	}
	if _, err := New(Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New(Config{}): %v", err)
	}
	// One registry may serve both constructors.
	cfg = DefaultConfig()
	cfg.Backend = &errBackend{}
	cfg.Registry = prometheus.NewRegistry()
	if _, err := NewHTTPHandler(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewGRPCService(cfg); err != nil {
		t.Fatal(err)
	}
}

func TestValidateNames(t *testing.T) {
	for _, good := range []string{"a", "0", "payments", "a.b_c-d", strings.Repeat("z", 63)} {
		if err := ValidateNamespace(good); err != nil {
			t.Errorf("ValidateNamespace(%q): %v", good, err)
		}
	}
	for _, bad := range []string{"", "A", "-a", ".a", "_a", "a b", "a/b", "é", strings.Repeat("z", 64)} {
		var e *Error
		if err := ValidateNamespace(bad); !errors.As(err, &e) || e.Code != CodeInvalidArgument {
			t.Errorf("ValidateNamespace(%q) = %v, want INVALID_ARGUMENT", bad, err)
		}
	}
	for _, good := range []string{"k", "!", "~", "a:b/c%d?e#f", strings.Repeat("k", 255)} {
		if err := ValidateKey(good); err != nil {
			t.Errorf("ValidateKey(%q): %v", good, err)
		}
	}
	for _, bad := range []string{"", " ", "a b", "\x7f", "\x00", "é", strings.Repeat("k", 256)} {
		var e *Error
		if err := ValidateKey(bad); !errors.As(err, &e) || e.Code != CodeInvalidArgument {
			t.Errorf("ValidateKey(%q) = %v, want INVALID_ARGUMENT", bad, err)
		}
	}
}

// TestGRPCRouting: without Config.Routing the RPC answers UNIMPLEMENTED (a
// router: clients keep round-robin); with it, the hook's answer.
func TestGRPCRouting(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), nil)
	if _, err := h.grpc.Routing(t.Context(), &idemv1.RoutingRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("Routing without a hook: %v, want UNIMPLEMENTED", err)
	}
	want := &idemv1.RoutingResponse{Cluster: "c", NodeId: "n1", RingFingerprint: "f"}
	h = newHarness(t, newMemBackend(newFakeClock()), func(c *Config) {
		c.Routing = func(context.Context) (*idemv1.RoutingResponse, error) { return want, nil }
	})
	got, err := h.grpc.Routing(t.Context(), &idemv1.RoutingRequest{})
	if err != nil || got.GetNodeId() != "n1" || got.GetRingFingerprint() != "f" {
		t.Fatalf("Routing = %v, %v; want the hook's answer", got, err)
	}
}
