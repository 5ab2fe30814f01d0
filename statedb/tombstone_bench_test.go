package statedb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem/fsm"
)

// BenchmarkTombstones measures what a tombstone costs against the COMPLETED
// record it replaces: it retains IDEM_TOMBSTONES records (default 200000)
// of 512-byte bodies in one shard, lets their retention end, sweeps them
// into tombstones (OpSweep, MaxSweep 10000), and prints the engine's bytes
// on disk per record and per tombstone (after a flush and a full
// compaction, so both are settled), the Go heap and the process's RSS at
// each stage. Run with
//
//	go test -run XXX -bench Tombstones -benchtime 1x ./statedb
func BenchmarkTombstones(b *testing.B) {
	total := 200_000
	if s := os.Getenv("IDEM_TOMBSTONES"); s != "" {
		total, _ = strconv.Atoi(s)
	}
	for b.Loop() {
		db, err := Open(Config{Dir: b.TempDir(), CacheBytes: 8 << 20})
		if err != nil {
			b.Fatal(err)
		}
		sm, err := db.Shard("bench-0")
		if err != nil {
			b.Fatal(err)
		}
		settle := func(stage string, n int) {
			if err := db.db.Flush(); err != nil {
				b.Fatal(err)
			}
			if err := db.db.Compact(context.Background(), []byte{0}, []byte{0xff, 0xff, 0xff, 0xff}, false); err != nil {
				b.Fatal(err)
			}
			runtime.GC()
			debug.FreeOSMemory()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			st := sm.FSM().Stats()
			m := db.db.Metrics()
			tables := m.Total().TablesSize
			fmt.Fprintf(os.Stderr, "%-28s completed %7d tombstones %7d | sstables %6.1f B each, engine on disk (with WAL) %6.1f B each | accounted %4.0f B each | Go heap %3d MiB | RSS %4d MiB\n",
				stage, st.Completed, st.Tombstones, float64(tables)/float64(n), float64(db.DiskBytes())/float64(n), float64(st.Bytes)/float64(n), ms.HeapInuse>>20, rssBytes()>>20)
		}
		settle("empty", 1)
		pool := make([]byte, 1<<20) // incompressible bodies, as real responses mostly are
		for i := range pool {
			pool[i] = byte(rand.IntN(256))
		}
		t0 := time.Now().UnixNano()
		const retention = int64(3600e9)
		idx := uint64(0)
		for i := range total {
			key := fmt.Sprintf("%08x-4c7e-4b1a-9d7e-%012d", i*2654435761, i)
			owner := "owner-" + strconv.Itoa(i)
			idx++
			sm.FSM().Apply(idx, &fsm.Command{Op: fsm.OpReserve, Namespace: "orders", Key: key, Now: t0, OwnerToken: owner, Fingerprint: "sha256:abcdef0123456789", Lease: 30e9})
			idx++
			sm.FSM().Apply(idx, &fsm.Command{Op: fsm.OpComplete, Namespace: "orders", Key: key, Now: t0, OwnerToken: owner, Retention: retention,
				Response: &fsm.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: pool[(i*4099)%(len(pool)-512):][:512]}})
			if i%256 == 255 {
				if err := sm.CommitApplied(idx); err != nil {
					b.Fatal(err)
				}
			}
		}
		if err := sm.CommitApplied(idx); err != nil {
			b.Fatal(err)
		}
		settle("completed records", total)
		start := time.Now()
		for {
			idx++
			r := sm.FSM().Apply(idx, &fsm.Command{Op: fsm.OpSweep, Now: t0 + retention + 1, MaxSweep: 10000})
			if err := sm.CommitApplied(idx); err != nil {
				b.Fatal(err)
			}
			if r.Swept == 0 {
				break
			}
		}
		took := time.Since(start)
		settle("after the sweep: tombstones", total)
		fmt.Fprintf(os.Stderr, "sweep into tombstones: %d in %v = %.0f records/s (10000 per entry)\n", total, took.Round(time.Millisecond), float64(total)/took.Seconds())
		if st := sm.FSM().Stats(); st.Tombstones != total {
			b.Fatalf("%d tombstones, want %d", st.Tombstones, total)
		}
		db.Close()
	}
}
