package raftstore

import (
	"errors"
	"testing"

	"github.com/hashicorp/raft"
)

// TestLogCacheBoundedByBytes: the cache holds at most its entry count and
// its byte budget, evicting the oldest first, serves what it holds, falls
// through to the store for the rest, and never caches an entry larger than
// the budget.
func TestLogCacheBoundedByBytes(t *testing.T) {
	store := raft.NewInmemStore()
	const budget = 10 * (1000 + 64)
	c := newLogCache(store, 8, budget)
	entry := func(i uint64, size int) *raft.Log { return &raft.Log{Index: i, Term: 1, Data: make([]byte, size)} }
	for i := uint64(1); i <= 20; i++ {
		if err := c.StoreLogs([]*raft.Log{entry(i, 1000)}); err != nil {
			t.Fatal(err)
		}
	}
	if n, b := c.cachedBytes(); n != 8 || b != 8*(1000+64) {
		t.Fatalf("cache holds %d entries, %d bytes; want the last 8 (entry bound)", n, b)
	}
	for i := uint64(1); i <= 20; i++ {
		var l raft.Log
		if err := c.GetLog(i, &l); err != nil || l.Index != i {
			t.Fatalf("GetLog(%d): %v %d", i, err, l.Index)
		}
	}
	// Bigger entries: the byte budget binds before the entry count.
	for i := uint64(21); i <= 25; i++ {
		if err := c.StoreLogs([]*raft.Log{entry(i, 3000)}); err != nil {
			t.Fatal(err)
		}
	}
	if n, b := c.cachedBytes(); b > budget || n != 3 {
		t.Fatalf("cache holds %d entries, %d bytes; want 3 entries within %d bytes", n, b, budget)
	}
	// One entry over the whole budget is not cached, and what follows it is.
	if err := c.StoreLogs([]*raft.Log{entry(26, budget+1), entry(27, 10)}); err != nil {
		t.Fatal(err)
	}
	if n, b := c.cachedBytes(); n != 1 || b != 74 {
		t.Fatalf("after an oversized entry the cache holds %d entries, %d bytes; want entry 27 only", n, b)
	}
	var l raft.Log
	if err := c.GetLog(26, &l); err != nil || len(l.Data) != budget+1 {
		t.Fatalf("oversized entry not served from the store: %v", err)
	}
	if err := c.DeleteRange(20, 27); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.cachedBytes(); n != 0 {
		t.Fatalf("cache holds %d entries after DeleteRange", n)
	}
	if err := c.GetLog(27, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("deleted entry still served: %v", err)
	}
}

func TestTrailingLogsBoundedByBytes(t *testing.T) {
	c := DefaultConfig()
	c.TrailingLogs, c.TrailingLogsBytes = 10240, 1<<20
	for _, tc := range []struct {
		mean int64
		want uint64
	}{{0, 10240}, {100, 10240}, {1 << 10, 1024}, {1 << 20, 1}, {1 << 30, 1}} {
		if got := c.trailingLogsFor(tc.mean); got != tc.want {
			t.Errorf("mean entry %d bytes: keep %d entries, want %d", tc.mean, got, tc.want)
		}
	}
}
