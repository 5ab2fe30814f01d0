package server

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/fsm"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// grpcService is the Idempotency service: the same validation as the JSON
// API (validator), the same backend calls (Server.apply, Server.get).
type grpcService struct {
	idemv1.UnimplementedIdempotencyServer
	s *Server
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
	})
	if e != nil {
		return nil, e
	}
	res, e := g.apply(ctx, cmd)
	if e != nil {
		return nil, e
	}
	out := idemv1.ReserveToProto(res)
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
	return idemv1.RecordToProto(rec), nil
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

func incomingHops(ctx context.Context) int {
	md, _ := metadata.FromIncomingContext(ctx)
	return idemv1.HopsFromMetadata(md)
}

func setLeaderHeader(ctx context.Context, leader string) {
	if leader != "" {
		_ = grpc.SetHeader(ctx, metadata.Pairs(idemv1.LeaderHeader, leader))
	}
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
		case "Reserve", "Heartbeat", "Complete", "Release", "Get", "Routing":
			return strings.ToLower(method)
		}
	case "idem.v1.Admin":
		switch method {
		case "Status", "TransferLeader", "Snapshot", "ListKeys", "ForceRelease", "DeleteKey", "ListShard":
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
		s.metrics.observe("grpc", grpcEndpoint(info.FullMethod), grpcOutcome(resp, err), time.Since(start))
	}()
	return handler(ctx, req)
}
