// Package gctune paces the Go garbage collector of idemnode and
// idemrouter: the next collection comes once the heap has grown past what
// the last one found live by Percent of it or by Headroom bytes, whichever
// is more.
//
// GOGC alone scales the room between collections with the live heap. A
// node's live heap is either large (in a CGO_ENABLED=0 build pebble keeps
// its block cache and memtables on the Go heap: hundreds of MiB once the
// cache is warm, long-lived and pointer-free) or small (a cgo build, whose
// pebble allocates them in C, or a cold cache: 20-50 MiB). The node runs
// GOGC=50 so that a warm cache does not double its resident memory; with a
// small live heap that same 50% is 10-25 MiB, which a node under load
// allocates several times a second (the collector took about a tenth of
// its CPU, docs/lab/2026-12-01-raft-profiles.md). The headroom
// keeps the room at least Headroom bytes while leaving a large heap at
// Percent: a heap never grows past max(live*(1+Percent/100), live+Headroom).
// idemrouter keeps no cache: its live heap is a few MiB at GOGC=100, which
// under load collected about 17 times a second.
//
// The tuner reads the live heap after every collection (a finalizer of a
// sentinel object runs once per cycle) and sets GOGC for the next one with
// debug.SetGCPercent, which takes the heap lock briefly and stops nothing.
// GOMEMLIMIT, if set, still caps the heap: the runtime collects at whichever
// goal comes first.
package gctune

import (
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// runtimeHeapMinimum is the Go runtime's least heap goal at GOGC=100
// (runtime.defaultHeapMinimum); the runtime scales it with GOGC, so a large
// GOGC raises it too, and PercentFor caps GOGC to keep it within Headroom.
const runtimeHeapMinimum = 4 << 20

// liveHeapMetric is the heap the last collection marked live.
const liveHeapMetric = "/gc/heap/live:bytes"

// Config configures a Tuner.
type Config struct {
	// Percent is the GOGC for a live heap large enough that Percent of it
	// is more than Headroom. At least 1.
	Percent int
	// Headroom is the least growth, in bytes, of the heap between
	// collections. 0 sets GOGC to Percent and adjusts nothing.
	Headroom uint64
	// Logger gets one line at Start (nil: slog.Default()).
	Logger *slog.Logger
}

// Tuner adjusts GOGC after every collection; Stop ends it.
type Tuner struct {
	cfg     Config
	prev    int          // GOGC before Start, restored by Stop
	percent atomic.Int64 // GOGC set last
	tunes   atomic.Uint64
	sample  []metrics.Sample
	mu      sync.Mutex // serializes tune with Stop; guards stopped
	stopped bool

	// setPercent is debug.SetGCPercent; liveHeap reads the live heap.
	setPercent func(int) int
	liveHeap   func() uint64
}

// PercentFor is the GOGC that gives a heap whose last collection found live
// bytes live at least headroom bytes of room: max(percent,
// headroom*100/live), capped so that the runtime's own minimum goal
// (4 MiB x GOGC/100) stays within headroom. headroom 0 is percent.
func PercentFor(live, headroom uint64, percent int) int {
	if headroom == 0 {
		return percent
	}
	if live == 0 {
		live = 1
	}
	p := float64(headroom) * 100 / float64(live)
	p = min(p, float64(headroom)*100/runtimeHeapMinimum, math.MaxInt32)
	if int(p) < percent {
		return percent
	}
	return int(p)
}

// Start sets GOGC to cfg.Percent and, with a Headroom, keeps adjusting it
// after every collection until Stop.
func Start(cfg Config) *Tuner {
	t := newTuner(cfg, debug.SetGCPercent, nil)
	t.start()
	return t
}

func newTuner(cfg Config, setPercent func(int) int, liveHeap func() uint64) *Tuner {
	if cfg.Percent < 1 {
		cfg.Percent = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	t := &Tuner{cfg: cfg, setPercent: setPercent, liveHeap: liveHeap}
	if t.liveHeap == nil {
		t.sample = []metrics.Sample{{Name: liveHeapMetric}}
		t.liveHeap = t.readLiveHeap
	}
	return t
}

func (t *Tuner) start() {
	live := t.liveHeap()
	p := PercentFor(live, t.cfg.Headroom, t.cfg.Percent)
	t.prev = t.setPercent(p)
	t.percent.Store(int64(p))
	t.cfg.Logger.Debug("garbage collector paced", "gogc_large_heap", t.cfg.Percent,
		"headroom_bytes", t.cfg.Headroom, "live_heap_bytes", live, "gogc", p)
	if t.cfg.Headroom > 0 {
		t.arm()
	}
}

// sentinel is garbage from the moment arm returns, so the next collection
// finds it unreachable and queues its finalizer: one call per cycle.
type sentinel struct{ t *Tuner }

func (t *Tuner) arm() {
	runtime.SetFinalizer(&sentinel{t: t}, func(s *sentinel) {
		if s.t.tune() {
			s.t.arm()
		}
	})
}

// tune sets GOGC for the live heap the collection that just ended found;
// false once stopped.
func (t *Tuner) tune() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	p := PercentFor(t.liveHeap(), t.cfg.Headroom, t.cfg.Percent)
	if int64(p) != t.percent.Load() {
		t.setPercent(p)
		t.percent.Store(int64(p))
	}
	t.tunes.Add(1)
	return true
}

func (t *Tuner) readLiveHeap() uint64 {
	metrics.Read(t.sample)
	if t.sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return t.sample[0].Value.Uint64()
}

// Percent is the GOGC the tuner set last.
func (t *Tuner) Percent() int { return int(t.percent.Load()) }

// Stop ends the adjustments and restores the GOGC in effect before Start.
func (t *Tuner) Stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	t.stopped = true
	t.setPercent(t.prev)
}
