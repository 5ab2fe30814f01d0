package gctune

import (
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name            string
		live, headroom  uint64
		percent, expect int
	}{
		{"no headroom keeps the percent", 8 * mib, 0, 50, 50},
		{"a large live heap keeps the percent", 1024 * mib, 128 * mib, 50, 50},
		{"the headroom and the percent meet", 256 * mib, 128 * mib, 50, 50},
		{"a small live heap gets the headroom", 32 * mib, 128 * mib, 50, 400},
		{"a tiny live heap is capped by the runtime's minimum goal", 1 * mib, 128 * mib, 50, 3200},
		{"an unknown live heap is capped the same", 0, 128 * mib, 50, 3200},
		{"the cap never goes below the percent", 1 * mib, 1 * mib, 50, 50},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := PercentFor(c.live, c.headroom, c.percent); got != c.expect {
				t.Fatalf("PercentFor(%d, %d, %d) = %d, want %d", c.live, c.headroom, c.percent, got, c.expect)
			}
		})
	}
}

// recorder stands in for debug.SetGCPercent, so the test's own collector
// stays as it is.
type recorder struct {
	mu  sync.Mutex
	set []int
	cur int
}

func (r *recorder) setPercent(p int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.cur
	r.cur = p
	r.set = append(r.set, p)
	return prev
}

func (r *recorder) current() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// collectUntil runs collections until cond holds (the finalizer runs on its
// own goroutine after the cycle) or fails after 5 s.
func collectUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s of collections: %s", what)
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

func TestTunerFollowsTheLiveHeapAfterEveryCollection(t *testing.T) {
	const mib = 1 << 20
	rec := &recorder{cur: 100}
	var mu sync.Mutex
	live := uint64(16 * mib)
	tu := newTuner(Config{Percent: 50, Headroom: 64 * mib, Logger: quiet()}, rec.setPercent, func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return live
	})
	tu.start()
	if got := rec.current(); got != 400 || tu.Percent() != 400 {
		t.Fatalf("at start, live 16 MiB, headroom 64 MiB: GOGC %d (tuner says %d), want 400", got, tu.Percent())
	}

	mu.Lock()
	live = 512 * mib
	mu.Unlock()
	collectUntil(t, "GOGC did not fall to 50 for a 512 MiB live heap", func() bool { return rec.current() == 50 })
	mu.Lock()
	live = 8 * mib
	mu.Unlock()
	collectUntil(t, "GOGC did not rise to 800 for an 8 MiB live heap", func() bool { return rec.current() == 800 })

	tu.Stop()
	if got := rec.current(); got != 100 {
		t.Fatalf("after Stop: GOGC %d, want the 100 in effect before Start", got)
	}
	n := tu.tunes.Load()
	mu.Lock()
	live = 1 * mib
	mu.Unlock()
	for range 3 {
		runtime.GC()
	}
	time.Sleep(20 * time.Millisecond)
	if got := rec.current(); got != 100 {
		t.Fatalf("a collection after Stop set GOGC %d", got)
	}
	if m := tu.tunes.Load(); m > n+1 { // one finalizer may have been queued before Stop
		t.Fatalf("the tuner kept running after Stop: %d more adjustments", m-n)
	}
}

func TestNoHeadroomSetsThePercentOnly(t *testing.T) {
	rec := &recorder{cur: 100}
	tu := newTuner(Config{Percent: 50, Logger: quiet()}, rec.setPercent, func() uint64 { return 1 << 20 })
	tu.start()
	for range 3 {
		runtime.GC()
	}
	time.Sleep(20 * time.Millisecond)
	if len(rec.set) != 1 || rec.set[0] != 50 || tu.tunes.Load() != 0 {
		t.Fatalf("with no headroom: GOGC set %v, %d adjustments; want [50] once and none", rec.set, tu.tunes.Load())
	}
	tu.Stop()
}

func gogc(t *testing.T) int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Fatalf("runtime/metrics has no /gc/gogc:percent")
	}
	return int(s[0].Value.Uint64())
}

// garbage allocates n bytes in 64 KiB pieces that die at once and returns
// how many collections ran meanwhile.
func garbage(n int) uint32 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.NumGC
	var keep []byte
	for i := 0; i < n/(64<<10); i++ {
		keep = make([]byte, 64<<10)
		keep[0] = byte(i)
	}
	runtime.KeepAlive(keep)
	runtime.ReadMemStats(&ms)
	return ms.NumGC - before
}

// The real runtime: with a headroom the same garbage takes far fewer
// collections, and Stop gives GOGC back.
func TestStartPacesTheRealCollector(t *testing.T) {
	old := debug.SetGCPercent(50)
	defer debug.SetGCPercent(old)
	runtime.GC()
	untuned := garbage(256 << 20)

	tu := Start(Config{Percent: 50, Headroom: 128 << 20, Logger: quiet()})
	collectUntil(t, "the tuner did not adjust after a collection", func() bool { return tu.tunes.Load() > 0 })
	if got := gogc(t); got != tu.Percent() || got <= 50 {
		t.Fatalf("runtime GOGC %d, tuner says %d: want the tuner's, above 50 for this test's small heap", got, tu.Percent())
	}
	tuned := garbage(256 << 20)
	tu.Stop()
	if got := gogc(t); got != 50 {
		t.Fatalf("after Stop the runtime's GOGC is %d, want 50 back", got)
	}
	t.Logf("256 MiB of garbage: %d collections at GOGC=50, %d with 128 MiB of headroom", untuned, tuned)
	if untuned < 8 || tuned*4 > untuned {
		t.Fatalf("256 MiB of garbage: %d collections at GOGC=50, %d with 128 MiB of headroom; want at least 8 and a quarter of them at most", untuned, tuned)
	}
}
