package statedb

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/idem-dev/idem/fsm"

	"github.com/idem-dev/idem/internal/testutil"
)

const sec = int64(1e9)

func openTestDB(t *testing.T, dir string) *DB {
	t.Helper()
	db, err := Open(Config{Dir: dir, CacheBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func openShard(t testing.TB, db *DB, id string) *StateMachine {
	t.Helper()
	sm, err := db.Shard(id)
	if err != nil {
		t.Fatal(err)
	}
	return sm
}

// randomCommand draws a command over a few keys and owners, so that every
// transition (acquire, replay, reclaim, complete, expiry, sweep) happens.
func randomCommand(rng *rand.Rand, now int64) *fsm.Command {
	key := "k" + strconv.Itoa(rng.IntN(12))
	ns := []string{"a", "b", "a\x00b"}[rng.IntN(3)]
	owner := "o" + strconv.Itoa(rng.IntN(3))
	c := &fsm.Command{Namespace: ns, Key: key, Now: now, OwnerToken: owner, Fingerprint: "f" + strconv.Itoa(rng.IntN(2))}
	switch rng.IntN(15) {
	case 11:
		c.Op, c.Checkpoint = fsm.OpCheckpoint, &fsm.Checkpoint{Name: "step" + strconv.Itoa(rng.IntN(2)), Data: []byte(owner)}
	case 12:
		c = &fsm.Command{Op: fsm.OpSetPolicy, Namespace: ns, Now: now, Policy: []*fsm.Policy{
			{}, {TombstoneSet: true}, {Tombstone: int64(1+rng.IntN(30)) * sec, TombstoneSet: true},
			{DefaultLease: 5 * sec, MaxLease: 15 * sec, MaxRetention: 40 * sec}}[rng.IntN(4)]}
	case 13:
		c.Op, c.Lease, c.SkewMargin, c.IfExpiredAcquire = fsm.OpReserve, int64(1+rng.IntN(20))*sec, sec, rng.IntN(2) == 0
	case 14:
		c.Op, c.Lease, c.LeaseIsDefault, c.SkewMargin = fsm.OpReserve, 30*sec, true, sec
	case 0, 1, 2:
		c.Op, c.Lease, c.SkewMargin = fsm.OpReserve, int64(1+rng.IntN(20))*sec, sec
	case 3:
		c.Op, c.Lease = fsm.OpHeartbeat, int64(1+rng.IntN(20))*sec
	case 4, 5:
		c.Op, c.Retention = fsm.OpComplete, int64(1+rng.IntN(60))*sec
		c.Response = &fsm.Response{Status: 200, Headers: map[string]string{"h": owner}, Body: []byte("body of " + key)}
	case 6:
		c.Op = fsm.OpRelease
	case 7:
		c.Op, c.OwnerToken = fsm.OpForceRelease, ""
	case 8:
		c.Op, c.OwnerToken = fsm.OpDelete, ""
	default:
		c = &fsm.Command{Op: fsm.OpSweep, Now: now, MaxSweep: rng.IntN(3), AbandonAfter: int64(rng.IntN(3)) * 10 * sec}
	}
	return c
}

func snapshotBytes(t *testing.T, f *fsm.FSM) []byte {
	t.Helper()
	s := f.Snapshot()
	defer s.Release()
	var buf bytes.Buffer
	if _, err := s.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestDiskMatchesMemory applies the same random log to an FSM over the
// in-memory store and one over the disk store, committing the disk store at
// random batch boundaries and reopening the engine now and then: every
// result, every read and the snapshot bytes must agree.
func TestDiskMatchesMemory(t *testing.T) {
	rng := testutil.Rand(testutil.Seed(t), 0)
	dir := t.TempDir()
	db := openTestDB(t, dir)
	defer func() { db.Close() }()
	disk := openShard(t, db, "s1")
	mem := fsm.New()
	now := int64(1000) * sec
	index := uint64(0)
	for round := range 60 {
		n := 1 + rng.IntN(40)
		for range n {
			index++
			now += int64(rng.IntN(3)) * sec
			cmd := randomCommand(rng, now)
			want := mem.Apply(index, cmd)
			got := disk.FSM().Apply(index, cmd)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("index %d %v: disk %+v, memory %+v", index, cmd.Op, got, want)
			}
		}
		index++ // a configuration or no-op entry the FSM never sees
		if err := disk.CommitApplied(index); err != nil {
			t.Fatal(err)
		}
		for _, ns := range []string{"a", "b", "a\x00b"} {
			for k := range 12 {
				w, wok := mem.Get(ns, "k"+strconv.Itoa(k), now)
				g, gok := disk.FSM().Get(ns, "k"+strconv.Itoa(k), now)
				if wok != gok || !reflect.DeepEqual(w, g) {
					t.Fatalf("round %d: Get %q/k%d: disk %v %+v, memory %v %+v", round, ns, k, gok, g, wok, w)
				}
			}
		}
		// Listings and the oldest in-progress key agree, page by page.
		for _, ns := range []string{"a", "b", "a\x00b"} {
			for _, q := range []fsm.ListQuery{{Namespace: ns, Limit: 3, MaxScan: 5}, {Namespace: ns, State: fsm.StateInProgress, Limit: 100},
				{Namespace: ns, After: "k3", State: fsm.StateCompleted, CreatedBefore: now - 5*sec, Limit: 2}} {
				for pages := 0; pages < 20; pages++ {
					w, werr := mem.List(q, now)
					g, gerr := disk.FSM().List(q, now)
					if werr != nil || gerr != nil || !reflect.DeepEqual(w, g) {
						t.Fatalf("round %d: List %+v: disk %+v %v, memory %+v %v", round, q, g, gerr, w, werr)
					}
					if w.Done {
						break
					}
					q.After = w.Last
				}
			}
		}
		wo, wok, werr := mem.OldestInProgress()
		gotOldest, gok, gerr := disk.FSM().OldestInProgress()
		if wo != gotOldest || wok != gok || werr != nil || gerr != nil {
			t.Fatalf("round %d: oldest in progress: disk %d %v %v, memory %d %v %v", round, gotOldest, gok, gerr, wo, wok, werr)
		}
		if ws, gs := mem.Stats(), disk.FSM().Stats(); ws != gs {
			t.Fatalf("round %d: stats disk %+v, memory %+v", round, gs, ws)
		}
		if w, g := snapshotBytes(t, mem), snapshotBytes(t, disk.FSM()); !bytes.Equal(w, g) {
			t.Fatalf("round %d: snapshots differ (%d and %d bytes)", round, len(g), len(w))
		}
		if rng.IntN(8) == 0 { // restart: the state and the applied index come back
			db.Close()
			db = openTestDB(t, dir)
			disk = openShard(t, db, "s1")
			if got := disk.AppliedIndex(); got != index {
				t.Fatalf("reopened applied index %d, want %d", got, index)
			}
		}
	}
}

// TestUncommittedBatchIsLost: what was applied but not committed is not in
// the state after a reopen, and neither is its applied index: both or
// neither (Raft applies those entries again).
func TestUncommittedBatchIsLost(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir)
	sm := openShard(t, db, "s1")
	reserve := func(i uint64, key string) {
		res := sm.FSM().Apply(i, &fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: key, Now: 10 * sec, OwnerToken: "o", Lease: sec})
		if res.Outcome != fsm.OutcomeAcquired {
			t.Fatalf("reserve %s: %v", key, res.Outcome)
		}
	}
	reserve(1, "a")
	if err := sm.CommitApplied(1); err != nil {
		t.Fatal(err)
	}
	reserve(2, "b") // never committed: the process "dies" here
	if _, ok := sm.FSM().Get("ns", "b", 10*sec); ok {
		t.Fatal("a reader saw an uncommitted record")
	}
	db.Close()
	db = openTestDB(t, dir)
	defer db.Close()
	sm = openShard(t, db, "s1")
	if sm.AppliedIndex() != 1 || sm.FSM().Stats().LastIndex != 1 {
		t.Fatalf("applied %d, fsm last index %d; want 1 and 1", sm.AppliedIndex(), sm.FSM().Stats().LastIndex)
	}
	if _, ok := sm.FSM().Get("ns", "a", 10*sec); !ok {
		t.Fatal("committed record lost")
	}
	if _, ok := sm.FSM().Get("ns", "b", 10*sec); ok {
		t.Fatal("uncommitted record survived")
	}
	reserve(2, "b") // Raft hands entry 2 again
}

func fill(t *testing.T, sm *StateMachine, from, n int, now int64) uint64 {
	t.Helper()
	idx := sm.FSM().Stats().LastIndex
	for i := from; i < from+n; i++ {
		idx++
		key := fmt.Sprintf("key-%06d", i)
		if r := sm.FSM().Apply(idx, &fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: key, Now: now, OwnerToken: "o", Lease: 60 * sec}); r.Outcome != fsm.OutcomeAcquired {
			t.Fatalf("reserve %s: %v", key, r.Outcome)
		}
		idx++
		if r := sm.FSM().Apply(idx, &fsm.Command{Op: fsm.OpComplete, Namespace: "ns", Key: key, Now: now, OwnerToken: "o",
			Retention: int64(i+1) * sec, Response: &fsm.Response{Status: 201, Body: bytes.Repeat([]byte{'x'}, 512)}}); r.Outcome != fsm.OutcomeOK {
			t.Fatalf("complete %s: %v", key, r.Outcome)
		}
	}
	if err := sm.CommitApplied(idx); err != nil {
		t.Fatal(err)
	}
	return idx
}

