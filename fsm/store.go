package fsm

import (
	"container/heap"
	"math"
	"sort"
	"strings"
)

// RecordKey names one record.
type RecordKey struct {
	Namespace string
	Key       string
}

func (k RecordKey) less(o RecordKey) bool {
	if c := strings.Compare(k.Namespace, o.Namespace); c != 0 {
		return c < 0
	}
	return k.Key < o.Key
}

// Meta is what the FSM keeps besides its records: its clock, the last index
// it applied, and its record counts. A Store keeps it with the records (a
// disk store writes it in the same engine batch), so it is never recomputed
// by a scan.
type Meta struct {
	// Clock is the highest command time applied (Unix nanoseconds).
	Clock int64
	// LastIndex is the highest fencing-token slot issued (FSM.tokenSlot):
	// the log index of the last entry applied until the first packed entry,
	// packed-mode slots after it (entryOf gives their log index).
	LastIndex uint64
	// InProgress, Completed and Tombstones count the records by state;
	// Policies the records that are not a key's (the namespace policies,
	// StatePolicy, and the partition table, StatePartitions).
	InProgress, Completed, Tombstones, Policies int64
	// Bytes approximates the records' size (RecordBytes).
	Bytes int64
}

// Store holds the records of one shard, the two indexes the sweep needs (by
// end of retention, by end of lease) and the FSM's Meta. The FSM is its only
// writer and treats stored *Record values as immutable: a change stores a
// new Record.
//
// Two implementations: NewMemStore (tests, the idemtest server) and the
// disk-backed store of package statedb, which keeps nothing in memory that
// grows with the retained state.
type Store interface {
	// Get returns the record at k as the writer sees it (changes of the
	// batch being applied included). Called only by the writer.
	Get(k RecordKey) (*Record, bool)
	// Lookup returns the record at k as readers see it (what has been
	// applied and committed). Safe concurrently with the writer.
	Lookup(k RecordKey) (*Record, bool)
	// Scan visits the committed records of namespace with keys greater
	// than after, in key order, from one consistent view, until fn returns
	// false. Safe concurrently with the writer.
	Scan(namespace, after string, fn func(key string, r *Record) bool) error
	// ScanInProgress visits committed IN_PROGRESS records, in the order of
	// their lease ends (earliest first), until fn returns false. Safe
	// concurrently with the writer.
	ScanInProgress(fn func(k RecordKey, r *Record) bool) error
	// ScanPartitions visits the committed records of the given ring
	// partitions (count partitions in the ring; PartitionOf), partition by
	// partition in ascending order and each in (namespace, key) order,
	// until fn returns false. Records of reserved namespaces (policies, the
	// partition table) belong to no partition. Safe concurrently with the
	// writer.
	ScanPartitions(count uint32, partitions []uint32, fn func(k RecordKey, r *Record) bool) error
	// PartitionKeys returns up to limit (0: all) keys of records of the
	// partitions as the writer sees them (the batch being applied
	// included), in ScanPartitions' order. Called only by the writer.
	PartitionKeys(count uint32, partitions []uint32, limit int) []RecordKey
	// Put replaces old (nil when absent) at k with rec (nil deletes) and
	// keeps the indexes in step.
	Put(k RecordKey, old, rec *Record)
	// Expired returns up to limit (0: no bound) COMPLETED and EXPIRED
	// records with ExpiresAt <= at, in (ExpiresAt, key) order, as the writer
	// sees them. The sweep turns each into a tombstone or deletes it (Put).
	Expired(at int64, limit int) []KeyedRecord
	// DropLeasesEnded does the same for IN_PROGRESS records with
	// LeaseExpiresAt <= at, in (LeaseExpiresAt, key) order.
	DropLeasesEnded(at int64, limit int) (n int, bytes int64)
	// Meta returns the Meta last set (or stored, for a reopened store).
	Meta() Meta
	// SetMeta records m; it is stored with the records it describes.
	SetMeta(m Meta)
	// View captures the committed state for a snapshot, cheaply; it is read
	// later, concurrently with further writes.
	View() StoreView
	// BeginRestore starts filling a fresh, empty keyspace; the store's
	// current state is untouched until StoreRestore.Commit.
	BeginRestore() StoreRestore
}

