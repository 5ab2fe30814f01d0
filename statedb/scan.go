package statedb

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idem-dev/idem/fsm"
)

// Scan implements fsm.Store over the committed state: one pebble iterator
// (a consistent point-in-time view) over the namespace's records, which
// are stored in key order, starting just after after. Its cost is the
// records fn is given, not the shard's size.
func (s *ShardStore) Scan(namespace, after string, fn func(string, *fsm.Record) bool) error {
	nsPrefix := appendEscaped(append([]byte(nil), s.recPrefix...), namespace)
	nsPrefix = append(nsPrefix, 0, 1)
	start := appendEscaped(append([]byte(nil), nsPrefix...), after)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: prefixEnd(nsPrefix)})
	if err != nil {
		return fmt.Errorf("statedb: shard %s: scan: %w", s.id, err)
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		if after != "" && bytes.Equal(it.Key(), start) {
			continue
		}
		val, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("statedb: shard %s: scan: %w", s.id, err)
		}
		k, rec, err := fsm.DecodeRecord(val)
		if err != nil {
			return fmt.Errorf("statedb: shard %s: stored record does not decode: %w", s.id, err)
		}
		if !fn(k.Key, rec) {
			return nil
		}
	}
	return it.Error()
}

// ScanInProgress implements fsm.Store: the lease index of a snapshot of
// the committed state, in lease-end order, each record read from the same
// snapshot.
func (s *ShardStore) ScanInProgress(fn func(fsm.RecordKey, *fsm.Record) bool) error {
	snap := s.db.NewSnapshot()
	defer snap.Close()
	leasePrefix, recPrefix := s.leasePrefix, s.recPrefix
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: leasePrefix, UpperBound: prefixEnd(leasePrefix)})
	if err != nil {
		return fmt.Errorf("statedb: shard %s: lease scan: %w", s.id, err)
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		raw := it.Key()[len(leasePrefix)+8:] // after the lease end time
		k, err := decodeKey(raw)
		if err != nil {
			return fmt.Errorf("statedb: shard %s: lease index: %w", s.id, err)
		}
		val, closer, err := snap.Get(append(append([]byte(nil), recPrefix...), raw...))
		if err == pebble.ErrNotFound {
			continue // an index entry without its record would be a bug; skip it here
		}
		if err != nil {
			return fmt.Errorf("statedb: shard %s: lease scan: %w", s.id, err)
		}
		_, rec, err := fsm.DecodeRecord(val)
		closer.Close()
		if err != nil {
			return fmt.Errorf("statedb: shard %s: stored record does not decode: %w", s.id, err)
		}
		if !fn(k, rec) {
			return nil
		}
	}
	return it.Error()
}
