package statedb

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/raftstore"
)

type replica struct {
	id, dir, addr string
	host          *raftstore.Host
	db            *DB
	g             *raftstore.Group
	f             *fsm.FSM
	log           *slog.Logger // nil: discarded
	rec           *logRecorder // what log wrote, when set
	// wrap, when set, stands between the shard's state machine and raft.
	wrap func(*StateMachine) raftstore.StateMachine
	// steady, when set, gives the group timeouts long enough that a
	// loaded machine's stalls do not move leadership: for tests whose
	// subject is not an election and that need one leader throughout.
	steady bool
}

func (r *replica) open(t *testing.T, voters []raftstore.Peer) {
	t.Helper()
	if err := r.tryOpen(t, voters); err != nil {
		t.Fatal(err)
	}
}

// tryOpen is open that returns AddGroup's error (the replica then closed).
func (r *replica) tryOpen(t *testing.T, voters []raftstore.Peer) error {
	t.Helper()
	cfg := raftstore.DefaultConfig()
	cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir, cfg.NoFsync = r.id, r.addr, filepath.Join(r.dir, "raft"), true
	cfg.CommitTimeout, cfg.TrailingLogs, cfg.SnapshotThreshold = 10*time.Millisecond, 5, 1<<40
	cfg.Logger = r.log
	if r.steady {
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 3*time.Second, 3*time.Second, 3*time.Second
	}
	h, err := raftstore.NewHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.host, r.addr = h, h.Addr()
	if voters == nil {
		return nil
	}
	if r.db, err = Open(Config{Dir: filepath.Join(r.dir, "state"), CacheBytes: 8 << 20}); err != nil {
		t.Fatal(err)
	}
	sm, err := r.db.Shard("s1")
	if err != nil {
		t.Fatal(err)
	}
	r.f = sm.FSM()
	var rsm raftstore.StateMachine = sm
	if r.wrap != nil {
		rsm = r.wrap(sm)
	}
	if r.g, err = h.AddGroup(raftstore.GroupConfig{ID: "s1", Voters: voters}, rsm); err != nil {
		r.close()
		r.g = nil
		return err
	}
	return nil
}

func (r *replica) close() {
	r.host.Close()
	if r.db != nil {
		r.db.Close()
	}
}

// TestFollowerCatchesUpBySnapshotInstall: a follower that was down while
// the leader snapshotted and compacted its log gets the state by an
// InstallSnapshot streamed from the leader's engine, restored into a new
// generation of its own engine, and then has every record.
func TestFollowerCatchesUpBySnapshotInstall(t *testing.T) {
	rs := make([]*replica, 3)
	var voters []raftstore.Peer
	for i := range rs {
		// The writes go to the first leader while one of its two followers
		// is down: it must stay leader (steady).
		rs[i] = &replica{id: fmt.Sprintf("n%d", i), dir: t.TempDir(), addr: "127.0.0.1:0", steady: true}
		rs[i].open(t, nil) // bind first: the voters need every address
		voters = append(voters, raftstore.Peer{ID: rs[i].id, Addr: rs[i].addr})
		rs[i].host.Close()
	}
	for _, r := range rs {
		r.open(t, voters)
	}
	defer func() {
		for _, r := range rs {
			r.close()
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	leader := func() *replica {
		for ctx.Err() == nil {
			for _, r := range rs {
				if r.g != nil && r.g.IsLeader() {
					return r
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
		t.Fatal("no leader")
		return nil
	}
	l := leader()
	var lagging *replica
	for _, r := range rs {
		if r != l {
			lagging = r
		}
	}
	lagging.close()
	lagging.g = nil
	now := time.Now().UnixNano()
	n := &singleNode{t: t, g: l.g, f: l.f}
	for i := range 200 {
		n.cycle(i, now)
	}
	if _, _, err := l.g.Snapshot(); err != nil {
		t.Fatal(err)
	}
	// The leader's snapshot is a reference to its engine: a header, not a
	// copy of the state.
	if size := newestSnapshotSize(t, filepath.Join(l.dir, "raft")); size != 13 {
		t.Fatalf("leader's newest snapshot holds %d bytes, want the 13-byte reference", size)
	}
	// Writes after the snapshot: the state the leader streams when the
	// follower asks is newer than the snapshot's index, and the follower
	// must skip the entries after the snapshot that its restored state
	// already holds (applying one twice would panic in the FSM).
	for i := 200; i < 300; i++ {
		n.cycle(i, now)
	}
	lagging.open(t, voters)
	target := l.g.Stats().AppliedIndex
	for lagging.g.Stats().AppliedIndex < target {
		if ctx.Err() != nil {
			t.Fatalf("follower stuck at %d, leader at %d", lagging.g.Stats().AppliedIndex, target)
		}
		select { // poll until ctx's deadline
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	if st := lagging.g.Stats(); st.SnapshotRestores != 1 {
		t.Fatalf("follower restored %d snapshots, want 1 (an install)", st.SnapshotRestores)
	}
	(&singleNode{t: t, f: lagging.f}).checkAll(300, now)
	n.cycle(300, now) // and both go on from there
	for lagging.f.Stats().Completed < 301 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	(&singleNode{t: t, f: lagging.f}).checkAll(301, now)
}

// newestSnapshotSize is the size of the state file of the newest snapshot
// under a raftstore data dir.
func newestSnapshotSize(t *testing.T, raftDir string) int64 {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(raftDir, "shards", "*", "snapshots", "*", "state.bin"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no snapshot under %s (%v)", raftDir, err)
	}
	var newest os.FileInfo
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if newest == nil || fi.ModTime().After(newest.ModTime()) {
			newest = fi
		}
	}
	return newest.Size()
}
