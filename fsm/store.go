package fsm

import (
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

// Store holds the records of one shard. The FSM is its only writer and
// treats stored *Record values as immutable: a change stores a new Record,
// so a snapshot may keep pointers to the old ones while Apply goes on.
//
// The in-memory store is the one in use; the interface is the seam for a
// disk-backed store that bounds retained state by disk rather than RAM.
type Store interface {
	Get(k RecordKey) (*Record, bool)
	Put(k RecordKey, r *Record)
	Delete(k RecordKey)
	Len() int
	// Range visits every record, in no particular order, until fn returns false.
	Range(fn func(k RecordKey, r *Record) bool)
	// Scan visits the records of namespace with keys greater than after,
	// in key order, until fn returns false.
	Scan(namespace, after string, fn func(key string, r *Record) bool)
}

// NewMemStore returns an empty in-memory Store.
func NewMemStore() Store { return &memStore{m: make(map[RecordKey]*Record)} }

type memStore struct{ m map[RecordKey]*Record }

func (s *memStore) Get(k RecordKey) (*Record, bool) { r, ok := s.m[k]; return r, ok }
func (s *memStore) Put(k RecordKey, r *Record)      { s.m[k] = r }
func (s *memStore) Delete(k RecordKey)              { delete(s.m, k) }
func (s *memStore) Len() int                        { return len(s.m) }
func (s *memStore) Range(fn func(RecordKey, *Record) bool) {
	for k, r := range s.m {
		if !fn(k, r) {
			return
		}
	}
}

// Scan sorts the namespace's keys on every call: the in-memory store serves
// tests and small servers; a disk store scans its ordered keyspace.
func (s *memStore) Scan(namespace, after string, fn func(string, *Record) bool) {
	var keys []string
	for k := range s.m {
		if k.Namespace == namespace && k.Key > after {
			keys = append(keys, k.Key)
		}
	}
	sort.Strings(keys)
	for _, key := range keys {
		if !fn(key, s.m[RecordKey{namespace, key}]) {
			return
		}
	}
}

type keyedRecord struct {
	k RecordKey
	r *Record
}

// sortedRecords returns the store's records in (namespace, key) order: the
// order of snapshots, so that equal states give equal bytes.
func sortedRecords(entries []keyedRecord) []keyedRecord {
	sort.Slice(entries, func(i, j int) bool { return entries[i].k.less(entries[j].k) })
	return entries
}

// expiryHeap orders completed records by (ExpiresAt, key): a total order, so
// a bounded sweep drops the same records on every replica however the heap
// was built. Entries go stale when their record changes; sweep skips them.
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
