package handoff

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/topology"
)

// Batch is the batch of partitions a change moves in one handoff: chosen
// once and recorded in the meta group before its first freeze, so that
// every driver after a failover moves exactly these partitions.
type Batch struct {
	Source, Dest string
	// Partitions are ascending ring partitions, all moving from Source to
	// Dest in the running change.
	Partitions []uint32
	// Attempt is the attempt that moves it now, as the meta group recorded
	// it (its log index there); 0 when none was recorded yet.
	Attempt uint64
}

func (b Batch) String() string {
	return fmt.Sprintf("%d partitions %s -> %s (attempt %d)", len(b.Partitions), b.Source, b.Dest, b.Attempt)
}

// Side is what one group said of the batch's partitions: its partition
// table's entry for each of them (missing, or State "", for one it never
// had).
type Side map[uint32]fsm.PartitionInfo

// Observed is everything a driver decides from, read fresh before each
// decision.
type Observed struct {
	// Epoch is the running change's target version: the epoch its handoff
	// commands carry.
	Epoch uint64
	// Moves are the partitions the change moves (the active ring's Moves
	// to the target ring), Moved those the meta group recorded as moved.
	Moves []topology.Move
	Moved map[uint32]bool
	// Size is how many partitions a new batch should have.
	Size int
	// Batch is the batch the meta group recorded (nil: none yet).
	Batch *Batch
	// Mine is true when Batch.Attempt is an attempt this driver recorded
	// itself and has not spent (an attempt is spent by any failure of its
	// move: a new one is recorded before trying again).
	Mine bool
	// Source and Dest are the two groups' states of Batch's partitions,
	// read from their leaders.
	Source, Dest Side
	// ClockGap is how far apart the two groups' clocks were read, the
	// reading's uncertainty included, and MaxGap the most a move accepts
	// (the cluster's clock-offset bound).
	ClockGap, MaxGap time.Duration
}

// Kind is what a step does.
type Kind int

const (
	// Done: every partition of the change is recorded as moved.
	Done Kind = iota
	// Wait: nothing may be done now (Reason says why); observe again later.
	Wait
	// Choose records Batch in the meta group, with a first attempt.
	Choose
	// Attempt records a new attempt for the recorded batch, which fences
	// every earlier attempt out of the groups' state machines.
	Attempt
	// Move freezes the batch at the source (a no-op for partitions
	// already frozen), copies its records to the destination with the
	// attempt's imports (the first one a Reset) and opens them there with
	// the digest of what was exported.
	Move
	// Record records the batch as moved in the meta group (the
	// destination opened every partition of it at the change's epoch).
	Record
)

