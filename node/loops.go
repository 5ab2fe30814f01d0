package node

import (
	"context"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/idem-dev/idem/forward"
	"github.com/idem-dev/idem/fsm"
)

// loop is one background goroutine with its own stop, so that each loop is
// started, stopped and waited for on its own.
type loop struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{}
}

// startLoop runs fn in a goroutine until its context is cancelled by stop.
func startLoop(name string, fn func(ctx context.Context)) *loop {
	ctx, cancel := context.WithCancel(context.Background())
	l := &loop{name: name, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		fn(ctx)
	}()
	return l
}

// stop cancels the loop and waits for it to return.
func (l *loop) stop() {
	l.cancel()
	<-l.done
}

// every calls fn every interval until ctx ends.
func every(ctx context.Context, interval time.Duration, fn func(ctx context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn(ctx)
	}
}

// startLoops starts the node's background work: sweeping, the ring check,
// the clock probes, the cluster version, and leader balancing unless
// disabled.
func (n *Node) startLoops() {
	n.loops = append(n.loops,
		startLoop("sweep", func(ctx context.Context) { every(ctx, n.cfg.SweepInterval, n.sweep) }),
		startLoop("ring check", n.checkRing),
		startLoop("rejoin", n.watchRejoin),
		startLoop("clock", n.clocks.run),
		startLoop("cluster version", func(ctx context.Context) {
			n.followClusterVersion(ctx)
			every(ctx, clockProbeInterval, n.followClusterVersion)
		}),
		startLoop("topology", n.watchTopology),
		startLoop("topology change", n.runMover))
	if n.cfg.LeaderBalanceInterval > 0 {
		b := newBalancer()
		n.loops = append(n.loops, startLoop("leader balance", func(ctx context.Context) {
			every(ctx, n.cfg.LeaderBalanceInterval, func(context.Context) { n.balance(b) })
		}))
	}
}

// stopLoops stops every background loop and waits for each.
func (n *Node) stopLoops() {
	for _, l := range n.loops {
		l.stop()
	}
	n.loops = nil
}

// sweep has the leader of each shard propose a sweep, so records past
// retention free their memory on every replica.
func (n *Node) sweep(ctx context.Context) {
	for _, s := range n.hosted() {
		id := s.id
		if !s.group.IsLeader() {
			continue
		}
		cmd := &fsm.Command{Op: fsm.OpSweep, AbandonAfter: int64(n.cfg.AbandonAfter), MaxSweep: n.cfg.MaxSweep}
		if err := n.clocks.stamp(cmd, n.voters(id, false)); err != nil {
			n.log.Debug("sweep skipped", "shard", id, "error", err)
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		v, err := s.group.Apply(actx, fsm.EncodeCommand(cmd))
		cancel()
		if err != nil {
			n.log.Debug("sweep failed", "shard", id, "error", err)
			continue
		}
		if res, _ := v.(fsm.Result); res.Swept > 0 {
			n.log.Debug("swept expired records", "shard", id, "records", res.Swept)
		}
	}
}

// checkRing asks peers, until one answers, which ring the cluster was
// created with; on a mismatch the node stays unready.
func (n *Node) checkRing(ctx context.Context) {
	forward.NewRingCheck(n.cfg.Topology, n.view().ring, n.cfg.NodeID, n.fwd.Conn).Watch(ctx, 2*time.Second, func(err error) {
		if err != nil {
			n.ringErr.Store(&err)
			n.log.Error("a peer was created with another ring: this node's topology file differs from the cluster's", "error", err)
		}
	})
}

// balance is one tick of leader balancing: it gathers what this node sees
// of each shard, lets the balancer decide (balance.go), and hands over the
// shards it says to.
func (n *Node) balance(b *balancer) {
	if n.view().target != nil {
		return // a topology change moves leaderships itself
	}
	hosted := n.hosted()
	facts := make([]balanceFacts, 0, len(hosted))
	shards := make([]hostedShard, 0, len(hosted))
	for _, s := range hosted {
		id := s.id
		voters := n.voters(id, false)
		if len(voters) == 0 {
			continue // removed by a topology change since hosted() read it
		}
		f := balanceFacts{Shard: id, Self: n.cfg.NodeID, Voters: voters, Preferred: voters[0]}
		if s.group.IsLeader() {
			f.Leader = n.cfg.NodeID
		} else {
			f.Leader, _ = s.group.Leader()
		}
		if f.Leader == n.cfg.NodeID && f.Preferred != n.cfg.NodeID {
			// A preferred voter whose clock is past the bound would only
			// hand the shard back again.
			f.PreferredDown = n.peerDown(f.Preferred) || n.clocks.peerSkewed(f.Preferred)
		}
		facts = append(facts, f)
		shards = append(shards, s)
	}
	for i, d := range b.next(facts) {
		if !d.Transfer {
			continue
		}
		id := facts[i].Shard
		if err := shards[i].group.TransferLeadership(d.To); err != nil {
			n.log.Debug("leadership hand-back failed", "shard", id, "to", d.To, "error", err)
			continue
		}
		b.handedOver(id)
		n.log.Info("handed leadership to the preferred voter", "shard", id, "to", d.To)
	}
}

// peerDown reports whether this node's connection to peer is failing (it
// does not dial: an idle or unknown connection counts as up).
func (n *Node) peerDown(peer string) bool {
	conn, err := n.fwd.Conn(peer)
	if err != nil {
		return false
	}
	st := conn.GetState()
	return st == connectivity.TransientFailure || st == connectivity.Shutdown
}
