package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/internal/durable"
	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/statedb"
	"github.com/idem-dev/idem/topology"
)

// view is the node's current picture of the cluster's shape: the active
// topology (from the meta group, or the node's own file until the meta group
// knows one) and the target of a running change. It is replaced whole,
// never modified (Node.view).
type view struct {
	active *topology.Topology
	target *topology.Topology // nil unless a change runs
	dead   []string
	// ring is the active topology's ring, with its voters: stamping and
	// admission use them, and the Routing RPC describes it.
	ring *topology.Ring
	// placer places keys: ring, or while a change moves keys between
	// shards, a blend of ring and the target's ring (a partition the change
	// moved by the target's). Its shards are the active and the target's.
	placer *topology.Ring
	// moved is how many partitions the running change has moved.
	moved int
	// targetVoters are the voters the target placement gives each shard
	// (nil without a change).
	targetVoters map[string][]string
	// fromMeta is false while the node runs on its own file.
	fromMeta bool
}

// version is the active version.
func (v *view) version() int { return v.active.EffectiveVersion() }

// forwardShard is info with the target's voters appended: while a change
// runs, a shard's leader may already be one of them.
func (v *view) forwardShard(info topology.Shard) topology.Shard {
	extra := v.targetVoters[info.ID]
	if len(extra) == 0 {
		return info
	}
	out := info
	out.Voters = slices.Clone(info.Voters)
	for _, id := range extra {
		if !slices.Contains(out.Voters, id) {
			out.Voters = append(out.Voters, id)
		}
	}
	return out
}

// seatedInView reports whether node holds or is to hold a seat in group
// by the cluster's topology (every node of it for the meta group): the
// Raft port admits it even while this replica's own configuration is an
// old one (raftstore Config.ExtraSeats).
func (n *Node) seatedInView(group, node string) bool {
	v := n.view()
	if group == MetaGroupID {
		_, ok := v.node(node)
		return ok
	}
	info, ok := v.placer.ShardByID(group)
	return ok && slices.Contains(v.forwardShard(info).Voters, node)
}

// seats lists the shards in which node id holds or is to hold a seat.
func (v *view) seats(id string) map[string]bool {
	out := map[string]bool{}
	for _, s := range v.placer.Shards() {
		if s.HasVoter(id) || slices.Contains(v.targetVoters[s.ID], id) {
			out[s.ID] = true
		}
	}
	return out
}

// nodes returns every node of the active and the target topology.
func (v *view) nodes() []topology.Node {
	out := v.active.Nodes()
	if v.target != nil {
		for _, n := range v.target.Nodes() {
			if _, ok := v.active.NodeByID(n.ID); !ok {
				out = append(out, n)
			}
		}
	}
	return out
}

// node finds id in the active or the target topology.
func (v *view) node(id string) (topology.Node, bool) {
	if n, ok := v.active.NodeByID(id); ok {
		return n, true
	}
	if v.target != nil {
		return v.target.NodeByID(id)
	}
	return topology.Node{}, false
}

// nodeOf finds node id, with the addresses of this node's own file when
// the file lists it: a node dials its peers at the addresses of its own
// view (a WAN proxy, a NAT), whatever addresses the replicated topology
// carries; the replicated ones serve for nodes the file does not know.
func (n *Node) nodeOf(v *view, id string) (topology.Node, bool) {
	if nd, ok := n.cfg.Topology.NodeByID(id); ok {
		return nd, true
	}
	return v.node(id)
}

// ownAddrs is nodes with the addresses of this node's own file where it
// lists them (nodeOf).
func (n *Node) ownAddrs(nodes []topology.Node) []topology.Node {
	out := make([]topology.Node, len(nodes))
	for i, nd := range nodes {
		if own, ok := n.cfg.Topology.NodeByID(nd.ID); ok {
			nd = own
		}
		out[i] = nd
	}
	return out
}

// newView builds the view of active (and target, with the partitions moved
// so far).
func newView(rings *ringCache, active, target *topology.Topology, dead []string, moved map[uint32]bool, fromMeta bool) (*view, error) {
	ring, err := rings.ring(active)
	if err != nil {
		return nil, err
	}
	v := &view{active: active, target: target, dead: dead, ring: ring, placer: ring, fromMeta: fromMeta}
	if target != nil {
		v.targetVoters = map[string][]string{}
		for _, s := range target.Shards() {
			v.targetVoters[s.ID] = s.Voters
		}
		next, err := rings.ring(target)
		if err != nil {
			return nil, err
		}
		v.placer = ring.Blend(next, func(p uint32) bool { return moved[p] })
		v.moved = len(moved)
	}
	return v, nil
}

