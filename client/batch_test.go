package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/server"
)

// gatedServer is the real gRPC service over backend.Mem whose RPCs wait at
// a gate until the test lets them through one by one, so that tests decide
// which calls are in flight and which queue in the client.
type gatedServer struct {
	addr string
	// noBatch answers Batch UNIMPLEMENTED, as a node older than v1.2.
	noBatch bool
	// failOnce fails the first operation on this key UNAVAILABLE before
	// anything is applied, alone or in a batch.
	failOnce string

	gate chan struct{} // one receive lets one RPC through

	mu       sync.Mutex
	waiting  int
	calls    map[string]int // RPCs by method
	ops      map[string]int // operations by method, alone or in a batch
	keys     map[string]int // operations by key
	answered map[string]int // operations by key, once the handler returned
	failed   bool
}

func startGated(t *testing.T, noBatch bool) *gatedServer {
	t.Helper()
	g := &gatedServer{noBatch: noBatch, gate: make(chan struct{}), calls: map[string]int{}, ops: map[string]int{}, keys: map[string]int{}, answered: map[string]int{}}
	api, err := server.New(server.Config{Backend: backend.NewMem(backend.MemConfig{})})
	if err != nil {
		t.Fatal(err)
	}
	gs := api.NewGRPCServer(grpc.ChainUnaryInterceptor(g.intercept))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.addr = lis.Addr().String()
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() {
		close(g.gate) // lets every RPC still waiting through
		gs.Stop()
	})
	return g
}

func (g *gatedServer) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	m := path.Base(info.FullMethod)
	g.mu.Lock()
	g.calls[m]++
	g.waiting++
	g.mu.Unlock()
	<-g.gate
	g.mu.Lock()
	g.waiting--
	g.mu.Unlock()
	if m == "Batch" {
		if g.noBatch {
			return nil, status.Error(codes.Unimplemented, "unknown method Batch")
		}
		ctx = idemv1.WithBatchOpInterceptor(ctx, g.op)
		return handler(ctx, req)
	}
	return g.op(ctx, req, info, handler)
}

// op counts an operation and injects failOnce.
func (g *gatedServer) op(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	key := req.(interface{ GetKey() string }).GetKey()
	g.mu.Lock()
	g.ops[path.Base(info.FullMethod)]++
	g.keys[key]++
	fail := key == g.failOnce && !g.failed
	if fail {
		g.failed = true
	}
	g.mu.Unlock()
	if fail {
		return nil, status.Error(codes.Unavailable, "gated: injected failure before applying")
	}
	resp, err := handler(ctx, req)
	g.mu.Lock()
	g.answered[key]++
	g.mu.Unlock()
	return resp, err
}

// let lets n RPCs through the gate.
func (g *gatedServer) let(n int) {
	for range n {
		g.gate <- struct{}{}
	}
}

func (g *gatedServer) count(m map[string]int, k string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return m[k]
}

// eventually polls cond until it holds, failing after 10 s with what.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// fillSlots starts two reserves, which take the connection's two RPC slots
// as unary RPCs and wait at the gate; it returns their results.
func fillSlots(t *testing.T, g *gatedServer, c *client.Client) chan error {
	t.Helper()
	done := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := c.Reserve(t.Context(), client.ReserveRequest{Namespace: ns, Key: fmt.Sprintf("slot-%d", i)})
			done <- err
		}()
	}
	eventually(t, "two unary reserves at the gate", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.waiting == 2
	})
	return done
}

func noRouting(c *client.Config) { c.DisableRouting = true }

