package statedb

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idem-dev/idem/fsm"
)

// restoreBatchBytes is how much a Restore buffers before writing a batch
// into the new generation: a snapshot is never held in memory whole.
const restoreBatchBytes = 8 << 20

// ShardStore is one shard's records in the node's engine: an fsm.Store.
// Writes of one Raft ApplyBatch go into one indexed engine batch (reads of
// the writer see it); commit writes it together with the FSM's meta and the
// applied Raft index, atomically. Readers (Lookup) read the committed state.
type ShardStore struct {
	db *pebble.DB
	id string

	gen                              uint64
	prefix                           []byte
	metaKey, recPrefix, expPrefix    []byte
	leasePrefix                      []byte
	recEnd, expEnd, leaseEnd, genEnd []byte

	batch   *pebble.Batch // the apply in progress; nil between batches
	meta    fsm.Meta
	applied uint64 // Raft index the committed state covers
	// pendingApplied is the Raft index a Restore in progress covers.
	pendingApplied uint64
	// err is the first engine error met while applying; commit reports it.
	err error

	// expFloor and leaseFloor are lower bounds of the two indexes' times:
	// every key below was deleted by a sweep, and no key below can be
	// added again (an expiry or a lease end is always after the FSM's
	// clock, and a sweep never looks past it), except records a handoff
	// imports with the times the source gave them: Put lowers the floor
	// for those. Scans start there, so they do not wade through the
	// tombstones of earlier sweeps. In memory only: after a restart the
	// first scan starts at the beginning once.
	expFloor, leaseFloor []byte

	// partitions is the ring's partition count the records are indexed by
	// (partition.go); 0: no partition index.
	partitions uint32
	partPrefix []byte

	// total is the DB's StateBytes; committedBytes this shard's share.
	total          *atomic.Int64
	committedBytes int64

	// droppedKeys and droppedBytes are what opening the shard dropped of
	// other generations (what an interrupted Restore left behind).
	droppedKeys  int
	droppedBytes int64
	// fault is the DB's Config.TestingRestoreFault (nil in production).
	fault *RestoreFault

	// recent caches the records the writer put lately, by record key, as
	// the writer sees them (the batch in progress included; nil: deleted):
	// a complete reads the record its reserve wrote a moment before, and
	// the cache answers it without an engine read (a point read through
	// the batch, the memtables and the levels was ~10% of a node's CPU).
	// Writer only, like Get and Put; every write of a record key goes
	// through it (Put, and drop, which forgets what it deletes), and a
	// generation switch (a restore) empties it. Bounded by recentCap keys,
	// oldest out first; what it does not hold is read from the engine.
	recent      map[string]*fsm.Record
	recentOrder []string
	recentNext  int
	keyBuf      []byte // the writer's scratch record key
	// The writer's scratch for what Put hands to the batch, which copies
	// it (pebble.Batch.Set and Delete): the encoded record, an index key
	// and its value, a partition index key.
	valBuf, idxBuf, idxValBuf, partBuf []byte
}

// recentCap bounds ShardStore.recent per shard (records of ~1 KiB: ~4 MiB).
const recentCap = 4096

// DroppedAtOpen is what opening the shard found and dropped of generations
// other than the current one: the leftovers of an interrupted Restore (a
// crash during a snapshot install); 0, 0 normally.
func (s *ShardStore) DroppedAtOpen() (keys int, bytes int64) { return s.droppedKeys, s.droppedBytes }

// setCommittedBytes moves this shard's share of the DB's StateBytes to b.
func (s *ShardStore) setCommittedBytes(b int64) {
	s.total.Add(b - s.committedBytes)
	s.committedBytes = b
}

var _ fsm.Store = (*ShardStore)(nil)

func (s *ShardStore) setGen(gen uint64) {
	s.gen = gen
	s.prefix = genPrefix(s.id, gen)
	s.metaKey = sub(s.prefix, subMeta)
	s.recPrefix = sub(s.prefix, subRecord)
	s.expPrefix = sub(s.prefix, subExpiry)
	s.leasePrefix = sub(s.prefix, subLease)
	s.recEnd, s.expEnd, s.leaseEnd = prefixEnd(s.recPrefix), prefixEnd(s.expPrefix), prefixEnd(s.leasePrefix)
	s.genEnd = prefixEnd(s.prefix)
	s.partPrefix = sub(s.prefix, subPart)
	s.expFloor, s.leaseFloor = nil, nil
	s.recent, s.recentOrder, s.recentNext = nil, nil, 0
}

