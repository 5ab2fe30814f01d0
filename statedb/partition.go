package statedb

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idem-dev/idem/fsm"
)

// The partition index: with Config.PartitionCount set, every record of a
// key (not the policies and the partition table, in '!' namespaces) has an
// empty index key 'p' partition(4) key, so the records of the ring
// partitions a topology change moves are read partition by partition
// instead of by a pass over the whole shard. Put keeps it in step as keys
// appear and disappear, the lease sweep's blind deletes drop their index
// keys, and a restore writes it with the records. The marker 'P' count(4)
// says the index is complete for that count; a shard opened without it (a
// data dir of a release without the index, or a count that changed) gets
// its index built once, before the marker is written; a shard opened
// without a count drops index and marker (nothing would keep them in step).

// appendPartKey appends k's partition index key under prefix to dst, or is
// nil when the shard keeps no index or k is not a key's record.
func (s *ShardStore) appendPartKey(dst, prefix []byte, k fsm.RecordKey) []byte {
	if s.partitions == 0 || k.Namespace == "" || k.Namespace[0] == '!' {
		return nil
	}
	if dst == nil {
		dst = make([]byte, 0, len(prefix)+4+len(k.Namespace)+len(k.Key)+4)
	}
	b := binary.BigEndian.AppendUint32(append(dst, prefix...), fsm.PartitionOf(k.Namespace, k.Key, s.partitions))
	return appendKey(b, k)
}

// indexPartition adds (add) or removes k's partition index key in the
// writer's batch.
func (s *ShardStore) indexPartition(b *pebble.Batch, k fsm.RecordKey, add bool) {
	pk := s.appendPartKey(s.partBuf[:0], s.partPrefix, k)
	if pk == nil {
		return
	}
	s.partBuf = pk
	if add {
		s.fail(b.Set(pk, nil, nil))
	} else {
		s.fail(b.Delete(pk, nil))
	}
}

// indexPartitions builds the partition index when the shard's marker does
// not say it is complete for s.partitions (called when the shard opens).
func (s *ShardStore) indexPartitions() error {
	marker := sub(s.prefix, subParts)
	if s.partitions == 0 {
		// Without a count nothing keeps an index in step: one left by an
		// earlier run goes, so that it is rebuilt, not trusted, later.
		b := s.db.NewBatch()
		defer b.Close()
		if err := errors.Join(b.Delete(marker, nil), b.DeleteRange(s.partPrefix, prefixEnd(s.partPrefix), nil)); err != nil {
			return err
		}
		if err := b.Commit(pebble.Sync); err != nil {
			return fmt.Errorf("statedb: shard %s: dropping the partition index: %w", s.id, err)
		}
		return nil
	}
	v, closer, err := s.db.Get(marker)
	switch {
	case err == nil:
		complete := len(v) == 4 && binary.BigEndian.Uint32(v) == s.partitions
		closer.Close()
		if complete {
			return nil
		}
	case !errors.Is(err, pebble.ErrNotFound):
		return fmt.Errorf("statedb: shard %s: partition index marker: %w", s.id, err)
	}
	b := s.db.NewBatch()
	defer func() { b.Close() }()
	if err := b.DeleteRange(s.partPrefix, prefixEnd(s.partPrefix), nil); err != nil {
		return err
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: s.recPrefix, UpperBound: prefixEnd(s.recPrefix)})
	if err != nil {
		return fmt.Errorf("statedb: shard %s: building the partition index: %w", s.id, err)
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		k, err := decodeKey(it.Key()[len(s.recPrefix):])
		if err != nil {
			return fmt.Errorf("statedb: shard %s: building the partition index: %w", s.id, err)
		}
		if pk := s.appendPartKey(nil, s.partPrefix, k); pk != nil {
			if err := b.Set(pk, nil, nil); err != nil {
				return err
			}
		}
		if b.Len() >= restoreBatchBytes {
			if err := b.Commit(pebble.NoSync); err != nil {
				return fmt.Errorf("statedb: shard %s: building the partition index: %w", s.id, err)
			}
			b.Close()
			b = s.db.NewBatch()
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("statedb: shard %s: building the partition index: %w", s.id, err)
	}
	if err := b.Set(marker, binary.BigEndian.AppendUint32(nil, s.partitions), nil); err != nil {
		return err
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("statedb: shard %s: building the partition index: %w", s.id, err)
	}
	return nil
}