// created reports whether shard id is one the running change creates.
func (v *view) created(id string) bool {
	if v.target == nil {
		return false
	}
	_, inActive := v.ring.ShardByID(id)
	_, inTarget := v.target.ShardByID(id)
	return inTarget && !inActive
}

func (n *Node) view() *view { return n.viewp.Load() }

// voters returns shard id's voters in the active topology, with those of
// a running change's target too when withTarget.
func (n *Node) voters(id string, withTarget bool) []string {
	v := n.view()
	info, ok := v.placer.ShardByID(id)
	if !ok {
		return nil
	}
	if withTarget {
		info = v.forwardShard(info)
	}
	return info.Voters
}

// shard returns the hosted replica of shard id, or nil.
func (n *Node) shard(id string) *shard { return (*n.shardsp.Load())[id] }

// shardMap returns the hosted replicas by shard id; read-only.
func (n *Node) shardMap() map[string]*shard { return *n.shardsp.Load() }

// setShard adds (s non-nil) or removes the hosted replica of shard id.
func (n *Node) setShard(id string, s *shard) {
	n.shardsMu.Lock()
	defer n.shardsMu.Unlock()
	m := maps.Clone(*n.shardsp.Load())
	if s == nil {
		delete(m, id)
	} else {
		m[id] = s
	}
	n.shardsp.Store(&m)
}

// park keeps the state machine of a replica this node closed: its records
// stay on disk and open, for the day the node gets a seat in the shard
// again.
func (n *Node) park(id string, sm *statedb.StateMachine) {
	n.shardsMu.Lock()
	defer n.shardsMu.Unlock()
	if n.parked == nil {
		n.parked = map[string]*statedb.StateMachine{}
	}
	n.parked[id] = sm
}

// seatMarker is the file that says this node held state of a shard: a
// group without state and with the marker lost it (refuse), without the
// marker it joins.
func (n *Node) seatMarker(id string) string {
	return filepath.Join(n.cfg.DataDir, "seats", id)
}

func (n *Node) hasSeatMarker(id string) bool {
	if _, ok := n.marked.Load(id); ok {
		return true
	}
	_, err := os.Stat(n.seatMarker(id))
	return err == nil
}

// writeSeatMarker creates the marker durably (the file and its directory
// entry), once: reconcileSeats asks every second.
func (n *Node) writeSeatMarker(id string) error {
	if n.hasSeatMarker(id) {
		n.marked.Store(id, true)
		return nil
	}
	dir := filepath.Dir(n.seatMarker(id))
	if err := durable.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("node: seat marker: %w", err)
	}
	f, err := os.Create(n.seatMarker(id))
	if err != nil {
		return fmt.Errorf("node: seat marker: %w", err)
	}
	if err := errors.Join(f.Sync(), f.Close(), durable.SyncDir(dir)); err != nil {
		return fmt.Errorf("node: seat marker: %w", err)
	}
	n.marked.Store(id, true)
	return nil
}

// startMode says how the group id starts when it has no state on disk:
// refuse when this node held it before (its marker is there), bootstrap on
// the first start of a new cluster's node, join otherwise (the leader adds
// this node as a learner and sends it a snapshot).
func (n *Node) startMode(id string, bootstrap bool) raftstore.StartMode {
	switch {
	case n.identity.Rejoining:
		return raftstore.StartJoin
	case n.hasSeatMarker(id):
		return raftstore.StartRequireState
	case bootstrap:
		return raftstore.StartBootstrap
	}
	return raftstore.StartJoin
}

// seatStart is how this node opens its replica of shard info in view v
// (startMode; bootstrap: the first start of a new cluster's node): every
// target voter of a shard the running change creates bootstraps it with
// the target's voters. The configurations are identical (one replicated
// target), which hashicorp/raft allows on every server, so the voters that
// are up elect a leader even when the preferred one is down; a voter that
// opens it after the others elected (its log then holds the leader's
// entries, or the bootstrap is refused) simply follows.
func (n *Node) seatStart(v *view, info topology.Shard, bootstrap bool) raftstore.StartMode {
	start := n.startMode(info.ID, bootstrap)
	if start == raftstore.StartJoin && !n.identity.Rejoining && v.created(info.ID) && slices.Contains(info.Voters, n.cfg.NodeID) {
		return raftstore.StartBootstrap
	}
	return start
}

