package node

import (
	"errors"
	"testing"

	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idem-dev/idem/internal/tracing"
)

// A topology-change step is a span of its own with its kind, shard, the
// node or shard it concerns and its partition count, and an error status
// when it failed; without tracing it records nothing and costs no span.
func TestTopologyStepSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	n := &Node{tracer: tracing.Tracer(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))}
	_, end := n.stepSpan(t.Context(), moveStep{shard: "r1-0", op: "handoff", node: "r1-2", partitions: []uint32{3, 4, 5}})
	end(errors.New("no leader of r1-2"))
	_, end = n.stepSpan(t.Context(), moveStep{shard: "r1-1", op: "add_learner", node: "r1-4"})
	end(nil)
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	want := []map[string]string{
		{"idem.step": "handoff", "idem.shard": "r1-0", "idem.node": "r1-2", "idem.partitions": "3"},
		{"idem.step": "add_learner", "idem.shard": "r1-1", "idem.node": "r1-4", "idem.partitions": "0"},
	}
	for i, s := range spans {
		if s.Name() != "idem.topology_step" {
			t.Errorf("span %d named %q", i, s.Name())
		}
		got := map[string]string{}
		for _, kv := range s.Attributes() {
			got[string(kv.Key)] = kv.Value.Emit()
		}
		for k, v := range want[i] {
			if got[k] != v {
				t.Errorf("span %d: %s = %q, want %q (all: %v)", i, k, got[k], v, got)
			}
		}
	}
	if spans[0].Status().Code != otelcodes.Error || spans[1].Status().Code == otelcodes.Error {
		t.Errorf("statuses %v, %v: want the failed step's an error and the other's not", spans[0].Status(), spans[1].Status())
	}
	off := &Node{}
	ctx, end := off.stepSpan(t.Context(), moveStep{op: "handoff"})
	end(nil)
	if ctx != t.Context() {
		t.Error("without tracing the step's context changed")
	}
}