// TestBatchCoalesces: calls that arrive while two RPCs are in flight go
// together in one Batch RPC when the first of them ends.
func TestBatchCoalesces(t *testing.T) {
	g := startGated(t, false)
	c := newClient(t, []string{g.addr}, noRouting)
	slots := fillSlots(t, g, c)

	const n = 50
	errs := make(chan error, n)
	for i := range n {
		go func() {
			r, err := c.Reserve(t.Context(), client.ReserveRequest{Namespace: ns, Key: fmt.Sprintf("k-%d", i)})
			if err == nil && r.Outcome != client.OutcomeAcquired {
				err = fmt.Errorf("k-%d: outcome %v", i, r.Outcome)
			}
			errs <- err
		}()
	}
	eventually(t, "50 queued calls", func() bool { return c.QueuedCalls() == n })
	g.let(1) // one unary ends: the queue goes out as one batch
	eventually(t, "the batch at the gate", func() bool { return g.count(g.calls, "Batch") == 1 })
	g.let(2) // the batch and the other unary
	for range 2 {
		if err := <-slots; err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := g.count(g.calls, "Reserve"); got != 2 {
		t.Fatalf("%d unary Reserve RPCs, want 2", got)
	}
	if got, ops := g.count(g.calls, "Batch"), g.count(g.ops, "Reserve"); got != 1 || ops != n+2 {
		t.Fatalf("%d Batch RPCs and %d reserve operations, want 1 and %d", got, ops, n+2)
	}
	if s := c.Stats(); s.BatchRPCs != 1 || s.BatchedCalls != n {
		t.Fatalf("stats: %d batch RPCs answering %d calls, want 1 and %d", s.BatchRPCs, s.BatchedCalls, n)
	}
}

// TestBatchWithdrawsEndedCalls: a call whose context ends while it is
// queued is never sent; one whose context ends while its batch is in
// flight returns at once with the context's error, and its operation may
// still be applied (the call is undecided, as a unary RPC cut short).
func TestBatchWithdrawsEndedCalls(t *testing.T) {
	g := startGated(t, false)
	c := newClient(t, []string{g.addr}, noRouting)
	slots := fillSlots(t, g, c)

	queuedCtx, cancelQueued := context.WithCancel(t.Context())
	queued := make(chan error, 1)
	go func() {
		_, err := c.Reserve(queuedCtx, client.ReserveRequest{Namespace: ns, Key: "withdrawn"})
		queued <- err
	}()
	eventually(t, "a queued call", func() bool { return c.QueuedCalls() == 1 })
	cancelQueued()
	if err := <-queued; !errors.Is(err, context.Canceled) {
		t.Fatalf("queued call after its context ended: %v, want context.Canceled", err)
	}
	if n := c.QueuedCalls(); n != 0 {
		t.Fatalf("%d calls still queued", n)
	}

	flightCtx, cancelFlight := context.WithCancel(t.Context())
	flight := make(chan error, 1)
	go func() {
		_, err := c.Reserve(flightCtx, client.ReserveRequest{Namespace: ns, Key: "in-flight"})
		flight <- err
	}()
	eventually(t, "a queued call", func() bool { return c.QueuedCalls() == 1 })
	g.let(1) // a unary ends; the batch of "in-flight" waits at the gate
	eventually(t, "the batch at the gate", func() bool { return g.count(g.calls, "Batch") == 1 })
	cancelFlight()
	if err := <-flight; !errors.Is(err, context.Canceled) {
		t.Fatalf("call in flight after its context ended: %v, want context.Canceled", err)
	}
	g.let(2)
	for range 2 {
		if err := <-slots; err != nil {
			t.Fatal(err)
		}
	}
	if n := g.count(g.keys, "withdrawn"); n != 0 {
		t.Fatalf("the withdrawn call reached the server %d times", n)
	}
	// The batch was answered after its caller left: the reserve was
	// applied, so the key is held (the caller's error said undecided).
	eventually(t, "the batch answered", func() bool { return g.count(g.answered, "in-flight") == 1 })
	go g.let(1) // the Get below
	rec, err := c.Get(t.Context(), ns, "in-flight")
	if err != nil || rec.State != client.StateInProgress {
		t.Fatalf("record of the call cut short in flight: %+v %v", rec, err)
	}
}

// TestBatchUnimplementedFallback: a node that answers Batch UNIMPLEMENTED
// gets the batch's calls as unary RPCs, and only unary RPCs from then on.
func TestBatchUnimplementedFallback(t *testing.T) {
	g := startGated(t, true)
	c := newClient(t, []string{g.addr}, noRouting)
	slots := fillSlots(t, g, c)
	const n = 10
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := c.Reserve(t.Context(), client.ReserveRequest{Namespace: ns, Key: fmt.Sprintf("k-%d", i)})
			errs <- err
		}()
	}
	eventually(t, "queued calls", func() bool { return c.QueuedCalls() == n })
	go g.let(2 + 1 + n) // the unaries, the batch, its calls alone
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := <-slots; err != nil {
			t.Fatal(err)
		}
	}
	if b, r := g.count(g.calls, "Batch"), g.count(g.calls, "Reserve"); b != 1 || r != n+2 {
		t.Fatalf("%d Batch and %d Reserve RPCs, want 1 and %d", b, r, n+2)
	}

	// From now on: unary at once, however many calls are in flight.
	slots = fillSlots(t, g, c)
	one := make(chan error, 1)
	go func() {
		_, err := c.Reserve(t.Context(), client.ReserveRequest{Namespace: ns, Key: "after"})
		one <- err
	}()
	eventually(t, "a third unary RPC at the gate", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.waiting == 3
	})
	if q := c.QueuedCalls(); q != 0 {
		t.Fatalf("%d calls queued after the fallback", q)
	}
	g.let(3)
	if err := errors.Join(<-one, <-slots, <-slots); err != nil {
		t.Fatal(err)
	}
	if b := g.count(g.calls, "Batch"); b != 1 {
		t.Fatalf("%d Batch RPCs after the fallback, want still 1", b)
	}
	if s := c.Stats(); s.BatchFallbacks != n {
		t.Fatalf("stats: %d fallbacks, want %d", s.BatchFallbacks, n)
	}
}

