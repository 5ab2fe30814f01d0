package idemtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"sync"
	"time"
	"unicode/utf8"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Defaults of Config, the same as an idemnode's.
const (
	DefaultSkewMargin       = time.Second
	DefaultMaxResponseBytes = contract.DefaultMaxResponseBytes
	DefaultLease            = contract.DefaultLease
	DefaultRetention        = contract.DefaultRetention
)

// Method names an RPC of the Idempotency service, for fault injection and
// call counts.
type Method string

// The Idempotency service's RPCs.
const (
	MethodReserve   Method = "Reserve"
	MethodHeartbeat Method = "Heartbeat"
	MethodComplete  Method = "Complete"
	MethodRelease   Method = "Release"
	MethodGet       Method = "Get"
)

// Config configures a Server.
type Config struct {
	// SkewMargin is how long past a lease's end the key stays with its owner
	// before another caller may reclaim it. Zero means DefaultSkewMargin.
	SkewMargin time.Duration
	// MaxResponseBytes is the largest stored response body; a larger one is
	// answered RESOURCE_EXHAUSTED. Zero means DefaultMaxResponseBytes.
	MaxResponseBytes int
}

// Validate reports every problem with the Config at once.
func (c Config) Validate() error {
	var errs []error
	if c.SkewMargin < 0 {
		errs = append(errs, fmt.Errorf("idemtest: config: SkewMargin = %v is negative", c.SkewMargin))
	}
	if c.MaxResponseBytes < 0 {
		errs = append(errs, fmt.Errorf("idemtest: config: MaxResponseBytes = %d is negative", c.MaxResponseBytes))
	}
	return errors.Join(errs...)
}

type fault struct {
	failLeft int // <0: every call
	failCode codes.Code
	dropLeft int
}

// Server is an in-memory idem store serving gRPC on 127.0.0.1.
type Server struct {
	cfg Config
	lis net.Listener
	gs  *grpc.Server

	mu     sync.Mutex // orders log indexes with their application
	fsm    *fsm.FSM
	index  uint64
	offset time.Duration // added to the wall clock by Advance
	faults map[Method]*fault
	calls  map[Method]int
}

// Start listens on 127.0.0.1 on a free port and serves until Close.
func Start(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.SkewMargin == 0 {
		cfg.SkewMargin = DefaultSkewMargin
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("idemtest: listen: %w", err)
	}
	s := &Server{
		cfg:    cfg,
		lis:    lis,
		fsm:    fsm.New(),
		faults: make(map[Method]*fault),
		calls:  make(map[Method]int),
	}
	s.gs = grpc.NewServer(grpc.UnaryInterceptor(s.intercept))
	idemv1.RegisterIdempotencyServer(s.gs, &service{s: s})
	go func() { _ = s.gs.Serve(lis) }()
	return s, nil
}

// Addr is the host:port the server listens on.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Close stops the server at once; calls in flight fail.
func (s *Server) Close() { s.gs.Stop() }

// Now is the store's clock: the wall clock plus every Advance.
func (s *Server) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Now().Add(s.offset)
}

// Advance moves the store's clock forward by d, so that leases and
// retentions run out without waiting.
func (s *Server) Advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.offset += d
}

// FailNext makes the next n calls of m fail with code before anything is
// applied (n < 0: every call until FailNext(m, 0, ...)).
func (s *Server) FailNext(m Method, n int, code codes.Code) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.fault(m)
	f.failLeft, f.failCode = n, code
}

// DropNext makes the next n calls of m apply and then lose their answer: the
// caller gets UNAVAILABLE although the store decided.
func (s *Server) DropNext(m Method, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault(m).dropLeft = n
}

// Calls reports how many calls of m reached the server, failed ones included.
func (s *Server) Calls(m Method) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[m]
}

func (s *Server) fault(m Method) *fault {
	f := s.faults[m]
	if f == nil {
		f = &fault{}
		s.faults[m] = f
	}
	return f
}

// Apply applies cmd as the next log entry, stamping Now with the store's clock
// when it is zero, and a reserve's SkewMargin when it is zero. It lets tests
// serve other front ends (a JSON handler, say) over the same store.
func (s *Server) Apply(cmd fsm.Command) fsm.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cmd.Now == 0 {
		cmd.Now = time.Now().Add(s.offset).UnixNano()
	}
	if cmd.Op == fsm.OpReserve && cmd.SkewMargin == 0 {
		cmd.SkewMargin = int64(s.cfg.SkewMargin)
	}
	s.index++
	return s.fsm.Apply(s.index, &cmd)
}

// Get reads the record of (namespace, key) at the store's clock.
func (s *Server) Get(namespace, key string) (fsm.Record, bool) {
	return s.fsm.Get(namespace, key, s.Now().UnixNano())
}