// bootstraps reports whether this start is the first of a new cluster's
// node: a fresh data dir and a file at version 1. A node that joins an
// existing cluster starts with a later version's file.
func (n *Node) bootstraps(freshDir bool) bool {
	return freshDir && n.cfg.Topology.EffectiveVersion() == 1
}

// peersOf is the Raft peers of shard info's voters, at the addresses of v
// (nodeOf).
func (n *Node) peersOf(v *view, info topology.Shard) ([]raftstore.Peer, error) {
	peers := make([]raftstore.Peer, 0, len(info.Voters))
	for _, id := range info.Voters {
		vn, ok := n.nodeOf(v, id)
		if !ok {
			return nil, fmt.Errorf("node: shard %s: voter %s has no address in the topology", info.ID, id)
		}
		peers = append(peers, raftstore.Peer{ID: id, Addr: vn.RaftAddr})
	}
	return peers, nil
}

// openShard starts hosting shard info (voters from v) with start mode.
func (n *Node) openShard(v *view, info topology.Shard, start raftstore.StartMode) error {
	peers, err := n.peersOf(v, info)
	if err != nil {
		return err
	}
	if !slices.Contains(info.Voters, n.cfg.NodeID) {
		// A joining replica: raftstore wants it among the group's members;
		// it bootstraps nothing (StartJoin), so the list only gives addresses.
		peers = append(peers, raftstore.Peer{ID: n.cfg.NodeID, Addr: n.self.RaftAddr})
	}
	gc := raftstore.GroupConfig{ID: info.ID, Voters: peers, Start: start}
	if spansRegions(v.active, info) && v.active.WANRTTMs > 0 {
		gc.Timing = raftstore.WANTiming(n.cfg.Raft, time.Duration(v.active.WANRTTMs)*time.Millisecond)
	}
	n.shardsMu.Lock()
	sm := n.parked[info.ID]
	delete(n.parked, info.ID)
	n.shardsMu.Unlock()
	if sm == nil {
		var err error
		if sm, err = n.state.Shard(info.ID); err != nil {
			return err
		}
	}
	logShardState(n.log, "shard state open", info.ID, sm.Store(), true)
	s := &shard{info: info, sm: sm, fsm: sm.FSM(), waiters: new(backend.Waiters)}
	s.fsm.OnApply(s.waiters.Settled)
	if s.group, err = n.host.AddGroup(gc, sm); err != nil {
		n.park(info.ID, sm)
		return n.startError(info.ID, err)
	}
	if start == raftstore.StartBootstrap {
		if err := n.writeSeatMarker(info.ID); err != nil {
			return err
		}
	}
	n.setShard(info.ID, s)
	return nil
}

// openMeta starts the meta group. On a new cluster's first start every
// node bootstraps it with the members topology.MetaMembers gives; a joining
// node waits to be added.
func (n *Node) openMeta(freshDir bool) error {
	t := n.cfg.Topology
	voters, learners := t.MetaMembers()
	peer := func(id string) raftstore.Peer {
		vn, _ := t.NodeByID(id)
		return raftstore.Peer{ID: id, Addr: vn.RaftAddr}
	}
	gc := raftstore.GroupConfig{ID: MetaGroupID, NoPacking: true}
	for _, id := range voters {
		gc.Voters = append(gc.Voters, peer(id))
	}
	for _, id := range learners {
		gc.Learners = append(gc.Learners, peer(id))
	}
	gc.Start = n.startMode(MetaGroupID, n.bootstraps(freshDir))
	if !freshDir && !n.identity.Rejoining && !n.hasMetaState() && t.EffectiveVersion() == 1 {
		// A data dir of a release without the meta group: its nodes all
		// run the file the cluster was created with, so they bootstrap the
		// same configuration.
		gc.Start = raftstore.StartBootstrap
	}
	if gc.Start == raftstore.StartJoin && !slices.Contains(append(slices.Clone(voters), learners...), n.cfg.NodeID) {
		gc.Voters = []raftstore.Peer{{ID: n.cfg.NodeID, Addr: n.self.RaftAddr}}
		gc.Learners = nil
	}
	if t.WANRTTMs > 0 && len(t.Regions) > 1 {
		gc.Timing = raftstore.WANTiming(n.cfg.Raft, time.Duration(t.WANRTTMs)*time.Millisecond)
	}
	g, err := n.host.AddGroup(gc, n.meta)
	if err != nil {
		return n.startError(MetaGroupID, err)
	}
	n.metaGroup = g
	if gc.Start == raftstore.StartBootstrap || g.Stats().LastLogIndex > 0 {
		return n.writeSeatMarker(MetaGroupID)
	}
	return nil
}

