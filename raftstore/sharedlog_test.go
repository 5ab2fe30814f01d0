package raftstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/idem-dev/idem/internal/testutil"
)

func openTestSharedLog(t *testing.T, path string) *sharedLog {
	t.Helper()
	sl, err := openSharedLog(path, true, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sl.close() })
	return sl
}

func testLogs(from, to, term uint64, tag string) []*raft.Log {
	var out []*raft.Log
	for i := from; i <= to; i++ {
		out = append(out, &raft.Log{Index: i, Term: term, Type: raft.LogCommand,
			Data: fmt.Appendf(nil, "%s-%d", tag, i), AppendedAt: time.Unix(1700000000, int64(i))})
	}
	return out
}

// hostLog is a log store shared by the groups of a host (the shared bolt
// log or the pebble log), for the tests that run against both.
type hostLog struct {
	group func(id string) (groupStore, error)
	close func() error
}

// hostLogs open each kind of host log in a directory, with fsync off.
var hostLogs = []struct {
	name string
	open func(dir string) (hostLog, error)
}{
	{LogStorePebble, func(dir string) (hostLog, error) {
		pl, err := openPebbleLog(filepath.Join(dir, pebbleLogDir), true, nil, nil, nil)
		if err != nil {
			return hostLog{}, err
		}
		return hostLog{func(id string) (groupStore, error) { return pl.group(id) }, pl.close}, nil
	}},
	{LogStoreSharedBolt, func(dir string) (hostLog, error) {
		sl, err := openSharedLog(filepath.Join(dir, sharedLogFile), true, nil, nil)
		if err != nil {
			return hostLog{}, err
		}
		return hostLog{func(id string) (groupStore, error) { return sl.group(id) }, sl.close}, nil
	}},
}

// TestSharedLogStore checks the raft.LogStore and raft.StableStore contract
// of two groups sharing one host log (pebble and shared bolt): isolation,
// ranges, deletes, the "not found" raft relies on, and that everything
// survives a close and reopen on the same directory.
func TestSharedLogStore(t *testing.T) {
	for _, hl := range hostLogs {
		t.Run(hl.name, func(t *testing.T) { testHostLogStore(t, hl.open) })
	}
}

