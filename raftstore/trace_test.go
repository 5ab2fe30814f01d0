package raftstore

import (
	"context"
	"fmt"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// A traced proposal gets propose, commit and apply spans under the
// proposer's span; a packed entry gets one span, a child of a proposer's,
// linking every proposer it carries; an untraced proposal gets none.
func TestProposalSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	c := newTestCluster(t, 1, []string{"s1"}, func(cfg *Config) { cfg.Packer = testPacker{}; cfg.TracerProvider = tp })
	g := c.group(c.leader("s1"), "s1")
	b := g.buf
	// Hold the dispatcher so that the proposals queue and go in one entry.
	b.mu.Lock()
	b.held = true
	b.mu.Unlock()
	const callers = 3
	roots := make([]trace.SpanContext, callers)
	var wg sync.WaitGroup
	for i := range callers {
		ctx, root := tp.Tracer("test").Start(context.Background(), fmt.Sprintf("caller-%d", i))
		roots[i] = root.SpanContext()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer root.End()
			if _, err := g.Apply(ctx, fmt.Appendf(nil, "k%d=v", i)); err != nil {
				t.Errorf("caller %d: %v", i, err)
			}
		}()
	}
	waitFor(t, "three queued proposals", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) == callers
	})
	b.mu.Lock()
	b.held = false
	b.mu.Unlock()
	b.wake <- struct{}{}
	wg.Wait()

	spans := rec.Ended()
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
	}
	parentName := func(s sdktrace.ReadOnlySpan) string {
		if p, ok := byID[s.Parent().SpanID()]; ok {
			return p.Name()
		}
		return ""
	}
	count := map[string]int{}
	var entry sdktrace.ReadOnlySpan
	for _, s := range spans {
		count[s.Name()]++
		switch s.Name() {
		case "raft.propose":
			if p := byID[s.Parent().SpanID()]; p == nil || s.Parent().TraceID() != s.SpanContext().TraceID() || p.Name()[:7] != "caller-" {
				t.Errorf("raft.propose's parent is %q, want the caller's span", parentName(s))
			}
		case "raft.commit", "raft.apply":
			if parentName(s) != "raft.propose" {
				t.Errorf("%s's parent is %q, want raft.propose", s.Name(), parentName(s))
			}
			if s.EndTime().Before(s.StartTime()) {
				t.Errorf("%s ends before it starts", s.Name())
			}
		case "raft.entry":
			entry = s
		}
	}
	for _, name := range []string{"raft.propose", "raft.commit", "raft.apply"} {
		if count[name] != callers {
			t.Errorf("%d %s spans, want one per caller (%d); spans: %v", count[name], name, callers, count)
		}
	}
	if count["raft.entry"] != 1 || entry == nil {
		t.Fatalf("%d raft.entry spans, want 1 for the packed entry; spans: %v", count["raft.entry"], count)
	}
	if parentName(entry) != "raft.propose" {
		t.Errorf("raft.entry's parent is %q, want a proposer's raft.propose", parentName(entry))
	}
	linked := map[trace.TraceID]bool{}
	for _, l := range entry.Links() {
		linked[l.SpanContext.TraceID()] = true
	}
	for i, r := range roots {
		if !linked[r.TraceID()] {
			t.Errorf("raft.entry links no span of caller %d's trace; links: %v", i, entry.Links())
		}
	}

	// Untraced: nothing recorded.
	before := len(rec.Ended())
	c.put("s1", "untraced", "1")
	if n := len(rec.Ended()) - before; n != 0 {
		t.Errorf("an untraced proposal recorded %d spans", n)
	}
}