// TestBatchErrors: a batched call fails with the same error as its unary
// RPC (the same sentinel and gRPC status), and a batched attempt that fails
// undecided is retried like a unary one.
func TestBatchErrors(t *testing.T) {
	g := startGated(t, false)
	g.failOnce = "flaky"
	c := newClient(t, []string{g.addr}, noRouting)
	go g.let(2) // the reserve and complete of "done"
	r, err := c.Reserve(t.Context(), client.ReserveRequest{Namespace: ns, Key: "done"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Complete(t.Context(), client.CompleteRequest{Namespace: ns, Key: "done", OwnerToken: r.OwnerToken, Response: client.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}

	calls := []struct {
		name string
		want error
		call func(ctx context.Context) error
	}{
		{"complete by another owner", client.ErrNotOwner, func(ctx context.Context) error {
			_, err := c.Complete(ctx, client.CompleteRequest{Namespace: ns, Key: "done", OwnerToken: "someone-else-0000000", Response: client.Response{Status: 201}})
			return err
		}},
		{"get of a missing key", client.ErrNotFound, func(ctx context.Context) error {
			_, err := c.Get(ctx, ns, "missing")
			return err
		}},
		{"heartbeat of a completed key", client.ErrNotOwner, func(ctx context.Context) error {
			_, err := c.Heartbeat(ctx, client.HeartbeatRequest{Namespace: ns, Key: "done", OwnerToken: r.OwnerToken})
			return err
		}},
		{"reserve failing once undecided", nil, func(ctx context.Context) error {
			_, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: "flaky"})
			return err
		}},
	}
	slots := fillSlots(t, g, c)
	batched := make([]chan error, len(calls))
	for i, tc := range calls {
		batched[i] = make(chan error, 1)
		go func() { batched[i] <- tc.call(t.Context()) }()
	}
	eventually(t, "queued calls", func() bool { return c.QueuedCalls() == len(calls) })
	go g.let(2 + 1 + 1) // the unaries, the batch, the retry of "flaky"
	batchedErrs := make([]error, len(calls))
	for i := range calls {
		batchedErrs[i] = <-batched[i]
	}
	for range 2 {
		if err := <-slots; err != nil {
			t.Fatal(err)
		}
	}
	if b := g.count(g.calls, "Batch"); b != 1 {
		t.Fatalf("%d Batch RPCs, want 1", b)
	}
	if n := g.count(g.keys, "flaky"); n != 2 {
		t.Fatalf("flaky reached the server %d times, want 2 (batched, then retried)", n)
	}
	for i, tc := range calls {
		err := batchedErrs[i]
		if tc.want == nil {
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, tc.want) {
			t.Fatalf("%s batched: %v, want %v", tc.name, err, tc.want)
		}
		go g.let(1)
		unaryErr := tc.call(t.Context()) // nothing in flight: unary
		if !errors.Is(unaryErr, tc.want) {
			t.Fatalf("%s unary: %v, want %v", tc.name, unaryErr, tc.want)
		}
		bs, _ := status.FromError(err)
		us, _ := status.FromError(unaryErr)
		if !proto.Equal(bs.Proto(), us.Proto()) {
			t.Fatalf("%s: batched status %v, unary status %v", tc.name, bs.Proto(), us.Proto())
		}
	}
	if b := g.count(g.calls, "Batch"); b != 1 {
		t.Fatalf("%d Batch RPCs, want still 1 (the unary calls went alone)", b)
	}
}

// TestBatchAlone: a waiting reserve (it would hold its batch's answer
// back), a complete larger than 64 KiB and a call whose context carries
// outgoing metadata go as their own RPCs even while the connection's two
// slots are taken.
func TestBatchAlone(t *testing.T) {
	g := startGated(t, false)
	c := newClient(t, []string{g.addr}, noRouting)
	slots := fillSlots(t, g, c)
	done := make(chan error, 3)
	go func() {
		_, err := c.Reserve(t.Context(), client.ReserveRequest{Namespace: ns, Key: "waiting", Wait: time.Second})
		done <- err
	}()
	go func() {
		_, err := c.Complete(t.Context(), client.CompleteRequest{Namespace: ns, Key: "big", OwnerToken: "someone-else-0000000",
			Response: client.Response{Status: 200, Body: make([]byte, 100<<10)}})
		done <- err
	}()
	go func() {
		_, err := c.Get(metadata.AppendToOutgoingContext(t.Context(), "x-trace", "1"), ns, "traced")
		done <- err
	}()
	eventually(t, "five RPCs at the gate", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.waiting == 5
	})
	if q := c.QueuedCalls(); q != 0 {
		t.Fatalf("%d calls queued", q)
	}
	go g.let(5)
	for range 2 {
		if err := <-slots; err != nil {
			t.Fatal(err)
		}
	}
	// The answers themselves: acquired, not the owner, not found.
	var errs []error
	for range 3 {
		errs = append(errs, <-done)
	}
	notOwner, notFound, ok := 0, 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, client.ErrNotOwner):
			notOwner++
		case errors.Is(err, client.ErrNotFound):
			notFound++
		default:
			t.Fatal(err)
		}
	}
	if ok != 1 || notOwner != 1 || notFound != 1 {
		t.Fatalf("answers %v", errs)
	}
	if b := g.count(g.calls, "Batch"); b != 0 {
		t.Fatalf("%d Batch RPCs, want none", b)
	}
}
