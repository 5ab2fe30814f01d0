package handoff

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/idem-dev/idem/fsm"
)

// worldCluster is one driver actor's Cluster: every call is one atomic
// step of the schedule (turn), and calls to the meta group go through the
// actor's own view (stale and refused while it is deposed).
type worldCluster struct {
	w *world
	a *actor
}

// turn parks the actor until the schedule lets it take its next step.
func (c worldCluster) turn() error {
	c.a.state = parked
	c.w.events <- event{c.a}
	if ok := <-c.a.wake; !ok {
		return errCrashed
	}
	return nil
}

func (c worldCluster) Meta(context.Context) (Meta, bool, error) {
	if err := c.turn(); err != nil {
		return Meta{}, false, err
	}
	m := c.w.meta
	if c.a.stale != nil {
		m = *c.a.stale
	}
	if len(m.moved) == 3 {
		return Meta{}, false, nil // the change activated
	}
	out := Meta{Epoch: epoch, Count: partCount, Moves: c.w.moves, Moved: m.moved, Size: c.w.sc.sizes[c.a.id], Nonce: m.nonce, MaxGap: maxGap}
	if m.batch != nil {
		b := *m.batch
		out.Batch = &b
	}
	return out, true, nil
}

func (c worldCluster) RecordBatch(_ context.Context, _ uint64, b Batch, nonce uint64) error {
	if err := c.turn(); err != nil {
		return err
	}
	w := c.w
	if w.leader != c.a.id || c.a.stale != nil {
		return errNotLeader
	}
	if cur := w.meta.batch; cur != nil && (cur.Source != b.Source || cur.Dest != b.Dest || !slices.Equal(cur.Partitions, b.Partitions)) {
		return fmt.Errorf("explorer: a different batch is recorded")
	}
	if err := b.Validate(w.moves, w.meta.moved); err != nil {
		return err
	}
	w.meta.index++
	b.Attempt = w.meta.index
	w.meta.batch, w.meta.nonce = &b, nonce
	w.logf("d%d records %s", c.a.id, b)
	return nil
}

func (c worldCluster) RecordMoved(_ context.Context, _ uint64, b Batch) error {
	if err := c.turn(); err != nil {
		return err
	}
	w := c.w
	if w.leader != c.a.id || c.a.stale != nil {
		return errNotLeader
	}
	if cur := w.meta.batch; cur == nil || !slices.Equal(cur.Partitions, b.Partitions) {
		return fmt.Errorf("explorer: %v is not the recorded batch", b.Partitions)
	}
	w.meta.index++
	for _, p := range b.Partitions {
		w.meta.moved[p] = true
	}
	w.meta.batch = nil
	w.logf("d%d records %v moved", c.a.id, b.Partitions)
	return nil
}

func (c worldCluster) Read(_ context.Context, shard string, parts []uint32) (Reading, error) {
	if err := c.turn(); err != nil {
		return Reading{}, err
	}
	states := c.w.groups[shard].leader.PartitionStates()
	side := Side{}
	for _, p := range parts {
		side[p] = states[p]
	}
	return Reading{Side: side, Offset: time.Duration(c.w.groups[shard].offset)}, nil
}

// Handoff delivers the command, or loses, delays or duplicates it as the
// schedule says (within the scope's faults).
func (c worldCluster) Handoff(_ context.Context, shard string, op fsm.Op, h fsm.Handoff) (fsm.Result, error) {
	if err := c.turn(); err != nil {
		return fsm.Result{}, err
	}
	w := c.w
	cmd := &fsm.Command{Op: op, Handoff: &h}
	fault := 0
	if w.used.faults < w.sc.faults {
		fault = w.ch.choose(4) // deliver, lose the request, lose the answer, delay (and duplicate)
	}
	switch fault {
	case 1:
		w.used.faults++
		w.logf("d%d %v at %s: request lost", c.a.id, op, shard)
		return fsm.Result{}, errLost
	case 3:
		w.used.faults++
		w.pending = append(w.pending, pendingCmd{shard, cmd})
		w.logf("d%d %v at %s: delayed", c.a.id, op, shard)
		if w.ch.choose(2) == 0 {
			return fsm.Result{}, errLost // the caller times out
		}
		// Delivered now too: the delayed copy is a duplicate.
	}
	r := w.propose(shard, cmd)
	w.logf("d%d %v %v at %s (attempt %d): %v", c.a.id, op, h.Partitions, shard, h.Attempt, r.Outcome)
	if fault == 2 {
		w.used.faults++
		return fsm.Result{}, errLost
	}
	return r, nil
}

// Export reads the frozen partitions' records at once (the leader's state
// after the freeze) and sends them two at a time, the policies first.
func (c worldCluster) Export(ctx context.Context, shard string, count uint32, parts []uint32, send func([][]byte) error) error {
	if err := c.turn(); err != nil {
		return err
	}
	g := c.w.groups[shard].leader
	states := g.PartitionStates()
	for _, p := range parts {
		if states[p].State != "moved" {
			return fmt.Errorf("explorer: %s has not frozen partition %d", shard, p)
		}
	}
	var frames [][]byte
	for _, kr := range g.PolicyRecords() {
		frames = append(frames, fsm.AppendRecord(nil, kr.K, kr.R))
	}
	if err := g.ExportPartitions(count, parts, func(kr fsm.KeyedRecord) bool {
		frames = append(frames, fsm.AppendRecord(nil, kr.K, kr.R))
		return true
	}); err != nil {
		return err
	}
	for chunk := range slices.Chunk(frames, 2) {
		if err := send(chunk); err != nil {
			return err
		}
	}
	return nil
}

func (c worldCluster) Drop(ctx context.Context, shard string, ep uint64, parts []uint32) error {
	r, err := c.Handoff(ctx, shard, fsm.OpDrop, fsm.Handoff{Count: partCount, Partitions: parts, Epoch: ep})
	if err != nil {
		return err
	}
	if r.Outcome != fsm.OutcomeOK {
		return fmt.Errorf("explorer: drop %v", r.Outcome)
	}
	return nil
}
