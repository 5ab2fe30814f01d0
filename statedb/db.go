package statedb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem/fsm"
)

// Errors of package statedb.
var (
	// ErrClosed: the engine was closed.
	ErrClosed = errors.New("statedb: closed")
	// ErrShardOpen: Shard was called twice for one shard id.
	ErrShardOpen = errors.New("statedb: shard already open")
)

// DefaultCacheBytes is the default block cache: 256 MiB, of which the
// memtables take 64-128 MiB; the rest holds the filter and index blocks a
// point read that misses needs (measured: with 64 MiB, all of it taken by the
// memtables, the block cache hit 1% of reads at 1M records and applies
// slowed by 43%; with 256 MiB it hits 95% and they did not slow).
const DefaultCacheBytes = 256 << 20

// Config configures a DB.
type Config struct {
	// Dir is the engine's directory (created if missing). Required.
	Dir string
	// CacheBytes is the engine's block cache; 0 means DefaultCacheBytes.
	// pebble reserves its memtables inside it (32 MiB each, two or more at a
	// time), so it must be well above 64 MiB. Resident
	// memory is bounded by it and the memtables, not by the stored state.
	CacheBytes int64
	// MaxStateBytes is the stored state (StateBytes) at which Admit refuses
	// requests that would add data; 0 means no limit.
	MaxStateBytes int64
	// Registry receives the idem_state_* metrics; nil: not exported.
	Registry *prometheus.Registry
	// PartitionCount is the ring's partition count (fixed for the
	// cluster's life). When set, every shard indexes its records by ring
	// partition, so that the records of the partitions a topology change
	// moves are found without a pass over the shard (ScanPartitions); an
	// index missing from an older data dir is built when the shard opens.
	// 0: no index.
	PartitionCount uint32
	// TestingRestoreFault, when set, injects a crash into every Restore:
	// fault injection for tests only (cmd/idemnode's
	// --testing-crash-during-restore). Nil in production.
	TestingRestoreFault *RestoreFault
}

// RestoreFault is fault injection for tests: a Restore that has written
// AfterRecords records into its new generation commits them with a synced
// write (so they are on disk, as a crash would find them) and calls Crash,
// before the switch to the new generation. Crash is meant not to return
// (cmd/idemnode exits the process in it); if it does, the Restore fails.
type RestoreFault struct {
	AfterRecords int
	Crash        func(shard string, recordsWritten int)
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if c.Dir == "" {
		errs = append(errs, errors.New("statedb: config: Dir is required"))
	}
	if c.MaxStateBytes < 0 {
		errs = append(errs, fmt.Errorf("statedb: config: MaxStateBytes %d is negative", c.MaxStateBytes))
	}
	if c.CacheBytes < 0 {
		errs = append(errs, fmt.Errorf("statedb: config: CacheBytes %d is negative", c.CacheBytes))
	}
	if f := c.TestingRestoreFault; f != nil && (f.AfterRecords <= 0 || f.Crash == nil) {
		errs = append(errs, fmt.Errorf("statedb: config: TestingRestoreFault needs AfterRecords > 0 (got %d) and a Crash func", f.AfterRecords))
	}
	return errors.Join(errs...)
}

// DB is one node's state engine: the records of every shard it hosts.
type DB struct {
	db *pebble.DB

	maxBytes   int64
	stateBytes atomic.Int64 // committed record bytes of every open shard
	refused    prometheus.Counter
	fault      *RestoreFault
	partitions uint32 // Config.PartitionCount

	mu     sync.Mutex
	shards map[string]bool
	closed bool
}

// Open opens (creating if needed) the engine in cfg.Dir.
func Open(cfg Config) (*DB, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts := pebbleOptions(cfg.CacheBytes)
	defer opts.Cache.Unref() // the engine holds its own reference
	db, err := pebble.Open(cfg.Dir, opts)
	if err != nil {
		return nil, fmt.Errorf("statedb: opening %s: %w", cfg.Dir, err)
	}
	d := &DB{db: db, shards: map[string]bool{}, maxBytes: cfg.MaxStateBytes, fault: cfg.TestingRestoreFault, partitions: cfg.PartitionCount}
	if err := d.registerMetrics(cfg.Registry); err != nil {
		db.Close()
		return nil, err
	}
	return d, nil
}

