package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/tracing"
	"github.com/idem-dev/idem/raftstore"
)

// The mover drives a topology change to its end. It runs on every node and
// acts only on the meta group's leader, one membership step at a time: each
// step is computed afresh from the shards' current Raft configurations, so
// a change resumes wherever it stopped (a killed leader, an interrupted
// apply) and repeating a step is harmless.
//
// For every shard whose voters change, in shard order:
//  1. a node that is to vote and is not a member is added as a learner
//     (it gets a snapshot and the log, and counts for no quorum);
//  2. a learner that caught up (its own applied index within
//     catchUpSlack of the leader's commit index) is promoted;
//  3. once every target voter votes, a member the target does not list is
//     removed, after the leader hands the leadership to the target's
//     preferred leader if it is leaving itself.
//
// A shard therefore never has fewer caught-up voters than replicas. Then the
// meta group's own members follow the target, and the target is activated.

const (
	// moveInterval is the pause between two steps (the rate limit): one
	// configuration change per interval, cluster-wide.
	moveInterval = 250 * time.Millisecond
	// catchUpSlack is how far behind the leader's commit index a learner
	// may be when it is promoted (entries are batches of commands).
	catchUpSlack = 256
	// stallAfter is how long a change may go without a step before
	// idem_topology_change_stalled says so.
	stallAfter = 10 * time.Minute
)

// moveStep is one step the mover takes.
type moveStep struct {
	shard, op, node, addr string
	// partitions (handoff) move from shard to node, which names a shard.
	partitions []uint32
}

func (s moveStep) String() string {
	switch s.op {
	case "handoff":
		return fmt.Sprintf("%s handoff of %d partitions to %s", s.shard, len(s.partitions), s.node)
	case "drop":
		return fmt.Sprintf("%s drop of the records of the %d partitions it handed off", s.shard, len(s.partitions))
	}
	return fmt.Sprintf("%s %s %s", s.shard, s.op, s.node)
}

// runMover takes a step whenever this node leads the meta group and a
// change runs.
func (n *Node) runMover(ctx context.Context) {
	every(ctx, moveInterval, func(ctx context.Context) {
		mv, _ := n.meta.read()
		if mv.target == nil || !n.metaGroup.IsLeader() {
			return
		}
		step, done, err := n.nextStep(ctx, mv)
		n.moveWait.Store(nil)
		switch {
		case err != nil:
			reason := err.Error()
			n.moveWait.Store(&reason)
			n.log.Warn("topology change: waiting", "target_version", mv.target.EffectiveVersion(), "reason", err)
		case done:
			if err := n.proposeMeta(ctx, metaCommand{Op: "activate", Version: mv.target.EffectiveVersion()}); err != nil {
				n.log.Warn("topology change: activating", "error", err)
				return
			}
			n.log.Info("topology change done: the target is the active topology", "version", mv.target.EffectiveVersion(),
				"took", time.Duration(time.Now().UnixNano()-mv.changeStarted).Round(time.Millisecond))
		default:
			if err := n.takeStep(ctx, step); err != nil {
				reason := step.String() + ": " + err.Error()
				n.moveWait.Store(&reason)
				n.log.Warn("topology change: step failed, retrying", "step", step.String(), "error", err)
				return
			}
			n.topoMetrics.steps.WithLabelValues(step.op).Inc()
			n.log.Info("topology change: step taken", "step", step.String(), "target_version", mv.target.EffectiveVersion())
			_ = n.proposeMeta(ctx, metaCommand{Op: "progress", At: time.Now().UnixNano()})
		}
	})
}

// shardState is one replica's answer to ShardState.
type shardState struct {
	node    string
	hosted  bool
	leader  bool
	applied uint64
	commit  uint64
	members []raftstore.Member
	// partitionCount is the group's partition table's (0: none adopted).
	partitionCount uint32
	// partitions are the table's states of the partitions asked for.
	partitions []fsm.PartitionInfo
	// clock is the time the node would stamp a command of the shard with
	// (0: it cannot); localMid is this node's clock halfway through the
	// call that read it, and rtt the call's round trip.
	clock, localMid int64
	rtt             time.Duration
}

