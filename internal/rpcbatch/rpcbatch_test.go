package rpcbatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/testutil"
)

// wait bounds every wait for something the code under test must do; it is
// a deadline for a hang, never a measure of speed.
const wait = 10 * time.Second

// rpc is one RPC the Batcher sent to the fake node: a unary call (batch
// nil) or a Batch RPC. It stays in flight until the test answers it.
type rpc struct {
	key    string // unary: the call's key
	batch  *idemv1.BatchRequest
	ctx    context.Context   // Batch: the batch's own context
	ops    []context.Context // Batch: the operations' contexts
	answer chan answer
}

type answer struct {
	resp *idemv1.BatchResponse
	err  error
}

func (r *rpc) keys() []string {
	var keys []string
	for _, op := range r.batch.GetOps() {
		keys = append(keys, op.GetReserve().GetKey())
	}
	return keys
}

// reply answers a Batch RPC with one result per operation: a reserve
// result led by "leader-<key>" unless results has another for the key.
func (r *rpc) reply(results map[string]*idemv1.BatchResult) {
	resp := &idemv1.BatchResponse{}
	for _, k := range r.keys() {
		res, ok := results[k]
		if !ok {
			res = acquired(k)
		}
		resp.Results = append(resp.Results, res)
	}
	r.answer <- answer{resp: resp}
}

func acquired(key string) *idemv1.BatchResult {
	return &idemv1.BatchResult{LeaderId: "leader-" + key, Result: &idemv1.BatchResult_Reserve{
		Reserve: &idemv1.ReserveResponse{OwnerToken: "owner-" + key}}}
}

// node is a fake node: every RPC sent to it waits in rpcs for the test.
type node struct {
	t     *testing.T
	rpcs  chan *rpc
	unary atomic.Int64 // unary RPCs sent
}

func newNode(t *testing.T) *node { return &node{t: t, rpcs: make(chan *rpc, 1024)} }

// newBatcher is a Batcher that sends to a new node and counts in stats.
func newBatcher(t *testing.T) (n *node, b *Batcher, stats *Stats) {
	n = newNode(t)
	stats = &Stats{}
	return n, New(Config{Send: n.send, Stats: stats}), stats
}

func (n *node) send(ctx context.Context, ops []context.Context, req *idemv1.BatchRequest) (*idemv1.BatchResponse, error) {
	r := &rpc{batch: req, ctx: ctx, ops: ops, answer: make(chan answer, 1)}
	n.rpcs <- r
	a := <-r.answer
	return a.resp, a.err
}

// next returns the next RPC sent, failing the test if none comes.
func (n *node) next() *rpc {
	n.t.Helper()
	select {
	case r := <-n.rpcs:
		return r
	case <-time.After(wait):
		n.t.Fatalf("no RPC sent within %s", wait)
		return nil
	}
}

// nextBatch returns the next RPC, which must be a Batch RPC.
func (n *node) nextBatch() *rpc {
	n.t.Helper()
	r := n.next()
	if r.batch == nil {
		n.t.Fatalf("unary RPC for %s sent, want a Batch RPC", r.key)
	}
	return r
}

// nextUnary returns the next RPC, which must be the unary RPC for key.
func (n *node) nextUnary(key string) *rpc {
	n.t.Helper()
	r := n.next()
	if r.batch != nil || r.key != key {
		n.t.Fatalf("sent %s, want the unary RPC for %s", r.describe(), key)
	}
	return r
}

// idle fails the test if an RPC was sent that it has not taken.
func (n *node) idle() {
	n.t.Helper()
	select {
	case r := <-n.rpcs:
		n.t.Fatalf("%s sent, want none while every slot is taken", r.describe())
	default:
	}
}

func (r *rpc) describe() string {
	if r.batch != nil {
		return fmt.Sprintf("a Batch RPC of %v", r.keys())
	}
	return "the unary RPC for " + r.key
}

// result is what one Call returned.
type result struct {
	key    string
	res    *idemv1.BatchResult
	err    error
	header metadata.MD
}

