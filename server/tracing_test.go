package server

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/metadata"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/internal/tracing"
)

const (
	callerTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpanID  = "00f067aa0ba902b7"
	traceparent   = "00-" + callerTraceID + "-" + callerSpanID + "-01"
)

func tracedHarness(t *testing.T, keys bool) (*harness, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	h := newHarness(t, newMemBackend(newFakeClock()), func(c *Config) { c.TracerProvider, c.TraceKeys = tp, keys })
	return h, rec
}

func (h *harness) postTraced(path, body string) reply {
	h.t.Helper()
	req, _ := http.NewRequestWithContext(h.t.Context(), http.MethodPost, h.httpURL+path, strings.NewReader(body))
	req.Header.Set("traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	resp.Body.Close()
	return reply{status: resp.StatusCode}
}

// spanNamed is the one ended span called name.
func spanNamed(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %q, want 1", len(found), name)
	}
	return found[0]
}

func attrs(s sdktrace.ReadOnlySpan) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

// The API's spans continue the caller's traceparent (JSON and gRPC) and
// carry namespace, operation and outcome; the key only when opted in.
func TestAPISpansContinueTheCallersTrace(t *testing.T) {
	for _, keys := range []bool{false, true} {
		h, rec := tracedHarness(t, keys)
		if r := h.postTraced("/v1/namespaces/payments/keys/order-42:reserve", `{}`); r.status != http.StatusOK {
			t.Fatalf("reserve: %d", r.status)
		}
		ctx := metadata.AppendToOutgoingContext(t.Context(), "traceparent", traceparent)
		if _, err := h.grpc.Release(ctx, &idemv1.ReleaseRequest{Namespace: "payments", Key: "order-42", OwnerToken: "someone-elses-token"}); err == nil {
			t.Fatal("release by a stranger succeeded")
		}
		for _, tc := range []struct{ name, op, outcome string }{
			{"idem.http reserve", "reserve", "ACQUIRED"},
			{"idem.v1.Idempotency/Release", "release", string(CodeNotOwner)},
		} {
			s := spanNamed(t, rec, tc.name)
			a := attrs(s)
			if s.Parent().TraceID().String() != callerTraceID || s.Parent().SpanID().String() != callerSpanID || !s.Parent().IsRemote() {
				t.Errorf("%s: parent %v, want the caller's span %s", tc.name, s.Parent(), callerSpanID)
			}
			if a["idem.namespace"] != "payments" || a["idem.operation"] != tc.op || a["idem.outcome"] != tc.outcome {
				t.Errorf("%s: attributes %v, want namespace payments, operation %s, outcome %s", tc.name, a, tc.op, tc.outcome)
			}
			if got, has := a["idem.key"]; has != keys || (keys && got != "order-42") {
				t.Errorf("%s with TraceKeys %v: idem.key %q (present %v)", tc.name, keys, got, has)
			}
			for k, v := range a {
				if strings.Contains(v, "someone-elses-token") || (!keys && strings.Contains(v, "order-42")) {
					t.Errorf("%s: attribute %s=%q carries a token or the key", tc.name, k, v)
				}
			}
		}
	}
}

// A batch's span counts its items.
func TestBatchSpanCountsItems(t *testing.T) {
	h, rec := tracedHarness(t, false)
	if r := h.postTraced("/v1/namespaces/ns/keys:batch-reserve", `{"items":[{"key":"a"},{"key":"b"},{"key":"c"}]}`); r.status != http.StatusOK {
		t.Fatalf("batch-reserve: %d", r.status)
	}
	if a := attrs(spanNamed(t, rec, "idem.http batch_reserve")); a["idem.batch.items"] != "3" {
		t.Errorf("batch span attributes %v, want idem.batch.items 3", a)
	}
}

// A request's log lines name its trace when the logger has the tracing
// handler (as the commands set it up with tracing on).
func TestRequestLogLinesCarryTraceIDs(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	var logs testutil.Buffer
	h := newHarness(t, &errBackend{err: errors.New("disk on fire")}, func(c *Config) {
		c.TracerProvider = tp
		c.Logger = slog.New(tracing.LogHandler(slog.NewJSONHandler(&logs, nil)))
	})
	if r := h.postTraced("/v1/namespaces/payments/keys/k:reserve", `{}`); r.status != http.StatusInternalServerError {
		t.Fatalf("reserve over a failing backend: %d, want 500", r.status)
	}
	line, _, _ := bytes.Cut([]byte(logs.String()), []byte("\n"))
	if !bytes.Contains(line, []byte(`"msg":"backend failed"`)) || !bytes.Contains(line, []byte(`"trace_id":"`+callerTraceID+`"`)) ||
		!bytes.Contains(line, []byte(`"span_id":"`)) {
		t.Errorf("backend failure logged without the request's trace: %s", logs.String())
	}
}