// intercept counts calls and injects faults around the handler.
func (s *Server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	m := Method(path.Base(info.FullMethod))
	s.mu.Lock()
	s.calls[m]++
	f := s.fault(m)
	if f.failLeft != 0 {
		if f.failLeft > 0 {
			f.failLeft--
		}
		code := f.failCode
		s.mu.Unlock()
		return nil, status.Errorf(code, "idemtest: injected failure of %s", m)
	}
	drop := f.dropLeft > 0
	if drop {
		f.dropLeft--
	}
	s.mu.Unlock()
	resp, err := handler(ctx, req)
	if drop {
		return nil, status.Errorf(codes.Unavailable, "idemtest: %s was applied, and its answer was dropped", m)
	}
	return resp, err
}

// invalidArgument answers INVALID_ARGUMENT naming every problem, or nil.
func invalidArgument(errs ...error) error {
	if err := errors.Join(errs...); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return nil
}

func checkNames(namespace, key string) error {
	if v := contract.CheckNamespace(namespace); v != nil {
		return fmt.Errorf("namespace %q must match %s", namespace, contract.NameGrammar)
	}
	if v := contract.CheckKey(key); v != nil {
		return v
	}
	return nil
}

func checkOwnerToken(tok string) error {
	if v := contract.CheckOwnerToken(tok); v != nil {
		return v
	}
	return nil
}

func leaseNanos(ms int64) (int64, error) {
	if ms == 0 {
		return int64(DefaultLease), nil
	}
	if ms < contract.MinLeaseMs || ms > contract.MaxLeaseMs {
		return 0, status.Errorf(codes.InvalidArgument, "lease_ms %d must be %d..%d", ms, contract.MinLeaseMs, contract.MaxLeaseMs)
	}
	return ms * int64(time.Millisecond), nil
}

func ts(nanos int64) *timestamppb.Timestamp {
	if nanos == 0 {
		return nil
	}
	return timestamppb.New(time.Unix(0, nanos).UTC())
}

func storedToProto(r *fsm.Response) *idemv1.StoredResponse {
	if r == nil {
		return nil
	}
	return &idemv1.StoredResponse{Status: r.Status, Headers: r.Headers, Body: r.Body}
}

func decided(op string, r fsm.Result) error {
	switch r.Outcome {
	case fsm.OutcomeNotOwner:
		return status.Errorf(codes.FailedPrecondition, "NOT_OWNER: the caller does not own the key")
	case fsm.OutcomeInvalid:
		return status.Errorf(codes.Internal, "idemtest: the state machine refused the %s command", op)
	}
	return nil
}

// service implements idemv1.IdempotencyServer over the Server's store.
type service struct {
	idemv1.UnimplementedIdempotencyServer
	s *Server
}

func (v *service) Reserve(_ context.Context, req *idemv1.ReserveRequest) (*idemv1.ReserveResponse, error) {
	if err := invalidArgument(checkNames(req.GetNamespace(), req.GetKey())); err != nil {
		return nil, err
	}
	if utf8.RuneCountInString(req.GetFingerprint()) > contract.MaxFingerprintChars {
		return nil, status.Errorf(codes.InvalidArgument, "fingerprint is longer than %d chars", contract.MaxFingerprintChars)
	}
	lease, err := leaseNanos(req.GetLeaseMs())
	if err != nil {
		return nil, err
	}
	tok := req.GetOwnerToken()
	if tok == "" {
		tok = contract.NewOwnerToken()
	} else if err := invalidArgument(checkOwnerToken(tok)); err != nil {
		return nil, err
	}
	r := v.s.Apply(fsm.Command{
		Op:          fsm.OpReserve,
		Namespace:   req.GetNamespace(),
		Key:         req.GetKey(),
		Fingerprint: req.GetFingerprint(),
		OwnerToken:  tok,
		Lease:       lease,
	})
	resp := &idemv1.ReserveResponse{}
	switch r.Outcome {
	case fsm.OutcomeAcquired, fsm.OutcomeReclaimed:
		resp.Outcome = idemv1.Outcome_ACQUIRED
		if r.Outcome == fsm.OutcomeReclaimed {
			resp.Outcome = idemv1.Outcome_RECLAIMED
			resp.PreviousFencingToken = r.PreviousFencingToken
		}
		resp.OwnerToken = r.OwnerToken
		resp.FencingToken = r.FencingToken
		resp.LeaseExpiresAt = ts(r.LeaseExpiresAt)
	case fsm.OutcomeInProgress:
		resp.Outcome = idemv1.Outcome_IN_PROGRESS
		resp.LeaseExpiresAt = ts(r.LeaseExpiresAt)
		// Round up so that a hint of under a millisecond does not read "now".
		resp.RetryAfterMs = (r.RetryAfter + int64(time.Millisecond) - 1) / int64(time.Millisecond)
	case fsm.OutcomeCompleted:
		resp.Outcome = idemv1.Outcome_COMPLETED
		resp.FencingToken = r.FencingToken
		resp.Response = storedToProto(r.Response)
		resp.CompletedAt = ts(r.CompletedAt)
		resp.ExpiresAt = ts(r.ExpiresAt)
	case fsm.OutcomeFingerprintMismatch:
		resp.Outcome = idemv1.Outcome_FINGERPRINT_MISMATCH
	default:
		return nil, decided("reserve", r)
	}
	return resp, nil
}