// call starts b.Call for a reserve of key on its own goroutine; the
// returned channel gives its result. opts are added to the grpc.Header
// option every call carries.
func (n *node) call(ctx context.Context, b *Batcher, key string, opts ...grpc.CallOption) <-chan result {
	return n.callOp(ctx, b, key, &idemv1.BatchOp{Op: &idemv1.BatchOp_Reserve{Reserve: &idemv1.ReserveRequest{Namespace: "ns", Key: key}}}, opts...)
}

func (n *node) callOp(ctx context.Context, b *Batcher, key string, op *idemv1.BatchOp, opts ...grpc.CallOption) <-chan result {
	out := make(chan result, 1)
	go func() {
		var md metadata.MD
		unary := func() error {
			n.unary.Add(1)
			r := &rpc{key: key, answer: make(chan answer, 1)}
			n.rpcs <- r
			return (<-r.answer).err
		}
		res, err := b.Call(ctx, op, append([]grpc.CallOption{grpc.Header(&md)}, opts...), unary)
		out <- result{key: key, res: res, err: err, header: md}
	}()
	return out
}

func get(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(wait):
		t.Fatalf("a call did not return within %s", wait)
		return result{}
	}
}

// returned reports whether the call behind ch returned (without waiting).
func returned(ch <-chan result) bool { return len(ch) > 0 }

// queued waits until n calls wait in b's queue.
func queued(t *testing.T, b *Batcher, n int) {
	t.Helper()
	testutil.Eventually(t, wait, fmt.Sprintf("%d queued calls", n), func() (bool, string) {
		q := b.Queued()
		return q == n, fmt.Sprintf("%d queued", q)
	})
}

// slotsFree waits until no RPC of b is in flight.
func slotsFree(t *testing.T, b *Batcher) {
	t.Helper()
	inflight(t, b, 0)
}

// inflight waits until n RPCs of b are in flight (a batch frees its slot
// just after answering its calls).
func inflight(t *testing.T, b *Batcher, n int) {
	t.Helper()
	testutil.Eventually(t, wait, fmt.Sprintf("%d RPCs in flight", n), func() (bool, string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.inflight == n, fmt.Sprintf("%d RPCs in flight", b.inflight)
	})
}

// fill takes every slot of b with a unary call held by the node, and
// returns the held RPCs and the calls' results.
func (n *node) fill(b *Batcher) ([]*rpc, []<-chan result) {
	n.t.Helper()
	var held []*rpc
	var calls []<-chan result
	for i := range Inflight {
		key := fmt.Sprintf("slot-%d", i)
		calls = append(calls, n.call(n.t.Context(), b, key))
		held = append(held, n.nextUnary(key))
	}
	return held, calls
}

// A call with nothing ahead of it goes at once as its unary RPC, with no
// Batch RPC and nothing queued.
func TestLoneCallGoesUnaryAtOnce(t *testing.T) {
	n, b, stats := newBatcher(t)
	ch := n.call(t.Context(), b, "k")
	n.nextUnary("k").answer <- answer{}
	if r := get(t, ch); r.res != nil || r.err != nil {
		t.Fatalf("lone call: %v, %v; want the unary RPC's nil, nil", r.res, r.err)
	}
	boom := status.Error(codes.Unavailable, "down")
	ch = n.call(t.Context(), b, "k2")
	n.nextUnary("k2").answer <- answer{err: boom}
	if r := get(t, ch); !errors.Is(r.err, boom) {
		t.Fatalf("lone call's unary error: %v, want %v", r.err, boom)
	}
	if stats.Batches.Load() != 0 {
		t.Fatalf("%d Batch RPCs for lone calls", stats.Batches.Load())
	}
	slotsFree(t, b)
}

