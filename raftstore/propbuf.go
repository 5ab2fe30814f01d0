package raftstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// The proposal buffer (Config.Packer) puts many commands into one Raft
// entry. Proposals queue here; one dispatcher goroutine per group takes
// everything queued (up to maxPackCommands commands or maxPackBytes bytes),
// packs it into one entry, hands it to raft.Apply and waits for the entry's
// result before it takes the queue again. So a group has one packed entry in
// flight at a time, and everything proposed while it is stored, replicated,
// committed and applied becomes the next one. An idle group proposes each
// command at once and alone (no added latency).
//
// Measured (docs/lab/2026-12-01-raft-groups-and-levers.md, bench/peers' per-cycle Raft figures): with
// one entry in flight the region did as many or slightly more cycles per
// second than without packing, at less CPU per cycle; two entries in flight
// (the first design) and handing the next entry over as soon as the leader
// had stored the previous one both cut entries smaller and cost 10-20%,
// since the cost that matters is per log write and per AppendEntries round,
// not per entry.
//
// Every proposer still gets its own result (the StateMachine returns []any
// for a packed entry, one per command, in order) and its own error: an error
// of the entry is every one of its commands' error, with the same
// applied/not applied/unknown meaning as for Group.Apply.
const (
	maxPackCommands = 1024 // fsm numbers a command's position in 16 bits
	maxPackBytes    = 4 << 20
)

// proposal is one command waiting in or travelling through the buffer.
type proposal struct {
	data  []byte
	ctx   context.Context
	done  chan proposalResult // buffered; written once
	start time.Time
}

type proposalResult struct {
	v     any
	entry proposed
	err   error
}

type propBuffer struct {
	g    *Group
	pack func([][]byte) []byte
	// on: commands go through the buffer and may be packed. Read by
	// Group.Apply for every command, i.e. when its entry is formed; while
	// it is false commands bypass the buffer (one entry each). Set once
	// (Group.EnablePacking), never cleared: see DESIGN.md "Switching
	// packing on".
	on atomic.Bool

	entries, commands atomic.Uint64 // proposed through the buffer (GroupStats)

	wake chan struct{} // capacity 1: the queue may be non-empty

	mu     sync.Mutex
	queue  []*proposal
	closed bool
	held   bool // tests only: the dispatcher takes nothing while set
}

func newPropBuffer(g *Group, pack func([][]byte) []byte, on bool) *propBuffer {
	b := &propBuffer{g: g, pack: pack, wake: make(chan struct{}, 1)}
	b.on.Store(on)
	return b
}

// apply is Group.Apply through the buffer; ctx already carries the
// ApplyTimeout bound.
func (b *propBuffer) apply(ctx context.Context, data []byte) (any, proposed, error) {
	p := &proposal{data: data, ctx: ctx, done: make(chan proposalResult, 1), start: time.Now()}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, proposed{}, shardErr(b.g.id, "%w", ErrShutdown)
	}
	b.queue = append(b.queue, p)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default: // the dispatcher has a wake-up pending already
	}
	select {
	case r := <-p.done:
		if r.err == nil {
			b.g.metrics.applyDuration.Observe(time.Since(p.start).Seconds())
		}
		return r.v, r.entry, r.err
	case <-ctx.Done():
		// Still queued: never proposed, so withdraw it. Otherwise it is in
		// an entry whose fate is open.
		if b.withdraw(p) {
			return nil, proposed{}, b.g.translate(ctx.Err(), phaseBeforeEnqueue)
		}
		return nil, proposed{}, b.g.translate(ctx.Err(), phaseAfterEnqueue)
	case <-b.g.closedCh:
		if b.withdraw(p) {
			return nil, proposed{}, shardErr(b.g.id, "%w", ErrShutdown)
		}
		return nil, proposed{}, b.g.translate(raft.ErrRaftShutdown, phaseAfterEnqueue)
	}
}

