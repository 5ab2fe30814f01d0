package handoff

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/topology"
)

// Meta is what a driver reads of the meta group for one decision.
type Meta struct {
	// Epoch is the running change's target version; Count the ring's
	// partition count.
	Epoch uint64
	Count uint32
	// Moves and Moved as in Observed; Size the next batch's size.
	Moves []topology.Move
	Moved map[uint32]bool
	Size  int
	// Batch is the recorded batch (nil: none), and Nonce the nonce its
	// attempt was recorded with (a driver knows its own attempts by it).
	Batch *Batch
	Nonce uint64
	// MaxGap is the most two groups' clocks may disagree for a move.
	MaxGap time.Duration
}

// Reading is one group leader's answer about the batch's partitions: their
// states, and its clock as the driver measured it (Offset: the leader's
// quorum time minus the driver's clock at the reading, Uncertainty: what
// the reading cannot tell apart, half its round trip).
type Reading struct {
	Side        Side
	Offset      time.Duration
	Uncertainty time.Duration
}

// Moved is what a move carried: for metrics and logs.
type Moved struct {
	Records int
	Bytes   int64
	// Pause is from the freeze's answer to the open's: how long the
	// batch's keys were served by no group.
	Pause time.Duration
}

// Cluster is what a driver acts on: the meta group (through this node,
// which leads it) and the groups' leaders. Every call may fail, and a call
// that failed may or may not have been applied: the driver never reads
// anything into a failure beyond "observe again".
type Cluster interface {
	// Meta reads the meta group's state; running is false when no change
	// runs.
	Meta(ctx context.Context) (m Meta, running bool, err error)
	// RecordBatch records b (its Source, Dest, Partitions) as the running
	// change's batch with a new attempt tagged nonce: a new batch when
	// none is recorded, a new attempt of the recorded one otherwise.
	RecordBatch(ctx context.Context, epoch uint64, b Batch, nonce uint64) error
	// RecordMoved records b's partitions as moved, which clears the batch.
	RecordMoved(ctx context.Context, epoch uint64, b Batch) error
	// Read asks shard's leader for its partition table's state of parts.
	Read(ctx context.Context, shard string, parts []uint32) (Reading, error)
	// Handoff proposes one partition command to shard's leader.
	Handoff(ctx context.Context, shard string, op fsm.Op, h fsm.Handoff) (fsm.Result, error)
	// Export streams the committed records of frozen partitions from
	// shard's leader, AppendRecord frames in chunks; the first chunk
	// carries the namespace policies (PolicyNamespace records).
	Export(ctx context.Context, shard string, count uint32, parts []uint32, send func(frames [][]byte) error) error
	// Drop deletes shard's copy of partitions recorded as moved.
	Drop(ctx context.Context, shard string, epoch uint64, parts []uint32) error
}

// Driver executes Next's steps on a Cluster. It keeps one thing in memory:
// the nonce of the attempt it recorded last and has not spent. A driver
// that restarts (or another that takes over) has none, and records a new
// attempt before touching a group.
type Driver struct {
	c     Cluster
	nonce func() uint64 // random, never 0
	live  uint64        // the nonce of this driver's unspent attempt; 0: none
	// Importing bounds one import command's records (one Raft entry): an
	// import is sent once its frames pass it.
	importBytes int
}

// NewDriver returns a driver over c; nonce draws attempt nonces (random,
// never 0); importBytes bounds one import command's records.
func NewDriver(c Cluster, nonce func() uint64, importBytes int) *Driver {
	return &Driver{c: c, nonce: nonce, importBytes: importBytes}
}

// Result is what one Step did.
type Result struct {
	Step  Step
	Moved Moved // Record after a Move: what was moved
}

// Step observes, decides (Next) and executes one step. A Move that opened
// the batch goes on to record it and drop the source's copy, so that a
// batch's keys are served again as soon as possible; any failure spends
// the attempt.
func (d *Driver) Step(ctx context.Context) (Result, error) {
	m, running, err := d.c.Meta(ctx)
	if err != nil || !running {
		return Result{Step: Step{Kind: Done}}, err
	}
	o := Observed{Epoch: m.Epoch, Moves: m.Moves, Moved: m.Moved, Size: m.Size, Batch: m.Batch, MaxGap: m.MaxGap}
	if b := m.Batch; b != nil {
		o.Mine = d.live != 0 && m.Nonce == d.live
		src, err := d.c.Read(ctx, b.Source, b.Partitions)
		if err != nil {
			return Result{Step: Step{Kind: Wait, Batch: *b, Reason: err.Error()}}, fmt.Errorf("reading %s: %w", b.Source, err)
		}
		dst, err := d.c.Read(ctx, b.Dest, b.Partitions)
		if err != nil {
			return Result{Step: Step{Kind: Wait, Batch: *b, Reason: err.Error()}}, fmt.Errorf("reading %s: %w", b.Dest, err)
		}
		o.Source, o.Dest = src.Side, dst.Side
		o.ClockGap = (src.Offset - dst.Offset).Abs() + src.Uncertainty + dst.Uncertainty
	}
	step := Next(o)
	res := Result{Step: step}
	switch step.Kind {
	case Done, Wait:
		return res, nil
	case Choose, Attempt:
		d.live = 0
		nonce := d.nonce()
		if err := d.c.RecordBatch(ctx, m.Epoch, step.Batch, nonce); err != nil {
			return res, fmt.Errorf("recording %s: %w", step, err)
		}
		d.live = nonce
		return res, nil
	case Record:
		return res, d.record(ctx, m.Epoch, step.Batch)
	case Move:
		moved, err := d.move(ctx, m, step.Batch)
		if err != nil {
			d.live = 0 // spent: the next try records a new attempt
			return res, err
		}
		res.Step, res.Moved = Step{Kind: Record, Batch: step.Batch}, moved
		return res, d.record(ctx, m.Epoch, step.Batch)
	}
	return res, fmt.Errorf("handoff: unknown step %v", step.Kind)
}