// failingReader returns an error after n bytes.
type failingReader struct {
	r io.Reader
	n int
}

var errInjected = errors.New("injected read failure")

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errInjected
	}
	if len(p) > f.n {
		p = p[:f.n]
	}
	n, err := f.r.Read(p)
	f.n -= n
	return n, err
}

// TestInterruptedRestoreKeepsOldState: a Restore whose reader fails midway
// leaves the old records readable, in this process and after a reopen; a
// complete Restore then replaces them.
func TestInterruptedRestoreKeepsOldState(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir)
	src := openShard(t, db, "src")
	dst := openShard(t, db, "dst")
	fill(t, src, 0, 3000, 100*sec)
	fill(t, dst, 50000, 10, 100*sec)
	snap := snapshotBytes(t, src.FSM())
	before := snapshotBytes(t, dst.FSM())

	err := dst.RestoreApplied(&failingReader{r: bytes.NewReader(snap), n: len(snap) / 2}, 777)
	if !errors.Is(err, fsm.ErrCorrupt) && !errors.Is(err, errInjected) && err == nil {
		t.Fatalf("interrupted restore: %v", err)
	}
	if err == nil {
		t.Fatal("interrupted restore succeeded")
	}
	check := func(sm *StateMachine, want []byte) {
		t.Helper()
		if got := snapshotBytes(t, sm.FSM()); !bytes.Equal(got, want) {
			t.Fatalf("state differs from the expected one (%d vs %d bytes)", len(got), len(want))
		}
	}
	check(dst, before)
	if _, ok := dst.FSM().Get("ns", "key-050003", 100*sec); !ok {
		t.Fatal("old record unreadable after an interrupted restore")
	}
	db.Close()
	db = openTestDB(t, dir)
	defer db.Close()
	dst = openShard(t, db, "dst")
	check(dst, before)

	if err := dst.RestoreApplied(bytes.NewReader(snap), 777); err != nil {
		t.Fatal(err)
	}
	check(dst, snap)
	if dst.AppliedIndex() != 777 {
		t.Fatalf("applied %d after restore, want 777", dst.AppliedIndex())
	}
	if _, ok := dst.FSM().Get("ns", "key-050003", 100*sec); ok {
		t.Fatal("record of the replaced state still readable")
	}
	db.Close()
	db2 := openTestDB(t, dir)
	defer db2.Close()
	dst = openShard(t, db2, "dst")
	check(dst, snap)
	if dst.AppliedIndex() != 777 {
		t.Fatalf("applied %d after reopen, want 777", dst.AppliedIndex())
	}
}