func (v *service) Heartbeat(_ context.Context, req *idemv1.HeartbeatRequest) (*idemv1.HeartbeatResponse, error) {
	if err := invalidArgument(checkNames(req.GetNamespace(), req.GetKey()), checkOwnerToken(req.GetOwnerToken())); err != nil {
		return nil, err
	}
	lease, err := leaseNanos(req.GetLeaseMs())
	if err != nil {
		return nil, err
	}
	r := v.s.Apply(fsm.Command{Op: fsm.OpHeartbeat, Namespace: req.GetNamespace(), Key: req.GetKey(), OwnerToken: req.GetOwnerToken(), Lease: lease})
	if err := decided("heartbeat", r); err != nil {
		return nil, err
	}
	return &idemv1.HeartbeatResponse{LeaseExpiresAt: ts(r.LeaseExpiresAt)}, nil
}

func (v *service) Complete(_ context.Context, req *idemv1.CompleteRequest) (*idemv1.CompleteResponse, error) {
	if err := invalidArgument(checkNames(req.GetNamespace(), req.GetKey()), checkOwnerToken(req.GetOwnerToken())); err != nil {
		return nil, err
	}
	resp := req.GetResponse()
	if resp == nil || resp.GetStatus() < contract.MinStatus || resp.GetStatus() > contract.MaxStatus {
		return nil, status.Errorf(codes.InvalidArgument, "response.status must be 100..599")
	}
	if len(resp.GetBody()) > v.s.cfg.MaxResponseBytes {
		return nil, status.Errorf(codes.ResourceExhausted, "PAYLOAD_TOO_LARGE: response body of %d bytes exceeds %d", len(resp.GetBody()), v.s.cfg.MaxResponseBytes)
	}
	retention := int64(DefaultRetention)
	if s := req.GetRetentionS(); s != 0 {
		if s < contract.MinRetentionS || s > contract.MaxRetentionS {
			return nil, status.Errorf(codes.InvalidArgument, "retention_s %d must be %d..%d", s, contract.MinRetentionS, contract.MaxRetentionS)
		}
		retention = s * int64(time.Second)
	}
	r := v.s.Apply(fsm.Command{
		Op:         fsm.OpComplete,
		Namespace:  req.GetNamespace(),
		Key:        req.GetKey(),
		OwnerToken: req.GetOwnerToken(),
		Response:   &fsm.Response{Status: resp.GetStatus(), Headers: resp.GetHeaders(), Body: resp.GetBody()},
		Retention:  retention,
	})
	if err := decided("complete", r); err != nil {
		return nil, err
	}
	return &idemv1.CompleteResponse{CompletedAt: ts(r.CompletedAt), ExpiresAt: ts(r.ExpiresAt)}, nil
}

func (v *service) Release(_ context.Context, req *idemv1.ReleaseRequest) (*idemv1.ReleaseResponse, error) {
	if err := invalidArgument(checkNames(req.GetNamespace(), req.GetKey()), checkOwnerToken(req.GetOwnerToken())); err != nil {
		return nil, err
	}
	r := v.s.Apply(fsm.Command{Op: fsm.OpRelease, Namespace: req.GetNamespace(), Key: req.GetKey(), OwnerToken: req.GetOwnerToken()})
	if err := decided("release", r); err != nil {
		return nil, err
	}
	return &idemv1.ReleaseResponse{}, nil
}

func (v *service) Get(_ context.Context, req *idemv1.GetRequest) (*idemv1.GetResponse, error) {
	if err := invalidArgument(checkNames(req.GetNamespace(), req.GetKey())); err != nil {
		return nil, err
	}
	rec, ok := v.s.Get(req.GetNamespace(), req.GetKey())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "NOT_FOUND: no record for %s/%s", req.GetNamespace(), req.GetKey())
	}
	resp := &idemv1.GetResponse{Fingerprint: rec.Fingerprint, FencingToken: rec.FencingToken}
	switch rec.State {
	case fsm.StateInProgress:
		resp.State = idemv1.State_STATE_IN_PROGRESS
		resp.LeaseExpiresAt = ts(rec.LeaseExpiresAt)
	case fsm.StateCompleted:
		resp.State = idemv1.State_STATE_COMPLETED
		resp.CompletedAt = ts(rec.CompletedAt)
		resp.ExpiresAt = ts(rec.ExpiresAt)
		resp.Response = storedToProto(rec.Response)
	}
	return resp, nil
}