var kindNames = [...]string{Done: "done", Wait: "wait", Choose: "choose", Attempt: "attempt", Move: "move", Record: "record"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Step is the next thing a driver does.
type Step struct {
	Kind   Kind
	Batch  Batch
	Reason string // Wait
}

func (s Step) String() string {
	switch s.Kind {
	case Done:
		return "done"
	case Wait:
		return "wait: " + s.Reason
	}
	return s.Kind.String() + " " + s.Batch.String()
}

// Next decides a driver's next step from what it observed. It does no I/O:
// the same observation always gives the same step.
//
// The rules, in order (fsm/DESIGN.md, "Fenced attempts", argues why they
// lose nothing):
//  1. No batch recorded: choose the next one (up to Size partitions of the
//     first source and destination pair with partitions not moved yet), or
//     Done when none is left.
//  2. The destination opened every partition of the batch at the epoch:
//     record it as moved. Opening is one command, so some opened and some
//     not is a broken invariant: wait, loudly.
//  3. The recorded attempt is not this driver's own live one: record a new
//     attempt (a driver that took over, or whose earlier try failed).
//  4. Every source partition is either still served (at an epoch below the
//     change's) or frozen at the epoch towards the destination; any other
//     state is a stale or foreign step's doing: wait.
//  5. The two clocks disagree by more than MaxGap: wait (a lease would end
//     early or late at the destination).
//  6. Otherwise move the batch.
func Next(o Observed) Step {
	if o.Batch == nil {
		b, ok := NextBatch(o.Moves, o.Moved, o.Size)
		if !ok {
			return Step{Kind: Done}
		}
		return Step{Kind: Choose, Batch: b}
	}
	b := *o.Batch
	opened := 0
	for _, p := range b.Partitions {
		if s := o.Dest[p]; s.State == "owned" && s.Epoch == o.Epoch {
			opened++
		}
	}
	switch {
	case opened == len(b.Partitions):
		return Step{Kind: Record, Batch: b}
	case opened > 0:
		return Step{Kind: Wait, Batch: b, Reason: fmt.Sprintf("%s opened %d of the %d partitions of the batch: an open names the whole batch, so this is a bug", b.Dest, opened, len(b.Partitions))}
	}
	if !o.Mine || b.Attempt == 0 {
		return Step{Kind: Attempt, Batch: b}
	}
	for _, p := range b.Partitions {
		s := o.Source[p]
		served := s.State == "owned" && s.Epoch < o.Epoch
		frozen := s.State == "moved" && s.Epoch == o.Epoch && s.Peer == b.Dest
		if !served && !frozen {
			return Step{Kind: Wait, Batch: b, Reason: fmt.Sprintf("%s holds partition %d as %s", b.Source, p, describe(s))}
		}
	}
	if o.ClockGap > o.MaxGap {
		return Step{Kind: Wait, Batch: b, Reason: fmt.Sprintf("the clocks of %s and %s are %s apart, more than the %s a move accepts", b.Source, b.Dest, o.ClockGap, o.MaxGap)}
	}
	return Step{Kind: Move, Batch: b}
}

// describe says what a partition state is, for a wait's reason.
func describe(s fsm.PartitionInfo) string {
	if s.State == "" {
		return "never had"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s at epoch %d", s.State, s.Epoch)
	if s.Peer != "" {
		fmt.Fprintf(&b, " (peer %s)", s.Peer)
	}
	if s.Attempt != 0 {
		fmt.Fprintf(&b, " by attempt %d", s.Attempt)
	}
	return b.String()
}

// NextBatch picks the next batch of partitions to move: up to size of the
// first (source, destination) pair with partitions not moved yet.
func NextBatch(moves []topology.Move, moved map[uint32]bool, size int) (Batch, bool) {
	for _, m := range moves {
		var parts []uint32
		for _, p := range m.Partitions {
			if !moved[p] {
				parts = append(parts, p)
				if len(parts) == size {
					break
				}
			}
		}
		if len(parts) > 0 {
			return Batch{Source: m.From, Dest: m.To, Partitions: parts}, true
		}
	}
	return Batch{}, false
}

// Validate checks that b is a batch of the change whose moves are moves:
// every partition moves from b.Source to b.Dest and is not moved yet. The
// meta group checks a batch with it before recording it.
func (b Batch) Validate(moves []topology.Move, moved map[uint32]bool) error {
	if len(b.Partitions) == 0 || len(b.Partitions) > fsm.MaxHandoffPartitions {
		return fmt.Errorf("handoff: a batch has 1 to %d partitions, not %d", fsm.MaxHandoffPartitions, len(b.Partitions))
	}
	if !slices.IsSorted(b.Partitions) || len(slices.Compact(slices.Clone(b.Partitions))) != len(b.Partitions) {
		return fmt.Errorf("handoff: a batch's partitions are ascending and distinct")
	}
	i := slices.IndexFunc(moves, func(m topology.Move) bool { return m.From == b.Source && m.To == b.Dest })
	if i < 0 {
		return fmt.Errorf("handoff: the change moves no partition from %s to %s", b.Source, b.Dest)
	}
	for _, p := range b.Partitions {
		if _, ok := slices.BinarySearch(moves[i].Partitions, p); !ok {
			return fmt.Errorf("handoff: the change does not move partition %d from %s to %s", p, b.Source, b.Dest)
		}
		if moved[p] {
			return fmt.Errorf("handoff: partition %d is moved already", p)
		}
	}
	return nil
}
