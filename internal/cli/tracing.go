package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem/internal/flagdoc"
	"github.com/idem-dev/idem/internal/tracing"
)

// TraceOptions are the tracing flags of the serving commands. Everything
// else is the OpenTelemetry SDK's standard environment, which it reads
// itself: OTEL_EXPORTER_OTLP_ENDPOINT (or _TRACES_ENDPOINT),
// OTEL_EXPORTER_OTLP_PROTOCOL (or _TRACES_PROTOCOL; http/protobuf or grpc),
// OTEL_EXPORTER_OTLP_HEADERS, OTEL_TRACES_SAMPLER and _ARG,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*.
type TraceOptions struct {
	// Endpoint is the OTLP collector's base URL (--otlp-endpoint); it
	// replaces OTEL_EXPORTER_OTLP_ENDPOINT. Empty: that variable's, and
	// with neither tracing is off.
	Endpoint string
	// SampleRatio is the share of traces that start in this process which
	// are recorded (--trace-sample-ratio, 0..1); a caller's traceparent
	// decides for its trace. Negative: OTEL_TRACES_SAMPLER's choice
	// (parentbased_always_on when unset).
	SampleRatio float64
	// Keys puts idempotency keys in clear on spans (--trace-keys).
	Keys bool
}

// DefaultTraceOptions: off unless the environment names a collector.
func DefaultTraceOptions() TraceOptions { return TraceOptions{SampleRatio: -1} }

// FlagTable is the tracing flags, in section.
func (o *TraceOptions) FlagTable(section string) []flagdoc.Flag {
	return []flagdoc.Flag{
		{Name: "otlp-endpoint", Value: &o.Endpoint, Section: section, Usage: "export traces over OTLP to the collector at this base `URL` (http://HOST:4318 for OTLP/HTTP, http://HOST:4317 with OTEL_EXPORTER_OTLP_PROTOCOL=grpc); replaces OTEL_EXPORTER_OTLP_ENDPOINT. With neither, tracing is off. The other OTEL_* variables (sampler, service name, resource attributes, headers) are honoured"},
		{Name: "trace-sample-ratio", Value: &o.SampleRatio, Section: section, Usage: "share `R` (0..1) of the traces starting here that are recorded; a caller's traceparent decides for its own trace. Negative: OTEL_TRACES_SAMPLER decides (default parentbased_always_on)"},
		{Name: "trace-keys", Value: &o.Keys, Section: section, Usage: "put idempotency keys in clear on spans (attribute idem.key); off, spans carry the namespace, operation and outcome but never the key. Owner tokens and bodies are never traced"},
	}
}

// Enabled reports whether o and the environment ask for traces.
func (o TraceOptions) Enabled() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") || os.Getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	return o.Endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// StartTracing builds the tracer provider o and the OTEL_* environment ask
// for: nil (tracing off, nothing to shut down) unless a collector is
// named. stop flushes the spans still queued, for at most 5 s (a
// collector that is down must not hold the exit); defer it.
//
// The resource names service (OTEL_SERVICE_NAME replaces it), version and
// attrs (the node id, the region), then OTEL_RESOURCE_ATTRIBUTES.
func StartTracing(ctx context.Context, o TraceOptions, service, version string, logger *slog.Logger, attrs ...attribute.KeyValue) (tp trace.TracerProvider, stop func(), err error) {
	shutdown := func() {}
	if !o.Enabled() {
		return nil, shutdown, nil
	}
	if o.SampleRatio > 1 {
		return nil, shutdown, fmt.Errorf("--trace-sample-ratio %v: use 0..1, or a negative value for OTEL_TRACES_SAMPLER", o.SampleRatio)
	}
	protocol := firstEnv("http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
	var exp sdktrace.SpanExporter
	switch protocol {
	case "http/protobuf":
		var opts []otlptracehttp.Option
		if o.Endpoint != "" {
			u, perr := endpointURL(o.Endpoint)
			if perr != nil {
				return nil, shutdown, perr
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(strings.TrimSuffix(u, "/")+"/v1/traces"))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	case "grpc":
		var opts []otlptracegrpc.Option
		if o.Endpoint != "" {
			u, perr := endpointURL(o.Endpoint)
			if perr != nil {
				return nil, shutdown, perr
			}
			opts = append(opts, otlptracegrpc.WithEndpointURL(u))
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	default:
		return nil, shutdown, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: idem exports traces over http/protobuf or grpc", protocol)
	}
	if err != nil {
		return nil, shutdown, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	// The service's name and version first, so that OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES, read after them, take precedence.
	res, err := resource.New(ctx,
		resource.WithAttributes(append([]attribute.KeyValue{attribute.String("service.name", service), attribute.String("service.version", version)}, attrs...)...),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, shutdown, fmt.Errorf("tracing: OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
	sampler := "OTEL_TRACES_SAMPLER"
	if o.SampleRatio >= 0 {
		opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))))
		sampler = fmt.Sprintf("parent-based, ratio %v", o.SampleRatio)
	}
	sdk := sdktrace.NewTracerProvider(opts...)
	endpoint := o.Endpoint
	if endpoint == "" {
		endpoint = firstEnv("", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	logger.Info("tracing on", "protocol", protocol, "endpoint", endpoint,
		"sampler", sampler, "keys_in_clear", o.Keys)
	return sdk, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := sdk.Shutdown(ctx); err != nil {
			logger.Warn("tracing: spans not flushed on exit", "error", err)
		}
	}, nil
}

// TraceLogger is logger with trace_id and span_id on every line logged
// with a request's context, when tracing is on (tp non-nil).
func TraceLogger(logger *slog.Logger, tp trace.TracerProvider) *slog.Logger {
	if tp == nil {
		return logger
	}
	return slog.New(tracing.LogHandler(logger.Handler()))
}

// endpointURL checks an --otlp-endpoint value.
func endpointURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("--otlp-endpoint %q: use a URL such as http://127.0.0.1:4318", s)
	}
	return s, nil
}

// firstEnv is the value of the first of names that is set, else def.
func firstEnv(def string, names ...string) string {
	for _, name := range names {
		if v := os.Getenv(name); v != "" {
			return v
		}
	}
	return def
}