// Never more than Inflight RPCs: calls beyond them queue, and the first
// RPC to end sends the whole queue, in order, as one Batch RPC whose
// results go to their calls (results, error results as status errors, the
// leader hint in the grpc.Header option).
func TestInflightLimitQueuesThenBatches(t *testing.T) {
	n, b, stats := newBatcher(t)
	held, slotCalls := n.fill(b)

	var calls []<-chan result
	for _, k := range []string{"a", "b", "c"} {
		calls = append(calls, n.call(t.Context(), b, k))
		queued(t, b, len(calls))
	}
	n.idle()

	held[0].answer <- answer{}
	get(t, slotCalls[0])
	batch := n.nextBatch()
	if got := strings.Join(batch.keys(), ","); got != "a,b,c" {
		t.Fatalf("batch holds %s, want a,b,c in call order", got)
	}
	if len(batch.ops) != 3 {
		t.Fatalf("Send got %d operation contexts for 3 operations", len(batch.ops))
	}
	// Two RPCs in flight again (the batch and a unary): a new call queues.
	late := n.call(t.Context(), b, "d")
	queued(t, b, 1)
	n.idle()

	notFound := idemv1.BatchErrorFromStatus(status.New(codes.NotFound, "no such key"))
	batch.reply(map[string]*idemv1.BatchResult{"b": {LeaderId: "leader-b", Result: &idemv1.BatchResult_Error{Error: notFound}}})
	for i, k := range []string{"a", "b", "c"} {
		r := get(t, calls[i])
		if got := r.header.Get(idemv1.LeaderHeader); len(got) != 1 || got[0] != "leader-"+k {
			t.Errorf("%s: leader header %v, want leader-%s", k, got, k)
		}
		if k == "b" {
			if status.Code(r.err) != codes.NotFound || r.res != nil {
				t.Errorf("b: %v, %v; want its error result as a NotFound status", r.res, r.err)
			}
			continue
		}
		if r.err != nil || r.res.GetReserve().GetOwnerToken() != "owner-"+k {
			t.Errorf("%s: %v, %v; want its own result", k, r.res, r.err)
		}
	}
	// The batch's slot sends what queued meanwhile.
	next := n.nextBatch()
	if got := strings.Join(next.keys(), ","); got != "d" {
		t.Fatalf("second batch holds %s, want d", got)
	}
	next.reply(nil)
	if r := get(t, late); r.err != nil || r.res.GetReserve().GetOwnerToken() != "owner-d" {
		t.Fatalf("d: %v, %v", r.res, r.err)
	}
	held[1].answer <- answer{}
	get(t, slotCalls[1])
	slotsFree(t, b)
	if got := stats.Batches.Load(); got != 2 {
		t.Errorf("Batches = %d, want 2", got)
	}
	if got := stats.BatchedCalls.Load(); got != 4 {
		t.Errorf("BatchedCalls = %d, want 4", got)
	}
	// All slots free: the next call goes unary at once.
	ch := n.call(t.Context(), b, "e")
	n.nextUnary("e").answer <- answer{}
	get(t, ch)
}

// A queued call whose context ends is withdrawn: it returns its context's
// error as a status, is never sent, and the batch goes without it.
func TestQueuedCallWithdrawn(t *testing.T) {
	n := newNode(t)
	b := New(Config{Send: n.send})
	held, _ := n.fill(b)

	ctx, cancel := context.WithCancel(t.Context())
	gone := n.call(ctx, b, "gone")
	queued(t, b, 1)
	stays := n.call(t.Context(), b, "stays")
	queued(t, b, 2)
	cancel()
	if r := get(t, gone); status.Code(r.err) != codes.Canceled || r.res != nil {
		t.Fatalf("withdrawn call: %v, %v; want a Canceled status", r.res, r.err)
	}
	queued(t, b, 1)

	deadline, cancelD := context.WithTimeout(t.Context(), time.Nanosecond)
	defer cancelD()
	<-deadline.Done()
	if r := get(t, n.call(deadline, b, "late")); status.Code(r.err) != codes.DeadlineExceeded {
		t.Fatalf("call queued past its deadline: %v, want a DeadlineExceeded status", r.err)
	}

	held[0].answer <- answer{}
	batch := n.nextBatch()
	if got := strings.Join(batch.keys(), ","); got != "stays" {
		t.Fatalf("batch holds %s, want only stays (the withdrawn calls never go)", got)
	}
	batch.reply(nil)
	if r := get(t, stays); r.err != nil || r.res == nil {
		t.Fatalf("stays: %v, %v", r.res, r.err)
	}
	held[1].answer <- answer{}
	slotsFree(t, b)
	if got := n.unary.Load(); got != int64(Inflight) {
		t.Fatalf("%d unary RPCs, want only the %d that took the slots", got, Inflight)
	}
}

