package handoff

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	"github.com/idem-dev/idem/fsm"
)

// The six interleavings a review of the unfenced protocol found, each
// played step by step in the explorer's world (or on the state machines
// directly where the world cannot reach it). Each fails on the protocol
// before fenced attempts; see fsm/DESIGN.md, "Fenced attempts".

// scripted is a world whose steps the test takes by hand.
type scripted struct {
	*world
	t *testing.T
}

func newScripted(t *testing.T, sc scope) scripted {
	if sc.sizes == nil {
		sc.sizes = []int{3, 3}
	}
	sc.drivers = len(sc.sizes)
	w := newWorld(t, sc, &dfsChooser{}, 1, nil, 0)
	w.actors = make([]*actor, sc.drivers)
	for i := range w.actors {
		w.actors[i] = &actor{id: i, wake: make(chan bool), state: finished}
	}
	w.start(w.actors[0])
	return scripted{w, t}
}

// until lets driver d take steps until its last trace line contains what
// (at most 50 steps), checking the invariants after each.
func (s scripted) until(d int, what string) (steps int) {
	s.t.Helper()
	a := s.actors[d]
	for range 50 {
		steps++
		if a.state != parked {
			s.t.Fatalf("d%d stopped before %q:\n  %s", d, what, strings.Join(s.trace, "\n  "))
		}
		n := len(s.trace)
		s.resume(a, true)
		s.steps++
		s.check()
		report(s.t, s.world, "the script")
		if len(s.trace) > n && strings.Contains(s.trace[len(s.trace)-1], what) {
			return steps
		}
	}
	s.t.Fatalf("d%d never did %q:\n  %s", d, what, strings.Join(s.trace, "\n  "))
	return steps
}

// failover makes d the meta group's leader; the old one keeps its view.
func (s scripted) failover(d int) {
	old := s.actors[s.leader]
	stale := s.meta.clone()
	old.stale = &stale
	s.leader = d
	s.actors[d].stale = nil
	s.logf("d%d leads; d%d is deposed", d, old.id)
	if s.actors[d].state == finished {
		s.start(s.actors[d])
	}
}

// crash stops driver d where it is and restarts it with no memory.
func (s scripted) crash(d int) {
	s.logf("d%d crashes", d)
	s.resume(s.actors[d], false)
	s.start(s.actors[d])
}

// finishChange lets the leader finish (deposed drivers stopped) and runs
// the end checks.
func (s scripted) finishChange() {
	s.t.Helper()
	s.sc.steps = 0
	s.run2end()
	report(s.t, s.world, "the script")
}

// 1. A driver that takes over after its predecessor opened a batch (but
// died before recording it) moves exactly the recorded batch, though its
// own batch size would have picked a larger one: no partition is frozen
// and then dropped without having been copied.
func TestRegressionRetriedBatchIsTheRecordedOne(t *testing.T) {
	s := newScripted(t, scope{sizes: []int{1, 3}})
	s.until(0, "records 1 partitions")
	s.until(0, "open")
	s.failover(1) // d0 opened [1] and is deposed before recording it
	s.until(1, "records [1] moved")
	s.finishChange()
	for p := range uint32(partCount) {
		if p > 0 && !s.meta.moved[p] {
			t.Fatalf("partition %d not moved", p)
		}
	}
}

// 2. A deposed driver goes on with its attempt while the new leader's
// attempt resets the same import: its late imports and its open are
// refused, so the destination never opens with part of the records.
func TestRegressionDeposedDriverCannotOpenAPartialImport(t *testing.T) {
	// A first run finds how many steps d0 takes to its open; the second
	// stops it right before, with every chunk imported.
	probe := newScripted(t, scope{sizes: []int{3, 3}})
	steps := probe.until(0, "open")
	s := newScripted(t, scope{sizes: []int{3, 3}})
	for range steps - 1 {
		s.resume(s.actors[0], true)
		s.check()
	}
	s.failover(1)        // d0 is cut from the meta group
	s.until(1, "import") // d1's Reset wipes d0's chunks
	s.until(0, "open")   // d0 opens what it imported: refused
	if !strings.Contains(s.trace[len(s.trace)-1], "FAILED_PRECONDITION") {
		t.Fatalf("the deposed driver's open was not refused: %s", s.trace[len(s.trace)-1])
	}
	s.finishChange()
}