func testHostLogStore(t *testing.T, open func(dir string) (hostLog, error)) {
	dir := t.TempDir()
	sl, err := open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, err := sl.group("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := sl.group("b")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []groupStore{a, b} {
		if first, last := mustIndexes(t, g); first != 0 || last != 0 {
			t.Fatalf("empty group: first %d last %d, want 0 0", first, last)
		}
		var l raft.Log
		if err := g.GetLog(1, &l); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("GetLog on empty group: %v, want ErrLogNotFound", err)
		}
		if _, err := g.Get([]byte("CurrentTerm")); err == nil || err.Error() != "not found" {
			t.Fatalf("Get of a missing key: %v, want an error reading exactly \"not found\" (raft compares the text)", err)
		}
		if _, err := g.GetUint64([]byte("CurrentTerm")); err == nil || err.Error() != "not found" {
			t.Fatalf("GetUint64 of a missing key: %v, want \"not found\"", err)
		}
	}

	full := &raft.Log{Index: 1, Term: 3, Type: raft.LogConfiguration, Data: []byte("conf"),
		Extensions: []byte("ext"), AppendedAt: time.Unix(1700000000, 123456789)}
	if err := a.StoreLog(full); err != nil {
		t.Fatal(err)
	}
	if err := a.StoreLogs(testLogs(2, 10, 3, "a")); err != nil {
		t.Fatal(err)
	}
	if err := b.StoreLogs(testLogs(5, 7, 1, "b")); err != nil {
		t.Fatal(err)
	}
	if err := a.SetUint64([]byte("CurrentTerm"), 3); err != nil {
		t.Fatal(err)
	}
	if err := b.Set([]byte("LastVoteCand"), []byte("n2")); err != nil {
		t.Fatal(err)
	}

	check := func(sl hostLog) {
		t.Helper()
		a, err := sl.group("a")
		if err != nil {
			t.Fatal(err)
		}
		b, err := sl.group("b")
		if err != nil {
			t.Fatal(err)
		}
		if first, last := mustIndexes(t, a); first != 3 || last != 8 {
			t.Fatalf("group a: first %d last %d, want 3 8", first, last)
		}
		if first, last := mustIndexes(t, b); first != 5 || last != 7 {
			t.Fatalf("group b: first %d last %d, want 5 7 (untouched by a's deletes)", first, last)
		}
		var l raft.Log
		if err := b.GetLog(6, &l); err != nil || string(l.Data) != "b-6" || l.Term != 1 || l.Index != 6 {
			t.Fatalf("b.GetLog(6) = %+v, %v", l, err)
		}
		if err := a.GetLog(5, &l); err != nil || string(l.Data) != "a-5" || !l.AppendedAt.Equal(time.Unix(1700000000, 5)) {
			t.Fatalf("a.GetLog(5) = %+v, %v", l, err)
		}
		for _, gone := range []uint64{1, 2, 9, 10} {
			if err := a.GetLog(gone, &l); !errors.Is(err, raft.ErrLogNotFound) {
				t.Fatalf("a.GetLog(%d) after DeleteRange: %v, want ErrLogNotFound", gone, err)
			}
		}
		if v, err := a.GetUint64([]byte("CurrentTerm")); err != nil || v != 3 {
			t.Fatalf("a CurrentTerm = %d, %v", v, err)
		}
		if _, err := b.GetUint64([]byte("CurrentTerm")); err == nil {
			t.Fatalf("b sees a's stable store")
		}
		if v, err := b.Get([]byte("LastVoteCand")); err != nil || string(v) != "n2" {
			t.Fatalf("b LastVoteCand = %q, %v", v, err)
		}
	}
	// Every field of an entry round-trips.
	var got raft.Log
	if err := a.GetLog(1, &got); err != nil {
		t.Fatal(err)
	}
	if got.Index != full.Index || got.Term != full.Term || got.Type != full.Type || !bytes.Equal(got.Data, full.Data) ||
		!bytes.Equal(got.Extensions, full.Extensions) || !got.AppendedAt.Equal(full.AppendedAt) {
		t.Fatalf("GetLog(1) = %+v, want %+v", got, full)
	}
	// Compaction from the front and a conflict truncation from the back.
	if err := a.DeleteRange(1, 2); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteRange(9, 10); err != nil {
		t.Fatal(err)
	}
	check(sl)

	if err := sl.close(); err != nil {
		t.Fatal(err)
	}
	if err := a.StoreLogs(testLogs(11, 11, 3, "a")); !errors.Is(err, ErrShutdown) {
		t.Fatalf("StoreLogs after close: %v, want ErrShutdown", err)
	}
	reopened, err := open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer reopened.close()
	check(reopened)
	// Writes after the reopen extend the indexes read back from disk.
	a2, err := reopened.group("a")
	if err != nil {
		t.Fatal(err)
	}
	if err := a2.StoreLogs(testLogs(9, 12, 4, "a")); err != nil {
		t.Fatal(err)
	}
	if first, last := mustIndexes(t, a2); first != 3 || last != 12 {
		t.Fatalf("group a after reopen and append: first %d last %d, want 3 12", first, last)
	}
	if err := a2.DeleteRange(3, 12); err != nil {
		t.Fatal(err)
	}
	if first, last := mustIndexes(t, a2); first != 0 || last != 0 {
		t.Fatalf("group a emptied: first %d last %d, want 0 0", first, last)
	}
}

func mustIndexes(t *testing.T, g raft.LogStore) (first, last uint64) {
	t.Helper()
	first, err := g.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, err = g.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	return first, last
}

// blockWriter queues a write that holds the writer until the returned
// function is called, and returns once the writer is inside it: writes
// queued meanwhile all wait for the next commit.
func blockWriter(t *testing.T, sl *sharedLog) (release func()) {
	t.Helper()
	entered, unblock := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- sl.write(func(*bbolt.Tx) error {
			close(entered)
			<-unblock
			return nil
		})
	}()
	<-entered
	return func() {
		close(unblock)
		if err := <-done; err != nil {
			t.Errorf("blocking write: %v", err)
		}
	}
}

// waitQueued polls until n writes wait in the shared log's queue.
func waitQueued(t *testing.T, sl *sharedLog, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(sl.queue) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d writes queued after 10s, want %d", len(sl.queue), n)
		}
		time.Sleep(time.Millisecond) // polling interval
	}
}