// A call whose context ends while its batch is in flight returns its
// context's error at once (it may still be applied); the batch goes on for
// the others, with a context of its own that the call's end does not
// cancel, and frees its slot when it ends.
func TestCancelledInFlight(t *testing.T) {
	n := newNode(t)
	b := New(Config{Send: n.send})
	held, _ := n.fill(b)

	type ctxKey struct{}
	ctx, cancel := context.WithCancel(context.WithValue(t.Context(), ctxKey{}, "v"))
	cut := n.call(ctx, b, "cut")
	queued(t, b, 1)
	other := n.call(t.Context(), b, "other")
	queued(t, b, 2)
	held[0].answer <- answer{}
	batch := n.nextBatch()
	if got := strings.Join(batch.keys(), ","); got != "cut,other" {
		t.Fatalf("batch holds %s, want cut,other", got)
	}
	if batch.ops[0] != ctx {
		t.Errorf("Send's first operation context is not the call's")
	}

	cancel()
	if r := get(t, cut); status.Code(r.err) != codes.Canceled {
		t.Fatalf("call cut short in flight: %v, want a Canceled status", r.err)
	}
	if returned(other) {
		t.Fatalf("the other call returned before its batch was answered")
	}
	if err := batch.ctx.Err(); err != nil {
		t.Fatalf("the batch's context ended with one operation's: %v", err)
	}
	if v := batch.ctx.Value(ctxKey{}); v != nil {
		t.Fatalf("the batch's context carries an operation's value %v", v)
	}
	if _, ok := batch.ctx.Deadline(); ok {
		t.Fatalf("the batch's context has a deadline; no operation had one")
	}

	batch.reply(nil)
	if r := get(t, other); r.err != nil || r.res.GetReserve().GetOwnerToken() != "owner-other" {
		t.Fatalf("other: %v, %v", r.res, r.err)
	}
	held[1].answer <- answer{}
	slotsFree(t, b)
}

// The batch runs until the latest of its operations' deadlines, and without
// one when any operation has none.
func TestBatchDeadlineIsTheLatest(t *testing.T) {
	n := newNode(t)
	b := New(Config{Send: n.send})
	held, _ := n.fill(b)

	soon := time.Now().Add(time.Hour)
	later := soon.Add(time.Hour)
	ctxSoon, c1 := context.WithDeadline(t.Context(), soon)
	defer c1()
	ctxLater, c2 := context.WithDeadline(t.Context(), later)
	defer c2()
	calls := []<-chan result{n.call(ctxSoon, b, "soon")}
	queued(t, b, 1)
	calls = append(calls, n.call(ctxLater, b, "later"))
	queued(t, b, 2)
	held[0].answer <- answer{}
	batch := n.nextBatch()
	if d, ok := batch.ctx.Deadline(); !ok || !d.Equal(later) {
		t.Fatalf("batch deadline %v (set: %v), want the latest, %v", d, ok, later)
	}
	// The batch's slot stays taken: the next two queue behind it.
	calls = append(calls, n.call(ctxSoon, b, "soon2"))
	queued(t, b, 1)
	calls = append(calls, n.call(t.Context(), b, "none"))
	queued(t, b, 2)
	batch.reply(nil)
	batch = n.nextBatch()
	if d, ok := batch.ctx.Deadline(); ok {
		t.Fatalf("batch with an operation without deadline has deadline %v", d)
	}
	batch.reply(nil)
	for _, ch := range calls {
		if r := get(t, ch); r.err != nil {
			t.Fatalf("%s: %v", r.key, r.err)
		}
	}
	held[1].answer <- answer{}
	slotsFree(t, b)
}

