package statedb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/raftstore"
)

// memStateMachine is what the release before statedb ran: an FSM over the
// in-memory store, snapshots in raft's file store, state rebuilt on every
// start by restoring the newest snapshot and replaying the log.
type memStateMachine struct{ f *fsm.FSM }

func (m memStateMachine) Apply(index uint64, data []byte) any { return m.f.ApplyEntry(index, data) }
func (m memStateMachine) Snapshot() (raftstore.SnapshotWriter, error) {
	return m.f.Snapshot(), nil
}
func (m memStateMachine) Restore(r io.Reader) error { return m.f.Restore(r) }

type singleNode struct {
	t    *testing.T
	dir  string
	addr string
	host *raftstore.Host
	db   *DB
	g    *raftstore.Group
	f    *fsm.FSM
}

// start opens a one-voter host on dir; durable picks the statedb state
// machine (the new code) or memStateMachine (the old one).
func startNode(t *testing.T, dir, addr string, durable bool) *singleNode {
	t.Helper()
	cfg := raftstore.DefaultConfig()
	cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir = "n1", addr, filepath.Join(dir, "raft")
	cfg.CommitTimeout, cfg.NoFsync = 10*time.Millisecond, true
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 300*time.Millisecond, 300*time.Millisecond, 150*time.Millisecond
	cfg.SnapshotThreshold = 1 << 40 // snapshots only when the test asks
	h, err := raftstore.NewHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := &singleNode{t: t, dir: dir, addr: h.Addr(), host: h}
	var sm raftstore.StateMachine
	if durable {
		if n.db, err = Open(Config{Dir: filepath.Join(dir, "state"), CacheBytes: 8 << 20}); err != nil {
			t.Fatal(err)
		}
		dsm, err := n.db.Shard("s1")
		if err != nil {
			t.Fatal(err)
		}
		sm, n.f = dsm, dsm.FSM()
	} else {
		n.f = fsm.New()
		sm = memStateMachine{n.f}
	}
	if n.g, err = h.AddGroup(raftstore.GroupConfig{ID: "s1", Voters: []raftstore.Peer{{ID: "n1", Addr: n.addr}}}, sm); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := h.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	// Ready allows a replica a few entries behind its commit index, and a
	// restarted leader knows its earlier entries committed only once it
	// commits one of its own term: the barrier returns once every entry
	// written before the restart is applied, which is what the tests read.
	if err := n.g.ReadBarrier(ctx); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *singleNode) stop() {
	n.t.Helper()
	if err := n.host.Close(); err != nil {
		n.t.Fatal(err)
	}
	if n.db != nil {
		if err := n.db.Close(); err != nil {
			n.t.Fatal(err)
		}
	}
}

func (n *singleNode) apply(cmd *fsm.Command) fsm.Result {
	n.t.Helper()
	v, err := n.g.Apply(n.t.Context(), fsm.EncodeCommand(cmd))
	if err != nil {
		n.t.Fatal(err)
	}
	return v.(fsm.Result)
}

func (n *singleNode) cycle(i int, now int64) {
	n.t.Helper()
	key := fmt.Sprintf("key-%05d", i)
	if r := n.apply(&fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: key, Now: now, OwnerToken: "o" + key, Lease: 60 * sec}); r.Outcome != fsm.OutcomeAcquired {
		n.t.Fatalf("reserve %s: %v", key, r.Outcome)
	}
	if r := n.apply(&fsm.Command{Op: fsm.OpComplete, Namespace: "ns", Key: key, Now: now, OwnerToken: "o" + key, Retention: 24 * 3600 * sec,
		Response: &fsm.Response{Status: 200, Body: []byte("response " + key)}}); r.Outcome != fsm.OutcomeOK {
		n.t.Fatalf("complete %s: %v", key, r.Outcome)
	}
}

func (n *singleNode) checkAll(count int, now int64) {
	n.t.Helper()
	for i := range count {
		key := fmt.Sprintf("key-%05d", i)
		rec, ok := n.f.Get("ns", key, now)
		if !ok || rec.State != fsm.StateCompleted || !bytes.Equal(rec.Response.Body, []byte("response "+key)) {
			n.t.Fatalf("record %s after restart: %v %+v", key, ok, rec)
		}
	}
	if st := n.f.Stats(); st.Completed != count {
		n.t.Fatalf("stats after restart %+v, want %d completed", st, count)
	}
}

