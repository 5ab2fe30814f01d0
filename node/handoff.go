package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"go.opentelemetry.io/otel/trace"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/handoff"
	"github.com/idem-dev/idem/internal/tracing"
	"github.com/idem-dev/idem/topology"
)

// Keys that change shard (a changed shards_per_region, regions added or
// removed) move as whole ring partitions, by the state machine's handoff
// commands (fsm/DESIGN.md, "Partitions and handoff" and "Fenced
// attempts"). The mover drives it once every shard of the target has its
// voters: each group that gives or takes partitions adopts a partition
// table, then batches of partitions move from their active shard to their
// target shard. Package handoff decides each batch's steps from what the
// meta group and the two groups' leaders say (record the batch, record an
// attempt, freeze + copy + open, record it as moved, drop); this file is
// the node's side: the Cluster those steps act on. Nodes place keys with a
// blend of the active and the target ring (view.placer): a moved partition
// by the target's.

const (
	// A batch's keys pause (answered 503 with Retry-After) from its freeze
	// to its open: a few Raft rounds, the copy of its records, and a part
	// that grows with its partitions; on top of it each batch pays a
	// meta-group round and a drop. So batches are sized by records, within
	// bounds on partitions (batchSizer): a change's first batch has
	// handoffBatch partitions (at 1M keys and 16,411 partitions, about
	// 7,800 records), later ones as many as should hold about
	// handoffRecords records by the density the last batch measured,
	// between handoffBatchMin and handoffBatchMax partitions and at most
	// twice the last size. A sparse ring then moves in a few large
	// batches rather than dozens of 128-partition ones that each pay the
	// rounds, and a dense one in batches that keep the copy short. The
	// most is 512: in the process tests a batch's pause grew with its
	// partitions (p50 40-50 ms at 128, ~127 ms at 512, 74-117 ms at 2,048
	// with two to three times the 503s), while 512 kept the 503s of 128.
	handoffBatch    = 128
	handoffBatchMin = 16
	handoffBatchMax = 512
	handoffRecords  = 8192
	// importBytes bounds one import command's records (one Raft entry); a
	// single larger record goes alone.
	importBytes = 1 << 20
	// dropLimit is how many records one drop command deletes.
	dropLimit = 2000
	// handoffStepTime is how long one mover step goes on moving batches.
	handoffStepTime = 2 * time.Second
)

// handoffOp maps the RPC's op names to the state machine's.
var handoffOp = map[string]fsm.Op{"adopt": fsm.OpAdopt, "freeze": fsm.OpFreeze, "import": fsm.OpImport, "open": fsm.OpOpen, "drop": fsm.OpDrop}

// handoffOpName is the RPC's name of op.
func handoffOpName(op fsm.Op) string {
	for name, o := range handoffOp {
		if o == op {
			return name
		}
	}
	return ""
}

// outcomeNamed is the outcome whose String is name (0 for none).
func outcomeNamed(name string) fsm.Outcome {
	for o := fsm.Outcome(1); o <= fsm.OutcomeMoved; o++ {
		if o.String() == name {
			return o
		}
	}
	return 0
}

// handoffLocal proposes a partition command to this node's replica of
// shard id, which must lead. Handoff commands carry no time (Now 0): they
// neither need one nor move the shard's clock.
func (n *Node) handoffLocal(ctx context.Context, id string, op fsm.Op, h fsm.Handoff) (fsm.Result, error) {
	s := n.shard(id)
	if s == nil {
		return fsm.Result{}, status.Errorf(codes.FailedPrecondition, "node %s does not host %s", n.cfg.NodeID, id)
	}
	if !s.group.IsLeader() {
		leader, _ := s.group.Leader()
		return fsm.Result{}, status.Errorf(codes.FailedPrecondition, "node %s does not lead %s (leader %q)", n.cfg.NodeID, id, leader)
	}
	out, err := s.group.Apply(ctx, fsm.EncodeCommand(&fsm.Command{Op: op, Handoff: &h}))
	if err != nil {
		return fsm.Result{}, status.Errorf(codes.Unavailable, "shard %s: %v", id, err)
	}
	res, ok := out.(fsm.Result)
	if !ok {
		return fsm.Result{}, fmt.Errorf("node: shard %s returned %T", id, out)
	}
	return res, nil
}