// TestSweepRemovesExactlyTheExpired: records expire one per second; a
// sweep at time T removes exactly those with expires_at <= T (bounded by
// MaxSweep per entry, oldest first) and nothing else, and abandoned
// reservations go only past the horizon.
func TestSweepRemovesExactlyTheExpired(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	defer db.Close()
	sm := openShard(t, db, "s")
	const n = 500
	t0 := 1000 * sec
	// No tombstones in this namespace: expired records go at once.
	sm.FSM().Apply(1, &fsm.Command{Op: fsm.OpSetPolicy, Namespace: "ns", Now: t0, Policy: &fsm.Policy{TombstoneSet: true}})
	idx := fill(t, sm, 0, n, t0) // key-i expires at t0 + (i+1) s
	// Two reservations nobody completes: leases end at t0+60s.
	for _, k := range []string{"stuck-1", "stuck-2"} {
		idx++
		sm.FSM().Apply(idx, &fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: k, Now: t0, OwnerToken: "o", Lease: 60 * sec})
	}
	sweep := func(now int64, max int) int {
		idx++
		r := sm.FSM().Apply(idx, &fsm.Command{Op: fsm.OpSweep, Now: now, MaxSweep: max, AbandonAfter: 3600 * sec})
		if err := sm.CommitApplied(idx); err != nil {
			t.Fatal(err)
		}
		return r.Swept
	}
	if got := sweep(t0+100*sec, 30); got != 30 {
		t.Fatalf("bounded sweep dropped %d, want 30", got)
	}
	if got := sweep(t0+100*sec, 1000); got != 70 {
		t.Fatalf("second sweep dropped %d, want the remaining 70 expired", got)
	}
	st := sm.FSM().Stats()
	if st.Completed != n-100 || st.InProgress != 2 {
		t.Fatalf("stats after sweeps %+v; want %d completed, 2 in progress", st, n-100)
	}
	for i := range n {
		_, ok := sm.Store().Lookup(fsm.RecordKey{Namespace: "ns", Key: fmt.Sprintf("key-%06d", i)})
		if ok != (i >= 100) {
			t.Fatalf("key-%06d stored=%v after sweeping up to %d s", i, ok, 100)
		}
	}
	if got := sweep(t0+60*sec+3599*sec, 0); got != n-100 { // every completed one is past retention by then
		t.Fatalf("sweep before the abandon horizon dropped %d, want %d", got, n-100)
	}
	if st := sm.FSM().Stats(); st.InProgress != 2 {
		t.Fatalf("in-progress records dropped before the horizon: %+v", st)
	}
	if got := sweep(t0+60*sec+3600*sec, 0); got != 2 {
		t.Fatalf("sweep at the horizon dropped %d, want the 2 abandoned", got)
	}
	policy := fsm.RecordBytes(fsm.RecordKey{Namespace: fsm.PolicyNamespace, Key: "ns"}, &fsm.Record{State: fsm.StatePolicy})
	if st := sm.FSM().Stats(); st.Records != 0 || st.Bytes != policy {
		t.Fatalf("state not empty after everything expired: %+v (the policy alone accounts %d bytes)", st, policy)
	}
}

