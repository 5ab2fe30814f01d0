package auth

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/security/pki"
)

// ForwardedPrincipalMetadata is ForwardedPrincipalHeader's gRPC metadata key.
var ForwardedPrincipalMetadata = strings.ToLower(ForwardedPrincipalHeader)

// CredentialsFromGRPC collects what the RPC in ctx presents: the verified
// client certificate of its connection, the "authorization" metadata, and,
// from a node or router peer only, the forwarded principal.
func CredentialsFromGRPC(ctx context.Context) Credentials {
	var c Credentials
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			c.Peer = PeerIdentity(&info.State)
		}
	}
	// ValueFromIncomingContext reads one key; FromIncomingContext would
	// copy the whole metadata of every call.
	if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
		c.Authorization = v[0]
	}
	if c.Peer.Kind.Peer() {
		if v := metadata.ValueFromIncomingContext(ctx, ForwardedPrincipalMetadata); len(v) > 0 {
			c.Forwarded = v[0]
		}
	}
	return c
}

// internalMetadata are the keys of gRPC metadata that only idem's own
// processes send each other: the hop count (a request carrying one is
// treated as forwarded: it is not forwarded again past MaxHops), the
// leader hint and the forwarded principal.
var internalMetadata = []string{idemv1.HopsHeader, idemv1.LeaderHeader, ForwardedPrincipalMetadata}

// withoutForeignInternalMetadata returns ctx with internalMetadata removed
// from the incoming metadata unless the RPC came over TLS from a node or
// router peer (a verified node or router certificate): a client cannot
// claim that its request was forwarded, and so hide an operator action as
// a forwarded one or steer forwarding. Without TLS (an insecure process:
// loopback, every caller root) there is no identity to judge by and the
// metadata is honoured, as the processes of an insecure cluster need it
// from each other.
func withoutForeignInternalMetadata(ctx context.Context) context.Context {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ctx
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || PeerIdentity(&info.State).Kind.Peer() {
		return ctx
	}
	found := false
	for _, k := range internalMetadata {
		if len(metadata.ValueFromIncomingContext(ctx, k)) > 0 {
			found = true
			break
		}
	}
	if !found {
		return ctx // the common case: no copy
	}
	md, _ := metadata.FromIncomingContext(ctx)
	md = md.Copy()
	for _, k := range internalMetadata {
		delete(md, k)
	}
	return metadata.NewIncomingContext(ctx, md)
}

// GRPCTargetFunc classifies an RPC; GRPCTarget is the idem.v1 services'.
// For a stream, req is nil (the namespace of a stream is not known before
// its first message, so stream RPCs are classified by method).
type GRPCTargetFunc func(fullMethod string, req any) Target

// UnaryServerInterceptor checks every unary RPC with Authorize; a refusal is
// returned as the gRPC status (UNAUTHENTICATED, PERMISSION_DENIED,
// RESOURCE_EXHAUSTED with RetryInfo) and the handler never runs. An allowed
// RPC runs with its principal in the context. target nil means GRPCTarget.
func (a *Authorizer) UnaryServerInterceptor(target GRPCTargetFunc) grpc.UnaryServerInterceptor {
	if target == nil {
		target = GRPCTarget
	}
	authorizeCost := func(cost int) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			p, err := a.authorize(CredentialsFromGRPC(ctx), target(info.FullMethod, req), cost)
			if err != nil {
				return nil, err.(*Error).GRPCStatus().Err()
			}
			return handler(a.withWaitCharge(WithPrincipal(ctx, p), p), req)
		}
	}
	authorize, authorizeItem := authorizeCost(1), authorizeCost(0)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx = withoutForeignInternalMetadata(ctx)
		switch info.FullMethod {
		case idemv1.Idempotency_BatchReserve_FullMethodName, idemv1.Idempotency_BatchComplete_FullMethodName:
			// A batch call of N items is charged N, all at once, before
			// any item is looked at (429 for the whole call when the
			// rate cannot pay them); each item is then authorized as
			// its unary RPC without a further charge.
			p, err := a.authorize(CredentialsFromGRPC(ctx), target(info.FullMethod, req), batchItems(req))
			if err != nil {
				return nil, err.(*Error).GRPCStatus().Err()
			}
			return handler(idemv1.WithBatchOpInterceptor(WithPrincipal(ctx, p), authorizeItem), req)
		case idemv1.Idempotency_Batch_FullMethodName:
		default:
			return authorize(ctx, req, info, handler)
		}
		// A batch needs a known caller and is charged its operation
		// count at once; each operation is then authorized exactly as
		// its unary RPC (the connection's credentials, the operation's
		// namespace), without a further charge.
		p, err := a.authorize(CredentialsFromGRPC(ctx), Target{Verb: VerbAuthenticate}, batchItems(req))
		if err != nil {
			return nil, err.(*Error).GRPCStatus().Err()
		}
		return handler(idemv1.WithBatchOpInterceptor(WithPrincipal(ctx, p), authorizeItem), req)
	}
}

// batchItems is the charge of a batch RPC: its item (or operation) count,
// at least one.
func batchItems(req any) int {
	n := 0
	switch r := req.(type) {
	case *idemv1.BatchReserveRequest:
		n = len(r.GetItems())
	case *idemv1.BatchCompleteRequest:
		n = len(r.GetItems())
	case *idemv1.BatchRequest:
		n = len(r.GetOps())
	}
	return max(n, 1)
}

// StreamServerInterceptor is UnaryServerInterceptor for streams (target is
// called with a nil request).
func (a *Authorizer) StreamServerInterceptor(target GRPCTargetFunc) grpc.StreamServerInterceptor {
	if target == nil {
		target = GRPCTarget
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		p, err := a.Authorize(CredentialsFromGRPC(ss.Context()), target(info.FullMethod, nil))
		if err != nil {
			return err.(*Error).GRPCStatus().Err()
		}
		ctx := withoutForeignInternalMetadata(ss.Context())
		return handler(srv, &principalStream{ServerStream: ss, ctx: a.withWaitCharge(WithPrincipal(ctx, p), p)})
	}
}

type principalStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *principalStream) Context() context.Context { return s.ctx }

// ForwardUnaryClientInterceptor is for the gRPC clients a node or router
// forwards with (dialed with pki's NodeClientTLS): it sends the principal of
// the context as ForwardedPrincipalMetadata, so the process holding the key
// checks that principal too, and drops one a caller may have set.
func ForwardUnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(forwardContext(ctx), method, req, reply, cc, opts...)
	}
}

func forwardContext(ctx context.Context) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	delete(md, ForwardedPrincipalMetadata)
	if p, ok := PrincipalFrom(ctx); ok && !p.Internal {
		md.Set(ForwardedPrincipalMetadata, p.Name)
	}
	return metadata.NewOutgoingContext(ctx, md)
}

// FromNodePeer reports whether the RPC of ctx came from a node: over TLS
// with a verified node certificate, or over a connection without TLS (an
// insecure cluster, where every caller is root). Services that only nodes
// call (the steps of a topology change) answer nobody else.
func FromNodePeer(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return true
	}
	return PeerIdentity(&info.State).Kind == pki.KindNode
}

// NodePeerID returns the node id of the RPC's verified node certificate.
// secure is false for a connection without TLS (an insecure cluster, where
// every caller is root and there is no identity to check); id is "" when
// the peer presented no node certificate.
func NodePeerID(ctx context.Context) (id string, secure bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", true
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", false
	}
	if pid := PeerIdentity(&info.State); pid.Kind == pki.KindNode {
		return pid.Name, true
	}
	return "", true
}