// record records b as moved, then drops the source's copy. A failed drop
// is not the move's failure: the records are garbage, dropped again before
// the change activates.
func (d *Driver) record(ctx context.Context, epoch uint64, b Batch) error {
	if err := d.c.RecordMoved(ctx, epoch, b); err != nil {
		return fmt.Errorf("recording %s as moved: %w", b, err)
	}
	if err := d.c.Drop(ctx, b.Source, epoch, b.Partitions); err != nil {
		return &DropError{Shard: b.Source, Err: err}
	}
	return nil
}

// DropError is a drop at the source that failed after its batch was
// recorded as moved: the move is done, the garbage stays until the change's
// last drop pass.
type DropError struct {
	Shard string
	Err   error
}

func (e *DropError) Error() string {
	return fmt.Sprintf("dropping the moved records at %s: %v", e.Shard, e.Err)
}

func (e *DropError) Unwrap() error { return e.Err }

// errRefused: a group refused a step of this attempt.
var errRefused = errors.New("handoff: refused")

// move freezes b at its source (a no-op for partitions frozen already: the
// answer still gives the floor and the clock), copies the records with
// this attempt's imports, and opens them at the destination with the
// digest of what was exported.
func (d *Driver) move(ctx context.Context, m Meta, b Batch) (Moved, error) {
	var moved Moved
	h := fsm.Handoff{Count: m.Count, Partitions: b.Partitions, Epoch: m.Epoch, Attempt: b.Attempt}
	freeze := h
	freeze.Peer = b.Dest
	fr, err := d.c.Handoff(ctx, b.Source, fsm.OpFreeze, freeze)
	if err != nil {
		return moved, fmt.Errorf("freezing at %s: %w", b.Source, err)
	}
	if fr.Outcome != fsm.OutcomeOK {
		return moved, fmt.Errorf("%w: %s answered the freeze %v (partition at %q, epoch %d)", errRefused, b.Source, fr.Outcome, fr.MovedTo, fr.Epoch)
	}
	start := time.Now()
	var digest fsm.Digest
	imp := h
	imp.Peer, imp.Floor, imp.Clock, imp.Reset = b.Source, fr.FencingToken, fr.Clock, true
	size := 0
	flush := func() error {
		r, err := d.c.Handoff(ctx, b.Dest, fsm.OpImport, imp)
		if err != nil {
			return fmt.Errorf("importing at %s: %w", b.Dest, err)
		}
		if r.Outcome != fsm.OutcomeOK {
			return fmt.Errorf("%w: %s answered an import %v", errRefused, b.Dest, r.Outcome)
		}
		imp.Reset, imp.Records, size = false, nil, 0
		return nil
	}
	err = d.c.Export(ctx, b.Source, m.Count, b.Partitions, func(frames [][]byte) error {
		for _, f := range frames {
			k, r, err := fsm.DecodeRecord(f)
			if err != nil {
				return fmt.Errorf("exported record: %w", err)
			}
			if size > 0 && size+len(f) > d.importBytes {
				if err := flush(); err != nil {
					return err
				}
			}
			imp.Records = append(imp.Records, fsm.KeyedRecord{K: k, R: r})
			size += len(f)
			if k.Namespace != fsm.PolicyNamespace {
				// The destination digests what it decoded, re-encoded:
				// so does the driver, whatever bytes the source sent.
				digest.Add(fsm.AppendRecord(nil, k, r))
				moved.Records++
				moved.Bytes += int64(len(f))
			}
		}
		return nil
	})
	if err == nil && (imp.Reset || len(imp.Records) > 0) {
		err = flush() // the last chunk, or the Reset of a batch with no records
	}
	if err != nil {
		return moved, fmt.Errorf("moving %s: %w", b, err)
	}
	open := h
	open.Peer, open.Expect = b.Source, digest
	or, err := d.c.Handoff(ctx, b.Dest, fsm.OpOpen, open)
	if err != nil {
		return moved, fmt.Errorf("opening at %s: %w", b.Dest, err)
	}
	if or.Outcome != fsm.OutcomeOK {
		return moved, fmt.Errorf("%w: %s answered the open %v", errRefused, b.Dest, or.Outcome)
	}
	moved.Pause = time.Since(start)
	return moved, nil
}
