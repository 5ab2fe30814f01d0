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
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/idem-dev/idem/internal/testutil"
)

func testLogs(from, to, term uint64, tag string) []*raft.Log {
	var out []*raft.Log
	for i := from; i <= to; i++ {
		out = append(out, &raft.Log{Index: i, Term: term, Type: raft.LogCommand,
			Data: fmt.Appendf(nil, "%s-%d", tag, i), AppendedAt: time.Unix(1700000000, int64(i))})
	}
	return out
}

// TestPebbleLogStore checks the raft.LogStore and raft.StableStore contract
// of two groups sharing one pebble log: isolation, ranges, deletes, the "not
// found" raft relies on, and that everything survives a close and reopen on
// the same directory.
func TestPebbleLogStore(t *testing.T) {
	open := func(dir string) (*pebbleLog, error) {
		return openPebbleLog(filepath.Join(dir, pebbleLogDir), true, nil, nil, nil)
	}
	dir := t.TempDir()
	sl, err := open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, b := groupsAB(t, sl)
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

	check := func(sl *pebbleLog) {
		t.Helper()
		a, b := groupsAB(t, sl)
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

// groupsAB is groups "a" and "b" of sl.
func groupsAB(t *testing.T, sl *pebbleLog) (a, b *pebbleGroupStore) {
	t.Helper()
	var err error
	if a, err = sl.group("a"); err != nil {
		t.Fatal(err)
	}
	if b, err = sl.group("b"); err != nil {
		t.Fatal(err)
	}
	return a, b
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

// TestDataDirKeepsItsLogStore restarts a node on its data dir with each
// log store: the store the data dir was created with restarts every group
// with its acknowledged writes, the other one is refused at start (a group
// looking in it would find no log and bootstrap again over its writes), as
// are a data dir holding both stores and one holding a shared bolt log.
func TestDataDirKeepsItsLogStore(t *testing.T) {
	for _, created := range LogStores {
		t.Run(created, func(t *testing.T) {
			var other string
			for _, s := range LogStores {
				if s != created {
					other = s
				}
			}
			dir := t.TempDir()
			addr := "127.0.0.1:0"
			open := func(store string) (*Host, error) {
				t.Helper()
				cfg := testConfig()
				cfg.LogStore = store
				// Single-voter groups: short timeouts cannot make them flap.
				cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 100*time.Millisecond, 100*time.Millisecond, 50*time.Millisecond
				cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir = "n1", addr, dir
				cfg.Logger = testutil.Logger(t, slog.LevelWarn)
				h, err := NewHost(cfg)
				if err != nil {
					return nil, err
				}
				addr = h.Addr()
				t.Cleanup(func() { h.Close() })
				return h, nil
			}
			mustOpen := func(store string) *Host {
				t.Helper()
				h, err := open(store)
				if err != nil {
					t.Fatalf("NewHost with LogStore %s: %v", store, err)
				}
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
			stop := func(h *Host) {
				t.Helper()
				if err := h.Shutdown(ctxTimeout(t, 10*time.Second)); err != nil {
					t.Fatal(err)
				}
			}
			refused := func(store string, want error, names string) {
				t.Helper()
				_, err := open(store)
				if !errors.Is(err, want) || !strings.Contains(err.Error(), names) {
					t.Fatalf("NewHost with LogStore %s: %v, want %v naming %s", store, err, want, names)
				}
			}

			h := mustOpen(created)
			a, _ := add(h, "a")
			put(a, "x=1")
			stop(h)

			// The other store would not find group a's log: refused.
			refused(other, ErrLogStoreMismatch, created)

			// The store it was created with: a keeps its writes, a new
			// group goes to the same store.
			h = mustOpen(created)
			a, aSM := add(h, "a")
			if err := a.ReadBarrier(ctxTimeout(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			if miss := aSM.missing(map[string]string{"x": "1"}); len(miss) > 0 {
				t.Fatalf("a lost %v after restart", miss)
			}
			b, _ := add(h, "b")
			put(b, "y=2")
			for _, g := range []*Group{a, b} {
				if got := g.Stats().LogStore; got != created {
					t.Errorf("%s: LogStore = %q, want %q", g.ID(), got, created)
				}
			}
			stop(h)

			// The other store appears beside it: refused, whatever the setting.
			if created == LogStorePebble {
				stray, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "shards", "a", boltLogFile)})
				if err != nil {
					t.Fatal(err)
				}
				stray.Close()
			} else if err := os.Mkdir(pebbleLogPath(dir), 0o750); err != nil {
				t.Fatal(err)
			}
			for _, store := range LogStores {
				refused(store, ErrStoreConflict, pebbleLogPath(dir))
			}
		})
	}
}

// TestSharedBoltLogRefused: a data dir holding the shared bolt log of
// development builds (DataDir/log.db) is refused at start with an error
// naming the file, whatever Config.LogStore says, rather than started as
// if it held no log: the node would rejoin as a new member while its peers
// count its old votes and entries.
func TestSharedBoltLogRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, sharedBoltLogFile)
	if err := os.WriteFile(path, []byte("bolt"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, store := range append([]string{""}, LogStores...) {
		cfg := testConfig()
		cfg.LogStore = store
		cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir = "n1", "127.0.0.1:0", dir
		h, err := NewHost(cfg)
		if err == nil {
			h.Close()
			t.Fatalf("NewHost with LogStore %q on a data dir holding %s: started, want ErrUnsupportedLog", store, path)
		}
		if !errors.Is(err, ErrUnsupportedLog) || !strings.Contains(err.Error(), path) {
			t.Fatalf("NewHost with LogStore %q: %v, want ErrUnsupportedLog naming %s", store, err, path)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Fatalf("error is not one line: %q", err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "shards")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused data dir was written to: shards/ %v", err)
	}
}
