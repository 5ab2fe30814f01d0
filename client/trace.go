package client

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/idem-dev/idem/internal/tracing"
)

// Trace context. When the host application has an active OpenTelemetry
// span in a call's context (its SDK and instrumentation put it there: an
// otelhttp handler, a span it started), every RPC of the call carries the
// span's W3C traceparent (and tracestate), so that idem's spans (router,
// forwards, Raft) join the application's trace. The client depends on the
// OpenTelemetry API only, and an application without it, or a call without
// a span, sends nothing more. Middleware and the Do helpers pass their
// request's context down, so they propagate the same way.
//
// A Batch RPC (calls coalesced on one connection) carries the trace
// context of its first operation.

// traceInterceptor adds the trace context of ctx's span to the RPC's
// metadata.
func traceInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(withTraceContext(ctx, ctx), method, req, reply, cc, opts...)
}

// withTraceContext is ctx with the trace context of from's span appended
// to its outgoing metadata; ctx itself when from has none.
func withTraceContext(ctx, from context.Context) context.Context {
	if !trace.SpanContextFromContext(from).IsValid() {
		return ctx
	}
	carrier := propagation.MapCarrier{}
	tracing.Propagator.Inject(from, carrier)
	kv := make([]string, 0, 2*len(carrier))
	for k, v := range carrier {
		kv = append(kv, k, v)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}