// Handoff implements the Topology service's Handoff: one partition
// command on the shard this node leads.
func (t *topologyService) Handoff(ctx context.Context, req *idemv1.HandoffRequest) (*idemv1.HandoffResponse, error) {
	if err := t.n.driverPeer(ctx, "Handoff"); err != nil {
		return nil, err
	}
	op, ok := handoffOp[req.GetOp()]
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "unknown handoff op %q", req.GetOp())
	}
	h := fsm.Handoff{Count: req.GetPartitionCount(), Partitions: req.GetPartitions(), Epoch: req.GetEpoch(), Peer: req.GetPeer(),
		Floor: req.GetFloor(), Reset: req.GetResetPartitions(), Limit: int(req.GetLimit()), Attempt: req.GetAttempt(), Clock: req.GetClock(),
		Expect: fsm.Digest{Records: req.GetExpectRecords(), Sum: req.GetExpectSum()}}
	for _, frame := range req.GetRecords() {
		k, r, err := fsm.DecodeRecord(frame)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "record: %v", err)
		}
		h.Records = append(h.Records, fsm.KeyedRecord{K: k, R: r})
	}
	res, err := t.n.handoffLocal(ctx, req.GetShard(), op, h)
	if err != nil {
		return nil, err
	}
	return handoffResponse(res), nil
}

func handoffResponse(res fsm.Result) *idemv1.HandoffResponse {
	return &idemv1.HandoffResponse{Outcome: res.Outcome.String(), FencingToken: res.FencingToken, Swept: int64(res.Swept), MovedTo: res.MovedTo, Epoch: res.Epoch,
		Clock: res.Clock}
}

// ExportPartitions implements the Topology service's ExportPartitions: the
// records of partitions the shard this node leads has frozen, after a read
// barrier (a leader elected after the freeze has applied it).
func (t *topologyService) ExportPartitions(req *idemv1.ExportPartitionsRequest, stream idemv1.Topology_ExportPartitionsServer) error {
	ctx := stream.Context()
	if err := t.n.driverPeer(ctx, "ExportPartitions"); err != nil {
		return err
	}
	return t.n.exportLocal(ctx, req.GetShard(), req.GetPartitionCount(), req.GetPartitions(), func(frames [][]byte) error {
		return stream.Send(&idemv1.ExportPartitionsChunk{Records: frames})
	})
}

// exportLocal sends the records of frozen partitions of shard id, which
// this node leads, in chunks of about importBytes; the first chunk also
// carries the shard's namespace policies.
func (n *Node) exportLocal(ctx context.Context, id string, count uint32, parts []uint32, send func([][]byte) error) error {
	s := n.shard(id)
	if s == nil {
		return status.Errorf(codes.FailedPrecondition, "node %s does not host %s", n.cfg.NodeID, id)
	}
	if err := s.group.ReadBarrier(ctx); err != nil {
		return status.Errorf(codes.FailedPrecondition, "shard %s: %v", id, err)
	}
	states := s.fsm.PartitionStates()
	for _, p := range parts {
		if states[p].State != "moved" {
			return status.Errorf(codes.FailedPrecondition, "shard %s has not frozen partition %d (%q)", id, p, states[p].State)
		}
	}
	var chunk [][]byte
	size := 0
	for _, kr := range s.fsm.PolicyRecords() {
		chunk = append(chunk, fsm.AppendRecord(nil, kr.K, kr.R))
	}
	var sendErr error
	err := s.fsm.ExportPartitions(count, parts, func(kr fsm.KeyedRecord) bool {
		frame := fsm.AppendRecord(nil, kr.K, kr.R)
		if size > 0 && size+len(frame) > importBytes {
			if sendErr = send(chunk); sendErr != nil {
				return false
			}
			chunk, size = nil, 0
		}
		chunk = append(chunk, frame)
		size += len(frame)
		return true
	})
	if err := errors.Join(err, sendErr); err != nil {
		return status.Errorf(codes.Unavailable, "exporting %s: %v", id, err)
	}
	return send(chunk)
}