// StoreView is a consistent, read-only view of a Store.
type StoreView interface {
	Meta() Meta
	// Len is the number of records in the view.
	Len() int
	// Frames calls fn with every record encoded by AppendRecord, in
	// (namespace, key) order, until fn returns an error, which it returns.
	Frames(fn func(frame []byte) error) error
	// Release frees the view; always called.
	Release()
}

// StoreRestore is a keyspace being filled by Restore.
type StoreRestore interface {
	// Has reports whether k was already put.
	Has(k RecordKey) (bool, error)
	Put(k RecordKey, r *Record) error
	// Commit makes the restored records (with m) the store's state,
	// atomically: before it returns the old state is intact, after it the
	// new one is complete.
	Commit(m Meta) error
	// Abort drops what was put; the old state stays.
	Abort()
}

// NewMemStore returns an empty in-memory Store.
func NewMemStore() Store {
	return &memStore{m: make(map[RecordKey]*Record), inProgress: make(map[RecordKey]struct{})}
}

// memStore keeps everything in maps: fine for tests and small test servers,
// which is all it is used for.
type memStore struct {
	m          map[RecordKey]*Record
	meta       Meta
	inProgress map[RecordKey]struct{}
	expiry     expiryHeap
}

func (s *memStore) Get(k RecordKey) (*Record, bool)    { r, ok := s.m[k]; return r, ok }
func (s *memStore) Lookup(k RecordKey) (*Record, bool) { return s.Get(k) }
func (s *memStore) Meta() Meta                         { return s.meta }
func (s *memStore) SetMeta(m Meta)                     { s.meta = m }

func (s *memStore) Put(k RecordKey, old, rec *Record) {
	if old != nil && old.State == StateInProgress {
		delete(s.inProgress, k)
	}
	if rec == nil {
		delete(s.m, k)
		return
	}
	s.m[k] = rec
	s.index(k, rec)
}

func (s *memStore) index(k RecordKey, rec *Record) {
	switch rec.State {
	case StateInProgress:
		s.inProgress[k] = struct{}{}
	case StateCompleted, StateExpired:
		heap.Push(&s.expiry, expiryEntry{at: rec.ExpiresAt, k: k})
	}
}

func (s *memStore) Expired(at int64, limit int) []KeyedRecord {
	var out []KeyedRecord
	for len(s.expiry) > 0 && s.expiry[0].at <= at && (limit == 0 || len(out) < limit) {
		e := heap.Pop(&s.expiry).(expiryEntry)
		rec, ok := s.m[e.k]
		if !ok || (rec.State != StateCompleted && rec.State != StateExpired) || rec.ExpiresAt != e.at {
			continue // stale entry: the record changed since
		}
		if len(out) > 0 && out[len(out)-1].K == e.k {
			// A second entry for the same record: it was deleted and put
			// back unchanged (a partition that moved away and back).
			continue
		}
		out = append(out, KeyedRecord{e.k, rec})
	}
	return out
}

func (s *memStore) DropLeasesEnded(at int64, limit int) (n int, bytes int64) {
	for _, k := range s.leasesEnded(at, limit) {
		bytes += RecordBytes(k, s.m[k])
		delete(s.m, k)
		delete(s.inProgress, k)
		n++
	}
	return n, bytes
}

func (s *memStore) leasesEnded(at int64, limit int) []RecordKey {
	var ended []expiryEntry
	for k := range s.inProgress {
		if r := s.m[k]; r.LeaseExpiresAt <= at {
			ended = append(ended, expiryEntry{at: r.LeaseExpiresAt, k: k})
		}
	}
	sort.Sort(expiryHeap(ended))
	if limit > 0 && len(ended) > limit {
		ended = ended[:limit]
	}
	keys := make([]RecordKey, len(ended))
	for i, e := range ended {
		keys[i] = e.k
	}
	return keys
}

