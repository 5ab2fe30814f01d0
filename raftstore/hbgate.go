package raftstore

import (
	"sync"

	"github.com/hashicorp/raft"
)

// gatedTransport is a group's NetworkTransport with raft's heartbeat
// handler behind a gate. hashicorp/raft handles a heartbeat on the
// transport's connection goroutine, not in its own loop (the fast path of
// NetworkTransport.handleCommand), so Raft.Shutdown does not wait for one
// in flight: a heartbeat that passed raft's shutdown check can still save a
// newer term after Shutdown returned, and if the group's log store closed
// meanwhile raft panics ("failed to save current term"), which turned a
// node's graceful drain into exit status 2. Group.shutdown closes the gate
// after Raft.Shutdown and before the store: that waits for a heartbeat in
// flight and drops any later one unanswered, as raft itself does once shut
// down (the peer's RPC then fails when the transport closes).
type gatedTransport struct {
	*raft.NetworkTransport
	gate heartbeatGate
}

func (t *gatedTransport) SetHeartbeatHandler(cb func(rpc raft.RPC)) {
	t.NetworkTransport.SetHeartbeatHandler(t.gate.wrap(cb))
}

// heartbeatGate runs handlers until closed; close waits for those running.
type heartbeatGate struct {
	mu     sync.RWMutex
	closed bool
}

// wrap returns cb behind the gate: a call after close does nothing.
func (g *heartbeatGate) wrap(cb func(rpc raft.RPC)) func(rpc raft.RPC) {
	if cb == nil {
		return nil
	}
	return func(rpc raft.RPC) {
		g.mu.RLock()
		defer g.mu.RUnlock()
		if g.closed {
			return
		}
		cb(rpc)
	}
}

// close returns once no handler runs; none runs after it.
func (g *heartbeatGate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}
