package idemv1

import (
	"context"
	"sync"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Limits of a Batch RPC (idem.proto, Batch).
const (
	// MaxBatchOps is the most operations one BatchRequest may carry.
	MaxBatchOps = 256
	// MaxBatchBytes is the largest encoded BatchRequest a node accepts. It
	// is the least gRPC receive limit any node has (contract.
	// GRPCMaxMessageBytes never goes below 4 MiB), so a batch that fits is
	// accepted whatever the node's --max-response-bytes; a complete too
	// large to share it goes as its own Complete RPC.
	MaxBatchBytes = 4 << 20
)

// The unary methods a Batch operation stands for, by full method name: what
// the operation's interceptors see in UnaryServerInfo.FullMethod.
var (
	batchOpMethods = [...]string{
		Idempotency_Reserve_FullMethodName,
		Idempotency_Heartbeat_FullMethodName,
		Idempotency_Complete_FullMethodName,
		Idempotency_Release_FullMethodName,
		Idempotency_Get_FullMethodName,
	}
)

// BatchOpMethod is the full method name of the unary RPC op stands for, and
// that RPC's request; ok is false for an empty op.
func BatchOpMethod(op *BatchOp) (fullMethod string, req any, ok bool) {
	switch o := op.GetOp().(type) {
	case *BatchOp_Reserve:
		return batchOpMethods[0], o.Reserve, o.Reserve != nil
	case *BatchOp_Heartbeat:
		return batchOpMethods[1], o.Heartbeat, o.Heartbeat != nil
	case *BatchOp_Complete:
		return batchOpMethods[2], o.Complete, o.Complete != nil
	case *BatchOp_Release:
		return batchOpMethods[3], o.Release, o.Release != nil
	case *BatchOp_Get:
		return batchOpMethods[4], o.Get, o.Get != nil
	}
	return "", nil, false
}

// BatchErrorFromStatus is the BatchError of st: its code, message and
// details, as google.rpc.Status carries them.
func BatchErrorFromStatus(st *status.Status) *BatchError {
	p := st.Proto()
	return &BatchError{Code: p.GetCode(), Message: p.GetMessage(), Details: p.GetDetails()}
}

// BatchErrorStatus is the gRPC status e carries: the status the
// operation's unary RPC would have returned.
func BatchErrorStatus(e *BatchError) *status.Status {
	return status.FromProto(&spb.Status{Code: e.GetCode(), Message: e.GetMessage(), Details: e.GetDetails()})
}

// Server side: a Batch RPC passes through the server's unary interceptors
// once, as the Batch method; each operation must then pass through the same
// interceptors as its unary RPC would (authorization, metrics, fault
// injection). An interceptor that has work to do per operation registers
// itself, when it sees the Batch method, with WithBatchOpInterceptor; the
// Batch handler runs each operation through the registered interceptors, in
// the order they registered (the order of the server's chain), with
// UnaryServerInfo.FullMethod naming the operation's unary RPC.

type batchOpKey struct{}

// WithBatchOpInterceptor returns ctx, the context of a Batch RPC, with i
// added after the operation interceptors already registered.
func WithBatchOpInterceptor(ctx context.Context, i grpc.UnaryServerInterceptor) context.Context {
	prev, _ := ctx.Value(batchOpKey{}).([]grpc.UnaryServerInterceptor)
	next := make([]grpc.UnaryServerInterceptor, len(prev), len(prev)+1)
	copy(next, prev)
	return context.WithValue(ctx, batchOpKey{}, append(next, i))
}

// BatchOpInterceptors are the operation interceptors registered in ctx.
func BatchOpInterceptors(ctx context.Context) []grpc.UnaryServerInterceptor {
	is, _ := ctx.Value(batchOpKey{}).([]grpc.UnaryServerInterceptor)
	return is
}

// ChainBatchOp runs handler for req through interceptors, the first
// outermost, as grpc-go chains a server's unary interceptors.
func ChainBatchOp(ctx context.Context, interceptors []grpc.UnaryServerInterceptor, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if len(interceptors) == 0 {
		return handler(ctx, req)
	}
	next := func(ctx context.Context, req any) (any, error) {
		return ChainBatchOp(ctx, interceptors[1:], req, info, handler)
	}
	return interceptors[0](ctx, req, info, next)
}

// batchOpLeader collects the leader hint of one operation of a batch.
type batchOpLeader struct {
	mu     sync.Mutex
	leader string
}

type batchLeaderKey struct{}

// WithBatchOpLeader returns the context of one operation of a batch, and a
// function that reports the leader SetLeaderHeader recorded for it.
func WithBatchOpLeader(ctx context.Context) (context.Context, func() string) {
	l := &batchOpLeader{}
	return context.WithValue(ctx, batchLeaderKey{}, l), func() string {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.leader
	}
}

// SetLeaderHeader sends leader as the LeaderHeader of the RPC in ctx, or,
// for an operation of a batch, as its result's leader_id. Empty sends none.
func SetLeaderHeader(ctx context.Context, leader string) {
	if leader == "" {
		return
	}
	if l, ok := ctx.Value(batchLeaderKey{}).(*batchOpLeader); ok {
		l.mu.Lock()
		l.leader = leader
		l.mu.Unlock()
		return
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs(LeaderHeader, leader))
}