// remember records rec (nil: deleted) as the writer's view of the record
// at key.
func (s *ShardStore) remember(key []byte, rec *fsm.Record) {
	if s.recent == nil {
		s.recent = make(map[string]*fsm.Record, recentCap)
		s.recentOrder = make([]string, 0, recentCap)
	}
	if _, ok := s.recent[string(key)]; ok {
		s.recent[string(key)] = rec
		return
	}
	k := string(key)
	if len(s.recentOrder) < recentCap {
		s.recentOrder = append(s.recentOrder, k)
	} else {
		// Evicting may drop a newer entry of a key that was forgotten and
		// remembered again: a cache miss, never a wrong answer.
		delete(s.recent, s.recentOrder[s.recentNext])
		s.recentOrder[s.recentNext] = k
		s.recentNext = (s.recentNext + 1) % recentCap
	}
	s.recent[k] = rec
}

// writerKey is k's record key in the writer's scratch buffer: valid until
// the next call; engine writes copy it.
func (s *ShardStore) writerKey(k fsm.RecordKey) []byte {
	s.keyBuf = appendKey(append(s.keyBuf[:0], s.recPrefix...), k)
	return s.keyBuf
}

// Applied is the Raft index the committed state covers (0: nothing yet).
func (s *ShardStore) Applied() uint64 { return s.applied }

func (s *ShardStore) wb() *pebble.Batch {
	if s.batch == nil {
		s.batch = s.db.NewIndexedBatch()
	}
	return s.batch
}

func (s *ShardStore) fail(err error) {
	if s.err == nil && err != nil {
		s.err = err
	}
}

func (s *ShardStore) recKey(k fsm.RecordKey) []byte {
	return appendKey(append([]byte(nil), s.recPrefix...), k)
}

// appendIndexValue appends an index entry's value: the record's
// fsm.RecordBytes, so that a sweep drops records without reading them.
func appendIndexValue(dst []byte, k fsm.RecordKey, r *fsm.Record) []byte {
	return binary.AppendUvarint(dst, uint64(fsm.RecordBytes(k, r)))
}

// appendIndexKey appends k's index key at time t under prefix.
func appendIndexKey(dst, prefix []byte, t int64, k fsm.RecordKey) []byte {
	return appendKey(appendTime(append(dst, prefix...), t), k)
}

// read reads the record at key (a record key of this generation).
func (s *ShardStore) read(get func([]byte) ([]byte, func() error, error), key []byte) (*fsm.Record, bool) {
	v, closeFn, err := get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false
	}
	if err != nil {
		s.fail(err)
		panic(fmt.Sprintf("statedb: shard %s: reading a record: %v", s.id, err))
	}
	defer closeFn()
	_, rec, err := fsm.DecodeRecord(v)
	if err != nil {
		panic(fmt.Sprintf("statedb: shard %s: stored record does not decode: %v", s.id, err))
	}
	return rec, true
}

func batchGet(b *pebble.Batch) func([]byte) ([]byte, func() error, error) {
	return func(k []byte) ([]byte, func() error, error) {
		v, c, err := b.Get(k)
		if err != nil {
			return nil, nil, err
		}
		return v, c.Close, nil
	}
}

func dbGet(r pebble.Reader) func([]byte) ([]byte, func() error, error) {
	return func(k []byte) ([]byte, func() error, error) {
		v, c, err := r.Get(k)
		if err != nil {
			return nil, nil, err
		}
		return v, c.Close, nil
	}
}

// Get reads through the batch in progress (the writer's view): from the
// recent cache if it holds k, else from the engine.
func (s *ShardStore) Get(k fsm.RecordKey) (*fsm.Record, bool) {
	key := s.writerKey(k)
	if rec, ok := s.recent[string(key)]; ok {
		return rec, rec != nil
	}
	return s.read(batchGet(s.wb()), key)
}

// Lookup reads the committed state.
// Readers run concurrently with the writer, so the key is their own, not
// the writer's scratch buffer.
func (s *ShardStore) Lookup(k fsm.RecordKey) (*fsm.Record, bool) {
	return s.read(dbGet(s.db), s.recKey(k))
}

