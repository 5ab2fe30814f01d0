package topology

import (
	"cmp"
	"slices"
)

// Keys change shard as whole ring partitions (package keyspace places a
// key in one; the ring maps partitions to shards). When the shard set
// changes (shards_per_region, regions added or removed) the rings of the
// old and the new topology differ in some partitions' owners: those
// partitions move, each from one shard to another, while both rings place
// every other key alike. A cluster in the middle of such a change places
// keys with a blend of the two (Blend).

// Move is a set of partitions that change shard together.
type Move struct {
	From, To   string
	Partitions []uint32
}

// PartitionCount is the ring's number of partitions.
func (r *Ring) PartitionCount() uint32 { return uint32(len(r.partitions)) }

// PartitionOwner returns the shard that owns partition p.
func (r *Ring) PartitionOwner(p uint32) Shard { return r.shards[r.partitions[p]] }

// PartitionsOf returns the partitions shard id owns, ascending (none for a
// shard the ring does not have).
func (r *Ring) PartitionsOf(id string) []uint32 {
	idx, ok := r.byID[id]
	if !ok {
		return nil
	}
	var out []uint32
	for p, owner := range r.partitions {
		if owner == uint32(idx) {
			out = append(out, uint32(p))
		}
	}
	return out
}

// Moves returns the partitions whose owning shard differs between r and
// next (rings of the same cluster and ring parameters), grouped by (from,
// to) pair: pairs ordered by from then to, partitions ascending.
func (r *Ring) Moves(next *Ring) []Move {
	if r.layout != next.layout {
		return nil
	}
	byPair := map[[2]string]*Move{}
	for p := range r.partitions {
		from, to := r.PartitionOwner(uint32(p)).ID, next.PartitionOwner(uint32(p)).ID
		if from == to {
			continue
		}
		m := byPair[[2]string{from, to}]
		if m == nil {
			m = &Move{From: from, To: to}
			byPair[[2]string{from, to}] = m
		}
		m.Partitions = append(m.Partitions, uint32(p))
	}
	out := make([]Move, 0, len(byPair))
	for _, m := range byPair {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b Move) int { return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To)) })
	return out
}

// MovedShares returns the share of partitions (so of keys, which spread
// evenly over partitions) whose shard differs between r and next, and the
// share whose home region differs.
func (r *Ring) MovedShares(next *Ring) (shard, region float64) {
	if r.layout != next.layout {
		return 1, 1
	}
	var ns, nr int
	for p := range r.partitions {
		a, b := r.PartitionOwner(uint32(p)), next.PartitionOwner(uint32(p))
		if a.ID != b.ID {
			ns++
		}
		if a.HomeRegion != b.HomeRegion {
			nr++
		}
	}
	n := float64(len(r.partitions))
	return float64(ns) / n, float64(nr) / n
}

// Blend returns a ring that places partition p as next does when moved(p)
// and as r does otherwise: the placement of a cluster part way through a
// change from r to next. Its shards are r's (with r's voters), then those
// only next has (with next's voters), so ShardByID finds every shard of
// either ring. r and next must share the cluster and ring parameters
// (LayoutFingerprint); Blend returns r otherwise.
func (r *Ring) Blend(next *Ring, moved func(p uint32) bool) *Ring {
	if r.layout != next.layout {
		return r
	}
	b := *r
	b.shards = slices.Clone(r.shards)
	b.byID = make(map[string]int, len(r.shards)+len(next.shards))
	for i, s := range b.shards {
		b.byID[s.ID] = i
	}
	for _, s := range next.shards {
		if _, ok := b.byID[s.ID]; !ok {
			b.byID[s.ID] = len(b.shards)
			b.shards = append(b.shards, s)
		}
	}
	b.partitions = slices.Clone(r.partitions)
	for p := range b.partitions {
		if moved(uint32(p)) {
			b.partitions[p] = uint32(b.byID[next.PartitionOwner(uint32(p)).ID])
		}
	}
	b.fingerprint = fingerprintOf(b.cluster, b.config, b.shards)
	return &b
}
