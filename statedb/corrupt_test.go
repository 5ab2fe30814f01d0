package statedb

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc64"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/raftstore"
)

// The checks a damaged snapshot meets (raftstore/DESIGN.md, "Damaged
// snapshots"): raft's file store keeps a CRC-64 of state.bin in meta.json
// and checks it when it opens the file; a full snapshot's header carries a
// CRC-32C of itself (version 4); package fsm's stream ends with a CRC-32C
// of everything before. These tests damage a snapshot file or stream and
// require that a node needing it refuses it with a clear error and applies
// nothing of it.

// snapshotFile is the state.bin of the only snapshot under raftDir.
func snapshotFile(t *testing.T, raftDir string) string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(raftDir, "shards", "s1", "snapshots", "*", "state.bin"))
	if len(files) != 1 {
		t.Fatalf("%d snapshots under %s, want 1", len(files), raftDir)
	}
	return files[0]
}

// damage rewrites the snapshot file at path with edit. With rechecksum it
// also rewrites raft's CRC-64 (and size) in meta.json, as if the damage had
// happened before raft computed it (in memory, or in transit to a follower,
// which checksums what it received).
func damage(t *testing.T, path string, rechecksum bool, edit func([]byte) []byte) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data = edit(data)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if !rechecksum {
		return
	}
	metaPath := filepath.Join(filepath.Dir(path), "meta.json")
	raw, err := os.ReadFile(metaPath)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var meta map[string]any
	if err := dec.Decode(&meta); err != nil {
		t.Fatal(err)
	}
	h := crc64.New(crc64.MakeTable(crc64.ECMA))
	h.Write(data)
	meta["CRC"] = base64.StdEncoding.EncodeToString(h.Sum(nil))
	meta["Size"] = len(data)
	if raw, err = json.Marshal(meta); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(metaPath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

func flipBit(at int) func([]byte) []byte {
	return func(b []byte) []byte { b[at] ^= 0x10; return b }
}

// upgradeDir writes a data dir of the release that kept the state in
// memory: 60 records, a snapshot after the first 50.
func upgradeDir(t *testing.T) (dir, addr string, now int64) {
	dir = t.TempDir()
	old := startNode(t, dir, "127.0.0.1:0", false)
	now = time.Now().UnixNano()
	for i := range 50 {
		old.cycle(i, now)
	}
	if _, _, err := old.g.Snapshot(); err != nil {
		t.Fatal(err)
	}
	for i := 50; i < 60; i++ {
		old.cycle(i, now)
	}
	addr = old.addr
	old.stop()
	return dir, addr, now
}

// startDurable starts the group over the state engine on dir and returns
// AddGroup's error; it closes what it opened.
func startDurable(t *testing.T, dir, addr string) error {
	t.Helper()
	cfg := raftstore.DefaultConfig()
	cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir, cfg.NoFsync = "n1", addr, filepath.Join(dir, "raft"), true
	h, err := raftstore.NewHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	db := openTestDB(t, filepath.Join(dir, "state"))
	defer db.Close()
	sm := openShard(t, db, "s1")
	_, err = h.AddGroup(raftstore.GroupConfig{ID: "s1", Voters: []raftstore.Peer{{ID: "n1", Addr: h.Addr()}}}, sm)
	return err
}

// TestCorruptSnapshotAtUpgradeFailsSafe: a data dir upgraded from the
// in-memory release needs its newest snapshot restored at open. Damaged,
// the node refuses to start with an error naming the snapshot, and the
// state engine holds nothing of it; a version 1 header (the older
// releases', without a checksum) still restores.
func TestCorruptSnapshotAtUpgradeFailsSafe(t *testing.T) {
	cases := []struct {
		name       string
		rechecksum bool
		edit       func([]byte) []byte
		check      func(error) bool
	}{
		// Caught by raft's CRC-64 when the file is opened.
		{"bit flip in a record", false, func(b []byte) []byte { return flipBit(len(b) / 2)(b) },
			func(err error) bool { return strings.Contains(err.Error(), "CRC mismatch") }},
		// Caught by package fsm's CRC-32C trailer.
		{"bit flip in a record under a recomputed file checksum", true, func(b []byte) []byte { return flipBit(len(b) / 2)(b) },
			func(err error) bool { return errors.Is(err, fsm.ErrCorrupt) }},
		// Caught by the header's CRC-32C (version 4); before it, this
		// restored the records under a wrong applied index.
		{"bit flip in the applied index under a recomputed file checksum", true, flipBit(11),
			func(err error) bool { return errors.Is(err, raftstore.ErrCorruptSnapshot) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, addr, _ := upgradeDir(t)
			damage(t, snapshotFile(t, filepath.Join(dir, "raft")), c.rechecksum, c.edit)
			err := startDurable(t, dir, addr)
			if err == nil || !c.check(err) || !strings.Contains(err.Error(), "snapshot") {
				t.Fatalf("start over the damaged snapshot: %v", err)
			}
			t.Logf("refused: %v", err)
			db := openTestDB(t, filepath.Join(dir, "state"))
			defer db.Close()
			sm := openShard(t, db, "s1")
			if keys, _ := sm.Store().DroppedAtOpen(); sm.AppliedIndex() != 0 || sm.FSM().Stats().Records != 0 || keys != 0 {
				t.Fatalf("the refused snapshot left applied index %d, %d records, %d stray keys", sm.AppliedIndex(), sm.FSM().Stats().Records, keys)
			}
		})
	}
	t.Run("version 1 header", func(t *testing.T) {
		dir, addr, now := upgradeDir(t)
		damage(t, snapshotFile(t, filepath.Join(dir, "raft")), true, func(b []byte) []byte {
			if string(b[:5]) != "IDRS\x04" {
				t.Fatalf("snapshot header %x, want version 4 (a full snapshot)", b[:5])
			}
			v1 := append([]byte("IDRS\x01"), b[5:13]...) // no checksum
			return append(v1, b[17:]...)
		})
		n := startNode(t, dir, addr, true)
		defer n.stop()
		if st := n.g.Stats(); st.SnapshotRestores != 1 {
			t.Fatalf("upgrade restored %d snapshots, want 1", st.SnapshotRestores)
		}
		n.checkAll(60, now)
	})
}

// logRecorder is a slog destination a test can search.
type logRecorder struct{ testutil.Buffer }

func (l *logRecorder) has(s string) bool { return strings.Contains(l.String(), s) }

// corruptingSM is a shard's state machine whose live snapshots (what a
// leader streams to a follower that needs one) have one byte flipped while
// corrupt is set: damage between the leader's engine and the follower's
// restore (memory, the wire), which no file checksum sees. The flip is the
// same on every WriteTo, as raft measures the stream before sending it.
type corruptingSM struct {
	*StateMachine
	corrupt *atomic.Bool
}

func (c corruptingSM) LiveSnapshot() (raftstore.SnapshotWriter, uint64, error) {
	w, applied, err := c.StateMachine.LiveSnapshot()
	if err != nil || !c.corrupt.Load() {
		return w, applied, err
	}
	return flippingWriter{w}, applied, nil
}

type flippingWriter struct{ raftstore.SnapshotWriter }

// flipAt is inside the first records (the fsm header is ~20 bytes).
const flipAt = 300

func (f flippingWriter) WriteTo(w io.Writer) (int64, error) {
	var buf bytes.Buffer
	n, err := f.SnapshotWriter.WriteTo(&buf)
	if err != nil {
		return n, err
	}
	b := buf.Bytes()
	b[flipAt] ^= 0x10
	k, err := w.Write(b)
	return int64(k), err
}

// TestCorruptSnapshotIsNeverInstalled: a follower that needs the leader's
// snapshot is never given a damaged one. A reference snapshot damaged on
// the leader's disk is refused by raft's CRC-64 when the leader opens it to
// send it; a stream damaged after the leader read it is sent, and the
// follower's restore refuses it (fsm's checks). Either way the follower
// keeps its old state (nothing of the snapshot applied); restarted over a
// damaged snapshot it received, it refuses to start; once the leader sends
// a good snapshot the follower installs it and has every record.
func TestCorruptSnapshotIsNeverInstalled(t *testing.T) {
	for _, c := range []struct {
		name     string
		onLeader bool   // damage the leader's snapshot file, else its stream
		logLine  string // the refusal, in the log of the leader or the follower
	}{
		{"reference damaged on the leader's disk", true, "CRC mismatch"},
		{"stream damaged after the leader read it", false, "fsm: corrupt data"},
	} {
		t.Run(c.name, func(t *testing.T) {
			corrupt := new(atomic.Bool)
			rs := make([]*replica, 3)
			var voters []raftstore.Peer
			for i := range rs {
				rec := &logRecorder{}
				rs[i] = &replica{id: fmt.Sprintf("n%d", i), dir: t.TempDir(), addr: "127.0.0.1:0", rec: rec,
					log:  slog.New(slog.NewTextHandler(rec, &slog.HandlerOptions{Level: slog.LevelWarn})),
					wrap: func(sm *StateMachine) raftstore.StateMachine { return corruptingSM{sm, corrupt} },
					// The damaged snapshot is the first leader's: it must
					// stay leader while one of its two followers is down.
					steady: true}
				rs[i].open(t, nil)
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
			t.Cleanup(func() {
				if t.Failed() {
					for _, r := range rs {
						t.Logf("log of %s:\n%s", r.id, r.rec.String())
					}
				}
			})
			ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
			defer cancel()
			wait := func(what string, cond func() bool) {
				t.Helper()
				for !cond() {
					select {
					case <-ctx.Done():
						t.Fatalf("timed out waiting for %s", what)
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
			var l *replica
			wait("a leader", func() bool {
				for _, r := range rs {
					if r.g.IsLeader() {
						l = r
						return true
					}
				}
				return false
			})
			var lagging *replica
			for _, r := range rs {
				if r != l {
					lagging = r
				}
			}
			now := time.Now().UnixNano()
			n := &singleNode{t: t, g: l.g, f: l.f}
			for i := range 20 {
				n.cycle(i, now)
			}
			wait("the follower to hold the first records", func() bool { return lagging.f.Stats().Records == 20 })
			lagging.close()
			lagging.g = nil
			for i := 20; i < 200; i++ {
				n.cycle(i, now)
			}
			if _, _, err := l.g.Snapshot(); err != nil {
				t.Fatal(err)
			}
			if c.onLeader {
				damage(t, snapshotFile(t, filepath.Join(l.dir, "raft")), false, flipBit(8))
			} else {
				corrupt.Store(true)
			}

			lagging.open(t, voters)
			where := lagging
			if c.onLeader {
				where = l
			}
			wait("the damaged snapshot to be refused", func() bool { return where.rec.has(c.logLine) })
			if st := lagging.g.Stats(); st.SnapshotRestores != 0 || lagging.f.Stats().Records != 20 {
				t.Fatalf("after the refused snapshot the follower restored %d snapshots and holds %d records, want 0 and its 20",
					st.SnapshotRestores, lagging.f.Stats().Records)
			}
			if _, ok := lagging.f.Get("ns", "key-00100", now); ok {
				t.Fatal("a record of the refused snapshot is readable on the follower")
			}
			if c.onLeader {
				// A new snapshot (after one more write: raft snapshots only
				// new state) replaces the damaged reference.
				n.cycle(200, now)
				if _, _, err := l.g.Snapshot(); err != nil {
					t.Fatal(err)
				}
			} else {
				// raft wrote the stream it received into the follower's
				// snapshot store before restoring it: restarted, the
				// follower finds a newest snapshot its state is behind and
				// refuses to start rather than skip what it covers.
				applied := lagging.g.Stats().AppliedIndex
				lagging.close()
				err := lagging.tryOpen(t, voters)
				if !errors.Is(err, fsm.ErrCorrupt) {
					t.Fatalf("restart of the follower over the damaged snapshot it received: %v, want fsm.ErrCorrupt", err)
				}
				t.Logf("restart refused: %v", err)
				// With the damaged snapshots removed it starts on its own
				// state and log, as before.
				received, _ := filepath.Glob(filepath.Join(lagging.dir, "raft", "shards", "s1", "snapshots", "*"))
				for _, d := range received {
					os.RemoveAll(d)
				}
				lagging.open(t, voters)
				if got := lagging.g.Stats().AppliedIndex; got != applied || lagging.f.Stats().Records != 20 {
					t.Fatalf("follower restarted at applied index %d with %d records, want %d and 20", got, lagging.f.Stats().Records, applied)
				}
				// The stream is sound again; one more write for the count.
				corrupt.Store(false)
				n.cycle(200, now)
			}
			target := l.g.Stats().AppliedIndex
			wait("the follower to install a sound snapshot", func() bool { return lagging.g.Stats().AppliedIndex >= target })
			(&singleNode{t: t, f: lagging.f}).checkAll(201, now)
		})
	}
}
