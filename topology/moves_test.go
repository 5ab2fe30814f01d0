package topology

import (
	"fmt"
	"testing"
)

// Moves names exactly the partitions whose owner differs, and a blend
// places each key by the old ring until its partition moved, by the new one
// after.
func TestMovesAndBlend(t *testing.T) {
	old := genTopology(regionNames(2), 3, 2, 3, SurvivalZone)
	next := old.Clone()
	next.Version = 2
	next.ShardsPerRegion = 4
	from, to := mustRing(t, old), mustRing(t, next)
	moves := from.Moves(to)
	moving := map[uint32]Move{}
	for _, m := range moves {
		for _, p := range m.Partitions {
			if _, dup := moving[p]; dup {
				t.Fatalf("partition %d in two moves", p)
			}
			moving[p] = m
		}
	}
	for p := range from.PartitionCount() {
		m, ok := moving[p]
		a, b := from.PartitionOwner(p).ID, to.PartitionOwner(p).ID
		if ok != (a != b) || (ok && (m.From != a || m.To != b)) {
			t.Fatalf("partition %d: owners %s -> %s, move %+v (listed %v)", p, a, b, m, ok)
		}
	}
	if len(moving) == 0 {
		t.Fatal("growing from 4 to 8 shards moved nothing")
	}
	half := func(p uint32) bool { return p%2 == 0 }
	blend := from.Blend(to, half)
	for i := range 5000 {
		ns, key := "ns", fmt.Sprint("k", i)
		p := from.Partition(ns, key)
		want := from.Locate(ns, key).ID
		if half(p) {
			want = to.Locate(ns, key).ID
		}
		if got := blend.Locate(ns, key).ID; got != want {
			t.Fatalf("%s: blend places it on %s, want %s", key, got, want)
		}
	}
	for _, s := range to.Shards() {
		if got, ok := blend.ShardByID(s.ID); !ok || len(got.Voters) == 0 {
			t.Fatalf("blend lacks the new shard %s", s.ID)
		}
	}
	if all := from.Blend(to, func(uint32) bool { return true }); all.PartitionsOf("r0-3") == nil {
		t.Fatal("a blend with every partition moved gives the new shards nothing")
	}
	if from.LayoutFingerprint() != to.LayoutFingerprint() {
		t.Fatal("a shard-set change changed the layout fingerprint (cluster and ring parameters)")
	}
}
