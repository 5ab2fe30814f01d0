package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// A line logged with a traced request's context names its trace and span;
// one without, none.
func TestLogHandlerAddsTraceIDs(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(LogHandler(slog.NewJSONHandler(&buf, nil))).With("node", "n1")
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	log.InfoContext(trace.ContextWithSpanContext(context.Background(), sc), "traced")
	log.InfoContext(context.Background(), "untraced")
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2: %s", len(lines), buf.String())
	}
	var traced, untraced map[string]any
	if err := json.Unmarshal(lines[0], &traced); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(lines[1], &untraced); err != nil {
		t.Fatal(err)
	}
	if traced[LogTraceID] != "4bf92f3577b34da6a3ce929d0e0e4736" || traced[LogSpanID] != "00f067aa0ba902b7" || traced["node"] != "n1" {
		t.Errorf("traced line: %s", lines[0])
	}
	if _, ok := untraced[LogTraceID]; ok {
		t.Errorf("untraced line has a trace id: %s", lines[1])
	}
}

// Keys stay off spans unless the operator opted in.
func TestKeyAttribute(t *testing.T) {
	if got := KeyAttribute(false, "order-42"); len(got) != 0 {
		t.Errorf("KeyAttribute(false) = %v, want nothing", got)
	}
	if got := KeyAttribute(true, "order-42"); len(got) != 1 || got[0].Value.AsString() != "order-42" {
		t.Errorf("KeyAttribute(true) = %v", got)
	}
}
