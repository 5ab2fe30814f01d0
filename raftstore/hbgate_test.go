package raftstore

import (
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// The gate's promise to Group.shutdown: close waits for a heartbeat handler
// in flight, and no handler runs after it.
func TestHeartbeatGateWaitsForTheHandlerInFlight(t *testing.T) {
	var g heartbeatGate
	entered, release := make(chan struct{}), make(chan struct{})
	calls := 0
	fn := g.wrap(func(raft.RPC) {
		calls++
		if calls == 1 {
			close(entered)
			<-release
		}
	})
	go fn(raft.RPC{})
	<-entered
	closed := make(chan struct{})
	go func() { g.close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("close returned while a heartbeat handler was still running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("close did not return after the handler finished")
	}
	fn(raft.RPC{})
	if calls != 1 {
		t.Fatalf("the handler ran %d times; a heartbeat after close must not reach it", calls)
	}
	if g.wrap(nil) != nil {
		t.Fatal("wrapping no handler must leave none, as raft's transport expects")
	}
}
