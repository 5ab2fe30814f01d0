package statedb

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"

	"github.com/idem-dev/idem/fsm"

	"github.com/idem-dev/idem/internal/testutil"
)

// Partitions move back and forth between two shards under a random
// workload; the disk store answers, exports, counts and snapshots exactly
// as the in-memory one, across restarts.
func TestDiskHandoffMatchesMemory(t *testing.T) {
	for _, indexed := range []bool{true, false} {
		t.Run(fmt.Sprintf("indexed=%v", indexed), func(t *testing.T) { diskHandoffMatchesMemory(t, indexed) })
	}
}

// diskHandoffMatchesMemory runs the comparison with the disk store's
// partition index (indexed: the DB knows the partition count; restarts then
// alternate with and without it, so the index is dropped and rebuilt) or
// without it.
func diskHandoffMatchesMemory(t *testing.T, indexed bool) {
	const count = 16
	rng := testutil.Rand(testutil.Seed(t), 3)
	dir := t.TempDir()
	open := func(partitions uint32) *DB {
		t.Helper()
		db, err := Open(Config{Dir: dir, CacheBytes: 8 << 20, PartitionCount: partitions})
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	partitions := uint32(0)
	if indexed {
		partitions = count
	}
	db := open(partitions)
	defer func() { db.Close() }()
	ids := []string{"s1", "s2"}
	disk := []*StateMachine{openShard(t, db, "s1"), openShard(t, db, "s2")}
	mem := []*fsm.FSM{fsm.New(), fsm.New()}
	index := []uint64{0, 0}
	owner := make([]int, count) // partition -> index of the shard that serves it
	now := int64(1000) * sec
	epoch := uint64(1)

	batch := make([][]string, 2) // the commands of each shard's open batch
	commit := func(s int) {
		t.Helper()
		index[s]++ // a configuration or no-op entry the FSM never sees
		if err := disk[s].CommitApplied(index[s]); err != nil {
			t.Fatal(err)
		}
		if w, g := snapshotBytes(t, mem[s]), snapshotBytes(t, disk[s].FSM()); !bytes.Equal(w, g) {
			t.Fatalf("shard %s index %d: disk and memory state differ after the batch %q", ids[s], index[s], batch[s])
		}
		batch[s] = nil
	}
	// apply applies cmd to both stores of shard s; the disk store's batch
	// is committed at random points, as Raft's apply batches fall.
	apply := func(s int, cmd *fsm.Command) fsm.Result {
		t.Helper()
		index[s]++
		batch[s] = append(batch[s], fmt.Sprintf("%v %s/%s", cmd.Op, cmd.Namespace, cmd.Key))
		want := mem[s].Apply(index[s], cmd)
		got := disk[s].FSM().Apply(index[s], cmd)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("shard %s index %d %v: disk %+v, memory %+v", ids[s], index[s], cmd.Op, got, want)
		}
		if rng.IntN(3) == 0 {
			commit(s)
		}
		return got
	}
	all := make([]uint32, count)
	for p := range all {
		all[p] = uint32(p)
	}
	apply(0, &fsm.Command{Op: fsm.OpAdopt, Now: now, Handoff: &fsm.Handoff{Count: count, Partitions: all}})
	apply(1, &fsm.Command{Op: fsm.OpAdopt, Now: now, Handoff: &fsm.Handoff{Count: count}})
	moved := 0
	for round := range 40 {
		for range 1 + rng.IntN(40) {
			now += int64(rng.IntN(3)) * sec
			cmd := randomCommand(rng, now)
			s := 0
			if cmd.Key != "" {
				s = owner[fsm.PartitionOf(cmd.Namespace, cmd.Key, count)]
			} else if rng.IntN(2) == 0 {
				s = 1
			}
			if cmd.Op == fsm.OpSetPolicy {
				apply(1-s, cmd) // policies go to every shard
			}
			if r := apply(s, cmd); r.Outcome == fsm.OutcomeMoved {
				t.Fatalf("round %d: %v of %s at the shard that serves it: MOVED", round, cmd.Op, cmd.Key)
			}
		}
		// Move some partitions of one shard to the other.
		src := rng.IntN(2)
		dst := 1 - src
		var parts []uint32
		for p := range uint32(count) {
			if owner[p] == src && rng.IntN(3) == 0 {
				parts = append(parts, p)
			}
		}
		if len(parts) == 0 {
			continue
		}
		epoch++
		h := fsm.Handoff{Count: count, Partitions: parts, Epoch: epoch, Peer: ids[dst]}
		fr := apply(src, &fsm.Command{Op: fsm.OpFreeze, Now: now, Handoff: &h})
		if fr.Outcome != fsm.OutcomeOK {
			t.Fatalf("round %d: freeze %+v", round, fr)
		}
		// Sweeps go on at the source while the partitions move (they may
		// shrink frozen records, never add any). The export reads
		// committed state: the freeze's answer comes after its batch is.
		for range rng.IntN(6) {
			now += sec
			apply(src, &fsm.Command{Op: fsm.OpSweep, Now: now, MaxSweep: 2, AbandonAfter: 10 * sec})
		}
		commit(src)
		var fromDisk, fromMem []fsm.KeyedRecord
		collect := func(out *[]fsm.KeyedRecord) func(fsm.KeyedRecord) bool {
			return func(kr fsm.KeyedRecord) bool { *out = append(*out, kr); return true }
		}
		if err := disk[src].FSM().ExportPartitions(count, parts, collect(&fromDisk)); err != nil {
			t.Fatal(err)
		}
		if err := mem[src].ExportPartitions(count, parts, collect(&fromMem)); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fromDisk, fromMem) {
			t.Fatalf("round %d: exports differ: disk %d records, memory %d", round, len(fromDisk), len(fromMem))
		}
		moved += len(fromDisk)
		batch := 1 + rng.IntN(4)
		for first := true; first || len(fromDisk) > 0; first = false {
			n := min(batch, len(fromDisk))
			ih := fsm.Handoff{Count: count, Partitions: parts, Epoch: epoch, Peer: ids[src], Floor: fr.FencingToken, Reset: first, Records: fromDisk[:n]}
			if r := apply(dst, &fsm.Command{Op: fsm.OpImport, Now: now, Handoff: &ih}); r.Outcome != fsm.OutcomeOK {
				t.Fatalf("round %d: import %+v", round, r)
			}
			fromDisk = fromDisk[n:]
		}
		oh := fsm.Handoff{Count: count, Partitions: parts, Epoch: epoch, Peer: ids[src]}
		if r := apply(dst, &fsm.Command{Op: fsm.OpOpen, Now: now, Handoff: &oh}); r.Outcome != fsm.OutcomeOK {
			t.Fatalf("round %d: open %+v", round, r)
		}
		for _, p := range parts {
			owner[p] = dst
		}
		for {
			dh := fsm.Handoff{Count: count, Partitions: parts, Epoch: epoch, Limit: 2}
			r := apply(src, &fsm.Command{Op: fsm.OpDrop, Now: now, Handoff: &dh})
			if r.Outcome != fsm.OutcomeOK {
				t.Fatalf("round %d: drop %+v", round, r)
			}
			if r.Swept < 2 {
				break
			}
		}
		for s := range disk {
			commit(s)
			if ws, gs := mem[s].Stats(), disk[s].FSM().Stats(); ws != gs {
				t.Fatalf("round %d shard %s: stats disk %+v, memory %+v", round, ids[s], gs, ws)
			}
			if w, g := snapshotBytes(t, mem[s]), snapshotBytes(t, disk[s].FSM()); !bytes.Equal(w, g) {
				t.Fatalf("round %d shard %s: snapshots differ", round, ids[s])
			}
		}
		if rng.IntN(4) == 0 { // restart: the partition tables come back with the records
			db.Close()
			if indexed && rng.IntN(2) == 0 {
				db = open(0) // drops the index; the next indexed open rebuilds it
				db.Close()
			}
			db = open(partitions)
			disk = []*StateMachine{openShard(t, db, "s1"), openShard(t, db, "s2")}
			for s := range disk {
				wc, wl := mem[s].Partitions()
				gc, gl := disk[s].FSM().Partitions()
				if wc != gc || !reflect.DeepEqual(wl, gl) || mem[s].LastToken() != disk[s].FSM().LastToken() {
					t.Fatalf("round %d: shard %s's partition table after a restart differs", round, ids[s])
				}
			}
		}
	}
	if moved == 0 {
		t.Fatal("no record moved: the test moved nothing")
	}
	// A restored shard (a snapshot installed on a replica) finds the same
	// records by partition.
	var snap bytes.Buffer
	sn := mem[0].Snapshot()
	_, err := sn.WriteTo(&snap)
	sn.Release()
	if err != nil {
		t.Fatal(err)
	}
	restored := openShard(t, db, "s3")
	if err := restored.RestoreApplied(&snap, index[0]); err != nil {
		t.Fatal(err)
	}
	var want, got []fsm.KeyedRecord
	mem[0].ExportPartitions(count, all, func(kr fsm.KeyedRecord) bool { want = append(want, kr); return true })
	restored.FSM().ExportPartitions(count, all, func(kr fsm.KeyedRecord) bool { got = append(got, kr); return true })
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("restored shard exports %d records, memory %d", len(got), len(want))
	}
	t.Logf("%d records moved", moved)
}
