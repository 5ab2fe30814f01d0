package statedb

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// pebbleOptions are the engine's options: a bounded block cache and
// memtables, so that resident memory does not grow with the retained state.
func pebbleOptions(cacheBytes int64) *pebble.Options {
	if cacheBytes == 0 {
		cacheBytes = 64 << 20
	}
	o := &pebble.Options{
		Cache:                       pebble.NewCache(cacheBytes),
		MemTableSize:                32 << 20,
		MemTableStopWritesThreshold: 4,
		MaxOpenFiles:                1000,
		Logger:                      quietLogger{},
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