// A node that answers Batch UNIMPLEMENTED gets the queued calls as unary
// RPCs (never applied by the batch, so sent once more) and every later call
// unary, at once, slots or not.
func TestUnimplementedTurnsBatchingOff(t *testing.T) {
	n, b, stats := newBatcher(t)
	held, _ := n.fill(b)
	a := n.call(t.Context(), b, "a")
	queued(t, b, 1)
	c := n.call(t.Context(), b, "c")
	queued(t, b, 2)
	held[0].answer <- answer{}
	n.nextBatch().answer <- answer{err: status.Error(codes.Unimplemented, "unknown method Batch")}
	for range 2 {
		r := n.next()
		if r.batch != nil {
			t.Fatalf("after UNIMPLEMENTED: %s, want unary RPCs", r.describe())
		}
		r.answer <- answer{}
	}
	for _, ch := range []<-chan result{a, c} {
		if r := get(t, ch); r.err != nil || r.res != nil {
			t.Fatalf("%s after UNIMPLEMENTED: %v, %v; want its unary RPC's nil, nil", r.key, r.res, r.err)
		}
	}
	if got := stats.Fallbacks.Load(); got != 2 {
		t.Errorf("Fallbacks = %d, want 2", got)
	}
	// One slot is free, one held: of two new calls, batching would send
	// one and queue the other; both go unary at once.
	inflight(t, b, 1)
	lates := []<-chan result{n.call(t.Context(), b, "late1"), n.call(t.Context(), b, "late2")}
	for range lates {
		r := n.next()
		if r.batch != nil {
			t.Fatalf("after UNIMPLEMENTED: %s, want unary RPCs", r.describe())
		}
		defer func() { r.answer <- answer{} }()
	}
	if q := b.Queued(); q != 0 {
		t.Fatalf("%d calls queued after UNIMPLEMENTED", q)
	}
	held[1].answer <- answer{}
}

// A result the node withheld (too large for the batch) is read again
// alone; a batch answered with the wrong number of results fails every call
// of it with Internal; a failed Batch RPC fails every call with its error.
func TestBatchAnswers(t *testing.T) {
	n, b, stats := newBatcher(t)
	held, _ := n.fill(b)
	queue := func(keys ...string) []<-chan result {
		var calls []<-chan result
		for i, k := range keys {
			calls = append(calls, n.call(t.Context(), b, k))
			queued(t, b, i+1)
		}
		return calls
	}

	calls := queue("big", "small")
	held[0].answer <- answer{}
	n.nextBatch().reply(map[string]*idemv1.BatchResult{"big": {Withheld: true, LeaderId: "leader-big"}})
	n.nextUnary("big").answer <- answer{}
	if r := get(t, calls[0]); r.err != nil || r.res != nil {
		t.Fatalf("withheld: %v, %v; want its unary RPC's answer", r.res, r.err)
	}
	if r := get(t, calls[1]); r.err != nil || r.res == nil {
		t.Fatalf("small: %v, %v", r.res, r.err)
	}
	if got := stats.Fallbacks.Load(); got != 1 {
		t.Errorf("Fallbacks = %d, want 1", got)
	}

	// The batch's slot is free again once its RPC ended; take it back.
	inflight(t, b, 1)
	slot := n.call(t.Context(), b, "slot-again")
	slotRPC := n.nextUnary("slot-again")
	calls = queue("x", "y")
	held[1].answer <- answer{}
	short := n.nextBatch()
	short.answer <- answer{resp: &idemv1.BatchResponse{Results: []*idemv1.BatchResult{acquired("x")}}}
	for _, ch := range calls {
		if r := get(t, ch); status.Code(r.err) != codes.Internal {
			t.Fatalf("%s of a batch answered with 1 result for 2: %v, want Internal", r.key, r.err)
		}
	}

	// Take the short batch's slot back too, then queue behind both.
	inflight(t, b, 1)
	third := n.call(t.Context(), b, "slot-3")
	thirdRPC := n.nextUnary("slot-3")
	calls = queue("p", "q")
	unavailable := status.Error(codes.Unavailable, "connection reset")
	slotRPC.answer <- answer{}
	get(t, slot)
	n.nextBatch().answer <- answer{err: unavailable}
	for _, ch := range calls {
		if r := get(t, ch); !errors.Is(r.err, unavailable) {
			t.Fatalf("%s of a failed batch: %v, want %v", r.key, r.err, unavailable)
		}
	}
	thirdRPC.answer <- answer{}
	get(t, third)
	slotsFree(t, b)
}