// hasMetaState reports whether the meta group ever ran here.
func (n *Node) hasMetaState() bool {
	_, err := os.Stat(filepath.Join(n.cfg.DataDir, "raft", "shards", MetaGroupID))
	return err == nil
}

// refreshView rebuilds the node's view from the meta state and applies it:
// peers and forwarder learn new nodes, replicas open for new seats and
// close for seats this node no longer holds. It runs on every meta change
// and every second.
func (n *Node) refreshView(ctx context.Context) {
	mv, _ := n.meta.read()
	cur := n.view()
	next := cur
	if mv.active != nil {
		changed := !cur.fromMeta || cur.active.EffectiveVersion() != mv.active.EffectiveVersion() ||
			(cur.target == nil) != (mv.target == nil) ||
			(cur.target != nil && mv.target != nil && cur.target.EffectiveVersion() != mv.target.EffectiveVersion()) ||
			cur.moved != len(mv.moved)
		if changed {
			v, err := newView(n.rings, mv.active, mv.target, mv.dead, mv.moved, true)
			if err != nil {
				n.log.Error("topology from the meta group unusable", "error", err)
				return
			}
			if v.ring.LayoutFingerprint() != n.layout {
				err := fmt.Errorf("%w: the cluster's active topology (version %d) places keys with ring %s, this node's data dir holds ring %s",
					ErrDataDirMismatch, v.version(), v.ring.LayoutFingerprint(), n.layout)
				n.ringErr.Store(&err)
				n.log.Error("topology from the meta group places keys elsewhere", "error", err)
				return
			}
			if fileV := n.cfg.Topology.EffectiveVersion(); fileV < v.version() {
				n.log.Info("following the cluster's topology version", "file_version", fileV, "active_version", v.version())
			}
			n.log.Info("topology view", "active_version", v.version(), "target_version", versionOf(mv.target), "dead", mv.dead, "partitions_moved", v.moved)
			n.viewp.Store(v)
			next = v
		}
	}
	if next != n.applied {
		// A view this loop has not applied yet (Start may have stored one
		// from the meta group's restored state): its nodes become
		// reachable and its voters the clock peers, once per view.
		nodes := n.ownAddrs(next.nodes())
		for _, nd := range nodes {
			n.host.SetPeer(nd.ID, nd.RaftAddr)
		}
		n.fwd.AddNodes(nodes)
		n.clocks.setPeers(next)
		n.applied = next
	}
	n.topoMetrics.observe(next, mv)
	n.reconcileSeats(ctx, next)
}

func versionOf(t *topology.Topology) int {
	if t == nil {
		return 0
	}
	return t.EffectiveVersion()
}

