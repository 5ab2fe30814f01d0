// Package rpcbatch coalesces the Idempotency calls that go to one node at
// the same time into Batch RPCs, for the Go client (package client) and for
// node-to-node forwarding (forward.Forwarder).
//
// A Batcher keeps up to Inflight RPCs (unary or Batch) in flight; calls that
// arrive meanwhile queue, and the first RPC to end sends the whole queue as
// one Batch RPC (raftstore's proposal buffer does the same with the commands
// a leader receives together: those of one batch pack into one Raft entry).
// A call with nothing ahead of it goes at once as its unary RPC, so batching
// adds no latency to a lone call. Every call keeps its own context: one
// whose context ends while queued is withdrawn (never sent); one whose
// context ends while its batch is in flight returns its context's error at
// once (its operation may still be applied: undecided, as a unary RPC cut
// short). A node that answers Batch UNIMPLEMENTED gets unary RPCs from that
// Batcher from then on.
package rpcbatch

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
)

const (
	// Inflight is how many RPCs (unary or Batch) a Batcher keeps in flight
	// before calls queue.
	Inflight = 2
	// MaxOpBytes is the largest operation that goes in a batch; a larger
	// one (a complete with a large stored response) goes alone.
	MaxOpBytes = 64 << 10
	// batchOpOverhead is what the repeated field adds per operation (tag
	// and length), bounded.
	batchOpOverhead = 4
)

// Stats counts Batchers' RPCs; one Stats may serve many Batchers.
type Stats struct {
	// Batches counts Batch RPCs sent, BatchedCalls the calls a batch
	// answered, Fallbacks the queued calls sent unary after all (the node
	// does not know Batch, or withheld a large result).
	Batches, BatchedCalls, Fallbacks atomic.Uint64
}

// SendFunc sends one Batch RPC. ctx is the batch's own context: no
// cancellation, the latest deadline of its operations, and the values of
// none of them; ops are the operations' contexts, in the order of req.Ops.
type SendFunc func(ctx context.Context, ops []context.Context, req *idemv1.BatchRequest) (*idemv1.BatchResponse, error)

// Config configures a Batcher.
type Config struct {
	// Send sends a Batch RPC (to the one node the Batcher serves).
	Send SendFunc
	// Stats is counted in; nil counts nowhere.
	Stats *Stats
	// SharedMetadata says that every call given to the Batcher carries the
	// same outgoing metadata and principal (the caller keeps one Batcher per
	// set), which Send puts on the batch. Without it, a call whose context
	// carries outgoing metadata goes alone: a batch has one set for all.
	SharedMetadata bool
}

// New returns a Batcher.
func New(cfg Config) *Batcher {
	if cfg.Stats == nil {
		cfg.Stats = &Stats{}
	}
	return &Batcher{cfg: cfg}
}

// Queued is how many calls wait in the queue.
func (b *Batcher) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// Stub is an IdempotencyClient whose Reserve, Heartbeat, Complete, Release
// and Get go through the Batcher Pick returns for the call's context (nil:
// the unary RPC), and anything else (Routing, Batch) straight to the
// embedded client. Waiting reserves always go alone: they would hold their
// whole batch's answer back.
type Stub struct {
	idemv1.IdempotencyClient
	Pick func(ctx context.Context) *Batcher
}

func (s *Stub) call(ctx context.Context, op *idemv1.BatchOp, opts []grpc.CallOption, unary func() error) (*idemv1.BatchResult, error) {
	b := s.Pick(ctx)
	if b == nil {
		return nil, unary()
	}
	return b.Call(ctx, op, opts, unary)
}

func (s *Stub) Reserve(ctx context.Context, in *idemv1.ReserveRequest, opts ...grpc.CallOption) (*idemv1.ReserveResponse, error) {
	var out *idemv1.ReserveResponse
	unary := func() (err error) { out, err = s.IdempotencyClient.Reserve(ctx, in, opts...); return err }
	if in.GetWaitMs() > 0 {
		// A waiting reserve would hold its whole batch's answer back.
		err := unary()
		return out, err
	}
	res, err := s.call(ctx, &idemv1.BatchOp{Op: &idemv1.BatchOp_Reserve{Reserve: in}}, opts, unary)
	if res != nil {
		return res.GetReserve(), nil
	}
	return out, err
}

