package node

import (
	"slices"
	"testing"

	"github.com/idem-dev/idem/topology"
)

// A change's batches start at handoffBatch partitions, at most double
// while the partitions are sparse, shrink to about handoffRecords records
// when they are dense, stay within handoffBatchMin..handoffBatchMax, and a
// new change starts over.
func TestBatchSizerSizesByRecords(t *testing.T) {
	var b batchSizer
	if got := b.size(2); got != handoffBatch {
		t.Fatalf("first batch of a change: %d partitions, want %d", got, handoffBatch)
	}
	b.moved(2, 6, 0) // the last 6 of a pair, empty: the size doubles
	if got := b.size(2); got != 2*handoffBatch {
		t.Fatalf("after a short empty batch: next %d partitions, want %d", got, 2*handoffBatch)
	}
	b = batchSizer{}
	steps := []struct {
		partitions, records, want int
	}{
		{128, 0, 256},                   // empty: doubles
		{256, 10, 512},                  // sparse: at most doubles
		{512, 40, handoffBatchMax},      // never past the most
		{512, 10, handoffBatchMax},      //
		{512, 32768, 128},               // 64 records a partition: 8192/64
		{128, 1 << 20, handoffBatchMin}, // 8192 a partition: never under the least
		{16, 8192, 16},                  // on target: stays
		{3, 0, 32},                      // a short empty batch: double the size
	}
	for _, s := range steps {
		b.moved(2, s.partitions, s.records)
		if got := b.size(2); got != s.want {
			t.Fatalf("after %d records in %d partitions: next batch %d partitions, want %d", s.records, s.partitions, got, s.want)
		}
	}
	if got := b.size(3); got != handoffBatch {
		t.Fatalf("first batch of the next change: %d partitions, want %d", got, handoffBatch)
	}
	b.moved(2, 0, 0) // nothing measured: no change
	if got := b.size(2); got != 32 {
		t.Fatalf("an empty batch changed the size to %d", got)
	}
}

// nextBatch takes up to size partitions not moved yet, all of the first
// (source, destination) pair that has any.
func TestNextBatchTakesSizeOfOnePair(t *testing.T) {
	moves := []topology.Move{{From: "a", To: "b", Partitions: []uint32{1, 2, 3, 4, 5}}, {From: "a", To: "c", Partitions: []uint32{6, 7}}}
	moved := map[uint32]bool{2: true}
	for _, c := range []struct {
		size     int
		src, dst string
		want     []uint32
	}{
		{2, "a", "b", []uint32{1, 3}},
		{10, "a", "b", []uint32{1, 3, 4, 5}},
	} {
		src, dst, batch := nextBatch(moves, moved, c.size)
		if src != c.src || dst != c.dst || !slices.Equal(batch, c.want) {
			t.Fatalf("size %d: %s -> %s %v, want %s -> %s %v", c.size, src, dst, batch, c.src, c.dst, c.want)
		}
	}
	for _, p := range []uint32{1, 3, 4, 5} {
		moved[p] = true
	}
	if src, dst, batch := nextBatch(moves, moved, 10); src != "a" || dst != "c" || !slices.Equal(batch, []uint32{6, 7}) {
		t.Fatalf("after the first pair: %s -> %s %v", src, dst, batch)
	}
	moved[6], moved[7] = true, true
	if _, _, batch := nextBatch(moves, moved, 10); len(batch) != 0 {
		t.Fatalf("all moved, yet a batch %v", batch)
	}
}

// Once every batch is moved, the drop step names each source not yet
// confirmed clean in this change with every partition it handed off, in
// order (a partition command's requirement), whatever its destinations; a
// source marked clean is skipped, and a new change starts over.
func TestDropStepCoversEverySourceOnce(t *testing.T) {
	n := &Node{}
	mv := metaView{target: &topology.Topology{Version: 2}}
	moves := []topology.Move{
		{From: "a", To: "b", Partitions: []uint32{5, 9}},
		{From: "c", To: "b", Partitions: []uint32{1}},
		{From: "a", To: "d", Partitions: []uint32{2, 7}},
	}
	step, ok := n.dropStep(mv, moves)
	if !ok || step.op != "drop" || step.shard != "a" || !slices.Equal(step.partitions, []uint32{2, 5, 7, 9}) {
		t.Fatalf("first drop step: %+v, %v; want a's partitions 2, 5, 7, 9", step, ok)
	}
	n.drops.markClean(2, "a")
	if step, ok = n.dropStep(mv, moves); !ok || step.shard != "c" || !slices.Equal(step.partitions, []uint32{1}) {
		t.Fatalf("after a is clean: %+v, %v; want c's partition 1", step, ok)
	}
	n.drops.markClean(2, "c")
	if step, ok = n.dropStep(mv, moves); ok {
		t.Fatalf("every source clean: still a step %+v", step)
	}
	if step, ok = n.dropStep(metaView{target: &topology.Topology{Version: 3}}, moves); !ok || step.shard != "a" {
		t.Fatalf("the next change: %+v, %v; want a's drop again", step, ok)
	}
}
