package server

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/tracing"
	"github.com/idem-dev/idem/internal/wire"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// grpcService is the Idempotency service: the same validation as the JSON
// API (validator), the same backend calls (Server.apply, Server.get).
type grpcService struct {
	idemv1.UnimplementedIdempotencyServer
	s       *Server
	workers *opWorkers // runs Batch operations
}

// recoverRPC turns a panic of an RPC into codes.Internal; the process keeps
// serving. The interceptor does the same for every service; this covers a
// service registered without it.
func (g *grpcService) recoverRPC(method string, err *error) {
	if p := recover(); p != nil {
		g.s.log.Error("panic in grpc handler", "method", method, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		*err = (&Error{Code: CodeInternal, Message: internalMessage}).GRPCStatus().Err()
	}
}

func (g *grpcService) Reserve(ctx context.Context, req *idemv1.ReserveRequest) (_ *idemv1.ReserveResponse, err error) {
	defer g.recoverRPC("Reserve", &err)
	cmd, e := g.s.validate.reserveCommand(reserveParams{
		Namespace:   req.GetNamespace(),
		Key:         req.GetKey(),
		Fingerprint: req.GetFingerprint(),
		LeaseMs:     req.GetLeaseMs(),
		OwnerToken:  req.GetOwnerToken(),
		WaitMs:      req.GetWaitMs(),
		IfExpired:   req.GetIfExpired(),
	})
	if e != nil {
		return nil, e
	}
	res, e := g.apply(ctx, cmd)
	if e != nil {
		return nil, e
	}
	out := wire.ReserveToProto(res)
	if res.Outcome == fsm.OutcomeAcquired || res.Outcome == fsm.OutcomeReclaimed {
		out.OwnerToken = ownerTokenOf(cmd, res)
	}
	return out, nil
}

func (g *grpcService) Heartbeat(ctx context.Context, req *idemv1.HeartbeatRequest) (_ *idemv1.HeartbeatResponse, err error) {
	defer g.recoverRPC("Heartbeat", &err)
	cmd, e := g.s.validate.heartbeatCommand(heartbeatParams{
		Namespace:  req.GetNamespace(),
		Key:        req.GetKey(),
		OwnerToken: req.GetOwnerToken(),
		LeaseMs:    req.GetLeaseMs(),
	})
	if e != nil {
		return nil, e
	}
	res, e := g.apply(ctx, cmd)
	if e != nil {
		return nil, e
	}
	return &idemv1.HeartbeatResponse{LeaseExpiresAt: idemv1.TimeToProto(res.LeaseExpiresAt)}, nil
}

func (g *grpcService) Complete(ctx context.Context, req *idemv1.CompleteRequest) (_ *idemv1.CompleteResponse, err error) {
	defer g.recoverRPC("Complete", &err)
	params := completeParams{
		Namespace:  req.GetNamespace(),
		Key:        req.GetKey(),
		OwnerToken: req.GetOwnerToken(),
		RetentionS: req.GetRetentionS(),
	}
	if r := req.GetResponse(); r != nil {
		params.Response = &responseParams{Status: int64(r.GetStatus()), Headers: r.GetHeaders(), Body: r.GetBody()}
	}
	cmd, e := g.s.validate.completeCommand(params)
	if e != nil {
		return nil, e
	}
	res, e := g.apply(ctx, cmd)
	if e != nil {
		return nil, e
	}
	return &idemv1.CompleteResponse{CompletedAt: idemv1.TimeToProto(res.CompletedAt), ExpiresAt: idemv1.TimeToProto(res.ExpiresAt)}, nil
}

func (g *grpcService) Release(ctx context.Context, req *idemv1.ReleaseRequest) (_ *idemv1.ReleaseResponse, err error) {
	defer g.recoverRPC("Release", &err)
	cmd, e := g.s.validate.releaseCommand(releaseParams{
		Namespace:  req.GetNamespace(),
		Key:        req.GetKey(),
		OwnerToken: req.GetOwnerToken(),
	})
	if e != nil {
		return nil, e
	}
	if _, e := g.apply(ctx, cmd); e != nil {
		return nil, e
	}
	return &idemv1.ReleaseResponse{}, nil
}

func (g *grpcService) Get(ctx context.Context, req *idemv1.GetRequest) (_ *idemv1.GetResponse, err error) {
	defer g.recoverRPC("Get", &err)
	if e := g.s.validate.getParams(req.GetNamespace(), req.GetKey()); e != nil {
		return nil, e
	}
	rec, found, e := g.get(ctx, req.GetNamespace(), req.GetKey())
	if e != nil {
		return nil, e
	}
	if !found {
		return nil, errorf(CodeNotFound, "no record for this key in namespace %q: it was never reserved, was released, or is past retention", req.GetNamespace())
	}
	return wire.RecordToProto(rec), nil
}

// Batch runs every operation through the interceptors registered for
// operations (idemv1.WithBatchOpInterceptor: metrics, authorization) and
// then the handler of its unary RPC, each on a goroutine of its own (an
// opWorkers worker), and answers when all are done.
func (g *grpcService) Batch(ctx context.Context, req *idemv1.BatchRequest) (_ *idemv1.BatchResponse, err error) {
	defer g.recoverRPC("Batch", &err)
	ops := req.GetOps()
	if len(ops) > idemv1.MaxBatchOps {
		return nil, errorf(CodeInvalidArgument, "a batch carries %d operations, more than %d: split it", len(ops), idemv1.MaxBatchOps)
	}
	if n := proto.Size(req); n > idemv1.MaxBatchBytes {
		return nil, errorf(CodePayloadTooLarge, "payload too large: a batch is %d bytes encoded, more than %d: split it, or send large completes on their own", n, idemv1.MaxBatchBytes)
	}
	if g.s.tracer != nil {
		trace.SpanFromContext(ctx).SetAttributes(tracing.Items.Int(len(ops)))
	}
	interceptors := idemv1.BatchOpInterceptors(ctx)
	results := make([]*idemv1.BatchResult, len(ops))
	var wg sync.WaitGroup
	for i, op := range ops {
		wg.Add(1)
		g.workers.run(func() {
			defer wg.Done()
			results[i] = g.batchOp(ctx, interceptors, op)
		})
	}
	wg.Wait()
	withholdLarge(results, idemv1.MaxBatchBytes)
	return &idemv1.BatchResponse{Results: results}, nil
}

// batchOp runs one operation of a batch as its unary RPC would run.
func (g *grpcService) batchOp(ctx context.Context, interceptors []grpc.UnaryServerInterceptor, op *idemv1.BatchOp) (res *idemv1.BatchResult) {
	method, req, ok := idemv1.BatchOpMethod(op)
	if !ok {
		st := (&Error{Code: CodeInvalidArgument, Message: "a batch operation names none of reserve, heartbeat, complete, release, get"}).GRPCStatus()
		return &idemv1.BatchResult{Result: &idemv1.BatchResult_Error{Error: idemv1.BatchErrorFromStatus(st)}}
	}
	defer func() {
		if p := recover(); p != nil { // an interceptor's panic: the handlers recover their own
			g.s.log.Error("panic in grpc batch operation", "method", method, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			st := (&Error{Code: CodeInternal, Message: internalMessage}).GRPCStatus()
			res = &idemv1.BatchResult{Result: &idemv1.BatchResult_Error{Error: idemv1.BatchErrorFromStatus(st)}}
		}
	}()
	octx, leader := idemv1.WithBatchOpLeader(ctx)
	octx, endSpan := g.s.startBatchOpSpan(octx, method)
	defer endSpan()
	info := &grpc.UnaryServerInfo{Server: g, FullMethod: method}
	resp, err := idemv1.ChainBatchOp(octx, interceptors, req, info, g.unaryHandler(method))
	res = &idemv1.BatchResult{LeaderId: leader()}
	if err != nil {
		res.Result = &idemv1.BatchResult_Error{Error: idemv1.BatchErrorFromStatus(status.Convert(err))}
		return res
	}
	switch r := resp.(type) {
	case *idemv1.ReserveResponse:
		res.Result = &idemv1.BatchResult_Reserve{Reserve: r}
	case *idemv1.HeartbeatResponse:
		res.Result = &idemv1.BatchResult_Heartbeat{Heartbeat: r}
	case *idemv1.CompleteResponse:
		res.Result = &idemv1.BatchResult_Complete{Complete: r}
	case *idemv1.ReleaseResponse:
		res.Result = &idemv1.BatchResult_Release{Release: r}
	case *idemv1.GetResponse:
		res.Result = &idemv1.BatchResult_Get{Get: r}
	default:
		st := (&Error{Code: CodeInternal, Message: internalMessage}).GRPCStatus()
		res.Result = &idemv1.BatchResult_Error{Error: idemv1.BatchErrorFromStatus(st)}
	}
	return res
}

// unaryHandler is the handler of the unary RPC fullMethod (one of
// idemv1.BatchOpMethod's).
func (g *grpcService) unaryHandler(fullMethod string) grpc.UnaryHandler {
	switch fullMethod {
	case idemv1.Idempotency_Reserve_FullMethodName:
		return func(ctx context.Context, req any) (any, error) { return g.Reserve(ctx, req.(*idemv1.ReserveRequest)) }
	case idemv1.Idempotency_Heartbeat_FullMethodName:
		return func(ctx context.Context, req any) (any, error) {
			return g.Heartbeat(ctx, req.(*idemv1.HeartbeatRequest))
		}
	case idemv1.Idempotency_Complete_FullMethodName:
		return func(ctx context.Context, req any) (any, error) { return g.Complete(ctx, req.(*idemv1.CompleteRequest)) }
	case idemv1.Idempotency_Release_FullMethodName:
		return func(ctx context.Context, req any) (any, error) { return g.Release(ctx, req.(*idemv1.ReleaseRequest)) }
	}
	return func(ctx context.Context, req any) (any, error) { return g.Get(ctx, req.(*idemv1.GetRequest)) }
}

// withholdLarge keeps a batch's response within limit bytes: the results
// of operations that change nothing (get, a reserve answered COMPLETED),
// the only ones that carry stored responses, are withheld, largest first,
// until the rest fit. The others are a few hundred bytes each, so 256 of
// them always fit.
func withholdLarge(results []*idemv1.BatchResult, limit int) {
	total := 0
	for _, r := range results {
		total += proto.Size(r) + 4 // tag and length of the repeated field
	}
	for total > limit {
		big, bigSize := -1, 0
		for i, r := range results {
			if !readOnlyResult(r) {
				continue
			}
			if n := proto.Size(r); n > bigSize {
				big, bigSize = i, n
			}
		}
		if big < 0 {
			return
		}
		results[big] = &idemv1.BatchResult{LeaderId: results[big].GetLeaderId(), Withheld: true}
		total -= bigSize - proto.Size(results[big])
	}
}

func readOnlyResult(r *idemv1.BatchResult) bool {
	if r.GetGet() != nil {
		return true
	}
	return r.GetReserve().GetOutcome() == idemv1.Outcome_COMPLETED
}

// apply is Server.apply for a gRPC request: the hop count comes from the
// request's metadata and the backend's leader hint goes back as a header,
// the wire form of data the backend takes and returns.
// Routing answers with Config.Routing; UNIMPLEMENTED when there is none.
func (g *grpcService) Routing(ctx context.Context, _ *idemv1.RoutingRequest) (_ *idemv1.RoutingResponse, err error) {
	defer g.recoverRPC("Routing", &err)
	if g.s.cfg.Routing == nil {
		return nil, status.Error(codes.Unimplemented, "this process does not serve routing (a router): send calls to it as to any endpoint")
	}
	return g.s.cfg.Routing(ctx)
}

func (g *grpcService) apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, *Error) {
	res, leader, e := g.s.applyRouted(ctx, cmd, incomingHops(ctx))
	setLeaderHeader(ctx, leader)
	return res, e
}

// get is Server.get for a gRPC request, as apply.
func (g *grpcService) get(ctx context.Context, namespace, key string) (fsm.Record, bool, *Error) {
	rec, found, leader, e := g.s.getRouted(ctx, namespace, key, incomingHops(ctx))
	setLeaderHeader(ctx, leader)
	return rec, found, e
}

func incomingHops(ctx context.Context) int { return idemv1.HopsFromIncomingContext(ctx) }

// setLeaderHeader sends the backend's leader hint: as the RPC's header, or
// as the leader_id of an operation of a batch.
func setLeaderHeader(ctx context.Context, leader string) {
	idemv1.SetLeaderHeader(ctx, leader)
}

// grpcEndpoint is the endpoint label of a full method name: the Idempotency
// RPCs by their JSON endpoint names, Admin RPCs as admin_<method>, anything
// else "other", so that the label set stays bounded.
func grpcEndpoint(fullMethod string) string {
	service, method, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok {
		return "other"
	}
	switch service {
	case "idem.v1.Idempotency":
		switch method {
		case "Reserve", "Heartbeat", "Complete", "Release", "Get", "Routing", "Batch", "Checkpoint":
			return strings.ToLower(method)
		case "BatchReserve":
			return endpointBatchReserve
		case "BatchComplete":
			return endpointBatchComplete
		}
	case "idem.v1.Admin":
		switch method {
		case "Status", "TransferLeader", "Snapshot", "ListKeys", "ForceRelease", "DeleteKey", "ListShard",
			"SetPolicy", "GetPolicy", "SetShardPolicy":
			return "admin_" + strings.ToLower(method)
		}
	}
	return "other"
}

// grpcOutcome is the outcome label of an RPC's result.
func grpcOutcome(resp any, err error) string {
	if err != nil {
		code, _, _ := idemv1.StatusToError(status.Convert(err))
		return string(code)
	}
	if r, ok := resp.(*idemv1.ReserveResponse); ok {
		return r.GetOutcome().String()
	}
	return outcomeOK
}

// unaryInterceptor recovers panics and records request metrics for every
// unary RPC on the server.
func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("panic in grpc handler", "method", info.FullMethod, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			resp, err = nil, (&Error{Code: CodeInternal, Message: internalMessage}).GRPCStatus().Err()
		}
		outcome := grpcOutcome(resp, err)
		s.metrics.observe("grpc", grpcEndpoint(info.FullMethod), outcome, time.Since(start))
		if n, ok := req.(interface{ GetNamespace() string }); ok && contract.ValidNamespace(n.GetNamespace()) {
			s.metrics.observeNamespace(n.GetNamespace(), outcome)
		}
		if s.tracer != nil {
			s.annotateRPC(ctx, info.FullMethod, req, resp, err)
		}
	}()
	if info.FullMethod == idemv1.Idempotency_Batch_FullMethodName {
		// Each operation is recorded (and recovered) as its unary RPC;
		// the batch itself once more, as endpoint "batch".
		ctx = idemv1.WithBatchOpInterceptor(ctx, s.unaryInterceptor)
	}
	return handler(ctx, req)
}