// localShardState is this node's ShardState for shard id, with the states
// of parts in its partition table.
func (n *Node) localShardState(id string, parts []uint32) shardState {
	st := shardState{node: n.cfg.NodeID, localMid: n.localNow()}
	var g *raftstore.Group
	if id == MetaGroupID {
		g = n.metaGroup
	} else if s := n.shard(id); s != nil {
		g = s.group
	}
	if g == nil {
		return st
	}
	stats := g.Stats()
	st.hosted, st.leader, st.applied, st.commit = true, g.IsLeader(), stats.AppliedIndex, stats.CommitIndex
	st.members, _ = g.Members()
	if s := n.shard(id); s != nil {
		st.partitionCount = s.fsm.PartitionCount()
		if len(parts) > 0 {
			states := s.fsm.PartitionStates()
			for _, p := range parts {
				pi := states[p]
				pi.Partition = p
				st.partitions = append(st.partitions, pi)
			}
		}
		var stamped fsm.Command
		if n.clocks.stamp(&stamped, n.voters(id, false)) == nil {
			st.clock = stamped.Now
		}
	}
	return st
}

// shardStateOf asks node id (this node directly) for its view of shard
// (and of the partitions parts in its table).
func (n *Node) shardStateOf(ctx context.Context, id, shard string, parts []uint32) (shardState, error) {
	if id == n.cfg.NodeID {
		return n.localShardState(shard, parts), nil
	}
	conn, err := n.fwd.Conn(id)
	if err != nil {
		return shardState{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start, local := time.Now(), n.localNow()
	resp, err := idemv1.NewTopologyClient(conn).ShardState(ctx, &idemv1.ShardStateRequest{Shard: shard, Partitions: parts})
	if err != nil {
		return shardState{}, err
	}
	rtt := time.Since(start)
	st := shardState{node: id, hosted: resp.GetHosted(), leader: resp.GetLeader(), applied: resp.GetAppliedIndex(), commit: resp.GetCommitIndex(),
		partitionCount: resp.GetPartitionCount(), clock: resp.GetClock(), localMid: local + int64(rtt/2), rtt: rtt}
	for _, ps := range resp.GetPartitions() {
		st.partitions = append(st.partitions, fsm.PartitionInfo{Partition: ps.GetPartition(), State: ps.GetState(), Epoch: ps.GetEpoch(), Peer: ps.GetPeer(),
			Attempt: ps.GetAttempt(), Digest: fsm.Digest{Records: ps.GetDigestRecords(), Sum: ps.GetDigestSum()}})
	}
	for _, m := range resp.GetMembers() {
		st.members = append(st.members, raftstore.Member{ID: m.GetId(), Addr: m.GetAddr(), Voter: m.GetVoter()})
	}
	return st, nil
}

// inOrder starts ask(ctx, i) for every i below count at once and returns
// answer, which waits for the i-th result (once per i): the caller takes
// the results in order, as a loop of calls would, and may stop at any of
// them (stop cancels what is still running). A change's step asks every shard's
// voters for their state, a round trip each over a WAN: asked one after
// another, a step across regions took seconds.
func inOrder[T any](ctx context.Context, count int, ask func(ctx context.Context, i int) (T, error)) (answer func(i int) (T, error), stop func()) {
	type result struct {
		v   T
		err error
	}
	ctx, cancel := context.WithCancel(ctx)
	results := make([]chan result, count)
	for i := range results {
		results[i] = make(chan result, 1)
		go func() {
			v, err := ask(ctx, i)
			results[i] <- result{v, err}
		}()
	}
	return func(i int) (T, error) {
		r := <-results[i]
		return r.v, r.err
	}, cancel
}

// statesOf asks every node of ids for its state of shard (and of parts)
// at once (shardStateOf); answer(i) is the i-th node's (inOrder).
func (n *Node) statesOf(ctx context.Context, ids []string, shard string, parts []uint32) (answer func(i int) (shardState, error), stop func()) {
	return inOrder(ctx, len(ids), func(ctx context.Context, i int) (shardState, error) {
		return n.shardStateOf(ctx, ids[i], shard, parts)
	})
}

// leaderState finds the leader of shard among candidates and returns its
// view (with the states of parts in its partition table): the first
// candidate, in their order, that says it leads (all are asked at once).
func (n *Node) leaderState(ctx context.Context, shard string, candidates []string, dead []string, parts []uint32) (shardState, error) {
	candidates = slices.DeleteFunc(slices.Clone(candidates), func(id string) bool { return slices.Contains(dead, id) })
	answer, stop := n.statesOf(ctx, candidates, shard, parts)
	defer stop()
	var errs []error
	for i, id := range candidates {
		st, err := answer(i)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
			continue
		}
		if st.leader {
			return st, nil
		}
	}
	if len(errs) == 0 {
		return shardState{}, fmt.Errorf("no leader of %s found among %v (none of them leads it now)", shard, candidates)
	}
	return shardState{}, fmt.Errorf("no leader of %s found among %v: %w", shard, candidates, errors.Join(errs...))
}

// nextStep computes the change's next step from the current configurations.
// done is true when every shard and the meta group have the target's
// members: the target may be activated.
func (n *Node) nextStep(ctx context.Context, mv metaView) (moveStep, bool, error) {
	target := mv.target
	v := n.view()
	addrOf := func(id string) string {
		if nd, ok := n.nodeOf(v, id); ok {
			return nd.RaftAddr
		}
		if nd, ok := target.NodeByID(id); ok {
			return nd.RaftAddr
		}
		nd, _ := mv.active.NodeByID(id)
		return nd.RaftAddr
	}
	// Every node of the target is a member of the meta group first: a
	// joining node learns the topology before it holds any seat.
	metaVoters, metaLearners := target.MetaMembers()
	metaMembers, err := n.metaGroup.Members()
	if err != nil {
		return moveStep{}, false, err
	}
	isMember := func(ms []raftstore.Member, id string) (member, voter bool) {
		for _, m := range ms {
			if m.ID == id {
				return true, m.Voter
			}
		}
		return false, false
	}
	for _, id := range append(slices.Clone(metaVoters), metaLearners...) {
		if ok, _ := isMember(metaMembers, id); !ok {
			return moveStep{shard: MetaGroupID, op: "add_learner", node: id, addr: addrOf(id)}, false, nil
		}
	}
	shards := target.Shards()
	leaderOf, stop := inOrder(ctx, len(shards), func(ctx context.Context, i int) (shardState, error) {
		return n.leaderState(ctx, shards[i].ID, mv.voters(shards[i].ID), mv.dead, nil)
	})
	defer stop()
	states := make(map[string]shardState, len(shards))
	for i, s := range shards {
		ls, err := leaderOf(i)
		if err != nil {
			return moveStep{}, false, err
		}
		step, ok, err := n.shardStep(ctx, s.ID, s.Voters, ls, addrOf)
		if err != nil || ok {
			return step, false, err
		}
		states[s.ID] = ls
	}
	// Every shard has its target voters: keys whose shard changes move.
	if step, ok, err := n.layoutStep(ctx, mv, states); err != nil || ok {
		return step, false, err
	}
	// The meta group: promote its target voters, then remove the members
	// that leave (after handing its leadership over if this node leaves).
	metaLeader := n.localShardState(MetaGroupID, nil)
	step, ok, err := n.shardStep(ctx, MetaGroupID, metaVoters, metaLeader, addrOf)
	if err != nil || ok {
		return step, false, err
	}
	for _, m := range metaMembers {
		if m.Voter && !slices.Contains(metaVoters, m.ID) && slices.Contains(metaLearners, m.ID) {
			return moveStep{shard: MetaGroupID, op: "demote", node: m.ID}, false, nil
		}
	}
	for _, m := range metaMembers {
		if !slices.Contains(metaVoters, m.ID) && !slices.Contains(metaLearners, m.ID) {
			return moveStep{shard: MetaGroupID, op: "remove", node: m.ID}, false, nil
		}
	}
	return moveStep{}, true, nil
}

// shardStep is the next step for one group whose leader's view is ls and
// whose voters are to be voters: ok is false when the group is done.
func (n *Node) shardStep(ctx context.Context, shard string, voters []string, ls shardState, addrOf func(string) string) (moveStep, bool, error) {
	member := map[string]raftstore.Member{}
	for _, m := range ls.members {
		member[m.ID] = m
	}
	for _, id := range voters {
		if _, ok := member[id]; !ok {
			return moveStep{shard: shard, op: "add_learner", node: id, addr: addrOf(id)}, true, nil
		}
	}
	for _, id := range voters {
		if member[id].Voter {
			continue
		}
		st, err := n.shardStateOf(ctx, id, shard, nil)
		if err != nil {
			return moveStep{}, false, fmt.Errorf("learner %s of %s: %w", id, shard, err)
		}
		if !st.hosted || st.applied+catchUpSlack < ls.commit {
			return moveStep{}, false, fmt.Errorf("learner %s of %s is catching up: applied %d, leader's commit %d", id, shard, st.applied, ls.commit)
		}
		return moveStep{shard: shard, op: "promote", node: id}, true, nil
	}
	for _, m := range ls.members {
		if slices.Contains(voters, m.ID) {
			continue
		}
		if shard == MetaGroupID && !m.Voter {
			continue // a meta learner that stays is handled by the caller
		}
		if m.ID == ls.node {
			return moveStep{shard: shard, op: "transfer_leader", node: voters[0]}, true, nil
		}
		if shard == MetaGroupID {
			return moveStep{shard: shard, op: "demote", node: m.ID}, true, nil
		}
		return moveStep{shard: shard, op: "remove", node: m.ID}, true, nil
	}
	return moveStep{}, false, nil
}

// stepSpan starts the span of one topology-change step (its kind, shard,
// the node or shard it concerns and its partitions), a root span of the
// mover's own; the returned end records err. Without tracing it does
// nothing.
func (n *Node) stepSpan(ctx context.Context, step moveStep) (context.Context, func(error)) {
	if n.tracer == nil {
		return ctx, func(error) {}
	}
	ctx, span := n.tracer.Start(ctx, "idem.topology_step", trace.WithAttributes(
		tracing.StepKind.String(step.op), tracing.Shard.String(step.shard), tracing.Node.String(step.node),
		tracing.Partitions.Int(len(step.partitions))))
	return ctx, func(err error) {
		if err != nil {
			span.SetStatus(otelcodes.Error, err.Error())
		}
		span.End()
	}
}

// takeStep runs step on the group's leader (here, or through the
// ChangeMember RPC), in a span of its own.
func (n *Node) takeStep(ctx context.Context, step moveStep) (err error) {
	ctx, end := n.stepSpan(ctx, step)
	defer func() { end(err) }()
	switch step.op {
	case "adopt":
		mv, _ := n.meta.read()
		return n.adopt(ctx, mv, step.shard)
	case "handoff":
		return n.handoffSteps(ctx)
	case "drop":
		return n.dropSteps(ctx, step)
	}
	var leader string
	if step.shard == MetaGroupID {
		leader = n.cfg.NodeID
	} else {
		mv, _ := n.meta.read()
		ls, err := n.leaderState(ctx, step.shard, mv.voters(step.shard), mv.dead, nil)
		if err != nil {
			return err
		}
		leader = ls.node
	}
	if leader == n.cfg.NodeID {
		return n.changeMember(ctx, step)
	}
	conn, err := n.fwd.Conn(leader)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = idemv1.NewTopologyClient(conn).ChangeMember(ctx, &idemv1.ChangeMemberRequest{Shard: step.shard, Op: step.op, Node: step.node, Addr: step.addr})
	return err
}

// changeMember runs step on this node's replica, which must lead.
func (n *Node) changeMember(ctx context.Context, step moveStep) error {
	var g *raftstore.Group
	if step.shard == MetaGroupID {
		g = n.metaGroup
	} else if s := n.shard(step.shard); s != nil {
		g = s.group
	}
	if g == nil {
		return status.Errorf(codes.NotFound, "node %s does not host %s", n.cfg.NodeID, step.shard)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	switch step.op {
	case "add_learner":
		return g.AddLearner(ctx, step.node, step.addr)
	case "promote":
		return g.Promote(ctx, step.node)
	case "remove":
		return g.RemoveMember(ctx, step.node)
	case "demote":
		return g.Demote(ctx, step.node)
	case "transfer_leader":
		return g.TransferLeadership(step.node)
	}
	return status.Errorf(codes.InvalidArgument, "unknown membership step %q", step.op)
}