// Scan sorts the namespace's keys on every call: the in-memory store serves
// tests and small servers; the disk store scans its ordered keyspace.
func (s *memStore) Scan(namespace, after string, fn func(string, *Record) bool) error {
	var keys []string
	for k := range s.m {
		if k.Namespace == namespace && k.Key > after {
			keys = append(keys, k.Key)
		}
	}
	sort.Strings(keys)
	for _, key := range keys {
		if !fn(key, s.m[RecordKey{namespace, key}]) {
			break
		}
	}
	return nil
}

func (s *memStore) ScanPartitions(count uint32, partitions []uint32, fn func(RecordKey, *Record) bool) error {
	for _, k := range s.PartitionKeys(count, partitions, 0) {
		if !fn(k, s.m[k]) {
			break
		}
	}
	return nil
}

// PartitionKeys is ScanPartitions' order of keys: the in-memory store has
// no batches, so the writer's view and the committed one are the same.
func (s *memStore) PartitionKeys(count uint32, partitions []uint32, limit int) []RecordKey {
	want := make(map[uint32]bool, len(partitions))
	for _, p := range partitions {
		want[p] = true
	}
	var keys []RecordKey
	for k := range s.m {
		if k.Namespace[0] != '!' && want[PartitionOf(k.Namespace, k.Key, count)] {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if pi, pj := PartitionOf(keys[i].Namespace, keys[i].Key, count), PartitionOf(keys[j].Namespace, keys[j].Key, count); pi != pj {
			return pi < pj
		}
		return keys[i].less(keys[j])
	})
	if limit > 0 && len(keys) > limit {
		keys = keys[:limit]
	}
	return keys
}

func (s *memStore) ScanInProgress(fn func(RecordKey, *Record) bool) error {
	for _, k := range s.leasesEnded(math.MaxInt64, 0) {
		if !fn(k, s.m[k]) {
			break
		}
	}
	return nil
}

func (s *memStore) View() StoreView {
	v := &memView{meta: s.meta, entries: make([]KeyedRecord, 0, len(s.m))}
	for k, r := range s.m {
		v.entries = append(v.entries, KeyedRecord{k, r})
	}
	return v
}

func (s *memStore) BeginRestore() StoreRestore {
	return &memRestore{s: s, fresh: NewMemStore().(*memStore)}
}

// KeyedRecord is a record with its key.
type KeyedRecord struct {
	K RecordKey
	R *Record
}

// memView holds pointers to the (immutable) records; sorting and encoding
// happen in Frames, outside the FSM's lock.
type memView struct {
	meta    Meta
	entries []KeyedRecord
}

func (v *memView) Meta() Meta { return v.meta }
func (v *memView) Len() int   { return len(v.entries) }
func (v *memView) Release()   { v.entries = nil }
func (v *memView) Frames(fn func([]byte) error) error {
	sort.Slice(v.entries, func(i, j int) bool { return v.entries[i].K.less(v.entries[j].K) })
	var frame []byte
	for _, e := range v.entries {
		frame = AppendRecord(frame[:0], e.K, e.R)
		if err := fn(frame); err != nil {
			return err
		}
	}
	return nil
}

type memRestore struct {
	s     *memStore
	fresh *memStore
}

func (r *memRestore) Has(k RecordKey) (bool, error) { _, ok := r.fresh.m[k]; return ok, nil }
func (r *memRestore) Put(k RecordKey, rec *Record) error {
	r.fresh.m[k] = rec
	r.fresh.index(k, rec)
	return nil
}
func (r *memRestore) Commit(m Meta) error {
	r.fresh.meta = m
	*r.s = *r.fresh
	return nil
}
func (r *memRestore) Abort() { r.fresh = nil }

// expiryHeap orders completed records by (ExpiresAt, key): a total order, so
// a bounded sweep drops the same records on every replica however the heap
// was built. Entries go stale when their record changes; Expired skips them.
type expiryHeap []expiryEntry

type expiryEntry struct {
	at int64
	k  RecordKey
}

func (h expiryHeap) Len() int { return len(h) }
func (h expiryHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].k.less(h[j].k)
}
func (h expiryHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)   { *h = append(*h, x.(expiryEntry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