// takeLocked removes the next entry's worth of proposals from the queue;
// nil if the queue is empty (or held).
func (b *propBuffer) takeLocked() []*proposal {
	if b.held || b.closed {
		return nil
	}
	n, size := 0, 0
	for n < len(b.queue) && n < maxPackCommands {
		size += len(b.queue[n].data)
		if n > 0 && size > maxPackBytes {
			break
		}
		n++
	}
	if n == 0 {
		return nil
	}
	batch := make([]*proposal, n)
	copy(batch, b.queue)
	b.queue = append(b.queue[:0], b.queue[n:]...)
	return batch
}

// withdraw removes p from the queue; false if it was already taken.
func (b *propBuffer) withdraw(p *proposal) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, q := range b.queue {
		if q == p {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			return true
		}
	}
	return false
}

// dispatch is the group's dispatcher goroutine: it proposes what is queued,
// one entry at a time, until the group closes.
func (b *propBuffer) dispatch() {
	for {
		select {
		case <-b.wake:
		case <-b.g.closedCh:
			return
		}
		for {
			b.mu.Lock()
			batch := b.takeLocked()
			b.mu.Unlock()
			if batch == nil {
				break
			}
			b.propose(batch)
		}
	}
}

// propose hands batch to raft as one entry (a lone command as itself),
// waits for it and gives each proposer its result. raft resolves every
// future, at the latest when the group shuts down.
func (b *propBuffer) propose(batch []*proposal) {
	g := b.g
	var data []byte
	if len(batch) == 1 {
		data = batch[0].data
	} else {
		cmds := make([][]byte, len(batch))
		for i, p := range batch {
			cmds[i] = p.data
		}
		data = b.pack(cmds)
	}
	// The entry may wait in raft's queue as long as its most patient
	// proposer; the others give up on their own contexts.
	enqueue := time.Duration(0)
	for _, p := range batch {
		enqueue = max(enqueue, remaining(p.ctx))
	}
	if enqueue <= 0 {
		for _, p := range batch {
			p.done <- proposalResult{err: g.translate(context.DeadlineExceeded, phaseBeforeEnqueue)}
		}
		return
	}
	g.metrics.packSize.Observe(float64(len(batch)))
	b.entries.Add(1)
	b.commands.Add(uint64(len(batch)))
	span := b.startEntrySpan(batch, len(data))
	f := g.raft.Apply(data, enqueue)
	err := f.Error()
	if span != nil {
		span.SetAttributes(attrIndex.Int64(int64(f.Index())))
		span.End()
	}
	entry := proposed{index: f.Index(), commands: len(batch)}
	if err != nil {
		err = g.translate(err, phaseAfterEnqueue)
		for _, p := range batch {
			p.done <- proposalResult{err: err}
		}
		return
	}
	if len(batch) == 1 {
		v, err := appliedResult(g.id, f.Response())
		batch[0].done <- proposalResult{v: v, entry: entry, err: err}
		return
	}
	if _, err := appliedResult(g.id, f.Response()); err != nil {
		for _, p := range batch {
			p.done <- proposalResult{err: err}
		}
		return
	}
	results, ok := f.Response().([]any)
	if !ok || len(results) != len(batch) {
		// The StateMachine broke its contract: the commands were applied,
		// but what each did is unknown.
		err := shardErr(g.id, "%w: state machine answered a packed entry of %d commands with %T", ErrUnknownOutcome, len(batch), f.Response())
		for _, p := range batch {
			p.done <- proposalResult{err: err}
		}
		return
	}
	for i, p := range batch {
		p.done <- proposalResult{v: results[i], entry: entry}
	}
}

// close fails what is still queued (never proposed) with ErrShutdown.
func (b *propBuffer) close() {
	b.mu.Lock()
	queued := b.queue
	b.queue, b.closed = nil, true
	b.mu.Unlock()
	for _, p := range queued {
		p.done <- proposalResult{err: shardErr(b.g.id, "%w", ErrShutdown)}
	}
}