// Calls a batch could not carry go alone, as their unary RPC, even while
// every slot is taken: per-call metadata (unless the Batcher's calls share
// it), call options other than grpc.Header, an operation over MaxOpBytes.
func TestCallsThatGoAlone(t *testing.T) {
	n := newNode(t)
	b := New(Config{Send: n.send})
	held, _ := n.fill(b)

	md := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer x")
	big := &idemv1.BatchOp{Op: &idemv1.BatchOp_Reserve{Reserve: &idemv1.ReserveRequest{
		Namespace: "ns", Key: "big", Fingerprint: strings.Repeat("f", MaxOpBytes)}}}
	if proto.Size(big) <= MaxOpBytes {
		t.Fatalf("test operation is %d bytes, want over %d", proto.Size(big), MaxOpBytes)
	}
	for _, tc := range []struct {
		name  string
		start func() <-chan result
	}{
		{"metadata", func() <-chan result { return n.call(md, b, "metadata") }},
		{"options", func() <-chan result { return n.call(t.Context(), b, "options", grpc.WaitForReady(true)) }},
		{"big", func() <-chan result { return n.callOp(t.Context(), b, "big", big) }},
	} {
		ch := tc.start()
		n.nextUnary(tc.name).answer <- answer{}
		if r := get(t, ch); r.err != nil || r.res != nil {
			t.Fatalf("%s: %v, %v; want its unary RPC's answer", tc.name, r.res, r.err)
		}
	}
	if q := b.Queued(); q != 0 {
		t.Fatalf("%d calls queued, want none", q)
	}

	// With SharedMetadata the same call queues and goes in the batch.
	shared := New(Config{Send: n.send, SharedMetadata: true})
	sharedHeld, _ := n.fill(shared)
	ch := n.call(md, shared, "metadata")
	queued(t, shared, 1)
	sharedHeld[0].answer <- answer{}
	n.nextBatch().reply(nil)
	if r := get(t, ch); r.err != nil || r.res == nil {
		t.Fatalf("shared metadata: %v, %v; want its batch result", r.res, r.err)
	}
	sharedHeld[1].answer <- answer{}
	for _, h := range held {
		h.answer <- answer{}
	}
	slotsFree(t, b)
	slotsFree(t, shared)
}