// TestSharedLogGroupCommit checks the point of the shared log: StoreLogs
// calls of different groups that arrive while a commit is under way are
// committed together, in one transaction (one fsync pair), and each caller
// returns only after that commit.
func TestSharedLogGroupCommit(t *testing.T) {
	sl := openTestSharedLog(t, filepath.Join(t.TempDir(), sharedLogFile))
	const groups = 8
	stores := make([]*sharedGroupStore, groups)
	for i := range stores {
		var err error
		if stores[i], err = sl.group(fmt.Sprintf("g%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	before := sl.stats()
	release := blockWriter(t, sl)
	var wg sync.WaitGroup
	errs := make([]error, groups)
	for i, g := range stores {
		wg.Go(func() { errs[i] = g.StoreLogs(testLogs(1, 5, 1, g.id)) })
	}
	waitQueued(t, sl, groups)
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("group %d StoreLogs: %v", i, err)
		}
	}
	after := sl.stats()
	if commits, writes := after.Commits-before.Commits, after.Writes-before.Writes; commits != 2 || writes != groups+1 {
		t.Fatalf("%d commits carried %d writes; want 2 commits (the blocking one, then all %d groups together)",
			commits, writes, groups)
	}
	for _, g := range stores {
		var l raft.Log
		if err := g.GetLog(5, &l); err != nil || string(l.Data) != g.id+"-5" {
			t.Fatalf("%s: entry 5 = %q, %v", g.id, l.Data, err)
		}
	}
}

// TestSharedLogFailedWriteIsolated checks that a write failing inside a
// shared transaction fails alone: the transaction is rolled back and the
// other writes of the batch are committed and answered without error.
func TestSharedLogFailedWriteIsolated(t *testing.T) {
	sl := openTestSharedLog(t, filepath.Join(t.TempDir(), sharedLogFile))
	a, err := sl.group("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := sl.group("b")
	if err != nil {
		t.Fatal(err)
	}
	release := blockWriter(t, sl)
	boom := errors.New("boom")
	results := make(chan error, 3)
	go func() { results <- a.StoreLogs(testLogs(1, 3, 1, "a")) }()
	waitQueued(t, sl, 1)
	go func() { results <- sl.write(func(*bbolt.Tx) error { return boom }) }()
	waitQueued(t, sl, 2)
	go func() { results <- b.StoreLogs(testLogs(1, 3, 1, "b")) }()
	waitQueued(t, sl, 3)
	release()
	var failed []error
	for range 3 {
		if err := <-results; err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) != 1 || !errors.Is(failed[0], boom) {
		t.Fatalf("errors %v; want exactly the failing write's", failed)
	}
	for _, g := range []*sharedGroupStore{a, b} {
		if _, last := mustIndexes(t, g); last != 3 {
			t.Fatalf("%s: last index %d, want 3 (committed despite the other write's failure)", g.id, last)
		}
	}
}

func TestLogEncoding(t *testing.T) {
	for _, l := range []*raft.Log{
		{Index: 1, Term: 1, Type: raft.LogNoop},
		{Index: 1 << 40, Term: 1 << 33, Type: raft.LogCommand, Data: bytes.Repeat([]byte{0xff}, 5000),
			Extensions: []byte{0}, AppendedAt: time.Unix(0, -1)},
		{Index: 7, Term: 2, Type: raft.LogBarrier, AppendedAt: time.Unix(1<<33, 999)},
	} {
		var got raft.Log
		if err := decodeLog(l.Index, encodeLog(l), &got); err != nil {
			t.Fatalf("decode(encode(%+v)): %v", l, err)
		}
		if got.Index != l.Index || got.Term != l.Term || got.Type != l.Type || !bytes.Equal(got.Data, l.Data) ||
			!bytes.Equal(got.Extensions, l.Extensions) || !got.AppendedAt.Equal(l.AppendedAt) || got.AppendedAt.IsZero() != l.AppendedAt.IsZero() {
			t.Fatalf("round trip: %+v, want %+v", got, l)
		}
	}
	valid := encodeLog(&raft.Log{Index: 3, Term: 2, Type: raft.LogCommand, Data: []byte("data"), Extensions: []byte("x")})
	flipped := bytes.Clone(valid)
	flipped[len(flipped)-6] ^= 0x01 // a bit of the data
	bad := map[string][]byte{
		"empty":          nil,
		"other version":  append([]byte{3}, valid[1:]...),
		"truncated":      valid[:len(valid)-1],
		"trailing bytes": append(bytes.Clone(valid), 0),
		"bit flip":       flipped,
		"huge length":    {logEncodingVersionV1, byte(raft.LogCommand), 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
	}
	// An entry moved under another index fails its checksum too.
	var moved raft.Log
	if err := decodeLog(4, valid, &moved); !errors.Is(err, errBadLogEntry) {
		t.Errorf("entry 3 read as entry 4: decode = %v, want errBadLogEntry", err)
	}
	// Version 1 (no checksum), as earlier releases wrote it, still decodes.
	v1 := append([]byte{logEncodingVersionV1}, valid[1:len(valid)-4]...)
	var old raft.Log
	if err := decodeLog(3, v1, &old); err != nil || string(old.Data) != "data" || string(old.Extensions) != "x" || old.Term != 2 {
		t.Errorf("version 1 entry: %+v, %v", old, err)
	}
	v1[len(v1)-1] = 'y' // and has no checksum to catch a flip: the reason for version 2
	if err := decodeLog(3, append(v1, 0), &old); !errors.Is(err, errBadLogEntry) {
		t.Errorf("version 1 entry with trailing bytes: decode = %v, want errBadLogEntry", err)
	}
	for name, v := range bad {
		var l raft.Log
		if err := decodeLog(3, v, &l); !errors.Is(err, errBadLogEntry) {
			t.Errorf("%s: decode = %v, want errBadLogEntry", name, err)
		}
	}
}

// TestGroupKeepsItsLogStore restarts a node with Config.LogStore changed
// each time: every group keeps the store it was created with and restarts
// with its acknowledged writes (choosing by the setting would bootstrap the
// group again over an empty log); a group found in two stores refuses to
// start.
func TestGroupKeepsItsLogStore(t *testing.T) {
	dir := t.TempDir()
	addr := "127.0.0.1:0"
	open := func(store string) *Host {
		t.Helper()
		cfg := testConfig()
		cfg.LogStore = store
		// Single-voter groups: short timeouts cannot make them flap.
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 100*time.Millisecond, 100*time.Millisecond, 50*time.Millisecond
		cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir = "n1", addr, dir
		cfg.Logger = testutil.Logger(t, slog.LevelWarn)
		h, err := NewHost(cfg)
		if err != nil {
			t.Fatal(err)
		}
		addr = h.Addr()
		t.Cleanup(func() { h.Close() })
		return h
	}
	add := func(h *Host, id string) (*Group, *kvSM) {
		t.Helper()
		sm := newKV()
		g, err := h.AddGroup(GroupConfig{ID: id, Voters: []Peer{{"n1", h.Addr()}}}, sm)
		if err != nil {
			t.Fatalf("AddGroup(%s): %v", id, err)
		}
		if _, _, err := g.WaitLeader(ctxTimeout(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		return g, sm
	}
	put := func(g *Group, kv string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := g.Apply(ctx, []byte(kv)); err != nil {
			t.Fatalf("Apply(%s) on %s: %v", kv, g.ID(), err)
		}
	}
	expect := func(g *Group, sm *kvSM, store string, want map[string]string) {
		t.Helper()
		if err := g.ReadBarrier(ctxTimeout(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		if got := g.Stats().LogStore; got != store {
			t.Errorf("%s: LogStore = %q, want %q", g.ID(), got, store)
		}
		if miss := sm.missing(want); len(miss) > 0 {
			t.Errorf("%s lost %v after restart", g.ID(), miss)
		}
	}
	stop := func(h *Host) {
		t.Helper()
		if err := h.Shutdown(ctxTimeout(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}

	// Created with its own file.
	h := open(LogStoreBolt)
	own, _ := add(h, "own")
	put(own, "a=1")
	stop(h)

	// Shared bolt: "own" keeps its file, a new group goes to log.db.
	h = open(LogStoreSharedBolt)
	own, ownSM := add(h, "own")
	expect(own, ownSM, LogStoreBolt, map[string]string{"a": "1"})
	put(own, "b=2")
	shared, _ := add(h, "shared")
	put(shared, "c=3")
	if st := h.SharedLogStats(); st.Commits == 0 {
		t.Errorf("shared log committed nothing")
	}
	stop(h)

	// Pebble: both keep theirs, a new group goes to the pebble log.
	h = open(LogStorePebble)
	own, ownSM = add(h, "own")
	expect(own, ownSM, LogStoreBolt, map[string]string{"a": "1", "b": "2"})
	shared, sharedSM := add(h, "shared")
	expect(shared, sharedSM, LogStoreSharedBolt, map[string]string{"c": "3"})
	peb, _ := add(h, "peb")
	put(peb, "d=4")
	if st := h.PebbleLogStats(); st.Commits == 0 {
		t.Errorf("pebble log committed nothing")
	}
	stop(h)

	// Back to a file per group: every group stays where it is.
	h = open(LogStoreBolt)
	own, ownSM = add(h, "own")
	expect(own, ownSM, LogStoreBolt, map[string]string{"a": "1", "b": "2"})
	shared, sharedSM = add(h, "shared")
	expect(shared, sharedSM, LogStoreSharedBolt, map[string]string{"c": "3"})
	peb, pebSM := add(h, "peb")
	expect(peb, pebSM, LogStorePebble, map[string]string{"d": "4"})
	stop(h)

	// A log in two places is refused, whatever the setting.
	for _, id := range []string{"shared", "peb"} {
		stray, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "shards", id, "raft.db")})
		if err != nil {
			t.Fatal(err)
		}
		stray.Close()
	}
	for _, store := range LogStores {
		h = open(store)
		for _, id := range []string{"shared", "peb"} {
			if _, err := h.AddGroup(GroupConfig{ID: id, Voters: []Peer{{"n1", h.Addr()}}}, newKV()); !errors.Is(err, ErrStoreConflict) {
				t.Fatalf("LogStore %s: AddGroup of %s, in two stores: %v, want ErrStoreConflict", store, id, err)
			}
		}
		stop(h)
	}
}

// TestSharedLogFailsStopOnCommitError injects a failed commit (what an
// fsync error looks like to bbolt): the writes of that commit and every
// later one get ErrStorageFailed, the failure is reported once, and nothing
// more is committed, so nothing more can be acknowledged.
func TestSharedLogFailsStopOnCommitError(t *testing.T) {
	path := filepath.Join(t.TempDir(), sharedLogFile)
	var reported []error
	sl, err := openSharedLog(path, true, nil, func(err error) { reported = append(reported, err) })
	if err != nil {
		t.Fatal(err)
	}
	defer sl.close()
	g, err := sl.group("a")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.StoreLogs(testLogs(1, 2, 1, "a")); err != nil {
		t.Fatal(err)
	}
	eio := errors.New("fdatasync: input/output error")
	sl.commitTx = func(tx *bbolt.Tx) error { tx.Rollback(); return eio }
	if err := g.StoreLogs(testLogs(3, 4, 1, "a")); !errors.Is(err, ErrStorageFailed) || !strings.Contains(err.Error(), eio.Error()) {
		t.Fatalf("write whose commit failed: %v, want ErrStorageFailed naming the cause", err)
	}
	// The disk "recovers": the log still takes nothing (fail-stop).
	sl.commitTx = (*bbolt.Tx).Commit
	if err := g.Set([]byte("CurrentTerm"), []byte{0, 0, 0, 0, 0, 0, 0, 2}); !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("write after the failure: %v, want ErrStorageFailed", err)
	}
	if len(reported) != 1 || !errors.Is(reported[0], ErrStorageFailed) {
		t.Fatalf("failure reported %d times (%v), want once", len(reported), reported)
	}
	if _, last := mustIndexes(t, g); last != 2 {
		t.Fatalf("last index %d after the failed commit, want 2 (only what was committed before)", last)
	}
}

// TestSharedLogCorruptFileIsOneError: a damaged log file gives an error
// naming the file and wrapping ErrCorruptLog, not a panic, and a host
// refuses to open a group on it.
func TestSharedLogCorruptFileIsOneError(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, sharedLogFile)
	sl := openTestSharedLog(t, path)
	g, err := sl.group("a")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.StoreLogs(testLogs(1, 50, 1, "a")); err != nil {
		t.Fatal(err)
	}
	sl.close()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range data { // every page, both meta pages included
		data[i] ^= 0x5a
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = openSharedLog(path, true, nil, nil)
	if !errors.Is(err, ErrCorruptLog) || !strings.Contains(err.Error(), path) {
		t.Fatalf("opening a corrupt log: %v, want ErrCorruptLog naming %s", err, path)
	}
	if strings.Count(err.Error(), "\n") > 0 {
		t.Fatalf("error is not one line: %q", err)
	}
}