func TestKeyEncodingOrderAndRoundTrip(t *testing.T) {
	var keys []fsm.RecordKey
	for _, p := range [][2]string{{"a", ""}, {"a", "\x00"}, {"a", "b"}, {"a\x00", ""}, {"a\x00b", "c"}, {"ab", ""}, {"b", "\xff\x00"}} {
		keys = append(keys, fsm.RecordKey{Namespace: p[0], Key: p[1]})
	}
	var prev []byte
	for i, k := range keys {
		enc := appendKey(nil, k)
		got, err := decodeKey(enc)
		if err != nil || got != k {
			t.Fatalf("round trip of %q: %q, %v", k, got, err)
		}
		if i > 0 && bytes.Compare(prev, enc) >= 0 {
			t.Fatalf("encoding of %q does not sort after %q", k, keys[i-1])
		}
		prev = enc
	}
}

// TestCrashDuringRestoreLeavesOldState: the engine as a crash in the
// middle of a Restore leaves it (a checkpoint taken inside the injected
// crash, after the first records of the new generation were synced) opens
// with the old state and applied index, and drops exactly what the restore
// had written into the new generation.
func TestCrashDuringRestoreLeavesOldState(t *testing.T) {
	dir, crashed := t.TempDir(), filepath.Join(t.TempDir(), "crashed")
	var db *DB
	calls := 0
	cfg := Config{Dir: dir, CacheBytes: 8 << 20, TestingRestoreFault: &RestoreFault{AfterRecords: 100, Crash: func(shard string, n int) {
		calls++
		if shard != "dst" || n != 100 {
			t.Errorf("crash hook called for shard %s after %d records, want dst after 100", shard, n)
		}
		if err := db.db.Checkpoint(crashed); err != nil {
			t.Error(err)
		}
	}}}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src := openShard(t, db, "src")
	dst := openShard(t, db, "dst")
	fill(t, src, 0, 300, 100*sec)
	fill(t, dst, 50000, 10, 100*sec)
	if err := dst.CommitApplied(20); err != nil {
		t.Fatal(err)
	}
	before := snapshotBytes(t, dst.FSM())
	if err := dst.RestoreApplied(bytes.NewReader(snapshotBytes(t, src.FSM())), 777); err == nil {
		t.Fatal("a restore whose crash hook returned succeeded")
	}
	if calls != 1 {
		t.Fatalf("crash hook called %d times, want 1", calls)
	}
	db.Close()

	after := openTestDB(t, crashed)
	defer after.Close()
	sm := openShard(t, after, "dst")
	if got := snapshotBytes(t, sm.FSM()); !bytes.Equal(got, before) {
		t.Fatalf("state after the crash differs from the one before the restore (%d vs %d bytes)", len(got), len(before))
	}
	if sm.AppliedIndex() != 20 {
		t.Fatalf("applied index %d after the crash, want 20 (the one before the restore)", sm.AppliedIndex())
	}
	// 100 records of the new generation, each with its index key.
	if keys, bytes := sm.Store().DroppedAtOpen(); keys != 200 || bytes == 0 {
		t.Fatalf("opening after the crash dropped %d keys (%d bytes) of the interrupted restore, want 200", keys, bytes)
	}
	after.Close()
	again := openTestDB(t, crashed)
	defer again.Close()
	if keys, _ := openShard(t, again, "dst").Store().DroppedAtOpen(); keys != 0 {
		t.Fatalf("the second open dropped %d keys: the first left a stray generation", keys)
	}
}

