package statedb

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/bbolt"
)

// The engine choice (DESIGN.md "Choosing the engine"): the write pattern of a
// reserve+complete cycle, measured on pebble and bbolt. A cycle writes a
// reserve (record + lease-index key) and, in the next batch, its complete
// (record with a 512-byte body, lease key deleted, expiry-index key added):
// what the FSM writes per Raft ApplyBatch. Run with
//
//	IDEM_ENGINE_RECORDS=1000000 go test -run XXX -bench EngineCycle -benchtime 1x ./statedb
//
// (records per engine; default 100000). Figures printed with b.Log.

type engine interface {
	apply(puts map[string][]byte, dels []string, sync bool) error
	get(k string) ([]byte, error)
	close() error
}

type pebbleEngine struct{ db *pebble.DB }

func (e pebbleEngine) apply(puts map[string][]byte, dels []string, sync bool) error {
	b := e.db.NewBatch()
	for k, v := range puts {
		b.Set([]byte(k), v, nil)
	}
	for _, k := range dels {
		b.Delete([]byte(k), nil)
	}
	opt := pebble.NoSync
	if sync {
		opt = pebble.Sync
	}
	return b.Commit(opt)
}
func (e pebbleEngine) get(k string) ([]byte, error) {
	v, c, err := e.db.Get([]byte(k))
	if err != nil {
		return nil, err
	}
	out := append([]byte(nil), v...)
	c.Close()
	return out, nil
}
func (e pebbleEngine) close() error { return e.db.Close() }

type boltEngine struct{ db *bbolt.DB }

var benchBucket = []byte("r")

func (e boltEngine) apply(puts map[string][]byte, dels []string, sync bool) error {
	e.db.NoSync = !sync
	return e.db.Update(func(tx *bbolt.Tx) error {
		bk := tx.Bucket(benchBucket)
		for k, v := range puts {
			if err := bk.Put([]byte(k), v); err != nil {
				return err
			}
		}
		for _, k := range dels {
			if err := bk.Delete([]byte(k)); err != nil {
				return err
			}
		}
		return nil
	})
}
func (e boltEngine) get(k string) ([]byte, error) {
	var out []byte
	err := e.db.View(func(tx *bbolt.Tx) error {
		out = append([]byte(nil), tx.Bucket(benchBucket).Get([]byte(k))...)
		return nil
	})
	return out, err
}
func (e boltEngine) close() error { return e.db.Close() }

func openBenchEngine(b *testing.B, name, dir string) engine {
	switch name {
	case "pebble":
		db, err := pebble.Open(dir, pebbleOptions(0))
		if err != nil {
			b.Fatal(err)
		}
		return pebbleEngine{db}
	default:
		db, err := bbolt.Open(filepath.Join(dir, "state.db"), 0o600, &bbolt.Options{NoFreelistSync: true, FreelistType: bbolt.FreelistMapType})
		if err != nil {
			b.Fatal(err)
		}
		if err := db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucketIfNotExists(benchBucket); return err }); err != nil {
			b.Fatal(err)
		}
		return boltEngine{db}
	}
}

func BenchmarkEngineCycle(b *testing.B) {
	records := 100000
	if s := os.Getenv("IDEM_ENGINE_RECORDS"); s != "" {
		records, _ = strconv.Atoi(s)
	}
	const batch = 256 // cycles per engine batch: a busy ApplyBatch
	// Bodies differ per record (random windows of a random pool), so block
	// compression cannot fold identical bodies together.
	pool := make([]byte, 1<<20)
	for i := range pool {
		pool[i] = byte(rand.IntN(256))
	}
	for _, name := range []string{"pebble", "bbolt"} {
		for _, sync := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/sync=%v", name, sync), func(b *testing.B) {
				n := records
				if sync {
					n = min(records, 50000) // fsync-bound: the rate is what matters
				}
				dir := b.TempDir()
				e := openBenchEngine(b, name, dir)
				defer e.close()
				var ms runtime.MemStats
				key := func(i int) string { return fmt.Sprintf("r/ns/key-%012d-0123456789abcdef", i) }
				leaseKey := func(i int) string { return "l/" + key(i) }
				expKey := func(i int) string {
					var t [8]byte
					binary.BigEndian.PutUint64(t[:], uint64(i))
					return "e/" + string(t[:]) + key(i)
				}
				reserveVal := make([]byte, 90)
				completeVal := make([]byte, 120+512)
				start := time.Now()
				for lo := 0; lo < n; lo += batch {
					hi := min(lo+batch, n)
					puts := map[string][]byte{}
					for i := lo; i < hi; i++ {
						puts[key(i)] = reserveVal
						puts[leaseKey(i)] = nil
					}
					if err := e.apply(puts, nil, sync); err != nil {
						b.Fatal(err)
					}
					puts = map[string][]byte{}
					var dels []string
					for i := lo; i < hi; i++ {
						off := (i * 4099) % (len(pool) - 512)
						v := append(completeVal[:120:120], pool[off:off+512]...)
						puts[key(i)] = v
						puts[expKey(i)] = nil
						dels = append(dels, leaseKey(i))
					}
					if err := e.apply(puts, dels, sync); err != nil {
						b.Fatal(err)
					}
				}
				took := time.Since(start)
				readStart := time.Now()
				const reads = 20000
				for range reads {
					v, err := e.get(key(rand.IntN(n)))
					if err != nil || len(v) != len(completeVal) {
						b.Fatalf("read: %v (%d bytes)", err, len(v))
					}
				}
				readTook := time.Since(readStart)
				runtime.ReadMemStats(&ms)
				disk := dirBytes(dir)
				b.Logf("%s sync=%v: %d cycles in %v = %.0f cycles/s; %.1f µs/read; disk %.0f B/record; Go heap in use %d MiB; RSS %d MiB",
					name, sync, n, took.Round(time.Millisecond), float64(n)/took.Seconds(),
					float64(readTook.Microseconds())/reads, float64(disk)/float64(n), ms.HeapInuse>>20, rssBytes()>>20)
			})
		}
	}
}
