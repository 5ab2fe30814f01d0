package node

import (
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
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

// A drop step that fails holds the change up for a source that goes on
// serving (not marked clean: the mover takes it again), and not for one
// the change removes (logged, marked clean: its records stay parked).
func TestDropStepFailureHoldsOnlyServingSources(t *testing.T) {
	file := func(version, shards int) json.RawMessage { return regionFile(t, version, shards) }
	for _, c := range []struct {
		from, to int
		shard    string
		stays    bool
	}{{2, 4, "r1-0", true}, {4, 2, "r1-2", false}} {
		n := &Node{meta: newMetaSM(), rings: &ringCache{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		for i, cmd := range []metaCommand{{Op: "init", Topology: file(1, c.from)}, {Op: "target", Topology: file(2, c.to), At: 1}} {
			data, err := json.Marshal(cmd)
			if err != nil {
				t.Fatal(err)
			}
			if res := n.meta.Apply(uint64(i+1), data); res != nil {
				t.Fatalf("meta %s: %v", cmd.Op, res)
			}
		}
		mv, _ := n.meta.read()
		from, to, err := n.rings.rings(mv)
		if err != nil {
			t.Fatal(err)
		}
		step, ok := n.dropStep(mv, from.Moves(to))
		if !ok || step.shard != c.shard {
			t.Fatalf("%d -> %d shards: first drop step %s (%v), want one at %s", c.from, c.to, step, ok, c.shard)
		}
		if _, ok := mv.target.ShardByID(c.shard); ok != c.stays {
			t.Fatalf("%s: in the target %v, want %v", c.shard, ok, c.stays)
		}
		n.dropFaults.Store(1)
		err = n.dropSteps(t.Context(), step)
		clean := n.drops.isClean(mv.target.EffectiveVersion(), c.shard)
		if c.stays && (err == nil || clean) {
			t.Fatalf("a failed drop at %s, which goes on serving: %v, clean %v; want the error and not clean", c.shard, err, clean)
		}
		if !c.stays && (err != nil || !clean) {
			t.Fatalf("a failed drop at %s, which the change removes: %v, clean %v; want no error and clean", c.shard, err, clean)
		}
	}
}

// regionFile is a one-region, three-node topology document at version with
// shards per region, as the meta group stores it.
func regionFile(t *testing.T, version, shards int) json.RawMessage {
	t.Helper()
	var b strings.Builder
	b.WriteString("cluster: drops\nversion: " + strconv.Itoa(version) + "\nshards_per_region: " + strconv.Itoa(shards) + "\nreplicas: 3\nregions:\n  - name: r1\n    nodes:\n")
	for i := 1; i <= 3; i++ {
		n := strconv.Itoa(i)
		b.WriteString("      - {id: r1-" + n + ", raft_addr: 127.0.0.1:700" + n + ", grpc_addr: 127.0.0.1:710" + n + ", http_addr: 127.0.0.1:810" + n + "}\n")
	}
	topo, err := topology.Parse([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(topo)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// The meta group records one batch at a time: a new one only when none is
// recorded, the same one again as a new attempt (a higher attempt id, the
// entry's index), a different one refused while the recorded one is not
// moved; recording it moved clears it, and so do activate and a new target.
func TestMetaRecordsOneBatchAtATime(t *testing.T) {
	m := newMetaSM()
	index := uint64(0)
	apply := func(cmd metaCommand) error {
		t.Helper()
		data, err := json.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		index++
		if res := m.Apply(index, data); res != nil {
			return res.(error)
		}
		return nil
	}
	must := func(cmd metaCommand) {
		t.Helper()
		if err := apply(cmd); err != nil {
			t.Fatalf("%s: %v", cmd.Op, err)
		}
	}
	batch := func(parts []uint32, nonce uint64) metaCommand {
		return metaCommand{Op: "batch", Version: 2, Source: "r1-0", Dest: "r1-2", Partitions: parts, Nonce: nonce}
	}
	must(metaCommand{Op: "init", Topology: regionFile(t, 1, 2)})
	if err := apply(batch([]uint32{1, 2}, 7)); err == nil {
		t.Fatal("a batch was recorded with no change running")
	}
	must(metaCommand{Op: "target", Topology: regionFile(t, 2, 4), At: 1})
	must(batch([]uint32{1, 2}, 7))
	mv, _ := m.read()
	first := mv.batch
	if first == nil || first.Attempt != index || first.Nonce != 7 || !slices.Equal(first.Partitions, []uint32{1, 2}) {
		t.Fatalf("recorded %+v, want partitions 1, 2 by nonce 7 at attempt %d", first, index)
	}
	if err := apply(batch([]uint32{1, 2, 3}, 8)); err == nil {
		t.Fatal("a larger batch replaced the recorded one")
	}
	for _, bad := range []metaCommand{batch([]uint32{2, 1}, 8), batch(nil, 8), batch([]uint32{1, 2}, 0), {Op: "batch", Version: 3, Source: "r1-0", Dest: "r1-2", Partitions: []uint32{1, 2}, Nonce: 8}} {
		if err := apply(bad); err == nil {
			t.Fatalf("recorded %+v", bad)
		}
	}
	must(batch([]uint32{1, 2}, 9)) // a driver that took over: a new attempt of the same batch
	if mv, _ = m.read(); mv.batch.Attempt <= first.Attempt || mv.batch.Nonce != 9 {
		t.Fatalf("a new attempt of the batch: %+v, want an attempt above %d by nonce 9", mv.batch, first.Attempt)
	}
	must(metaCommand{Op: "moved", Version: 2, Partitions: []uint32{1, 2}})
	if mv, _ = m.read(); mv.batch != nil || !mv.moved[1] || !mv.moved[2] {
		t.Fatalf("after moved: batch %+v, moved %v", mv.batch, mv.moved)
	}
	if err := apply(batch([]uint32{2, 3}, 10)); err == nil {
		t.Fatal("a batch with a moved partition was recorded")
	}
	must(batch([]uint32{3}, 10))
	must(metaCommand{Op: "activate", Version: 2})
	if mv, _ = m.read(); mv.batch != nil {
		t.Fatalf("the batch outlived its change: %+v", mv.batch)
	}
}