// 3. The same log applied with different apply-batch cuts gives the same
// state: a Reset import that follows an earlier import of the same
// partitions within one batch drops what that import wrote, as a replica
// that committed in between does.
func TestRegressionRepeatedResetSameStateWhateverTheCuts(t *testing.T) {
	db := openDB(t)
	rec := func(k string) fsm.KeyedRecord {
		return fsm.KeyedRecord{K: fsm.RecordKey{Namespace: "ns", Key: k}, R: &fsm.Record{State: fsm.StateCompleted, FencingToken: 3, ExpiresAt: 1 << 62,
			Response: &fsm.Response{Status: 200, Body: []byte(k)}}}
	}
	var keys []fsm.KeyedRecord
	for i := 0; len(keys) < 2; i++ {
		k := rec("r" + string(rune('a'+i)))
		if fsm.PartitionOf("ns", k.K.Key, partCount) == 1 {
			keys = append(keys, k)
		}
	}
	h := func(attempt uint64, records ...fsm.KeyedRecord) *fsm.Command {
		return &fsm.Command{Op: fsm.OpImport, Handoff: &fsm.Handoff{Count: partCount, Partitions: []uint32{1}, Epoch: epoch, Peer: "s",
			Reset: true, Attempt: attempt, Records: records}}
	}
	log := []*fsm.Command{
		{Op: fsm.OpAdopt, Handoff: &fsm.Handoff{Count: partCount, Epoch: 1}},
		h(1, keys...),     // the first attempt imports two records
		h(2, keys[0]),     // the next starts over with one
		h(3, keys[:1]...), // and another, the same
	}
	var states [][]byte
	for i, cut := range [][]int{{1, 2, 3, 4}, {4}, {1, 4}, {2, 4}} {
		sm, err := db.Shard("t" + string(rune('0'+i)))
		if err != nil {
			t.Fatal(err)
		}
		for idx, c := range log {
			sm.FSM().Apply(uint64(idx+1), c)
			for _, at := range cut {
				if at == idx+1 {
					if err := sm.CommitApplied(uint64(idx + 1)); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		var b bytes.Buffer
		if _, err := sm.FSM().Snapshot().WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		states = append(states, b.Bytes())
		if n := sm.FSM().Stats().Records; n != 1 {
			t.Errorf("cuts %v: %d records after the last Reset imported one", cut, n)
		}
	}
	for i := range states {
		if !bytes.Equal(states[i], states[0]) {
			t.Fatalf("replica %d's state differs from replica 0's after the same log", i)
		}
	}
}

// 4. Time moves with the keys: a key the source answered EXPIRED is not
// COMPLETED again at a destination whose clock is behind (within the
// bound a move accepts).
func TestRegressionExpiredKeyStaysExpiredAtABehindDestination(t *testing.T) {
	s := newScripted(t, scope{sizes: []int{3}})
	s.groups["t"].offset = -int64(maxGap) * 4 / 5
	var short fsm.RecordKey // a key of a moving partition completed with a 30 s retention
	for _, k := range s.keyList {
		if a := s.keys[k]; a.retention == 30*sec && fsm.PartitionOf(k.Namespace, k.Key, partCount) != 0 {
			short = k
			break
		}
	}
	s.trueNow = s.keys[short].completeAt + 30*sec // its retention ends now
	s.reserve(short, "o9", 20*sec)                // the source says so
	report(t, s.world, "the probe at the source")
	if !s.keys[short].goneAfter {
		t.Fatalf("the source still replays %s after its retention", short.Key)
	}
	s.finishChange()
	s.reserve(short, "o8", 20*sec) // now at the destination
	report(t, s.world, "the probe at the destination")
}

// 5. A freeze of an earlier change that arrives late does not strand a
// partition that moved away and came back since.
func TestRegressionStaleFreezeRefused(t *testing.T) {
	a, b := fsm.New(), fsm.New()
	idx := map[*fsm.FSM]uint64{}
	apply := func(f *fsm.FSM, op fsm.Op, h fsm.Handoff) fsm.Result {
		idx[f]++
		return f.Apply(idx[f], &fsm.Command{Op: op, Handoff: &h})
	}
	move := func(src, dst *fsm.FSM, srcID, dstID string, ep, attempt uint64) {
		t.Helper()
		p := []uint32{1}
		fr := apply(src, fsm.OpFreeze, fsm.Handoff{Count: partCount, Partitions: p, Epoch: ep, Peer: dstID, Attempt: attempt})
		ir := apply(dst, fsm.OpImport, fsm.Handoff{Count: partCount, Partitions: p, Epoch: ep, Peer: srcID, Attempt: attempt, Reset: true, Floor: fr.FencingToken})
		or := apply(dst, fsm.OpOpen, fsm.Handoff{Count: partCount, Partitions: p, Epoch: ep, Peer: srcID, Attempt: attempt})
		if fr.Outcome != fsm.OutcomeOK || ir.Outcome != fsm.OutcomeOK || or.Outcome != fsm.OutcomeOK {
			t.Fatalf("move at epoch %d: %v %v %v", ep, fr.Outcome, ir.Outcome, or.Outcome)
		}
	}
	apply(a, fsm.OpAdopt, fsm.Handoff{Count: partCount, Partitions: []uint32{0, 1, 2, 3}, Epoch: 1})
	apply(b, fsm.OpAdopt, fsm.Handoff{Count: partCount, Epoch: 1})
	move(a, b, "a", "b", 2, 10)
	move(b, a, "b", "a", 3, 20)
	late := apply(a, fsm.OpFreeze, fsm.Handoff{Count: partCount, Partitions: []uint32{1}, Epoch: 2, Peer: "b", Attempt: 10})
	if late.Outcome == fsm.OutcomeOK {
		t.Fatal("a freeze of epoch 2 was applied to a partition owned since epoch 3")
	}
	var k string
	for i := 0; k == ""; i++ {
		if c := "k" + string(rune('a'+i)); fsm.PartitionOf("ns", c, partCount) == 1 {
			k = c
		}
	}
	if owned, _, _ := a.Owns("ns", k); !owned {
		t.Fatal("the partition is served by no group")
	}
}

// 6. A read checks ownership and reads the record in one view: while a
// partition moves away and is dropped, a read of a completed key answers
// the record or "moved", never "not found".
func TestRegressionReadDuringMoveNeverNotFound(t *testing.T) {
	f := fsm.New()
	var idx uint64
	apply := func(cmd *fsm.Command) fsm.Result { idx++; return f.Apply(idx, cmd) }
	apply(&fsm.Command{Op: fsm.OpAdopt, Handoff: &fsm.Handoff{Count: partCount, Partitions: []uint32{0, 1, 2, 3}, Epoch: 1}})
	var keys []string
	for i := 0; len(keys) < 50; i++ {
		k := "key" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26))
		apply(&fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: k, OwnerToken: "o", Lease: longLease, Now: 1000 * sec})
		apply(&fsm.Command{Op: fsm.OpComplete, Namespace: "ns", Key: k, OwnerToken: "o", Retention: longLease, Now: 1000 * sec,
			Response: &fsm.Response{Status: 200}})
		keys = append(keys, k)
	}
	var mu sync.Mutex // the FSM has one writer
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() {
		defer close(done)
		for ep := uint64(2); ep < 300; ep++ {
			mu.Lock()
			apply(&fsm.Command{Op: fsm.OpFreeze, Handoff: &fsm.Handoff{Count: partCount, Partitions: []uint32{1}, Epoch: ep, Peer: "t", Attempt: ep}})
			apply(&fsm.Command{Op: fsm.OpDrop, Handoff: &fsm.Handoff{Count: partCount, Partitions: []uint32{1}, Epoch: ep, Attempt: ep}})
			// ... and back, with the records (as a return move brings them).
			var recs []fsm.KeyedRecord
			for _, k := range keys {
				if fsm.PartitionOf("ns", k, partCount) == 1 {
					recs = append(recs, fsm.KeyedRecord{K: fsm.RecordKey{Namespace: "ns", Key: k}, R: &fsm.Record{State: fsm.StateCompleted,
						ExpiresAt: 1 << 62, Response: &fsm.Response{Status: 200}}})
				}
			}
			ep++
			apply(&fsm.Command{Op: fsm.OpImport, Handoff: &fsm.Handoff{Count: partCount, Partitions: []uint32{1}, Epoch: ep, Peer: "t", Attempt: ep, Reset: true, Records: recs}})
			var d fsm.Digest
			for _, kr := range recs {
				d.Add(fsm.AppendRecord(nil, kr.K, kr.R))
			}
			apply(&fsm.Command{Op: fsm.OpOpen, Handoff: &fsm.Handoff{Count: partCount, Partitions: []uint32{1}, Epoch: ep, Peer: "t", Attempt: ep, Expect: d}})
			mu.Unlock()
		}
	})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				for _, k := range keys {
					if _, found, owned, _, _ := f.Read("ns", k, 1000*sec); owned && !found {
						t.Errorf("%s: owned but not found", k)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}
