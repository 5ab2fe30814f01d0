package idemtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/server"
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
	MethodRouting   Method = "Routing"
	// MethodBatch is the Batch RPC itself. Each operation of a batch also
	// counts as a call of its own method, and meets that method's faults
	// (a FailNext or DropNext of MethodReserve fails or drops the next
	// reserves whether they come alone or in a batch; the other operations
	// of the batch are answered as usual).
	MethodBatch Method = "Batch"
)

// Config configures a Server.
type Config struct {
	// SkewMargin is how long past a lease's end the key stays with its owner
	// before another caller may reclaim it. Zero means DefaultSkewMargin.
	SkewMargin time.Duration
	// MaxResponseBytes is the largest stored response body; a larger one is
	// answered RESOURCE_EXHAUSTED (PAYLOAD_TOO_LARGE). Zero means
	// DefaultMaxResponseBytes; at most contract.MaxMaxResponseBytes.
	MaxResponseBytes int
	// DisableBatch answers the Batch RPC UNIMPLEMENTED, as a node older than
	// v1.2 does.
	DisableBatch bool
}

// Validate reports every problem with the Config at once.
func (c Config) Validate() error {
	var errs []error
	if c.SkewMargin < 0 {
		errs = append(errs, fmt.Errorf("idemtest: config: SkewMargin = %v is negative", c.SkewMargin))
	}
	if c.MaxResponseBytes < 0 || c.MaxResponseBytes > contract.MaxMaxResponseBytes {
		errs = append(errs, fmt.Errorf("idemtest: config: MaxResponseBytes = %d is out of range: use 0..%d", c.MaxResponseBytes, contract.MaxMaxResponseBytes))
	}
	return errors.Join(errs...)
}

type fault struct {
	failLeft int // <0: every call
	failCode codes.Code
	dropLeft int
}

// Server is an in-memory idem store serving gRPC on 127.0.0.1: the real
// gRPC service of package server over backend.Mem, with fault injection in
// front of it.
type Server struct {
	cfg Config
	lis net.Listener
	gs  *grpc.Server
	mem *backend.Mem

	mu     sync.Mutex
	offset time.Duration // added to the wall clock by Advance
	faults map[Method]*fault
	calls  map[Method]int
	// traceparents is the W3C traceparent the last call of each method
	// carried ("" for none).
	traceparents map[Method]string
	// routing answers the Routing RPC (nil: UNIMPLEMENTED, as a router);
	// leaderHint is sent as the leader header of every other answer.
	routing    *idemv1.RoutingResponse
	leaderHint string
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
	s := &Server{
		cfg:    cfg,
		faults: make(map[Method]*fault),
		calls:  make(map[Method]int),

		traceparents: make(map[Method]string),
	}
	s.mem = backend.NewMem(backend.MemConfig{Now: func() int64 { return s.Now().UnixNano() }, SkewMargin: cfg.SkewMargin})
	api, err := server.New(server.Config{Backend: s.mem, MaxResponseBytes: int64(cfg.MaxResponseBytes), Routing: s.answerRouting})
	if err != nil {
		return nil, fmt.Errorf("idemtest: %w", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("idemtest: listen: %w", err)
	}
	s.lis = lis
	s.gs = api.NewGRPCServer(grpc.ChainUnaryInterceptor(s.intercept))
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

// SetRouting makes the server answer the Routing RPC with resp, as a node
// does (build it with idemv1.RoutingToProto from a topology that names this
// and other servers' addresses); nil answers UNIMPLEMENTED, as a router does
// (the default).
func (s *Server) SetRouting(resp *idemv1.RoutingResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.routing = resp
}

// SetLeaderHint makes the server name nodeID as the leader in the leader
// header (idemv1.LeaderHeader) of every answer but Routing's, as a node names
// the leader of the key's shard; "" sends none (the default).
func (s *Server) SetLeaderHint(nodeID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leaderHint = nodeID
}

func (s *Server) answerRouting(context.Context) (*idemv1.RoutingResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.routing == nil {
		return nil, status.Error(codes.Unimplemented, "idemtest: no routing (SetRouting)")
	}
	return proto.Clone(s.routing).(*idemv1.RoutingResponse), nil
}

// Calls reports how many calls of m reached the server, failed ones included.
func (s *Server) Calls(m Method) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[m]
}

// Traceparent is the W3C traceparent metadata the last call of m carried,
// "" when it carried none: a test of an application's tracing checks that
// its calls join its traces. Operations of a Batch carry their batch's.
func (s *Server) Traceparent(m Method) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.traceparents[m]
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
func (s *Server) Apply(cmd fsm.Command) fsm.Result { return s.mem.ApplyStamped(cmd) }

// Get reads the record of (namespace, key) at the store's clock.
func (s *Server) Get(namespace, key string) (fsm.Record, bool) {
	rec, ok, _ := s.mem.Get(context.Background(), namespace, key)
	return rec, ok
}

// intercept counts calls and injects faults around the handler; for a
// batch, around each operation too.
func (s *Server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	m := Method(path.Base(info.FullMethod))
	if m == MethodBatch {
		if s.cfg.DisableBatch {
			s.mu.Lock()
			s.calls[m]++
			s.mu.Unlock()
			return nil, status.Error(codes.Unimplemented, "idemtest: unknown method Batch (Config.DisableBatch)")
		}
		ctx = idemv1.WithBatchOpInterceptor(ctx, s.intercept)
	}
	var traceparent string
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("traceparent")) > 0 {
		traceparent = md.Get("traceparent")[0]
	}
	s.mu.Lock()
	s.calls[m]++
	s.traceparents[m] = traceparent
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
	hint := s.leaderHint
	s.mu.Unlock()
	if hint != "" && m != MethodRouting && m != MethodBatch {
		idemv1.SetLeaderHeader(ctx, hint)
	}
	resp, err := handler(ctx, req)
	if drop {
		return nil, status.Errorf(codes.Unavailable, "idemtest: %s was applied, and its answer was dropped", m)
	}
	return resp, err
}