// handoffOn runs one partition command on the leader of shard id.
func (n *Node) handoffOn(ctx context.Context, mv metaView, id string, op fsm.Op, h fsm.Handoff) (fsm.Result, error) {
	ls, err := n.leaderState(ctx, id, mv.voters(id), mv.dead, nil)
	if err != nil {
		return fsm.Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if ls.node == n.cfg.NodeID {
		return n.handoffLocal(ctx, id, op, h)
	}
	req := &idemv1.HandoffRequest{Shard: id, Op: handoffOpName(op), PartitionCount: h.Count, Partitions: h.Partitions, Epoch: h.Epoch, Peer: h.Peer,
		Floor: h.Floor, ResetPartitions: h.Reset, Limit: int32(h.Limit), Attempt: h.Attempt, Clock: h.Clock,
		ExpectRecords: h.Expect.Records, ExpectSum: h.Expect.Sum}
	for _, kr := range h.Records {
		req.Records = append(req.Records, fsm.AppendRecord(nil, kr.K, kr.R))
	}
	conn, err := n.fwd.Conn(ls.node)
	if err != nil {
		return fsm.Result{}, err
	}
	resp, err := idemv1.NewTopologyClient(conn).Handoff(ctx, req)
	if err != nil {
		return fsm.Result{}, err
	}
	return fsm.Result{Outcome: outcomeNamed(resp.GetOutcome()), FencingToken: resp.GetFencingToken(), Swept: int(resp.GetSwept()),
		MovedTo: resp.GetMovedTo(), Epoch: resp.GetEpoch(), Clock: resp.GetClock()}, nil
}

// layoutStep is the next step of moving partitions: ok is false when no
// partition is left to move (or the change moves none). known holds the
// leader states the caller read in this tick; only the shards it lacks
// (those the change removes) are asked.
func (n *Node) layoutStep(ctx context.Context, mv metaView, known map[string]shardState) (moveStep, bool, error) {
	from, to, err := n.rings.rings(mv)
	if err != nil {
		return moveStep{}, false, err
	}
	moves := from.Moves(to)
	if len(moves) == 0 {
		return moveStep{}, false, nil
	}
	// A replica of a release without the partition commands would refuse
	// what its peers apply, and diverge: no partition moves before every
	// node supports them.
	if err := n.needVersion(mv, VersionFencedHandoff, "moving keys between shards"); err != nil {
		return moveStep{}, false, err
	}
	involved := map[string]bool{}
	for _, m := range moves {
		involved[m.From], involved[m.To] = true, true
	}
	ids := slices.Sorted(maps.Keys(involved))
	leaderOf, stop := inOrder(ctx, len(ids), func(ctx context.Context, i int) (shardState, error) {
		if ls, ok := known[ids[i]]; ok {
			return ls, nil // read in this tick already
		}
		return n.leaderState(ctx, ids[i], mv.voters(ids[i]), mv.dead, nil)
	})
	defer stop()
	for i, id := range ids {
		ls, err := leaderOf(i)
		if err != nil {
			return moveStep{}, false, err
		}
		if ls.partitionCount != 0 {
			continue
		}
		return moveStep{shard: id, op: "adopt"}, true, nil
	}
	if b := mv.batch; b != nil {
		return moveStep{shard: b.Source, op: "handoff", node: b.Dest, partitions: b.Partitions}, true, nil
	}
	if b, ok := handoff.NextBatch(moves, mv.moved, n.batches.size(mv.target.EffectiveVersion())); ok {
		return moveStep{shard: b.Source, op: "handoff", node: b.Dest, partitions: b.Partitions}, true, nil
	}
	// Every partition is recorded as moved: no source keeps a copy of one
	// after the change (a batch whose own drop failed leaves one).
	if step, ok := n.dropStep(mv, moves); ok {
		return step, true, nil
	}
	return moveStep{}, false, nil
}

// batchSizer sizes the batches of the change this node drives (see
// handoffRecords): ring partitions hold about as many records each, since
// keys are hashed onto them, so the last batch's records per partition
// predict the next batch's.
type batchSizer struct {
	mu      sync.Mutex
	version int // of the change the size was measured for
	next    int
}

// size is how many partitions the next batch of the change to version
// moves.
func (b *batchSizer) size(version int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.current(version)
}

// current is size with b.mu held.
func (b *batchSizer) current(version int) int {
	if b.version != version || b.next == 0 {
		return handoffBatch
	}
	return b.next
}

// moved records that a batch of the change to version moved records
// records in partitions partitions. The batch may have been smaller than
// the size asked (the last of a source and destination pair), so growth
// is bounded by the size, not by the batch.
func (b *batchSizer) moved(version, partitions, records int) {
	if partitions <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	next := 2 * b.current(version)
	if records > 0 {
		next = min(next, int(int64(partitions)*handoffRecords/int64(records)))
	}
	b.version, b.next = version, min(max(next, handoffBatchMin), handoffBatchMax)
}

// handoffSteps runs the handoff driver (package handoff) for up to
// handoffStepTime: each of its steps is decided afresh from what the meta
// group and the two groups' leaders say, so that a change's pace is set by
// the batches, not by the mover's checks of every shard (a round trip per
// shard, seconds across a WAN).
func (n *Node) handoffSteps(ctx context.Context) error {
	start := time.Now()
	for first := true; ; first = false {
		if !first && (time.Since(start) > handoffStepTime || ctx.Err() != nil || !n.metaGroup.IsLeader()) {
			return nil
		}
		res, err := n.driver.Step(ctx)
		step := res.Step
		trace.SpanFromContext(ctx).AddEvent("handoff "+step.Kind.String(), trace.WithAttributes(tracing.Shard.String(step.Batch.Source),
			tracing.Partitions.Int(len(step.Batch.Partitions)), tracing.HandoffAttempt.Int64(int64(step.Batch.Attempt))))
		if !first && step.Kind != handoff.Done {
			n.topoMetrics.steps.WithLabelValues("handoff").Inc()
		}
		if res.Moved.Records > 0 || step.Kind == handoff.Record {
			n.movedBatch(step.Batch, res.Moved)
		}
		var dropErr *handoff.DropError
		switch {
		case errors.As(err, &dropErr):
			// The batch moved; what the source kept is dropped again
			// before the change activates (layoutStep's drop step).
			n.log.Warn("topology change: dropping moved records at the source failed; retried before the change activates", "shard", dropErr.Shard, "error", dropErr.Err)
		case err != nil:
			return fmt.Errorf("%s: %w", step, err)
		}
		switch step.Kind {
		case handoff.Done:
			return nil
		case handoff.Wait:
			return errors.New(step.Reason)
		case handoff.Choose, handoff.Attempt:
			n.log.Info("topology change: handoff batch recorded", "step", step.Kind.String(), "from", step.Batch.Source, "to", step.Batch.Dest,
				"partitions", len(step.Batch.Partitions))
		}
	}
}

// movedBatch counts and logs a batch the driver recorded as moved (moved
// is zero when an earlier attempt or driver had opened it).
func (n *Node) movedBatch(b handoff.Batch, moved handoff.Moved) {
	n.topoMetrics.keysMoved.Add(float64(moved.Records))
	n.topoMetrics.bytesMoved.Add(float64(moved.Bytes))
	n.topoMetrics.partitionsMoved.Add(float64(len(b.Partitions)))
	if moved.Pause > 0 {
		n.topoMetrics.pause.Observe(moved.Pause.Seconds())
		mv, _ := n.meta.read()
		if mv.target != nil {
			n.batches.moved(mv.target.EffectiveVersion(), len(b.Partitions), moved.Records)
		}
	}
	n.log.Info("topology change: partitions moved", "from", b.Source, "to", b.Dest, "partitions", len(b.Partitions), "attempt", b.Attempt,
		"records", moved.Records, "bytes", moved.Bytes, "paused", moved.Pause.Round(time.Microsecond))
}

// adopt gives shard id its partition table: the partitions the active ring
// places on it (none for a shard the change creates).
func (n *Node) adopt(ctx context.Context, mv metaView, id string) error {
	from, err := n.rings.ring(mv.active)
	if err != nil {
		return err
	}
	res, err := n.handoffOn(ctx, mv, id, fsm.OpAdopt, fsm.Handoff{Count: from.PartitionCount(), Partitions: from.PartitionsOf(id), Epoch: uint64(mv.active.EffectiveVersion())})
	if err != nil {
		return err
	}
	if res.Outcome != fsm.OutcomeOK {
		return fmt.Errorf("shard %s refused its partition table: %s", id, res.Outcome)
	}
	return nil
}

// dropMoved deletes shard src's copy of partitions it handed off in the
// change mv runs (parts in order), in commands of at most
// fsm.MaxHandoffPartitions partitions and dropLimit records, and returns how
// many records it deleted. A drop is safe to repeat: it deletes only
// records of partitions the source froze for this change, and finds none
// the second time.
func (n *Node) dropMoved(ctx context.Context, mv metaView, src string, parts []uint32) (int, error) {
	ring, err := n.rings.ring(mv.active)
	if err != nil {
		return 0, err
	}
	count, epoch := ring.PartitionCount(), uint64(mv.target.EffectiveVersion())
	dropped := 0
	for chunk := range slices.Chunk(parts, fsm.MaxHandoffPartitions) {
		for i := 0; ; i++ {
			if i == 100_000 {
				return dropped, fmt.Errorf("dropping at %s: still records left after 100,000 commands", src)
			}
			if n.dropFaults.Load() > 0 && n.dropFaults.Add(-1) >= 0 {
				return dropped, fmt.Errorf("dropping at %s: injected failure (--testing-fail-drops)", src)
			}
			dr, err := n.handoffOn(ctx, mv, src, fsm.OpDrop, fsm.Handoff{Count: count, Partitions: chunk, Epoch: epoch, Limit: dropLimit})
			if err != nil {
				return dropped, fmt.Errorf("dropping at %s: %w", src, err)
			}
			if dr.Outcome != fsm.OutcomeOK {
				return dropped, fmt.Errorf("%s refused to drop: %s", src, dr.Outcome)
			}
			dropped += dr.Swept
			if dr.Swept < dropLimit {
				break
			}
		}
	}
	return dropped, nil
}

// dropLedger remembers the sources this node, driving a change, has
// dropped every moved partition of: the drop step runs once per source and
// change on each meta leader (a new leader runs it again, finding nothing).
type dropLedger struct {
	mu      sync.Mutex
	version int
	clean   map[string]bool
}

func (d *dropLedger) isClean(version int, src string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.version == version && d.clean[src]
}

func (d *dropLedger) markClean(version int, src string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.version != version {
		d.version, d.clean = version, map[string]bool{}
	}
	d.clean[src] = true
}

// dropStep is the next drop step once every partition of the change is
// recorded as moved: a source not confirmed clean in this change, with
// every partition it hands off. ok is false when every source is clean.
func (n *Node) dropStep(mv metaView, moves []topology.Move) (moveStep, bool) {
	version := mv.target.EffectiveVersion()
	for _, m := range moves {
		if n.drops.isClean(version, m.From) {
			continue
		}
		var parts []uint32
		for _, o := range moves {
			if o.From == m.From {
				parts = append(parts, o.Partitions...)
			}
		}
		slices.Sort(parts) // a partition command lists them in order
		return moveStep{shard: m.From, op: "drop", partitions: slices.Compact(parts)}, true
	}
	return moveStep{}, false
}

// dropSteps runs a drop step: the source's copy of everything it handed
// off in this change is deleted (nearly always already, by each batch's own
// drop), and the source is marked clean. A source that goes on serving
// must succeed (the change waits: its copies would be listed and counted
// beside the moved keys); one the change removes closes at activation and
// serves nothing, so a failed drop there is logged and left parked with
// it, and does not hold up a change whose region may be gone for good.
func (n *Node) dropSteps(ctx context.Context, step moveStep) error {
	mv, _ := n.meta.read()
	if mv.target == nil {
		return nil
	}
	switch dropped, err := n.dropMoved(ctx, mv, step.shard, step.partitions); {
	case err != nil:
		if _, stays := mv.target.ShardByID(step.shard); stays {
			return err
		}
		n.log.Warn("topology change: the records a batch left at a removed shard stay parked with it", "shard", step.shard, "error", err)
	case dropped > 0:
		n.log.Info("topology change: dropped moved records a batch had left at the source", "shard", step.shard, "records", dropped)
	}
	n.drops.markClean(mv.target.EffectiveVersion(), step.shard)
	return nil
}

// nodeCluster is the handoff driver's Cluster on this node, which leads
// the meta group: the meta group through its own replica, the groups
// through their leaders (here, or over the Topology service).
type nodeCluster struct{ n *Node }

func (c nodeCluster) Meta(ctx context.Context) (handoff.Meta, bool, error) {
	n := c.n
	mv, _ := n.meta.read()
	if mv.target == nil {
		return handoff.Meta{}, false, nil
	}
	from, to, err := n.rings.rings(mv)
	if err != nil {
		return handoff.Meta{}, false, err
	}
	version := mv.target.EffectiveVersion()
	m := handoff.Meta{Epoch: uint64(version), Count: from.PartitionCount(), Moves: from.Moves(to), Moved: mv.moved,
		Size: n.batches.size(version), MaxGap: n.clocks.stampBound}
	if b := mv.batch; b != nil {
		m.Batch = &handoff.Batch{Source: b.Source, Dest: b.Dest, Partitions: b.Partitions, Attempt: b.Attempt}
		m.Nonce = b.Nonce
	}
	return m, true, nil
}

func (c nodeCluster) RecordBatch(ctx context.Context, epoch uint64, b handoff.Batch, nonce uint64) error {
	return c.n.proposeMeta(ctx, metaCommand{Op: "batch", Version: int(epoch), Source: b.Source, Dest: b.Dest, Partitions: b.Partitions, Nonce: nonce})
}

func (c nodeCluster) RecordMoved(ctx context.Context, epoch uint64, b handoff.Batch) error {
	return c.n.proposeMeta(ctx, metaCommand{Op: "moved", Version: int(epoch), Partitions: b.Partitions})
}

func (c nodeCluster) Read(ctx context.Context, shard string, parts []uint32) (handoff.Reading, error) {
	mv, _ := c.n.meta.read()
	ls, err := c.n.leaderState(ctx, shard, mv.voters(shard), mv.dead, parts)
	if err != nil {
		return handoff.Reading{}, err
	}
	if ls.clock == 0 {
		return handoff.Reading{}, fmt.Errorf("the leader of %s (%s) cannot tell its clock (its voters' clocks disagree or are unknown)", shard, ls.node)
	}
	side := make(handoff.Side, len(ls.partitions))
	for _, pi := range ls.partitions {
		side[pi.Partition] = pi
	}
	return handoff.Reading{Side: side, Offset: time.Duration(ls.clock - ls.localMid), Uncertainty: ls.rtt / 2}, nil
}

func (c nodeCluster) Handoff(ctx context.Context, shard string, op fsm.Op, h fsm.Handoff) (fsm.Result, error) {
	mv, _ := c.n.meta.read()
	return c.n.handoffOn(ctx, mv, shard, op, h)
}

// Export streams the frozen partitions' records from shard's leader.
func (c nodeCluster) Export(ctx context.Context, shard string, count uint32, parts []uint32, send func([][]byte) error) error {
	n := c.n
	mv, _ := n.meta.read()
	ls, err := n.leaderState(ctx, shard, mv.voters(shard), mv.dead, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if ls.node == n.cfg.NodeID {
		return n.exportLocal(ctx, shard, count, parts, send)
	}
	conn, err := n.fwd.Conn(ls.node)
	if err != nil {
		return err
	}
	stream, err := idemv1.NewTopologyClient(conn).ExportPartitions(ctx, &idemv1.ExportPartitionsRequest{Shard: shard, PartitionCount: count, Partitions: parts})
	for err == nil {
		var chunk *idemv1.ExportPartitionsChunk
		if chunk, err = stream.Recv(); err == nil {
			err = send(chunk.GetRecords())
		}
	}
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

func (c nodeCluster) Drop(ctx context.Context, shard string, _ uint64, parts []uint32) error {
	mv, _ := c.n.meta.read()
	_, err := c.n.dropMoved(ctx, mv, shard, parts)
	return err
}
