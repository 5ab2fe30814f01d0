package forward

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/topology"
)

// Whether a failed forwarded call may have been applied decides whether a
// release that then answers NOT_OWNER is reported as NOT_OWNER (the key was
// not ours) or as UNAVAILABLE (our first attempt may have released it). The
// decision comes from connection state, never from error text: these tests
// inject a dialer that fails, and a node that answers with the very text
// ("connection refused") that an error-text check would have trusted.

// scriptedNode serves Release with a scripted sequence of answers.
type scriptedNode struct {
	idemv1.UnimplementedIdempotencyServer
	mu      sync.Mutex
	answers []error // nil: OK; consumed in order, the last one repeats
	calls   atomic.Int32
}

func (s *scriptedNode) Release(context.Context, *idemv1.ReleaseRequest) (*idemv1.ReleaseResponse, error) {
	s.calls.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.answers[0]
	if len(s.answers) > 1 {
		s.answers = s.answers[1:]
	}
	if err != nil {
		return nil, err
	}
	return &idemv1.ReleaseResponse{}, nil
}

func serveScripted(t *testing.T, answers ...error) (string, *scriptedNode) {
	t.Helper()
	node := &scriptedNode{answers: answers}
	return serveNode(t, node), node
}

// serveNode serves node's API on a loopback port until the test ends and
// returns the address.
func serveNode(t *testing.T, node idemv1.IdempotencyServer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	idemv1.RegisterIdempotencyServer(srv, node)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// forwarderWith returns a Forwarder over nodes "n-1" (addr1) and "n-2"
// (addr2) whose dialer fails every dial of failAddr, and the shard they
// vote in.
func forwarderWith(t *testing.T, addr1, addr2, failAddr string) (*Forwarder, topology.Shard, *atomic.Int32) {
	t.Helper()
	topo := &topology.Topology{Cluster: "fwd", Regions: []topology.Region{{Name: "r", Nodes: []topology.Node{
		{ID: "n-1", GRPCAddr: addr1}, {ID: "n-2", GRPCAddr: addr2},
	}}}}
	var failedDials atomic.Int32
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		if addr == failAddr {
			failedDials.Add(1)
			return nil, errors.New("injected dial failure")
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	opts := append(DefaultDialOptions(), grpc.WithContextDialer(dialer))
	f, err := NewForwarder(ForwarderConfig{Topology: topo, DialOptions: opts, AttemptTimeout: 2 * time.Second, Logger: testutil.Logger(t, slog.LevelDebug)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, topology.Shard{ID: "r-0", HomeRegion: "r", Voters: []string{"n-1", "n-2"}}, &failedDials
}

var notOwner = status.Error(codes.FailedPrecondition, "NOT_OWNER")

func release(t *testing.T, f *Forwarder, shard topology.Shard) (fsm.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	return f.Apply(ctx, shard, &fsm.Command{Op: fsm.OpRelease, Namespace: "ns", Key: "k", OwnerToken: "tok_0123456789abcdef"}, "n-1", 0)
}

// A first attempt that never got a connection cannot have released the key,
// so the second node's NOT_OWNER is the answer.
func TestForwardFailedDialIsNotAmbiguous(t *testing.T) {
	const unreachable = "127.0.0.1:1" // never dialled: the injected dialer fails it
	addr2, n2 := serveScripted(t, notOwner)
	f, shard, failedDials := forwarderWith(t, unreachable, addr2, unreachable)
	res, err := release(t, f, shard)
	if err != nil || res.Outcome != fsm.OutcomeNotOwner {
		t.Fatalf("release = %v, %v; want NOT_OWNER (the failed dial cannot have applied it)", res.Outcome, err)
	}
	if failedDials.Load() == 0 || n2.calls.Load() == 0 {
		t.Fatalf("dials failed %d, n-2 called %d: the test did not exercise both nodes", failedDials.Load(), n2.calls.Load())
	}
}

// A first attempt that reached a node may have released the key, whatever
// its error says, so a later NOT_OWNER is UNAVAILABLE (outcome unknown).
func TestForwardFailureAfterSendIsAmbiguous(t *testing.T) {
	for name, first := range map[string]error{
		"unavailable with connection-refused text": status.Error(codes.Unavailable, "connection refused"),
		"unavailable":       status.Error(codes.Unavailable, "leader lost"),
		"deadline exceeded": status.Error(codes.DeadlineExceeded, "raft apply timed out"),
	} {
		t.Run(name, func(t *testing.T) {
			addr1, n1 := serveScripted(t, first)
			addr2, _ := serveScripted(t, notOwner)
			f, shard, _ := forwarderWith(t, addr1, addr2, "")
			_, err := release(t, f, shard)
			if !errors.Is(err, backend.ErrUnavailable) {
				t.Fatalf("release = %v; want UNAVAILABLE: n-1 received the first attempt", err)
			}
			if n1.calls.Load() == 0 {
				t.Fatal("n-1 was never called")
			}
		})
	}
}

// Without any failure, a NOT_OWNER is what it says.
func TestForwardNotOwnerWithoutFailure(t *testing.T) {
	addr1, _ := serveScripted(t, notOwner)
	f, shard, _ := forwarderWith(t, addr1, addr1, "")
	if res, err := release(t, f, shard); err != nil || res.Outcome != fsm.OutcomeNotOwner {
		t.Fatalf("release = %v, %v; want NOT_OWNER", res.Outcome, err)
	}
}

// The hop limit: a request that has already been forwarded MaxHops times is
// answered UNAVAILABLE without another forward (a leader moving faster than
// requests cannot bounce one around forever); one hop fewer still goes out.
func TestForwardHopLimit(t *testing.T) {
	addr1, n1 := serveScripted(t, nil)
	addr2, n2 := serveScripted(t, nil)
	f, shard, _ := forwarderWith(t, addr1, addr2, "")
	cmd := &fsm.Command{Op: fsm.OpRelease, Namespace: "ns", Key: "k", OwnerToken: "tok_0123456789abcdef"}
	_, err := f.Apply(t.Context(), shard, cmd, "n-1", MaxHops)
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "forwarded") {
		t.Fatalf("a request at the hop limit: %v, want UNAVAILABLE naming the hops", err)
	}
	if n1.calls.Load()+n2.calls.Load() != 0 {
		t.Fatalf("a request at the hop limit was forwarded (%d, %d calls)", n1.calls.Load(), n2.calls.Load())
	}
	if _, err := f.Apply(t.Context(), shard, cmd, "n-1", MaxHops-1); err != nil {
		t.Fatalf("a request one hop below the limit: %v", err)
	}
	if n1.calls.Load() != 1 {
		t.Fatalf("n-1 got %d calls, want the one forward", n1.calls.Load())
	}
}

// TestForwardOnlyVoterSaysSo: on the shard's only voter, which does not
// lead it (a dev node still electing itself), there is nobody to forward
// to; the answer is Unavailable and says why, not a dial to nowhere.
func TestForwardOnlyVoterSaysSo(t *testing.T) {
	topo := &topology.Topology{Cluster: "fwd", Regions: []topology.Region{{Name: "r", Nodes: []topology.Node{{ID: "n-1", GRPCAddr: "127.0.0.1:1"}}}}}
	f, err := NewForwarder(ForwarderConfig{Topology: topo, Self: "n-1", DialOptions: DefaultDialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	_, err = release(t, f, topology.Shard{ID: "r-0", HomeRegion: "r", Voters: []string{"n-1"}})
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "r-0 has no leader right now and this node is its only voter: it is starting up or unready") {
		t.Fatalf("release on the only voter, not leading: %v, want ErrUnavailable saying the node is the only voter", err)
	}
}

// deadlineNode answers Complete at once and records how long the caller's
// deadline gave it.
type deadlineNode struct {
	idemv1.UnimplementedIdempotencyServer
	left chan time.Duration
}

func (d *deadlineNode) Complete(ctx context.Context, _ *idemv1.CompleteRequest) (*idemv1.CompleteResponse, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		return nil, status.Error(codes.Internal, "no deadline")
	}
	d.left <- time.Until(dl)
	return &idemv1.CompleteResponse{}, nil
}

// A forwarded completion's attempt gets a second per MiB it carries on top
// of the attempt timeout, so that a multi-megabyte response is not cut off
// (and sent again) at a bound meant for small commands; a small one keeps
// the bound.
func TestForwardAttemptTimeoutGrowsWithPayload(t *testing.T) {
	node := &deadlineNode{left: make(chan time.Duration, 1)}
	topo := &topology.Topology{Cluster: "fwd", Regions: []topology.Region{{Name: "r", Nodes: []topology.Node{{ID: "n-1", GRPCAddr: serveNode(t, node)}}}}}
	const attempt = 300 * time.Millisecond
	f, err := NewForwarder(ForwarderConfig{Topology: topo, AttemptTimeout: attempt})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	shard := topology.Shard{ID: "r-0", HomeRegion: "r", Voters: []string{"n-1"}}
	for _, tc := range []struct {
		body     int
		min, max time.Duration
	}{
		{body: 100, min: 0, max: attempt},
		// More than the attempt timeout alone (which is all the node
		// would get without the allowance), however long the 3 MiB took to
		// arrive on a loaded box; PayloadAllowance's size is checked below.
		{body: 3 << 20, min: attempt, max: attempt + 3*time.Second},
	} {
		cmd := &fsm.Command{Op: fsm.OpComplete, Namespace: "ns", Key: "k", OwnerToken: "tok_0123456789abcdef",
			Response: &fsm.Response{Status: 200, Body: make([]byte, tc.body)}}
		if want := time.Duration(tc.body) * time.Second / (1 << 20); PayloadAllowance(cmd) != want {
			t.Errorf("PayloadAllowance(%d-byte body) = %s, want %s", tc.body, PayloadAllowance(cmd), want)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		_, err := f.Apply(ctx, shard, cmd, "", 0)
		cancel()
		if err != nil {
			t.Fatalf("%d-byte completion: %v", tc.body, err)
		}
		if left := <-node.left; left <= tc.min || left > tc.max {
			t.Errorf("%d-byte completion: the node was given %s, want (%s, %s]", tc.body, left, tc.min, tc.max)
		}
	}
}
