package raftstore

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem/internal/tracing"
)

// Spans of a proposal (Config.TracerProvider; DESIGN.md "Traces"). The
// proposer's context carries its trace (the forward to the leader brought
// it over gRPC), and proposal and apply happen in this process, so the
// spans are children of the proposer's: nothing of the trace goes into
// the log entry.
//
//	raft.propose  the proposer's wait, from Group.Apply to its result
//	  raft.commit from the proposal to the moment the entry reached the
//	              state machine (buffer queue, log writes, quorum)
//	  raft.apply  the apply of the batch of entries that held it
//	raft.entry    a packed entry: a child of its first traced proposer,
//	              with a link to every proposer it carries

// Span attribute keys of raftstore.
const (
	attrIndex         = attribute.Key("raft.index")
	attrEntryCommands = attribute.Key("raft.entry.commands")
	attrEntryBytes    = attribute.Key("raft.entry.bytes")
	attrCommitMs      = attribute.Key("raft.commit_ms")
	attrApplyEntries  = attribute.Key("raft.apply.entries")
)

// proposed is what a proposer learns of the entry its command went in.
type proposed struct {
	index    uint64 // 0: never appended (or unknown)
	commands int    // commands packed in that entry
}

// applyTimes remembers when the state machine applied the latest batches
// of entries, so that a proposer can place its apply span. Kept only when
// tracing is on.
type applyTimes struct {
	mu   sync.Mutex
	ring [256]appliedBatch
	next int
}

type appliedBatch struct {
	first, last uint64
	start, end  time.Time
	entries     int
}

func (a *applyTimes) record(b appliedBatch) {
	a.mu.Lock()
	a.ring[a.next] = b
	a.next = (a.next + 1) % len(a.ring)
	a.mu.Unlock()
}

// lookup is the batch that applied index, if still remembered.
func (a *applyTimes) lookup(index uint64) (appliedBatch, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, b := range a.ring {
		if b.first <= index && index <= b.last && b.entries > 0 {
			return b, true
		}
	}
	return appliedBatch{}, false
}

// applyTraced is Group.apply inside a raft.propose span with its commit
// and apply children.
func (g *Group) applyTraced(ctx context.Context, tracer trace.Tracer, data []byte) (any, error) {
	start := time.Now()
	ctx, span := tracer.Start(ctx, "raft.propose", trace.WithAttributes(tracing.Shard.String(g.id), tracing.Node.String(g.host.cfg.NodeID)))
	defer span.End()
	v, pr, err := g.apply(ctx, data)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	if pr.index == 0 {
		return v, err
	}
	span.SetAttributes(attrIndex.Int64(int64(pr.index)), attrEntryCommands.Int(pr.commands))
	if b, ok := g.fsm.times.lookup(pr.index); ok {
		span.SetAttributes(attrCommitMs.Float64(float64(b.start.Sub(start).Microseconds()) / 1000))
		_, commit := tracer.Start(ctx, "raft.commit", trace.WithTimestamp(start), trace.WithAttributes(attrIndex.Int64(int64(pr.index))))
		commit.End(trace.WithTimestamp(b.start))
		_, apply := tracer.Start(ctx, "raft.apply", trace.WithTimestamp(b.start), trace.WithAttributes(attrApplyEntries.Int(b.entries)))
		apply.End(trace.WithTimestamp(b.end))
	}
	return v, err
}

// startEntrySpan starts the span of a packed entry when any of its
// proposers is traced: a child of the first such, linking all of them.
func (b *propBuffer) startEntrySpan(batch []*proposal, size int) trace.Span {
	tracer := b.g.host.tracer
	if tracer == nil || len(batch) < 2 {
		return nil
	}
	var parent context.Context
	ctxs := make([]context.Context, 0, len(batch))
	for _, p := range batch {
		if trace.SpanFromContext(p.ctx).IsRecording() {
			if parent == nil {
				parent = p.ctx
			}
			ctxs = append(ctxs, p.ctx)
		}
	}
	if parent == nil {
		return nil
	}
	_, span := tracer.Start(parent, "raft.entry", trace.WithLinks(tracing.Links(ctxs)...),
		trace.WithAttributes(tracing.Shard.String(b.g.id), attrEntryCommands.Int(len(batch)), attrEntryBytes.Int(size)))
	return span
}