func (s *Stub) Heartbeat(ctx context.Context, in *idemv1.HeartbeatRequest, opts ...grpc.CallOption) (*idemv1.HeartbeatResponse, error) {
	var out *idemv1.HeartbeatResponse
	unary := func() (err error) { out, err = s.IdempotencyClient.Heartbeat(ctx, in, opts...); return err }
	res, err := s.call(ctx, &idemv1.BatchOp{Op: &idemv1.BatchOp_Heartbeat{Heartbeat: in}}, opts, unary)
	if res != nil {
		return res.GetHeartbeat(), nil
	}
	return out, err
}

func (s *Stub) Complete(ctx context.Context, in *idemv1.CompleteRequest, opts ...grpc.CallOption) (*idemv1.CompleteResponse, error) {
	var out *idemv1.CompleteResponse
	unary := func() (err error) { out, err = s.IdempotencyClient.Complete(ctx, in, opts...); return err }
	res, err := s.call(ctx, &idemv1.BatchOp{Op: &idemv1.BatchOp_Complete{Complete: in}}, opts, unary)
	if res != nil {
		return res.GetComplete(), nil
	}
	return out, err
}

func (s *Stub) Release(ctx context.Context, in *idemv1.ReleaseRequest, opts ...grpc.CallOption) (*idemv1.ReleaseResponse, error) {
	var out *idemv1.ReleaseResponse
	unary := func() (err error) { out, err = s.IdempotencyClient.Release(ctx, in, opts...); return err }
	res, err := s.call(ctx, &idemv1.BatchOp{Op: &idemv1.BatchOp_Release{Release: in}}, opts, unary)
	if res != nil {
		return res.GetRelease(), nil
	}
	return out, err
}

func (s *Stub) Get(ctx context.Context, in *idemv1.GetRequest, opts ...grpc.CallOption) (*idemv1.GetResponse, error) {
	var out *idemv1.GetResponse
	unary := func() (err error) { out, err = s.IdempotencyClient.Get(ctx, in, opts...); return err }
	res, err := s.call(ctx, &idemv1.BatchOp{Op: &idemv1.BatchOp_Get{Get: in}}, opts, unary)
	if res != nil {
		return res.GetGet(), nil
	}
	return out, err
}

// Batcher coalesces the calls to one node (and, with SharedMetadata, of one
// set of metadata).
type Batcher struct {
	cfg Config
	// off is set once the node answered Batch UNIMPLEMENTED: every call
	// goes unary from then on.
	off atomic.Bool

	mu       sync.Mutex
	inflight int
	queue    []*pendingOp
}

// pendingOp is one queued call. res, err, unary and leader are written by
// the sender before it closes done and read by the caller after.
type pendingOp struct {
	ctx   context.Context
	op    *idemv1.BatchOp
	size  int
	state int // opQueued, then opSent or opWithdrawn; guarded by Batcher.mu
	done  chan struct{}

	res    *idemv1.BatchResult
	err    error
	unary  bool
	leader string
}

const (
	opQueued = iota
	opSent
	opWithdrawn
)

