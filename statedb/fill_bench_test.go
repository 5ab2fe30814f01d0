package statedb

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem/fsm"
)

// BenchmarkFill retains records of 512-byte bodies in one node's state
// engine (reserve+complete cycles applied straight into the FSM over
// statedb, 256 entries per engine batch, as a busy Raft ApplyBatch) and
// prints (to stderr, as it goes), at 0, 1M and 10M retained records: apply throughput (cycles/s
// over the next 100k cycles), RSS, Go heap and disk bytes per record; then
// the time to reopen (restart to ready: open the engine and the shard) and
// the sweep throughput (records dropped per second by OpSweep entries of
// MaxSweep 10000 once everything has expired). Run with
//
//	IDEM_FILL_RECORDS=10000000 go test -run XXX -bench Fill -benchtime 1x -timeout 2h ./statedb
//
// (default 1M records). The box's CPU is shared: figures are indicative.
func BenchmarkFill(b *testing.B) {
	total := 1_000_000
	if s := os.Getenv("IDEM_FILL_RECORDS"); s != "" {
		total, _ = strconv.Atoi(s)
	}
	const window, batch = 100_000, 256
	dir := b.TempDir()
	if d := os.Getenv("IDEM_FILL_DIR"); d != "" {
		dir = d
	}
	cache, _ := strconv.ParseInt(os.Getenv("IDEM_FILL_CACHE_MIB"), 10, 64)
	db, err := Open(Config{Dir: dir, CacheBytes: cache << 20})
	if err != nil {
		b.Fatal(err)
	}
	sm, err := db.Shard("bench-0")
	if err != nil {
		b.Fatal(err)
	}
	pool := make([]byte, 1<<20)
	for i := range pool {
		pool[i] = byte(rand.IntN(256))
	}
	t0 := time.Now().UnixNano()
	const retention = int64(3600e9)
	idx := uint64(0)
	inBatch := 0
	step := func(cmd *fsm.Command) {
		idx++
		sm.FSM().Apply(idx, cmd)
		if inBatch++; inBatch == batch {
			if err := sm.CommitApplied(idx); err != nil {
				b.Fatal(err)
			}
			inBatch = 0
		}
	}
	cycle := func(i int) {
		key := fmt.Sprintf("%08x-4c7e-4b1a-9d7e-%012d", i*2654435761, i)
		owner := "owner-" + strconv.Itoa(i)
		now := t0 + int64(i)*1000
		step(&fsm.Command{Op: fsm.OpReserve, Namespace: "orders", Key: key, Now: now, OwnerToken: owner, Fingerprint: "sha256:abcdef", Lease: 30e9})
		off := (i * 4099) % (len(pool) - 512)
		step(&fsm.Command{Op: fsm.OpComplete, Namespace: "orders", Key: key, Now: now, OwnerToken: owner, Retention: retention,
			Response: &fsm.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: pool[off : off+512]}})
	}
	report := func(at int) {
		// IDEM_FILL_PROFILE=DIR: a CPU profile of each measured window.
		if d := os.Getenv("IDEM_FILL_PROFILE"); d != "" {
			f, err := os.Create(filepath.Join(d, fmt.Sprintf("fill-%d.pprof", at)))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				b.Fatal(err)
			}
			defer pprof.StopCPUProfile()
		}
		start := time.Now()
		for i := at; i < at+window; i++ {
			cycle(i)
		}
		rate := float64(window) / time.Since(start).Seconds()
		if err := sm.CommitApplied(idx); err != nil {
			b.Fatal(err)
		}
		inBatch = 0
		runtime.GC()
		debug.FreeOSMemory()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		n := at + window
		m := db.db.Metrics()
		fmt.Fprintf(os.Stderr, "retained %9d: %7.0f cycles/s over the next %d | RSS %4d MiB | Go heap %3d MiB | engine on disk %6.0f B/record | read amp %d, L0 files %d, block cache hit %.0f%%, filter hits %d misses %d\n",
			at, rate, window, rssBytes()>>20, ms.HeapInuse>>20, float64(db.DiskBytes())/float64(n),
			m.ReadAmp(), m.Levels[0].TablesCount, 100*float64(m.BlockCache.Hits)/float64(max(1, m.BlockCache.Hits+m.BlockCache.Misses)), m.Filter.Hits, m.Filter.Misses)
	}
	checkpoints := []int{0, 1_000_000, 10_000_000}
	done := 0
	for _, cp := range checkpoints {
		if cp > total {
			break
		}
		for ; done < cp; done++ {
			cycle(done)
		}
		report(done)
		done += window
	}
	for ; done < total; done++ { // the rest, if total is past the last checkpoint
		cycle(done)
	}
	if err := sm.CommitApplied(idx); err != nil {
		b.Fatal(err)
	}
	if err := db.Close(); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if db, err = Open(Config{Dir: dir}); err != nil {
		b.Fatal(err)
	}
	if sm, err = db.Shard("bench-0"); err != nil {
		b.Fatal(err)
	}
	reopen := time.Since(start)
	st := sm.FSM().Stats()
	fmt.Fprintf(os.Stderr, "retained %9d: reopen (engine + shard, ready to apply) %v; applied index %d; RSS %d MiB\n", st.Completed, reopen.Round(time.Millisecond), sm.AppliedIndex(), rssBytes()>>20)

	// Sweep: everything expired; drop up to 1M records, 10000 per entry.
	start = time.Now()
	swept := 0
	now := t0 + int64(total)*1000 + 2*retention
	for swept < min(total, 1_000_000) {
		idx++
		r := sm.FSM().Apply(idx, &fsm.Command{Op: fsm.OpSweep, Now: now, MaxSweep: 10000})
		if err := sm.CommitApplied(idx); err != nil {
			b.Fatal(err)
		}
		if r.Swept == 0 {
			break
		}
		swept += r.Swept
	}
	took := time.Since(start)
	fmt.Fprintf(os.Stderr, "sweep: %d records in %v = %.0f records/s (10000 per entry)\n", swept, took.Round(time.Millisecond), float64(swept)/took.Seconds())
	db.Close()
}
