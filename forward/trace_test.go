package forward

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/topology"
)

// traceNode answers Release with answer and records the traceparent of
// every call.
type traceNode struct {
	idemv1.UnimplementedIdempotencyServer
	answer error
	mu     sync.Mutex
	seen   []string
}

func (n *traceNode) Release(ctx context.Context, _ *idemv1.ReleaseRequest) (*idemv1.ReleaseResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	n.mu.Lock()
	n.seen = append(n.seen, strings.Join(md.Get("traceparent"), ","))
	n.mu.Unlock()
	if n.answer != nil {
		return nil, n.answer
	}
	return &idemv1.ReleaseResponse{}, nil
}

// Each forwarded attempt is a span (shard, target region and node, hop
// count, attempt) under the caller's, and the node it reaches gets the
// trace in its traceparent.
func TestForwardSpansAndTraceparent(t *testing.T) {
	down := &traceNode{answer: status.Error(codes.Unavailable, "leader moved")}
	up := &traceNode{}
	topo := &topology.Topology{Cluster: "fwd", Regions: []topology.Region{{Name: "r", Nodes: []topology.Node{
		{ID: "n-1", GRPCAddr: serveNode(t, down)}, {ID: "n-2", GRPCAddr: serveNode(t, up)},
	}}}}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	f, err := NewForwarder(ForwarderConfig{Topology: topo, TracerProvider: tp, Logger: testutil.Logger(t, slog.LevelDebug)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ctx, root := tp.Tracer("test").Start(ctx, "caller")
	shard := topology.Shard{ID: "r-0", HomeRegion: "r", Voters: []string{"n-1", "n-2"}}
	_, err = f.Apply(ctx, shard, &fsm.Command{Op: fsm.OpRelease, Namespace: "ns", Key: "k", OwnerToken: "tok_0123456789abcdef"}, "n-1", 0)
	root.End()
	if err != nil {
		t.Fatal(err)
	}
	var forwards []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "idem.forward" {
			forwards = append(forwards, s)
		}
	}
	if len(forwards) != 2 {
		t.Fatalf("%d forward spans, want one per attempt (2)", len(forwards))
	}
	for i, s := range forwards {
		a := map[string]string{}
		for _, kv := range s.Attributes() {
			a[string(kv.Key)] = kv.Value.Emit()
		}
		wantNode := []string{"n-1", "n-2"}[i]
		if s.Parent().SpanID() != root.SpanContext().SpanID() || a["idem.node"] != wantNode || a["idem.shard"] != "r-0" ||
			a["idem.region"] != "r" || a["idem.hops"] != "1" {
			t.Errorf("forward span %d: parent %s, attributes %v; want the caller's child to %s", i, s.Parent().SpanID(), a, wantNode)
		}
	}
	if forwards[0].Status().Code.String() != "Error" {
		t.Errorf("the failed attempt's span has status %v", forwards[0].Status())
	}
	traceID := root.SpanContext().TraceID().String()
	for name, n := range map[string]*traceNode{"n-1": down, "n-2": up} {
		if len(n.seen) == 0 || !strings.Contains(n.seen[0], traceID) {
			t.Errorf("%s got traceparent %q, want trace %s", name, n.seen, traceID)
		}
	}
}
