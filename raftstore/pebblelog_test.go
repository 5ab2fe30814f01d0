package raftstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"
)

func openTestPebbleLog(t *testing.T, dir string, onFail func(error)) *pebbleLog {
	t.Helper()
	pl, err := openPebbleLog(filepath.Join(dir, pebbleLogDir), true, nil, nil, onFail)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pl.close() })
	return pl
}

// TestPebbleLogFailsStopOnCommitError injects a failed commit (what a WAL
// write or fdatasync error looks like): that write and every later one get
// ErrStorageFailed, the failure is reported once, reads stop too, and the
// cached indexes do not move past what was committed.
func TestPebbleLogFailsStopOnCommitError(t *testing.T) {
	var reported []error
	pl := openTestPebbleLog(t, t.TempDir(), func(err error) { reported = append(reported, err) })
	g, err := pl.group("a")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.StoreLogs(testLogs(1, 2, 1, "a")); err != nil {
		t.Fatal(err)
	}
	eio := errors.New("fdatasync: input/output error")
	pl.commitBatch = func(*pebble.Batch) error { return eio }
	if err := g.StoreLogs(testLogs(3, 4, 1, "a")); !errors.Is(err, ErrStorageFailed) || !strings.Contains(err.Error(), eio.Error()) {
		t.Fatalf("write whose commit failed: %v, want ErrStorageFailed naming the cause", err)
	}
	// The disk "recovers": the log still takes nothing (fail-stop).
	pl.commitBatch = func(b *pebble.Batch) error { return b.Commit(pl.wo) }
	if err := g.SetUint64([]byte("CurrentTerm"), 2); !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("write after the failure: %v, want ErrStorageFailed", err)
	}
	if err := g.DeleteRange(1, 1); !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("delete after the failure: %v, want ErrStorageFailed", err)
	}
	var l raft.Log
	if err := g.GetLog(1, &l); !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("read after the failure: %v, want ErrStorageFailed", err)
	}
	if len(reported) != 1 || !errors.Is(reported[0], ErrStorageFailed) {
		t.Fatalf("failure reported %d times (%v), want once", len(reported), reported)
	}
	if first, last := mustIndexes(t, g); first != 1 || last != 2 {
		t.Fatalf("indexes %d..%d after the failed commit, want 1..2 (only what was committed)", first, last)
	}
}

// TestPebbleLogFatalCommitFailsStop: pebble calls its logger's Fatalf when
// a commit failed inside its pipeline (it cannot go on); the log fails stop
// and the write gets ErrStorageFailed instead of the process crashing or,
// worse, the write being acknowledged.
func TestPebbleLogFatalCommitFailsStop(t *testing.T) {
	var reported []error
	pl := openTestPebbleLog(t, t.TempDir(), func(err error) { reported = append(reported, err) })
	g, err := pl.group("a")
	if err != nil {
		t.Fatal(err)
	}
	pl.commitBatch = func(*pebble.Batch) error {
		pl.plog.Fatalf("pebble: fatal commit error: %v", "write /raftlog/000002.log: no space left on device")
		return nil // not reached
	}
	if err := g.StoreLogs(testLogs(1, 2, 1, "a")); !errors.Is(err, ErrStorageFailed) || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("write whose commit was fatal: %v, want ErrStorageFailed naming the cause", err)
	}
	if len(reported) != 1 {
		t.Fatalf("failure reported %d times, want once", len(reported))
	}
	if _, last := mustIndexes(t, g); last != 0 {
		t.Fatalf("last index %d after the fatal commit, want 0", last)
	}
}

// TestPebbleLogCorruptEntryFailsStop: an entry that does not decode (its
// CRC-32C fails; pebble's own block and WAL checksums catch damage below
// it) is not handed to raft: GetLog fails with ErrStorageFailed wrapping
// ErrCorruptLog, the failure is reported once and the log takes no more
// writes, as after a failed fsync.
func TestPebbleLogCorruptEntryFailsStop(t *testing.T) {
	var reported []error
	pl := openTestPebbleLog(t, t.TempDir(), func(err error) { reported = append(reported, err) })
	g, err := pl.group("a")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.StoreLogs(testLogs(1, 5, 1, "a")); err != nil {
		t.Fatal(err)
	}
	// Flip a bit of entry 3's data behind the store's back.
	v, closer, err := pl.db.Get(g.logKey(3))
	if err != nil {
		t.Fatal(err)
	}
	bad := append([]byte(nil), v...)
	closer.Close()
	bad[len(bad)-6] ^= 0x01
	if err := pl.db.Set(g.logKey(3), bad, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	var l raft.Log
	if err := g.GetLog(2, &l); err != nil || string(l.Data) != "a-2" {
		t.Fatalf("GetLog(2) = %q, %v", l.Data, err)
	}
	err = g.GetLog(3, &l)
	if !errors.Is(err, ErrStorageFailed) || !errors.Is(err, ErrCorruptLog) || !errors.Is(err, errBadLogEntry) {
		t.Fatalf("GetLog of the corrupt entry: %v, want ErrStorageFailed wrapping ErrCorruptLog", err)
	}
	if err := g.StoreLogs(testLogs(6, 6, 1, "a")); !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("write after the corrupt read: %v, want ErrStorageFailed", err)
	}
	if len(reported) != 1 || !errors.Is(reported[0], ErrCorruptLog) {
		t.Fatalf("failure reported %d times (%v), want once, as ErrCorruptLog", len(reported), reported)
	}
}

