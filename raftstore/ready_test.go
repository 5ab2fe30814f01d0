package raftstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestApplyLagOK(t *testing.T) {
	for _, tc := range []struct {
		lag     uint64
		stalled time.Duration
		want    bool
	}{
		{1, 0, true},
		{readyLagEntries, readyLagGrace - time.Millisecond, true},
		{readyLagEntries + 1, 0, false}, // replaying a long log
		{1, readyLagGrace, false},       // the state machine stopped applying
	} {
		if got := applyLagOK(tc.lag, tc.stalled); got != tc.want {
			t.Errorf("applyLagOK(%d, %v) = %v, want %v", tc.lag, tc.stalled, got, tc.want)
		}
	}
}

// gatedKV is a kvSM whose Apply says it was called (entered) and then
// waits while gate is closed.
type gatedKV struct {
	*kvSM
	entered chan uint64
	gate    chan struct{}
}

func (s *gatedKV) Apply(index uint64, data []byte) any {
	select {
	case s.entered <- index:
	default: // only the first is waited for
	}
	<-s.gate
	return s.kvSM.Apply(index, data)
}

// TestReadyToleratesApplyLagButNotAStall: a replica an entry behind the
// commit index it knows is ready (under load every replica is, most of
// the time); one whose state machine has not applied that entry for
// readyLagGrace is not; it is ready again once it applies.
func TestReadyToleratesApplyLagButNotAStall(t *testing.T) {
	cfg := testConfig()
	cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir = "n1", "127.0.0.1:0", t.TempDir()
	h, err := NewHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	sm := &gatedKV{kvSM: newKV(), entered: make(chan uint64, 1), gate: make(chan struct{})}
	var openGate sync.Once
	t.Cleanup(func() { openGate.Do(func() { close(sm.gate) }) }) // before h.Close: raft waits for the FSM
	g, err := h.AddGroup(GroupConfig{ID: "s0", Voters: []Peer{{"n1", h.Addr()}}}, sm)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, _, err := g.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	applied := make(chan error, 1)
	go func() {
		_, err := g.Apply(ctx, []byte("k=v"))
		applied <- err
	}()
	// Committed, not applied: the state machine holds the entry.
	var idx uint64
	select {
	case idx = <-sm.entered:
	case <-ctx.Done():
		t.Fatal("the command never reached the state machine")
	}
	if ok, a, c, err := g.caughtUp(); err != nil || !ok || a >= idx || c < idx {
		t.Fatalf("entry %d held by the state machine, just now: caught up %v (applied %d, committed %d, %v), want caught up, behind", idx, ok, a, c, err)
	}
	if err := h.Ready(); err != nil {
		t.Fatalf("Ready while an entry behind: %v", err)
	}
	time.Sleep(readyLagGrace + 100*time.Millisecond)
	if err := h.Ready(); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Ready after the state machine stalled for %v: %v, want ErrNotReady", readyLagGrace, err)
	}
	openGate.Do(func() { close(sm.gate) })
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	if err := h.WaitReady(ctx); err != nil {
		t.Fatalf("after the apply: %v", err)
	}
}