// TestRestoreReplacesWhatTheWriterRemembers: after a snapshot install the
// writer sees the installed state, not the records it put (and cached)
// before it.
func TestRestoreReplacesWhatTheWriterRemembers(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	defer db.Close()
	disk := openShard(t, db, "s1")
	now := int64(1000) * sec
	reserve := func(f *fsm.FSM, index uint64, owner string) fsm.Result {
		return f.Apply(index, &fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: "k", Now: now, OwnerToken: owner, Lease: 60 * sec})
	}
	if r := reserve(disk.FSM(), 1, "a"); r.Outcome != fsm.OutcomeAcquired {
		t.Fatalf("first reserve: %+v", r)
	}
	if err := disk.CommitApplied(1); err != nil {
		t.Fatal(err)
	}
	// The leader's state: k is held by b.
	leader := fsm.New()
	if r := reserve(leader, 1, "b"); r.Outcome != fsm.OutcomeAcquired {
		t.Fatalf("leader's reserve: %+v", r)
	}
	if err := disk.RestoreApplied(bytes.NewReader(snapshotBytes(t, leader)), 1); err != nil {
		t.Fatal(err)
	}
	// a's reserve again: before the install it would renew a's own
	// reservation; after it, k is b's.
	got, want := reserve(disk.FSM(), 2, "a"), reserve(leader, 2, "a")
	if !reflect.DeepEqual(got, want) || got.Outcome == fsm.OutcomeAcquired {
		t.Fatalf("reserve after the install: %+v, want the leader's %+v", got, want)
	}
}