// TestPebbleLogCorruptDirIsOneError: a pebble log whose files are damaged
// gives one error naming the directory and wrapping ErrCorruptLog, not a
// panic; so does a directory of another format.
func TestPebbleLogCorruptDirIsOneError(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, pebbleLogDir)
	pl := openTestPebbleLog(t, dir, nil)
	g, err := pl.group("a")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.StoreLogs(testLogs(1, 50, 1, "a")); err != nil {
		t.Fatal(err)
	}
	if err := pl.close(); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if name := e.Name(); strings.HasPrefix(name, "MANIFEST") || strings.HasSuffix(name, ".log") {
			p := filepath.Join(path, name)
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			for i := range data {
				data[i] ^= 0x5a
			}
			if err := os.WriteFile(p, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	_, err = openPebbleLog(path, true, nil, nil, nil)
	if !errors.Is(err, ErrCorruptLog) || !strings.Contains(err.Error(), path) {
		t.Fatalf("opening a corrupt log: %v, want ErrCorruptLog naming %s", err, path)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Fatalf("error is not one line: %q", err)
	}

	// Another format.
	other := filepath.Join(t.TempDir(), pebbleLogDir)
	db, err := pebble.Open(other, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set(pebbleFormatKey, []byte("idem-raftlog/99"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := openPebbleLog(other, true, nil, nil, nil); !errors.Is(err, ErrCorruptLog) || !strings.Contains(err.Error(), "idem-raftlog/99") {
		t.Fatalf("opening a log of another format: %v, want ErrCorruptLog naming the format", err)
	}
}

// TestPebbleLogConcurrentGroups: groups appending at once while each one
// also compacts its front (raft's snapshot goroutine does that while its
// leader loop appends) end with cached first and last indexes equal to what
// a reopen reads back from disk, and with every entry still in range.
func TestPebbleLogConcurrentGroups(t *testing.T) {
	dir := t.TempDir()
	pl := openTestPebbleLog(t, dir, nil)
	const groups, last = 8, 300
	stores := make([]*pebbleGroupStore, groups)
	for i := range stores {
		var err error
		if stores[i], err = pl.group(fmt.Sprintf("g%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for _, g := range stores {
		appended := make(chan uint64, last)
		wg.Go(func() {
			defer close(appended)
			for from := uint64(1); from <= last; from += 10 {
				if err := g.StoreLogs(testLogs(from, from+9, 1, g.id)); err != nil {
					t.Error(err)
					return
				}
				appended <- from + 9
			}
		})
		wg.Go(func() {
			for upTo := range appended {
				if upTo > 50 {
					if err := g.DeleteRange(1, upTo-50); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for _, g := range stores {
		first, lastIdx := mustIndexes(t, g)
		if first != last-50+1 || lastIdx != last {
			t.Errorf("%s: first %d last %d, want %d %d", g.id, first, lastIdx, last-50+1, last)
		}
		var l raft.Log
		if err := g.GetLog(first, &l); err != nil {
			t.Errorf("%s: GetLog(first=%d): %v", g.id, first, err)
		}
		if err := g.GetLog(first-1, &l); !errors.Is(err, raft.ErrLogNotFound) {
			t.Errorf("%s: GetLog(%d), compacted: %v", g.id, first-1, err)
		}
	}
	if err := pl.close(); err != nil {
		t.Fatal(err)
	}
	reopened := openTestPebbleLog(t, dir, nil)
	for _, g := range stores {
		r, err := reopened.group(g.id)
		if err != nil {
			t.Fatal(err)
		}
		f1, l1 := g.first.Load(), g.last.Load()
		if f2, l2 := mustIndexes(t, r); f1 != f2 || l1 != l2 {
			t.Errorf("%s: cached %d..%d, on disk %d..%d", g.id, f1, l1, f2, l2)
		}
	}
}
