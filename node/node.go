package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/serving"
	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/router"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/statedb"
	"github.com/idem-dev/idem/topology"
)

// Errors of package node.
var (
	// ErrInvalidConfig: Config.Validate failed; the joined errors say why.
	ErrInvalidConfig = errors.New("node: invalid config")
	// ErrDataDirMismatch: the data dir belongs to another cluster, node or ring.
	ErrDataDirMismatch = errors.New("node: data dir does not match this node")
	// ErrStateLost: the data dir held this node's Raft state (it has an
	// identity file) but the state is missing, truncated or unreadable; the
	// node refuses to start (idemctl replace-node brings it back).
	ErrStateLost = errors.New("node: Raft state lost")
	// ErrClockSkewed: this node's clock is off from its peers' by more than
	// Config.MaxClockOffset, or a shard's voters' clocks do not agree: it
	// leads nothing, is not ready, and stamps no time.
	ErrClockSkewed = errors.New("node: clock skewed")
	// ErrNotStarted: Serve or Ready was called before Start.
	ErrNotStarted = errors.New("node: not started (call Start, or Run)")
)

// shard is one Raft group hosted here with its state machine.
type shard struct {
	info  topology.Shard
	group *raftstore.Group
	sm    *statedb.StateMachine
	fsm   *fsm.FSM
}

// Node is one idemnode: the Raft groups of the shards it hosts, the public
// API over them, and forwarding for every key it does not lead. It is the
// server.Backend of its own API (this file); process.go starts and stops it,
// loops.go runs its background work.
type Node struct {
	cfg  Config
	log  *slog.Logger
	self topology.Node
	ring *topology.Ring
	fwd  *router.Forwarder
	api  *server.Server

	// Set by Start.
	host           *raftstore.Host
	state          *statedb.DB // every hosted shard's records, on disk
	shards         map[string]*shard
	httpLn, grpcLn net.Listener
	servers        []serving.Server
	loops          []*loop

	started, served atomic.Bool
	// ringErr is set when a peer reports another cluster or ring: this
	// node's topology file is not the one the cluster was created with.
	ringErr  atomic.Pointer[error]
	clocks   *clocks
	admit    *admission // set by Start
	disk     *diskSpace // set by Start
	identity identity   // as read (or written) by Start
	// failure is set once the Raft log failed stop; failed is then closed
	// and Serve returns the error.
	failure   atomic.Pointer[error]
	failOnce  sync.Once
	failed    chan struct{}
	closeOnce sync.Once
	closeErr  error
	closed    chan struct{} // closed by closeAll: Serve returns
}

// localNow is this node's own wall clock (shifted by Config.ClockOffset in
// fault tests).
func (n *Node) localNow() int64 { return time.Now().Add(n.cfg.ClockOffset).UnixNano() }

// now is this node's clock corrected by its offset to its peers': reads
// judge expiry with it. Commands are stamped by clocks.stamp.
func (n *Node) now() int64 { return n.clocks.now() }

// Apply implements backend.Backend: ApplyRouted for a request that was not
// forwarded.
func (n *Node) Apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, error) {
	res, _, err := n.ApplyRouted(ctx, cmd, 0)
	return res, err
}

// ApplyRouted implements backend.Routed: it proposes cmd to the shard's Raft
// group when this node leads it, and forwards it to the leader otherwise
// (hops: how often the request was forwarded already). leader is the node
// this node believes leads the shard; the gRPC service tells its caller
// (other nodes' and routers' forwarders learn leaders from it).
func (n *Node) ApplyRouted(ctx context.Context, cmd *fsm.Command, hops int) (res fsm.Result, leader string, err error) {
	info := n.ring.Locate(cmd.Namespace, cmd.Key)
	prefer := ""
	if s := n.shards[info.ID]; s != nil {
		res, leader, done, err := n.proposeLocal(ctx, s, info, cmd)
		if done {
			return res, leader, err
		}
		prefer = leader
	}
	res, err = n.fwd.Apply(ctx, info, cmd, prefer, hops)
	leader = prefer
	if err == nil {
		if id, ok := n.fwd.Leader(info.ID); ok {
			leader = id
		}
	}
	return res, leader, err
}

// proposeLocal proposes cmd to this node's replica s of the key's shard.
// done is false when the replica does not lead (leader is then the one it
// knows of, "" if none): the caller forwards.
func (n *Node) proposeLocal(ctx context.Context, s *shard, info topology.Shard, cmd *fsm.Command) (res fsm.Result, leader string, done bool, err error) {
	stamped := *cmd
	if err := n.clocks.stamp(&stamped, info.Voters); err != nil {
		if !s.group.IsLeader() { // the leader stamps it
			leader, _ = s.group.Leader()
			return fsm.Result{}, leader, false, nil
		}
		return fsm.Result{}, "", true, unavailable(info, err)
	}
	stamped.SkewMargin = int64(n.cfg.ClockSkewMargin)
	if s.group.IsLeader() {
		if err := n.admit.admit(s, &stamped); err != nil { // disk reserve, --max-state-bytes
			return fsm.Result{}, n.cfg.NodeID, true, err
		}
	}
	v, err := s.group.Apply(ctx, fsm.EncodeCommand(&stamped))
	if err == nil {
		res, ok := v.(fsm.Result)
		if !ok {
			return fsm.Result{}, n.cfg.NodeID, true, fmt.Errorf("node: shard %s returned %T", info.ID, v)
		}
		return res, n.cfg.NodeID, true, nil
	}
	var nle *raftstore.NotLeaderError
	if !errors.As(err, &nle) {
		return fsm.Result{}, "", true, unavailable(info, err)
	}
	return fsm.Result{}, nle.LeaderID, false, nil
}

// Get implements backend.Backend: GetRouted for a request that was not
// forwarded.
func (n *Node) Get(ctx context.Context, namespace, key string) (fsm.Record, bool, error) {
	rec, found, _, err := n.GetRouted(ctx, namespace, key, 0)
	return rec, found, err
}

// GetRouted implements backend.Routed with a linearizable read: on the
// leader after a read barrier, otherwise forwarded to the leader.
func (n *Node) GetRouted(ctx context.Context, namespace, key string, hops int) (fsm.Record, bool, string, error) {
	info := n.ring.Locate(namespace, key)
	prefer := ""
	if s := n.shards[info.ID]; s != nil {
		err := s.group.ReadBarrier(ctx)
		if err == nil {
			rec, ok := s.fsm.Get(namespace, key, n.now())
			return rec, ok, n.cfg.NodeID, nil
		}
		var nle *raftstore.NotLeaderError
		if !errors.As(err, &nle) {
			return fsm.Record{}, false, "", unavailable(info, err)
		}
		prefer = nle.LeaderID
	}
	rec, found, err := n.fwd.Get(ctx, info, namespace, key, prefer, hops)
	return rec, found, "", err
}

func unavailable(info topology.Shard, err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	return &server.UnavailableError{Reason: fmt.Sprintf("shard %s: %v", info.ID, err)}
}

// Ready implements server.Backend: every hosted shard has a leader and this
// node has applied what it knows to be committed.
func (n *Node) Ready(ctx context.Context) error {
	if p := n.ringErr.Load(); p != nil {
		return *p
	}
	if n.host == nil {
		return ErrNotStarted
	}
	if err := n.clocks.skewed(); err != nil {
		return err
	}
	return n.host.Ready()
}

// WaitReady blocks until Ready is nil or ctx ends.
func (n *Node) WaitReady(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		err := n.Ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node: not ready: %w (last: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

func (n *Node) shardIDs() []string {
	ids := make([]string, 0, len(n.shards))
	for id := range n.shards {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}
