package cli

import (
	"log/slog"
	"strings"
	"testing"
)

// Tracing is off unless a collector is named; bad settings are refused at
// start with the flag's name.
func TestStartTracing(t *testing.T) {
	for _, v := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED",
		"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		t.Setenv(v, "")
	}
	log := slog.New(slog.DiscardHandler)
	tp, stop, err := StartTracing(t.Context(), DefaultTraceOptions(), "idemnode", "test", log)
	if err != nil || tp != nil {
		t.Fatalf("no collector named: provider %v, error %v; want tracing off", tp, err)
	}
	stop()

	o := DefaultTraceOptions()
	o.Endpoint = "http://127.0.0.1:4318"
	tp, stop, err = StartTracing(t.Context(), o, "idemnode", "test", log)
	if err != nil || tp == nil {
		t.Fatalf("--otlp-endpoint set: provider %v, error %v; want tracing on", tp, err)
	}
	stop()
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	o.Endpoint = "http://127.0.0.1:4317"
	if tp, stop, err = StartTracing(t.Context(), o, "idemnode", "test", log); err != nil || tp == nil {
		t.Fatalf("OTLP over gRPC: provider %v, error %v; want tracing on", tp, err)
	}
	stop()
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "")

	t.Setenv("OTEL_SDK_DISABLED", "true")
	if tp, _, _ := StartTracing(t.Context(), o, "idemnode", "test", log); tp != nil {
		t.Error("OTEL_SDK_DISABLED=true: tracing on")
	}
	t.Setenv("OTEL_SDK_DISABLED", "")

	for _, tc := range []struct {
		name, endpoint, protocol string
		ratio                    float64
		want                     string
	}{
		{"bad endpoint", "127.0.0.1:4318", "", -1, "--otlp-endpoint"},
		{"ratio above 1", "http://127.0.0.1:4318", "", 1.5, "--trace-sample-ratio"},
		{"unknown protocol", "http://127.0.0.1:4318", "http/json", -1, "OTEL_EXPORTER_OTLP_PROTOCOL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tc.protocol)
			o := TraceOptions{Endpoint: tc.endpoint, SampleRatio: tc.ratio}
			_, _, err := StartTracing(t.Context(), o, "idemnode", "test", log)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}
