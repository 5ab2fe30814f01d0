package server

import (
	"context"
	"net/http"
	"strconv"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/idem-dev/idem/internal/tracing"
)

// Spans of the API (Config.TracerProvider). A gRPC call's span is
// otelgrpc's server span (named after the method), which continues the
// caller's traceparent; the interceptor adds idem's attributes to it. A
// JSON call's span is this package's own, not otelhttp's: otelhttp records
// the URL path, and the API's paths carry the key.

// grpcTraceOptions is the stats handler that extracts the caller's trace
// context and starts each RPC's span; none when tracing is off.
func (s *Server) grpcTraceOptions() []grpc.ServerOption {
	if s.cfg.TracerProvider == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(s.cfg.TracerProvider), otelgrpc.WithPropagators(tracing.Propagator)))}
}

// namespaced is every Idempotency request that names a namespace.
type namespaced interface{ GetNamespace() string }

// keyed is every Idempotency request that names a key.
type keyed interface{ GetKey() string }

// annotateRPC puts idem's attributes on ctx's span once the RPC is
// answered.
func (s *Server) annotateRPC(ctx context.Context, fullMethod string, req, resp any, err error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	outcome := grpcOutcome(resp, err)
	attrs := make([]attribute.KeyValue, 0, 4)
	attrs = append(attrs, tracing.Operation.String(grpcEndpoint(fullMethod)), tracing.Outcome.String(outcome))
	if r, ok := req.(namespaced); ok {
		attrs = append(attrs, tracing.Namespace.String(r.GetNamespace()))
	}
	if r, ok := req.(keyed); ok {
		attrs = append(attrs, tracing.KeyAttribute(s.cfg.TraceKeys, r.GetKey())...)
	}
	span.SetAttributes(attrs...)
	if err != nil && serverFault(outcome) {
		span.SetStatus(codes.Error, outcome)
	}
}

// serverFault reports whether an outcome is the service's failure rather
// than an answer the caller asked for (a span's error status).
func serverFault(outcome string) bool {
	return outcome == string(CodeInternal) || outcome == string(CodeUnavailable)
}

// startBatchOpSpan starts the span of one operation of a gRPC Batch, a
// child of the Batch RPC's span; ctx unchanged when that is not recorded.
func (s *Server) startBatchOpSpan(ctx context.Context, method string) (context.Context, func()) {
	if s.tracer == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, func() {}
	}
	ctx, span := s.tracer.Start(ctx, "idem.batch_op "+grpcEndpoint(method))
	return ctx, func() { span.End() }
}

// httpSpan is the span of one JSON API call.
type httpSpan struct {
	s    *Server
	span trace.Span
}

// startHTTPSpan continues the caller's traceparent (or starts a trace) for
// a JSON API call; r carries the span on.
func (s *Server) startHTTPSpan(r *http.Request) (*http.Request, *httpSpan) {
	ctx := tracing.Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := s.tracer.Start(ctx, "idem.http", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method)))
	return r.WithContext(ctx), &httpSpan{s: s, span: span}
}

// end names the span after the endpoint and ends it with idem's attributes.
func (h *httpSpan) end(rt route, outcome string, status int) {
	if h.span.IsRecording() {
		h.span.SetName("idem.http " + rt.endpoint)
		attrs := []attribute.KeyValue{tracing.Operation.String(rt.endpoint), tracing.Outcome.String(outcome),
			attribute.Int("http.response.status_code", status)}
		if rt.namespace != "" {
			attrs = append(attrs, tracing.Namespace.String(rt.namespace))
		}
		if rt.key != "" {
			attrs = append(attrs, tracing.KeyAttribute(h.s.cfg.TraceKeys, rt.key)...)
		}
		h.span.SetAttributes(attrs...)
		if serverFault(outcome) {
			h.span.SetStatus(codes.Error, outcome+" (HTTP "+strconv.Itoa(status)+")")
		}
	}
	h.span.End()
}