// ScanPartitions implements fsm.Store: the committed records of the
// partitions, partition by partition in ascending order, each in key order.
// With the partition index (count being the shard's), it reads only those
// records; otherwise one pass over the shard's keys finds them (the
// partition computed from each key), and they are visited in the same
// order.
func (s *ShardStore) ScanPartitions(count uint32, partitions []uint32, fn func(fsm.RecordKey, *fsm.Record) bool) error {
	parts := slices.Clone(partitions)
	slices.Sort(parts)
	snap := s.db.NewSnapshot()
	defer snap.Close()
	visit := func(k fsm.RecordKey) (bool, error) {
		val, closer, err := snap.Get(s.recKey(k))
		if errors.Is(err, pebble.ErrNotFound) {
			return true, nil // an index key without its record would be a bug; skip it here
		}
		if err != nil {
			return false, err
		}
		_, rec, err := fsm.DecodeRecord(val)
		closer.Close()
		if err != nil {
			return false, fmt.Errorf("stored record does not decode: %w", err)
		}
		return fn(k, rec), nil
	}
	if s.partitions > 0 && count == s.partitions {
		for _, p := range parts {
			prefix := binary.BigEndian.AppendUint32(bytes.Clone(s.partPrefix), p)
			it, err := snap.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
			if err != nil {
				return fmt.Errorf("statedb: shard %s: partition scan: %w", s.id, err)
			}
			for ok := it.First(); ok; ok = it.Next() {
				k, err := decodeKey(it.Key()[len(prefix):])
				if err == nil {
					var more bool
					if more, err = visit(k); err == nil && !more {
						return it.Close()
					}
				}
				if err != nil {
					it.Close()
					return fmt.Errorf("statedb: shard %s: partition scan: %w", s.id, err)
				}
			}
			if err := errors.Join(it.Error(), it.Close()); err != nil {
				return fmt.Errorf("statedb: shard %s: partition scan: %w", s.id, err)
			}
		}
		return nil
	}
	// No index for this count: one pass over the keys, the matches sorted
	// by partition (keys only: a batch's share of a shard).
	want := make(map[uint32]bool, len(parts))
	for _, p := range parts {
		want[p] = true
	}
	type match struct {
		p uint32
		k fsm.RecordKey
	}
	var matches []match
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: s.recPrefix, UpperBound: prefixEnd(s.recPrefix)})
	if err != nil {
		return fmt.Errorf("statedb: shard %s: partition scan: %w", s.id, err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k, err := decodeKey(it.Key()[len(s.recPrefix):])
		if err != nil {
			it.Close()
			return fmt.Errorf("statedb: shard %s: partition scan: %w", s.id, err)
		}
		if k.Namespace == "" || k.Namespace[0] == '!' {
			continue
		}
		if p := fsm.PartitionOf(k.Namespace, k.Key, count); want[p] {
			matches = append(matches, match{p, k})
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fmt.Errorf("statedb: shard %s: partition scan: %w", s.id, err)
	}
	slices.SortStableFunc(matches, func(a, b match) int { return int(a.p) - int(b.p) })
	for _, m := range matches {
		more, err := visit(m.k)
		if err != nil {
			return fmt.Errorf("statedb: shard %s: partition scan: %w", s.id, err)
		}
		if !more {
			return nil
		}
	}
	return nil
}

// PartitionKeys implements fsm.Store: the keys of the partitions' records
// as the writer sees them, through the batch in progress (an indexed batch
// reads its own writes over the committed state), in ScanPartitions' order.
func (s *ShardStore) PartitionKeys(count uint32, partitions []uint32, limit int) []fsm.RecordKey {
	parts := slices.Clone(partitions)
	slices.Sort(parts)
	b := s.wb()
	var keys []fsm.RecordKey
	full := func() bool { return limit > 0 && len(keys) >= limit }
	scan := func(lower []byte, each func(key []byte) bool) {
		it, err := b.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(lower)})
		if err != nil {
			panic(fmt.Sprintf("statedb: shard %s: partition keys: %v", s.id, err))
		}
		for ok := it.First(); ok && each(it.Key()[len(lower):]); ok = it.Next() {
		}
		if err := errors.Join(it.Error(), it.Close()); err != nil {
			panic(fmt.Sprintf("statedb: shard %s: partition keys: %v", s.id, err))
		}
	}
	decode := func(raw []byte) fsm.RecordKey {
		k, err := decodeKey(raw)
		if err != nil {
			panic(fmt.Sprintf("statedb: shard %s: partition keys: %v", s.id, err))
		}
		return k
	}
	if s.partitions > 0 && count == s.partitions {
		for _, p := range parts {
			if full() {
				break
			}
			scan(binary.BigEndian.AppendUint32(bytes.Clone(s.partPrefix), p), func(raw []byte) bool {
				keys = append(keys, decode(raw))
				return !full()
			})
		}
		return keys
	}
	want := make(map[uint32]bool, len(parts))
	for _, p := range parts {
		want[p] = true
	}
	type match struct {
		p uint32
		k fsm.RecordKey
	}
	var matches []match
	scan(s.recPrefix, func(raw []byte) bool {
		k := decode(raw)
		if k.Namespace != "" && k.Namespace[0] != '!' {
			if p := fsm.PartitionOf(k.Namespace, k.Key, count); want[p] {
				matches = append(matches, match{p, k})
			}
		}
		return true
	})
	slices.SortStableFunc(matches, func(a, b match) int { return int(a.p) - int(b.p) })
	for _, m := range matches {
		if full() {
			break
		}
		keys = append(keys, m.k)
	}
	return keys
}
