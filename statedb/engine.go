package statedb

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
)

// pebbleOptions are the engine's options: a bounded block cache and
// memtables, so that resident memory does not grow with the retained state.
func pebbleOptions(cacheBytes int64) *pebble.Options {
	if cacheBytes == 0 {
		cacheBytes = DefaultCacheBytes
	}
	o := &pebble.Options{
		Cache:                       pebble.NewCache(cacheBytes),
		MemTableSize:                32 << 20,
		MemTableStopWritesThreshold: 4,
		MaxOpenFiles:                1000,
		Logger:                      quietLogger{},
	}
	// Bloom filters on every level: a reserve of a new key is a point
	// read that misses, and without filters every miss reads an index and
	// a data block per level (measured: half the apply time).
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	o.EnsureDefaults()
	return o
}

// quietLogger drops pebble's informational chatter; fatal errors still panic.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("statedb: pebble: "+format, args...))
}