// indexOf is r's lease or expiry index key in the writer's scratch buffer:
// valid until the next call; engine writes copy it.
func (s *ShardStore) indexOf(k fsm.RecordKey, r *fsm.Record) []byte {
	prefix, t := s.expPrefix, r.ExpiresAt
	if r.State == fsm.StateInProgress {
		prefix, t = s.leasePrefix, r.LeaseExpiresAt
	}
	s.idxBuf = appendIndexKey(s.idxBuf[:0], prefix, t, k)
	return s.idxBuf
}

// Put writes into the batch in progress.
func (s *ShardStore) Put(k fsm.RecordKey, old, rec *fsm.Record) {
	b := s.wb()
	if old != nil {
		s.fail(b.Delete(s.indexOf(k, old), nil))
	}
	if old == nil && rec != nil {
		s.indexPartition(b, k, true)
	} else if old != nil && rec == nil {
		s.indexPartition(b, k, false)
	}
	key := s.writerKey(k)
	s.remember(key, rec)
	if rec == nil {
		s.fail(b.Delete(key, nil))
		return
	}
	s.valBuf = fsm.AppendRecord(s.valBuf[:0], k, rec)
	s.fail(b.Set(key, s.valBuf, nil))
	ik := s.indexOf(k, rec)
	s.idxValBuf = appendIndexValue(s.idxValBuf[:0], k, rec)
	s.fail(b.Set(ik, s.idxValBuf, nil))
	for _, floor := range []*[]byte{&s.expFloor, &s.leaseFloor} {
		if *floor != nil && bytes.HasPrefix(ik, (*floor)[:len(*floor)-8]) && string(ik) < string(*floor) {
			*floor = nil // an imported record below the floor: the next sweep starts at the beginning
		}
	}
}

// drop deletes up to limit records of the index at prefix with times <=
// at, from the index alone: its values hold each record's RecordBytes, so
// nothing is read but the index. It starts at *floor (nil: the start) and
// moves it to the time of the last key dropped.
func (s *ShardStore) drop(prefix, end []byte, floor *[]byte, at int64, limit int) (n int, bytes int64) {
	upper := prefixEnd(appendTime(append([]byte(nil), prefix...), at)) // every key at time at
	if upper == nil || string(upper) > string(end) {
		upper = end
	}
	lower := prefix
	if *floor != nil && string(*floor) > string(lower) {
		lower = *floor
	}
	if string(lower) >= string(upper) {
		return 0, 0
	}
	b := s.wb()
	it, err := b.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		panic(fmt.Sprintf("statedb: shard %s: index iterator: %v", s.id, err))
	}
	defer it.Close()
	var doomed [][]byte
	for ok := it.First(); ok && (limit == 0 || n < limit); ok = it.Next() {
		ik := it.Key()
		k, err := decodeKey(ik[len(prefix)+8:])
		if err != nil {
			panic(fmt.Sprintf("statedb: shard %s: index key: %v", s.id, err))
		}
		v, err := it.ValueAndErr()
		size, m := binary.Uvarint(v)
		if err != nil || m <= 0 {
			panic(fmt.Sprintf("statedb: shard %s: index value of %q: %v", s.id, k.Key, err))
		}
		doomed = append(doomed, append([]byte(nil), ik...), s.recKey(k))
		if pk := s.appendPartKey(nil, s.partPrefix, k); pk != nil {
			doomed = append(doomed, pk)
		}
		bytes += int64(size)
		n++
		*floor = append((*floor)[:0], ik[:len(prefix)+8]...)
	}
	if err := it.Error(); err != nil {
		panic(fmt.Sprintf("statedb: shard %s: index scan: %v", s.id, err))
	}
	for _, k := range doomed { // after the scan: the iterator reads the batch
		s.fail(b.Delete(k, nil))
		delete(s.recent, string(k)) // index keys are not in it: a no-op for them
	}
	return n, bytes
}