// Call answers op as its unary RPC would: the batch's result for it (an
// error result as the unary RPC's status error), or, when op goes on its
// own, nil and the error of unary, which sends op's unary RPC and keeps
// its response. opts are the call's options: only grpc.Header is honoured
// in a batch (set to the result's leader hint); a call with others goes
// alone.
func (b *Batcher) Call(ctx context.Context, op *idemv1.BatchOp, opts []grpc.CallOption, unary func() error) (*idemv1.BatchResult, error) {
	header, ok := headerOption(opts)
	if !ok || b.off.Load() {
		return nil, unary()
	}
	if md, _ := metadata.FromOutgoingContext(ctx); len(md) > 0 && !b.cfg.SharedMetadata {
		// Metadata is per RPC; a batch carries one set for all.
		return nil, unary()
	}
	size := proto.Size(op)
	if size > MaxOpBytes {
		return nil, unary()
	}
	b.mu.Lock()
	if b.inflight < Inflight && len(b.queue) == 0 {
		// Nothing ahead: go at once, as the unary RPC, in a slot.
		b.inflight++
		b.mu.Unlock()
		defer b.release()
		return nil, unary()
	}
	p := &pendingOp{ctx: ctx, op: op, size: size, done: make(chan struct{})}
	b.queue = append(b.queue, p)
	var batch []*pendingOp
	if b.inflight < Inflight {
		b.inflight++
		batch = b.takeLocked()
	}
	b.mu.Unlock()
	if batch != nil {
		go b.send(batch)
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		b.mu.Lock()
		if p.state == opQueued {
			// Withdrawn: it was never sent.
			p.state = opWithdrawn
			for i, q := range b.queue {
				if q == p {
					b.queue = append(b.queue[:i], b.queue[i+1:]...)
					break
				}
			}
			b.mu.Unlock()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		b.mu.Unlock()
		select {
		case <-p.done:
		default:
			// In flight: it may still be applied (undecided), as a unary
			// RPC cut short by its context.
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if p.leader != "" && header != nil {
		*header = metadata.Pairs(idemv1.LeaderHeader, p.leader)
	}
	switch {
	case p.unary:
		b.cfg.Stats.Fallbacks.Add(1)
		return nil, unary()
	case p.err != nil:
		return nil, p.err
	case p.res.GetError() != nil:
		return nil, idemv1.BatchErrorStatus(p.res.GetError()).Err()
	}
	return p.res, nil
}

// headerOption finds the grpc.Header option of an attempt (Client.invoke
// passes exactly that one); ok is false when there are other options,
// which a batch could not honour per call.
func headerOption(opts []grpc.CallOption) (*metadata.MD, bool) {
	var header *metadata.MD
	for _, o := range opts {
		h, isHeader := o.(grpc.HeaderCallOption)
		if !isHeader {
			return nil, false
		}
		header = h.HeaderAddr
	}
	return header, true
}

// release ends an RPC of the batcher's: the queue, if any, goes out as the
// next batch in the same slot; otherwise the slot is free.
func (b *Batcher) release() {
	b.mu.Lock()
	batch := b.takeLocked()
	if batch == nil {
		b.inflight--
	}
	b.mu.Unlock()
	if batch != nil {
		go b.send(batch)
	}
}

// takeLocked removes the next batch from the queue: as many operations as
// fit in one Batch RPC (idemv1.MaxBatchOps, idemv1.MaxBatchBytes).
func (b *Batcher) takeLocked() []*pendingOp {
	n, bytes := 0, 0
	for n < len(b.queue) && n < idemv1.MaxBatchOps {
		sz := b.queue[n].size + batchOpOverhead
		if n > 0 && bytes+sz > idemv1.MaxBatchBytes {
			break
		}
		bytes += sz
		n++
	}
	if n == 0 {
		return nil
	}
	batch := make([]*pendingOp, n)
	copy(batch, b.queue[:n])
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	for _, p := range batch {
		p.state = opSent
	}
	return batch
}

// send sends batch as one Batch RPC, answers each operation, and releases
// its slot. The RPC runs until the latest of the operations' deadlines (each
// attempt has one, Client.invoke); an operation whose context ends
// meanwhile has already returned.
func (b *Batcher) send(batch []*pendingOp) {
	defer b.release()
	ctx := context.Background()
	var latest time.Time
	for _, p := range batch {
		d, ok := p.ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	if !latest.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	req := &idemv1.BatchRequest{Ops: make([]*idemv1.BatchOp, len(batch))}
	ops := make([]context.Context, len(batch))
	for i, p := range batch {
		req.Ops[i], ops[i] = p.op, p.ctx
	}
	b.cfg.Stats.Batches.Add(1)
	resp, err := b.cfg.Send(ctx, ops, req)
	if status.Code(err) == codes.Unimplemented {
		b.off.Store(true)
	}
	for i, p := range batch {
		switch {
		case status.Code(err) == codes.Unimplemented:
			p.unary = true // never applied: the node does not know Batch
		case err != nil:
			p.err = err
		case len(resp.GetResults()) != len(batch):
			p.err = status.Errorf(codes.Internal, "client: a batch of %d operations was answered with %d results", len(batch), len(resp.GetResults()))
		default:
			r := resp.GetResults()[i]
			p.leader = r.GetLeaderId()
			if r.GetWithheld() {
				p.unary = true // changes nothing: read again alone
			} else {
				p.res = r
				b.cfg.Stats.BatchedCalls.Add(1)
			}
		}
		close(p.done)
	}
}
