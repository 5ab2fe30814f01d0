package raftstore

import (
	"sync"

	"github.com/hashicorp/raft"
)

// logCache keeps the most recent log entries in memory, like raft.LogCache,
// but bounded by bytes as well as by entries: raft's cache holds a fixed
// number of entries whatever their size, so 1024 entries carrying responses
// at the --max-response-bytes ceiling would pin gigabytes. Cached entries
// are always one contiguous range [lo, hi); the oldest go first.
type logCache struct {
	store    raft.LogStore
	maxBytes int64

	mu     sync.RWMutex
	ring   []*raft.Log
	lo, hi uint64 // cached: [lo, hi); empty when lo == hi
	bytes  int64
}

func newLogCache(store raft.LogStore, entries int, maxBytes int64) *logCache {
	return &logCache{store: store, maxBytes: maxBytes, ring: make([]*raft.Log, entries)}
}

// logBytes is what an entry costs in the cache.
func logBytes(l *raft.Log) int64 { return int64(len(l.Data)+len(l.Extensions)) + 64 }

func (c *logCache) IsMonotonic() bool {
	if s, ok := c.store.(raft.MonotonicLogStore); ok {
		return s.IsMonotonic()
	}
	return false
}

func (c *logCache) GetLog(idx uint64, log *raft.Log) error {
	c.mu.RLock()
	if idx >= c.lo && idx < c.hi {
		*log = *c.ring[idx%uint64(len(c.ring))]
		c.mu.RUnlock()
		return nil
	}
	c.mu.RUnlock()
	return c.store.GetLog(idx, log)
}

func (c *logCache) StoreLog(log *raft.Log) error { return c.StoreLogs([]*raft.Log{log}) }

func (c *logCache) StoreLogs(logs []*raft.Log) error {
	if err := c.store.StoreLogs(logs); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range logs {
		if c.lo != c.hi && l.Index != c.hi {
			c.resetLocked() // not the next entry: start over from it
		}
		if c.lo == c.hi {
			c.lo, c.hi = l.Index, l.Index
		}
		size := logBytes(l)
		if size > c.maxBytes {
			c.resetLocked()
			c.lo, c.hi = l.Index+1, l.Index+1
			continue
		}
		for c.lo < c.hi && (c.hi-c.lo >= uint64(len(c.ring)) || c.bytes+size > c.maxBytes) {
			slot := c.lo % uint64(len(c.ring))
			c.bytes -= logBytes(c.ring[slot])
			c.ring[slot] = nil
			c.lo++
		}
		c.ring[c.hi%uint64(len(c.ring))] = l
		c.hi++
		c.bytes += size
	}
	return nil
}

func (c *logCache) resetLocked() {
	clear(c.ring)
	c.lo, c.hi, c.bytes = 0, 0, 0
}

func (c *logCache) FirstIndex() (uint64, error) { return c.store.FirstIndex() }
func (c *logCache) LastIndex() (uint64, error)  { return c.store.LastIndex() }

func (c *logCache) DeleteRange(min, max uint64) error {
	c.mu.Lock()
	c.resetLocked()
	c.mu.Unlock()
	return c.store.DeleteRange(min, max)
}

// cachedBytes is what the cache holds (tests).
func (c *logCache) cachedBytes() (entries uint64, bytes int64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.hi - c.lo, c.bytes
}
