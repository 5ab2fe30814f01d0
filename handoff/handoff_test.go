package handoff

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/topology"
)

// NextBatch takes up to size partitions not moved yet, all of the first
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
		b, ok := NextBatch(moves, moved, c.size)
		if !ok || b.Source != c.src || b.Dest != c.dst || !slices.Equal(b.Partitions, c.want) {
			t.Fatalf("size %d: %v, want %s -> %s %v", c.size, b, c.src, c.dst, c.want)
		}
		if err := b.Validate(moves, moved); err != nil {
			t.Fatalf("size %d: the batch chosen does not validate: %v", c.size, err)
		}
	}
	for _, p := range []uint32{1, 3, 4, 5} {
		moved[p] = true
	}
	if b, ok := NextBatch(moves, moved, 10); !ok || b.Source != "a" || b.Dest != "c" || !slices.Equal(b.Partitions, []uint32{6, 7}) {
		t.Fatalf("after the first pair: %v", b)
	}
	moved[6], moved[7] = true, true
	if b, ok := NextBatch(moves, moved, 10); ok {
		t.Fatalf("all moved, yet a batch %v", b)
	}
	for _, bad := range []Batch{
		{Source: "a", Dest: "c", Partitions: []uint32{1}},    // not a->c's
		{Source: "a", Dest: "b", Partitions: []uint32{2}},    // moved
		{Source: "a", Dest: "b", Partitions: []uint32{4, 3}}, // not ascending
		{Source: "a", Dest: "b"},                             // empty
	} {
		if err := bad.Validate(moves, map[uint32]bool{2: true}); err == nil {
			t.Errorf("%v validates", bad)
		}
	}
}

// Next's decision for each kind of observation, one rule at a time.
func TestNextDecides(t *testing.T) {
	moves := []topology.Move{{From: "s", To: "t", Partitions: []uint32{1, 2}}}
	batch := &Batch{Source: "s", Dest: "t", Partitions: []uint32{1, 2}, Attempt: 7}
	owned := func(ep uint64) fsm.PartitionInfo { return fsm.PartitionInfo{State: "owned", Epoch: ep} }
	frozen := fsm.PartitionInfo{State: "moved", Epoch: 2, Peer: "t", Attempt: 5}
	incoming := fsm.PartitionInfo{State: "incoming", Epoch: 2, Peer: "s", Attempt: 5}
	base := Observed{Epoch: 2, Moves: moves, Moved: map[uint32]bool{}, Size: 8, Batch: batch, Mine: true,
		Source: Side{1: owned(1), 2: owned(1)}, Dest: Side{}, MaxGap: time.Second}
	for _, c := range []struct {
		name   string
		change func(o *Observed)
		want   Kind
		reason string
	}{
		{"no batch: choose one", func(o *Observed) { o.Batch = nil }, Choose, ""},
		{"no batch, all moved: done", func(o *Observed) { o.Batch, o.Moved = nil, map[uint32]bool{1: true, 2: true} }, Done, ""},
		{"fresh batch, own attempt: move", func(*Observed) {}, Move, ""},
		{"someone else's attempt: a new one", func(o *Observed) { o.Mine = false }, Attempt, ""},
		{"opened everywhere: record, whoever's attempt", func(o *Observed) {
			o.Mine, o.Dest = false, Side{1: owned(2), 2: owned(2)}
		}, Record, ""},
		{"opened at an older epoch is not this change's", func(o *Observed) { o.Dest = Side{1: owned(1), 2: owned(1)} }, Move, ""},
		{"opened in part: a bug, wait", func(o *Observed) { o.Dest = Side{1: owned(2), 2: incoming} }, Wait, "opened 1 of the 2"},
		{"frozen and half imported by another attempt: move (a Reset takes over)", func(o *Observed) {
			o.Source, o.Dest = Side{1: frozen, 2: frozen}, Side{1: incoming, 2: incoming}
		}, Move, ""},
		{"frozen towards another shard: wait", func(o *Observed) {
			f := frozen
			f.Peer = "u"
			o.Source = Side{1: f, 2: frozen}
		}, Wait, "peer u"},
		{"source owns it from this epoch (it came back): wait", func(o *Observed) { o.Source = Side{1: owned(2), 2: owned(1)} }, Wait, "owned at epoch 2"},
		{"source never had it: wait", func(o *Observed) { o.Source = Side{2: owned(1)} }, Wait, "never had"},
		{"clocks apart: wait", func(o *Observed) { o.ClockGap = 2 * time.Second }, Wait, "apart"},
		{"clocks apart, but opened: record", func(o *Observed) { o.ClockGap, o.Dest = 2*time.Second, Side{1: owned(2), 2: owned(2)} }, Record, ""},
	} {
		o := base
		o.Batch = &Batch{}
		*o.Batch = *batch
		c.change(&o)
		got := Next(o)
		if got.Kind != c.want || !strings.Contains(got.Reason, c.reason) {
			t.Errorf("%s: %v, want %v (reason with %q)", c.name, got, c.want, c.reason)
		}
	}
}