// Expired reads the expiry index from its floor up to at (limit keys at
// most) and returns the records it names, as the writer sees them; the
// sweep replaces each (a tombstone) or deletes it through Put, which moves
// or removes its index key.
func (s *ShardStore) Expired(at int64, limit int) []fsm.KeyedRecord {
	upper := prefixEnd(appendTime(append([]byte(nil), s.expPrefix...), at))
	if upper == nil || string(upper) > string(s.expEnd) {
		upper = s.expEnd
	}
	lower := s.expPrefix
	if s.expFloor != nil && string(s.expFloor) > string(lower) {
		lower = s.expFloor
	}
	if string(lower) >= string(upper) {
		return nil
	}
	it, err := s.wb().NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		panic(fmt.Sprintf("statedb: shard %s: index iterator: %v", s.id, err))
	}
	var keys []fsm.RecordKey
	for ok := it.First(); ok && (limit == 0 || len(keys) < limit); ok = it.Next() {
		ik := it.Key()
		k, err := decodeKey(ik[len(s.expPrefix)+8:])
		if err != nil {
			panic(fmt.Sprintf("statedb: shard %s: index key: %v", s.id, err))
		}
		keys = append(keys, k)
		s.expFloor = append(s.expFloor[:0], ik[:len(s.expPrefix)+8]...)
	}
	err = it.Error()
	it.Close()
	if err != nil {
		panic(fmt.Sprintf("statedb: shard %s: index scan: %v", s.id, err))
	}
	out := make([]fsm.KeyedRecord, 0, len(keys))
	for _, k := range keys {
		rec, ok := s.Get(k)
		if !ok {
			panic(fmt.Sprintf("statedb: shard %s: expiry index names %q, which has no record", s.id, k.Key))
		}
		out = append(out, fsm.KeyedRecord{K: k, R: rec})
	}
	return out
}

func (s *ShardStore) DropLeasesEnded(at int64, limit int) (int, int64) {
	return s.drop(s.leasePrefix, s.leaseEnd, &s.leaseFloor, at, limit)
}

func (s *ShardStore) Meta() fsm.Meta     { return s.meta }
func (s *ShardStore) SetMeta(m fsm.Meta) { s.meta = m }

// commit writes the batch in progress with the meta and applied, in one
// atomic engine write. It is not fsync'd: the Raft log is, and on restart
// every entry after the stored applied index is applied again (DESIGN.md).
func (s *ShardStore) commit(applied uint64) error {
	if s.err != nil {
		return fmt.Errorf("statedb: shard %s: %w", s.id, s.err)
	}
	b := s.wb()
	if err := b.Set(s.metaKey, encodeMeta(s.meta, applied), nil); err != nil {
		return fmt.Errorf("statedb: shard %s: %w", s.id, err)
	}
	err := b.Commit(pebble.NoSync)
	b.Close()
	s.batch = nil
	if err != nil {
		s.err = err
		return fmt.Errorf("statedb: shard %s: committing applied index %d: %w", s.id, applied, err)
	}
	s.applied = applied
	s.setCommittedBytes(s.meta.Bytes)
	return nil
}

// sync makes every committed batch durable: a synced write of a WAL-only
// record flushes and fsyncs the WAL up to it.
func (s *ShardStore) sync() error {
	b := s.db.NewBatch()
	defer b.Close()
	if err := b.LogData(nil, nil); err != nil {
		return fmt.Errorf("statedb: shard %s: %w", s.id, err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("statedb: shard %s: syncing the engine: %w", s.id, err)
	}
	return nil
}

// View is a pebble snapshot of the committed state: streaming it costs no
// memory beyond one record.
func (s *ShardStore) View() fsm.StoreView {
	snap := s.db.NewSnapshot()
	v := &view{snap: snap, s: s, recPrefix: s.recPrefix, recEnd: s.recEnd}
	val, c, err := snap.Get(s.metaKey)
	switch {
	case err == nil:
		v.meta, v.applied, v.err = decodeMeta(val)
		c.Close()
	case !errors.Is(err, pebble.ErrNotFound):
		v.err = err
	}
	return v
}

type view struct {
	snap              *pebble.Snapshot
	s                 *ShardStore
	recPrefix, recEnd []byte
	meta              fsm.Meta
	applied           uint64 // the Raft index the viewed state covers
	err               error
}

func (v *view) Meta() fsm.Meta { return v.meta }
func (v *view) Len() int {
	return int(v.meta.InProgress + v.meta.Completed + v.meta.Tombstones + v.meta.Policies)
}
func (v *view) Release() { v.snap.Close() }
func (v *view) Frames(fn func([]byte) error) error {
	if v.err != nil {
		return fmt.Errorf("statedb: shard %s: snapshot meta: %w", v.s.id, v.err)
	}
	it, err := v.snap.NewIter(&pebble.IterOptions{LowerBound: v.recPrefix, UpperBound: v.recEnd})
	if err != nil {
		return fmt.Errorf("statedb: shard %s: snapshot iterator: %w", v.s.id, err)
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		val, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("statedb: shard %s: snapshot read: %w", v.s.id, err)
		}
		if err := fn(val); err != nil {
			return err
		}
	}
	return it.Error()
}

