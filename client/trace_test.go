package client_test

import (
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemtest"
)

// A span context as the host application's OpenTelemetry SDK would have
// put in a request's context.
var appSpan = trace.NewSpanContext(trace.SpanContextConfig{
	TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
	SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
	TraceFlags: trace.FlagsSampled,
})

const appTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// A call made with an active span carries its traceparent; one without
// carries none.
func TestClientSendsTraceparent(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	ctx := trace.ContextWithSpanContext(t.Context(), appSpan)
	res, err := c.Reserve(ctx, client.ReserveRequest{Namespace: "payments", Key: "traced"})
	if err != nil {
		t.Fatal(err)
	}
	if got := srv.Traceparent(idemtest.MethodReserve); got != appTraceparent {
		t.Errorf("traced reserve carried traceparent %q, want %q", got, appTraceparent)
	}
	if _, err := c.Complete(ctx, client.CompleteRequest{Namespace: "payments", Key: "traced", OwnerToken: res.OwnerToken, Response: client.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}
	if got := srv.Traceparent(idemtest.MethodComplete); got != appTraceparent {
		t.Errorf("traced complete carried traceparent %q, want %q", got, appTraceparent)
	}
	if _, err := c.Reserve(t.Context(), client.ReserveRequest{Namespace: "payments", Key: "untraced"}); err != nil {
		t.Fatal(err)
	}
	if got := srv.Traceparent(idemtest.MethodReserve); got != "" {
		t.Errorf("untraced reserve carried traceparent %q", got)
	}
}

// The middleware's reserve and complete continue the trace of the request
// it serves (as an otelhttp handler in front of it would start it).
func TestMiddlewareSendsTraceparent(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	h := client.Middleware(c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("paid"))
	}))
	traced := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(trace.ContextWithSpanContext(r.Context(), appSpan)))
	})
	url := serve(t, traced)
	if rep := post(t, url, "order-1", "{}"); rep.Status != http.StatusOK {
		t.Fatalf("POST: %d %s", rep.Status, rep.Body)
	}
	for _, m := range []idemtest.Method{idemtest.MethodReserve, idemtest.MethodComplete} {
		if got := srv.Traceparent(m); got != appTraceparent {
			t.Errorf("%s carried traceparent %q, want %q", m, got, appTraceparent)
		}
	}
}