// Close closes the engine; every shard's Raft group must have stopped.
func (d *DB) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	if err := d.db.Close(); err != nil {
		return fmt.Errorf("statedb: closing: %w", err)
	}
	return nil
}

// DiskBytes is the engine's size on disk (tables, logs, manifests).
func (d *DB) DiskBytes() uint64 { return d.db.Metrics().DiskSpaceUsage() }

// Flush writes the memtables out and syncs the engine (tests and benchmarks
// that measure the disk; never needed for correctness).
func (d *DB) Flush() error { return d.db.Flush() }

// openShard opens shard id's store at its current generation, dropping any
// other generation (what an interrupted Restore left behind).
func (d *DB) openShard(id string) (*ShardStore, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.closed:
		return nil, ErrClosed
	case d.shards[id]:
		return nil, fmt.Errorf("%w: %s", ErrShardOpen, id)
	}
	s := &ShardStore{db: d.db, id: id, gen: 1, total: &d.stateBytes, fault: d.fault, partitions: d.partitions}
	v, closer, err := d.db.Get(genKey(id))
	switch {
	case err == nil:
		if len(v) != 8 {
			closer.Close()
			return nil, fmt.Errorf("%w: shard %s generation key of %d bytes", fsm.ErrCorrupt, id, len(v))
		}
		s.gen = binary.BigEndian.Uint64(v)
		closer.Close()
	case errors.Is(err, pebble.ErrNotFound):
		if err := d.db.Set(genKey(id), binary.BigEndian.AppendUint64(nil, s.gen), pebble.Sync); err != nil {
			return nil, fmt.Errorf("statedb: shard %s: %w", id, err)
		}
	default:
		return nil, fmt.Errorf("statedb: shard %s: %w", id, err)
	}
	s.setGen(s.gen)
	// Leftovers of an interrupted restore: every other generation. They are
	// counted first (for the operator's log line; usually nothing: the
	// range tombstones of earlier drops hide what they covered).
	stale := [][2][]byte{{shardPrefix(id), genPrefix(id, s.gen)}, {genPrefix(id, s.gen+1), prefixEnd(shardPrefix(id))}}
	for _, r := range stale {
		keys, bytes, err := countRange(d.db, r[0], r[1])
		if err != nil {
			return nil, fmt.Errorf("statedb: shard %s: reading stale generations: %w", id, err)
		}
		s.droppedKeys += keys
		s.droppedBytes += bytes
	}
	b := d.db.NewBatch()
	for _, r := range stale {
		b.DeleteRange(r[0], r[1], nil)
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return nil, fmt.Errorf("statedb: shard %s: dropping stale generations: %w", id, err)
	}
	v, closer, err = d.db.Get(s.metaKey)
	switch {
	case err == nil:
		s.meta, s.applied, err = decodeMeta(v)
		closer.Close()
		if err != nil {
			return nil, fmt.Errorf("statedb: shard %s: %w", id, err)
		}
	case !errors.Is(err, pebble.ErrNotFound):
		return nil, fmt.Errorf("statedb: shard %s: %w", id, err)
	}
	if err := s.indexPartitions(); err != nil {
		return nil, err
	}
	d.shards[id] = true
	s.committedBytes = s.meta.Bytes
	d.stateBytes.Add(s.meta.Bytes)
	return s, nil
}

// countRange counts the keys in [lower, upper) and their bytes (keys and
// values).
func countRange(db *pebble.DB, lower, upper []byte) (keys int, bytes int64, err error) {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return 0, 0, err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		keys++
		bytes += int64(len(it.Key())) + int64(len(it.Value()))
	}
	return keys, bytes, it.Error()
}