// BeginRestore fills generation gen+1; the current one stays as it is.
func (s *ShardStore) BeginRestore() fsm.StoreRestore {
	r := &restore{s: s, gen: s.gen + 1}
	r.prefix = genPrefix(s.id, r.gen)
	r.recPrefix = sub(r.prefix, subRecord)
	r.batch = s.db.NewIndexedBatch()
	return r
}

type restore struct {
	s         *ShardStore
	gen       uint64
	prefix    []byte
	recPrefix []byte
	batch     *pebble.Batch
	records   int // put so far
}

func (r *restore) key(k fsm.RecordKey) []byte {
	return appendKey(append([]byte(nil), r.recPrefix...), k)
}

func (r *restore) Has(k fsm.RecordKey) (bool, error) {
	_, c, err := r.batch.Get(r.key(k))
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	c.Close()
	return true, nil
}

func (r *restore) Put(k fsm.RecordKey, rec *fsm.Record) error {
	if err := r.batch.Set(r.key(k), fsm.AppendRecord(nil, k, rec), nil); err != nil {
		return err
	}
	idx := sub(r.prefix, subExpiry)
	t := rec.ExpiresAt
	if rec.State == fsm.StateInProgress {
		idx, t = sub(r.prefix, subLease), rec.LeaseExpiresAt
	}
	if err := r.batch.Set(appendIndexKey(nil, idx, t, k), appendIndexValue(nil, k, rec), nil); err != nil {
		return err
	}
	if pk := r.s.appendPartKey(nil, sub(r.prefix, subPart), k); pk != nil {
		if err := r.batch.Set(pk, nil, nil); err != nil {
			return err
		}
	}
	r.records++
	if f := r.s.fault; f != nil && r.records == f.AfterRecords {
		return r.crash(f)
	}
	if r.batch.Len() >= restoreBatchBytes {
		err := r.batch.Commit(pebble.NoSync)
		r.batch.Close()
		r.batch = r.s.db.NewIndexedBatch()
		return err
	}
	return nil
}

// crash is Config.TestingRestoreFault: the records so far go to disk
// (synced, so the crash leaves them there), then the process "crashes".
func (r *restore) crash(f *RestoreFault) error {
	err := r.batch.Commit(pebble.Sync)
	r.batch.Close()
	r.batch = r.s.db.NewIndexedBatch()
	if err != nil {
		return err
	}
	f.Crash(r.s.id, r.records)
	return fmt.Errorf("statedb: shard %s: injected crash during a restore, after %d records", r.s.id, r.records)
}

// Commit writes the new generation's meta, syncs, and switches the
// generation key in one synced write; then drops the old generation.
func (r *restore) Commit(m fsm.Meta) error {
	s := r.s
	if err := r.batch.Set(sub(r.prefix, subMeta), encodeMeta(m, s.pendingApplied), nil); err != nil {
		return err
	}
	if s.partitions > 0 {
		if err := r.batch.Set(sub(r.prefix, subParts), binary.BigEndian.AppendUint32(nil, s.partitions), nil); err != nil {
			return err
		}
	}
	if err := r.batch.Set(genKey(s.id), binary.BigEndian.AppendUint64(nil, r.gen), nil); err != nil {
		return err
	}
	err := r.batch.Commit(pebble.Sync)
	r.batch.Close()
	r.batch = nil
	if err != nil {
		return err
	}
	old := s.prefix
	if s.batch != nil { // nothing may be pending across a restore
		s.batch.Close()
		s.batch = nil
	}
	s.setGen(r.gen)
	s.meta, s.applied = m, s.pendingApplied
	s.setCommittedBytes(m.Bytes)
	// Garbage now. The switch is done, so a failure here is not the
	// restore's: opening the shard drops every other generation again.
	_ = s.db.DeleteRange(old, prefixEnd(old), pebble.NoSync)
	return nil
}

func (r *restore) Abort() {
	if r.batch != nil {
		r.batch.Close()
		r.batch = nil
	}
	// What was written of the new generation goes; opening drops it too.
	r.s.db.DeleteRange(r.prefix, prefixEnd(r.prefix), pebble.NoSync)
}