// reconcileSeats opens a replica for every shard in which this node holds
// or is to hold a seat, marks replicas that received state, and closes
// replicas of shards it no longer belongs to once no change runs.
func (n *Node) reconcileSeats(ctx context.Context, v *view) {
	want := v.seats(n.cfg.NodeID)
	hosted := n.shardMap()
	for _, info := range v.placer.Shards() {
		if !want[info.ID] || hosted[info.ID] != nil {
			continue
		}
		forward := v.forwardShard(info)
		start := n.seatStart(v, info, false)
		if err := n.openShard(v, forward, start); err != nil {
			n.log.Error("could not open a replica for a new seat", "shard", info.ID, "error", err)
			continue
		}
		if start == raftstore.StartBootstrap {
			n.log.Info("replica opened for a shard the topology change creates: bootstrapped with its voters", "shard", info.ID, "voters", info.Voters)
		} else {
			n.log.Info("replica opened for a new seat: it catches up as a learner", "shard", info.ID)
		}
	}
	if n.metaGroup.Stats().LastLogIndex > 0 {
		if err := n.writeSeatMarker(MetaGroupID); err != nil {
			n.log.Warn("seat marker", "shard", MetaGroupID, "error", err)
		}
	}
	for id, s := range n.shardMap() {
		if info, ok := v.placer.ShardByID(id); ok && n.seatStart(v, info, false) == raftstore.StartBootstrap && s.group.Stats().LastLogIndex == 0 {
			// A shard the change creates whose replica this node opened
			// empty before it learnt of the change (it started with the new
			// file): as one of its voters, it bootstraps it now.
			peers, err := n.peersOf(v, info)
			if err == nil {
				err = s.group.Bootstrap(peers)
			}
			if err != nil {
				n.log.Warn("bootstrapping a shard the topology change creates", "shard", id, "error", err)
				continue
			}
			n.log.Info("shard the topology change creates bootstrapped with its voters", "shard", id, "voters", info.Voters)
		}
		if s.group.Stats().LastLogIndex > 0 {
			if err := n.writeSeatMarker(id); err != nil {
				n.log.Warn("seat marker", "shard", id, "error", err)
			}
		}
		if want[id] || v.target != nil || !v.fromMeta {
			continue
		}
		if _, ok := v.ring.ShardByID(id); !ok && n.cfg.Topology.EffectiveVersion() <= v.version() {
			// The change that removed the shard is done: its partitions
			// moved out before it was activated, so the group serves
			// nothing. Its replicas close; its state stays parked. (A node
			// whose file is newer than the view is still learning the
			// change that creates the shard: it keeps it.)
			n.setShard(id, nil)
			if err := n.host.RemoveGroup(id); err != nil {
				n.log.Warn("closing the replica of a removed shard", "shard", id, "error", err)
			}
			n.park(id, s.sm)
			n.log.Info("replica closed: the shard was removed by a topology change", "shard", id)
			continue
		}
		// The change that took this seat away is done: the leader removed
		// this node from the group before the change was activated. This
		// node's meta replica may still be catching up after a restart,
		// so the shard's leader confirms first.
		if !n.leaderDropped(ctx, v, id) {
			continue
		}
		n.setShard(id, nil)
		if err := n.host.RemoveGroup(id); err != nil {
			n.log.Warn("closing the replica of a seat this node left", "shard", id, "error", err)
		}
		n.park(id, s.sm)
		n.log.Info("replica closed: this node no longer holds a seat in the shard", "shard", id)
	}
}

// leaderDropped reports whether the leader of shard id, found among the
// shard's voters in v, has this node in none of its members.
func (n *Node) leaderDropped(ctx context.Context, v *view, id string) bool {
	info, ok := v.placer.ShardByID(id)
	if !ok {
		return false
	}
	ls, err := n.leaderState(ctx, id, info.Voters, nil, nil)
	if err != nil {
		return false
	}
	return !slices.ContainsFunc(ls.members, func(m raftstore.Member) bool { return m.ID == n.cfg.NodeID })
}

// watchTopology applies every change of the meta state as it is applied,
// and re-checks every second (replicas that received state, peers).
func (n *Node) watchTopology(ctx context.Context) {
	for {
		_, changed := n.meta.read()
		leaderChanged := n.metaGroup.LeaderChanged()
		n.refreshView(ctx)
		n.initMeta(ctx)
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-leaderChanged:
		case <-time.After(time.Second):
		}
	}
}

// initMeta has the meta group's leader record the first active topology
// (the file the cluster was created with) once.
func (n *Node) initMeta(ctx context.Context) {
	if mv, _ := n.meta.read(); mv.active != nil || !n.metaGroup.IsLeader() || n.cfg.Topology.EffectiveVersion() != 1 {
		return
	}
	raw, err := json.Marshal(n.cfg.Topology)
	if err != nil {
		return
	}
	n.proposeMeta(ctx, metaCommand{Op: "init", Topology: raw})
}

// proposeMeta proposes cmd to the meta group and returns the state
// machine's refusal, or the proposal's error.
func (n *Node) proposeMeta(ctx context.Context, cmd metaCommand) error {
	data, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := n.metaGroup.Apply(ctx, data)
	if err != nil {
		return err
	}
	if e, ok := res.(error); ok {
		return e
	}
	return nil
}

// markSeatsOfOlderRelease writes the seat markers a data dir of a release
// without them lacks: every shard the node's file gives it and whose Raft
// directory exists held state.
func (n *Node) markSeatsOfOlderRelease() {
	if _, err := os.Stat(filepath.Join(n.cfg.DataDir, "seats")); err == nil {
		return
	}
	for _, s := range n.cfg.Topology.ShardsOnNode(n.cfg.NodeID) {
		if _, err := os.Stat(filepath.Join(n.cfg.DataDir, "raft", "shards", s.ID)); err == nil {
			if err := n.writeSeatMarker(s.ID); err != nil {
				n.log.Warn("seat marker", "shard", s.ID, "error", err)
			}
		}
	}
}
