package statedb

import (
	"fmt"
	"io"

	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/raftstore"
)

// StateMachine is one shard's fsm.FSM over its ShardStore, as a
// raftstore.DurableStateMachine.
type StateMachine struct {
	db *DB
	f  *fsm.FSM
	s  *ShardStore
}

var _ raftstore.LiveSnapshotter = (*StateMachine)(nil)

// Shard opens shard id's state (empty the first time) and returns its state
// machine. A shard can be opened once per DB.
func (d *DB) Shard(id string) (*StateMachine, error) {
	s, err := d.openShard(id)
	if err != nil {
		return nil, err
	}
	return &StateMachine{db: d, f: fsm.NewWithStore(s), s: s}, nil
}

// FSM is the shard's state machine, for reads and stats.
func (m *StateMachine) FSM() *fsm.FSM { return m.f }

// Store is the shard's store.
func (m *StateMachine) Store() *ShardStore { return m.s }

// Apply applies one log entry: a single command (its fsm.Result), or a
// packed entry of raftstore's proposal buffer (one fsm.Result per command,
// as the []any the buffer hands back to each proposer).
func (m *StateMachine) Apply(index uint64, data []byte) any {
	if fsm.IsPacked(data) {
		rs := m.f.ApplyPackedEntry(index, data)
		out := make([]any, len(rs))
		for i, r := range rs {
			out[i] = r
		}
		return out
	}
	return m.f.ApplyEntry(index, data)
}

// Snapshot first makes the engine durable (one fsync of its WAL, which
// carries every batch committed before), then captures a view. Raft
// compacts its log only up to a snapshot, so the state on disk never falls
// behind what the log still holds: after a crash a restart re-applies at
// most the unsynced tail from the log and never needs to restore a snapshot.
func (m *StateMachine) Snapshot() (raftstore.SnapshotWriter, error) {
	if err := m.s.sync(); err != nil {
		return nil, err
	}
	return m.f.Snapshot(), nil
}

// SyncState makes every committed batch durable (raftstore calls it before
// writing a reference snapshot).
func (m *StateMachine) SyncState() error { return m.s.sync() }

// LiveSnapshot captures the committed state now (a pebble snapshot), with
// the Raft index it covers, read from the same snapshot; safe from any
// goroutine.
func (m *StateMachine) LiveSnapshot() (raftstore.SnapshotWriter, uint64, error) {
	snap := m.f.Snapshot()
	v, ok := snap.View().(*view)
	if !ok {
		snap.Release()
		return nil, 0, fmt.Errorf("statedb: shard %s: the FSM's view is a %T", m.s.id, snap.View())
	}
	if v.err != nil {
		snap.Release()
		return nil, 0, fmt.Errorf("statedb: shard %s: snapshot meta: %w", m.s.id, v.err)
	}
	return snap, v.applied, nil
}

// Restore restores a snapshot that carries no applied index (never called
// by raftstore for a DurableStateMachine; kept for the interface).
func (m *StateMachine) Restore(r io.Reader) error { return m.RestoreApplied(r, m.f.Stats().LastIndex) }

// AppliedIndex is the Raft index the committed state covers.
func (m *StateMachine) AppliedIndex() uint64 { return m.s.Applied() }

// CommitApplied writes everything applied since the last call, with index,
// in one atomic engine batch.
func (m *StateMachine) CommitApplied(index uint64) error { return m.s.commit(index) }

// RestoreApplied replaces the state with the snapshot in r, which covers
// Raft index applied; the switch and the index are one synced write.
func (m *StateMachine) RestoreApplied(r io.Reader, applied uint64) error {
	m.s.pendingApplied = applied
	return m.f.Restore(r)
}