// TestRestartNeitherRestoresNorReapplies: a group over the disk state
// restarts with its records, without restoring a snapshot and without
// applying again what the state covers (a fresh FSM would panic on a
// repeated index; the applied index must be where it was at once).
func TestRestartNeitherRestoresNorReapplies(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, dir, "127.0.0.1:0", true)
	now := int64(time.Now().UnixNano())
	for i := range 100 {
		n.cycle(i, now)
	}
	if _, _, err := n.g.Snapshot(); err != nil {
		t.Fatal(err)
	}
	for i := 100; i < 150; i++ { // a tail after the snapshot
		n.cycle(i, now)
	}
	applied := n.g.Stats().AppliedIndex
	addr := n.addr
	n.stop()

	n = startNode(t, dir, addr, true)
	defer n.stop()
	st := n.g.Stats()
	if st.SnapshotRestores != 0 {
		t.Fatalf("restart restored %d snapshots", st.SnapshotRestores)
	}
	if st.AppliedCommands != 0 {
		t.Fatalf("restart applied %d commands again", st.AppliedCommands)
	}
	if st.AppliedIndex < applied {
		t.Fatalf("applied index %d after restart, was %d", st.AppliedIndex, applied)
	}
	n.checkAll(150, now)
	n.cycle(150, now) // and it goes on: fencing tokens above everything before
	n.checkAll(151, now)
}

// TestUpgradeFromInMemoryState: a data dir written by the release that kept
// the state in memory (snapshots in raft's file store plus a log tail)
// starts under the disk state with every record: the newest snapshot is
// restored into the engine once, the tail applied on top; the next restart
// needs neither.
func TestUpgradeFromInMemoryState(t *testing.T) {
	dir := t.TempDir()
	old := startNode(t, dir, "127.0.0.1:0", false)
	now := int64(time.Now().UnixNano())
	for i := range 200 {
		old.cycle(i, now)
	}
	if _, _, err := old.g.Snapshot(); err != nil {
		t.Fatal(err)
	}
	for i := 200; i < 260; i++ {
		old.cycle(i, now)
	}
	want := snapshotBytes(t, old.f)
	addr := old.addr
	old.stop()

	n := startNode(t, dir, addr, true)
	if st := n.g.Stats(); st.SnapshotRestores != 1 {
		t.Fatalf("upgrade restored %d snapshots, want 1", st.SnapshotRestores)
	}
	n.checkAll(260, now)
	if got := snapshotBytes(t, n.f); !bytes.Equal(got, want) {
		t.Fatalf("upgraded state differs from the old one (%d vs %d bytes)", len(got), len(want))
	}
	n.cycle(260, now)
	n.stop()

	n = startNode(t, dir, addr, true)
	defer n.stop()
	if st := n.g.Stats(); st.SnapshotRestores != 0 || st.AppliedCommands != 0 {
		t.Fatalf("second start after the upgrade: %d restores, %d commands re-applied", st.SnapshotRestores, st.AppliedCommands)
	}
	n.checkAll(261, now)
}

// addGroupOn opens a host and the state engine on dir and returns what
// adding its one-voter group answers (the group and both stores are closed
// at the end of the test).
func addGroupOn(t *testing.T, dir, addr string) error {
	t.Helper()
	db, err := Open(Config{Dir: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // after the host's (cleanups run last first)
	cfg := raftstore.DefaultConfig()
	cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir, cfg.NoFsync = "n1", addr, filepath.Join(dir, "raft"), true
	h, err := raftstore.NewHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	sm, err := db.Shard("s1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.AddGroup(raftstore.GroupConfig{ID: "s1", Voters: []raftstore.Peer{{ID: "n1", Addr: h.Addr()}}}, sm)
	return err
}

// TestStateAheadOfLogRefused: a state engine kept while the Raft data was
// removed would make the group skip new entries as already applied; the
// group refuses to start instead.
func TestStateAheadOfLogRefused(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, dir, "127.0.0.1:0", true)
	now := int64(time.Now().UnixNano())
	for i := range 5 {
		n.cycle(i, now)
	}
	n.stop()
	if err := os.RemoveAll(filepath.Join(dir, "raft")); err != nil {
		t.Fatal(err)
	}
	if err := addGroupOn(t, dir, "127.0.0.1:0"); !errors.Is(err, raftstore.ErrStateAhead) {
		t.Fatalf("AddGroup over a state ahead of the log: %v, want ErrStateAhead", err)
	}
}

// TestLostStateUnderReferenceSnapshotRefused: a reference snapshot is the
// state on disk itself; a node whose state engine was lost after one was
// taken cannot rebuild it from its own data dir (the log behind the
// snapshot is compacted away), and says so instead of starting empty.
func TestLostStateUnderReferenceSnapshotRefused(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, dir, "127.0.0.1:0", true)
	now := int64(time.Now().UnixNano())
	for i := range 20 {
		n.cycle(i, now)
	}
	if _, _, err := n.g.Snapshot(); err != nil {
		t.Fatal(err)
	}
	addr := n.addr
	n.stop()
	if err := os.RemoveAll(filepath.Join(dir, "state")); err != nil {
		t.Fatal(err)
	}
	if err := addGroupOn(t, dir, addr); !errors.Is(err, raftstore.ErrReferenceAhead) {
		t.Fatalf("AddGroup over a lost state under a reference snapshot: %v, want ErrReferenceAhead", err)
	}
}