// A batch carries at most idemv1.MaxBatchOps operations and
// idemv1.MaxBatchBytes bytes; the rest goes in the next one.
func TestBatchBounds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		calls int
		fp    int // fingerprint bytes per operation
	}{
		{"ops", idemv1.MaxBatchOps + 3, 0},
		{"bytes", 80, MaxOpBytes - 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			b := New(Config{Send: n.send})
			held, _ := n.fill(b)
			var calls []<-chan result
			for i := range tc.calls {
				key := fmt.Sprintf("k%03d", i)
				op := &idemv1.BatchOp{Op: &idemv1.BatchOp_Reserve{Reserve: &idemv1.ReserveRequest{
					Namespace: "ns", Key: key, Fingerprint: strings.Repeat("f", tc.fp)}}}
				calls = append(calls, n.callOp(t.Context(), b, key, op))
				queued(t, b, i+1)
			}
			// One slot frees: its batches follow each other in it, in order.
			held[0].answer <- answer{}
			sent := 0
			for sent < tc.calls {
				batch := n.nextBatch()
				bytes := 0
				for _, op := range batch.batch.GetOps() {
					bytes += proto.Size(op) + batchOpOverhead
				}
				if len(batch.keys()) > idemv1.MaxBatchOps || bytes > idemv1.MaxBatchBytes {
					t.Fatalf("a batch of %d operations, %d bytes: over the bounds (%d, %d)",
						len(batch.keys()), bytes, idemv1.MaxBatchOps, idemv1.MaxBatchBytes)
				}
				if sent == 0 && len(batch.keys()) == tc.calls {
					t.Fatalf("all %d operations went in one batch", tc.calls)
				}
				if got, want := batch.keys()[0], fmt.Sprintf("k%03d", sent); got != want {
					t.Fatalf("batch starts at %s, want %s (queue order)", got, want)
				}
				sent += len(batch.keys())
				batch.reply(nil)
			}
			for _, ch := range calls {
				if r := get(t, ch); r.err != nil || r.res == nil {
					t.Fatalf("%s: %v, %v", r.key, r.res, r.err)
				}
			}
			held[1].answer <- answer{}
			slotsFree(t, b)
		})
	}
}

// reserveClient answers unary Reserve calls; Stub sends everything else
// nowhere in these tests.
type reserveClient struct {
	idemv1.IdempotencyClient
	calls atomic.Int64
}

func (c *reserveClient) Reserve(ctx context.Context, in *idemv1.ReserveRequest, _ ...grpc.CallOption) (*idemv1.ReserveResponse, error) {
	c.calls.Add(1)
	return &idemv1.ReserveResponse{OwnerToken: "unary-" + in.GetKey()}, nil
}

// Stub sends through the Batcher Pick gives (the batch's typed result), the
// unary RPC when Pick gives none, and a waiting reserve always alone.
func TestStub(t *testing.T) {
	n := newNode(t)
	b := New(Config{Send: n.send})
	held, _ := n.fill(b)
	client := &reserveClient{}
	var pick atomic.Pointer[Batcher]
	pick.Store(b)
	stub := &Stub{IdempotencyClient: client, Pick: func(context.Context) *Batcher { return pick.Load() }}

	// Every slot is taken: a waiting reserve still goes at once.
	resp, err := stub.Reserve(t.Context(), &idemv1.ReserveRequest{Namespace: "ns", Key: "waits", WaitMs: 1000})
	if err != nil || resp.GetOwnerToken() != "unary-waits" || client.calls.Load() != 1 {
		t.Fatalf("waiting reserve: %v, %v after %d unary calls; want its unary answer", resp, err, client.calls.Load())
	}
	type out struct {
		resp *idemv1.ReserveResponse
		err  error
	}
	ch := make(chan out, 1)
	go func() {
		resp, err := stub.Reserve(t.Context(), &idemv1.ReserveRequest{Namespace: "ns", Key: "batched"})
		ch <- out{resp, err}
	}()
	queued(t, b, 1)
	held[0].answer <- answer{}
	n.nextBatch().reply(nil)
	select {
	case o := <-ch:
		if o.err != nil || o.resp.GetOwnerToken() != "owner-batched" {
			t.Fatalf("batched reserve: %v, %v; want the batch's result", o.resp, o.err)
		}
	case <-time.After(wait):
		t.Fatalf("batched reserve did not return within %s", wait)
	}
	pick.Store(nil)
	resp, err = stub.Reserve(t.Context(), &idemv1.ReserveRequest{Namespace: "ns", Key: "alone"})
	if err != nil || resp.GetOwnerToken() != "unary-alone" {
		t.Fatalf("reserve with no Batcher: %v, %v; want its unary answer", resp, err)
	}
	held[1].answer <- answer{}
	slotsFree(t, b)
}
