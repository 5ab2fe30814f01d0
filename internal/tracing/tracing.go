// Package tracing is what idem's serving packages share about OpenTelemetry
// traces: the propagator (W3C trace context: traceparent and tracestate),
// the names of the spans' attributes, and the slog handler that puts a
// request's trace and span ids on its log lines, so that logs and traces
// join.
//
// It imports the OpenTelemetry API only. The SDK (the tracer provider, the
// sampler, the OTLP exporters) is set up by the commands (internal/cli) and
// handed down as a trace.TracerProvider in each component's Config; a nil
// provider means tracing is off, and every component then skips its
// tracing code entirely (no no-op spans, no wrapped handlers), so that off
// costs nothing per request.
//
// What a span may carry: a namespace, an operation, an outcome, shard,
// region and node names, counts and times. Never an owner token or a body;
// never a key in clear unless the operator opted in (KeyAttribute).
package tracing

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// InstrumentationName names idem's tracers (the instrumentation scope).
const InstrumentationName = "github.com/idem-dev/idem"

// Propagator reads and writes W3C trace context (traceparent, tracestate)
// on every hop idem makes. It is used as given, never the process-wide
// otel.GetTextMapPropagator, whose default propagates nothing.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Attribute keys of idem's spans.
const (
	Namespace = attribute.Key("idem.namespace")
	Operation = attribute.Key("idem.operation")
	Outcome   = attribute.Key("idem.outcome")
	Key       = attribute.Key("idem.key") // only with the operator's opt-in
	Shard     = attribute.Key("idem.shard")
	Region    = attribute.Key("idem.region")
	Node      = attribute.Key("idem.node")
	Hops      = attribute.Key("idem.hops")
	Attempt   = attribute.Key("idem.attempt")
	Items     = attribute.Key("idem.batch.items")
	WaitMs    = attribute.Key("idem.wait_ms")
	// A topology-change step: its kind ("add_learner", "handoff", ...)
	// and how many ring partitions it moves or drops.
	StepKind   = attribute.Key("idem.step")
	Partitions = attribute.Key("idem.partitions")
	// HandoffAttempt is the fenced handoff attempt a step belongs to.
	HandoffAttempt = attribute.Key("idem.handoff.attempt")
)

// Log attribute keys of a request's trace context.
const (
	LogTraceID = "trace_id"
	LogSpanID  = "span_id"
)

// Tracer is tp's tracer for idem's spans; nil when tp is nil (tracing off).
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(InstrumentationName)
}

// KeyAttribute is the key as a span attribute when the operator opted in
// (keys true), and nothing otherwise: a key may be personal data (an
// order or payment id), so traces leave it out by default.
func KeyAttribute(keys bool, key string) []attribute.KeyValue {
	if !keys {
		return nil
	}
	return []attribute.KeyValue{Key.String(key)}
}

// LogHandler wraps h so that a record logged with a context that carries a
// valid span (logger.InfoContext(ctx, ...)) gets trace_id and span_id
// attributes: a request's log lines then name the trace they belong to.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String(LogTraceID, sc.TraceID().String()), slog.String(LogSpanID, sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(attrs)}
}

func (h logHandler) WithGroup(name string) slog.Handler { return logHandler{h.Handler.WithGroup(name)} }

// Links are the span contexts of ctxs that are valid, as span links: the
// callers whose work one span (a packed Raft entry, a batch RPC) does.
func Links(ctxs []context.Context) []trace.Link {
	links := make([]trace.Link, 0, len(ctxs))
	for _, ctx := range ctxs {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return links
}
