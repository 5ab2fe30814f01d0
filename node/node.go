package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/console"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/forward"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/handoff"
	"github.com/idem-dev/idem/internal/datadir"
	"github.com/idem-dev/idem/internal/serving"
	"github.com/idem-dev/idem/internal/tracing"
	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/statedb"
	"github.com/idem-dev/idem/topology"
)

// Errors of package node.
var (
	// ErrInvalidConfig: Config.Validate failed; the joined errors say why.
	ErrInvalidConfig = errors.New("node: invalid config")
	// ErrDataDirMismatch: the data dir belongs to another cluster, node or ring.
	ErrDataDirMismatch = datadir.ErrMismatch
	// ErrStateLost: the data dir held this node's Raft state (it has an
	// identity file) but the state is missing, truncated or unreadable, or
	// the data dir is empty while another node already holds state of a
	// group this node would bootstrap; the node refuses to start (idemctl
	// replace-node brings it back).
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
	// waiters are the reserves waiting here for a key of the shard; the
	// FSM's OnApply wakes them.
	waiters *backend.Waiters
}

// Node is one idemnode: the Raft groups of the shards it hosts, the public
// API over them, and forwarding for every key it does not lead. It is the
// server.Backend of its own API (this file); process.go starts and stops it,
// loops.go runs its background work.
type Node struct {
	// rings are the rings of the topologies this node placed keys with
	// lately (view and mover).
	rings *ringCache
	cfg   Config
	log   *slog.Logger
	self  topology.Node
	// viewp is the cluster's shape as this node knows it (elastic.go);
	// layout is the key layout its data dir holds, which never changes.
	viewp  atomic.Pointer[view]
	layout string
	// applied is the view whose nodes and clock peers refreshView set
	// up last; only its goroutine touches it.
	applied *view
	fwd     *forward.Forwarder
	api     *server.Server
	// console is the operator console at /ui/; httpHandler is what the
	// HTTP listener serves (the API behind its authentication), through
	// which the console reads and acts.
	console     *console.Console
	httpHandler http.Handler
	tracer      trace.Tracer // nil: tracing off
	// unsafeGauge is idem_node_unsafe_settings (safety.go).
	unsafeGauge *prometheus.GaugeVec
	// waiting counts the reserves with a wait in ApplyRouted (bounded by
	// Config.MaxWaiters); waitRefusals counts those answered without one.
	waiting      atomic.Int64
	waitRefusals prometheus.Counter
	// repeats counts completes answered from the state (repeat.go).
	repeats prometheus.Counter

	// Set by Start.
	host  *raftstore.Host
	state *statedb.DB // every hosted shard's records, on disk
	// shardsp holds the hosted replicas by shard id, replaced whole on a
	// change (copy on write under shardsMu): seats come and go online.
	shardsp  atomic.Pointer[map[string]*shard]
	shardsMu sync.Mutex
	parked   map[string]*statedb.StateMachine // of closed replicas (elastic.go)
	marked   sync.Map                         // seat markers known to exist (elastic.go)
	// meta is the meta group's state machine (the replicated topology)
	// and metaGroup its Raft group; topoMetrics its metrics.
	meta        *metaSM
	metaGroup   *raftstore.Group
	topoMetrics *topoMetrics
	batches     batchSizer // of the partition moves this node drives
	drops       dropLedger // sources this node confirmed clean, per change
	// driver drives the partition handoffs of a change while this node
	// leads the meta group (package handoff).
	driver *handoff.Driver
	// moveWait is why the mover's last tick took no step (nil: it took
	// one), for topology status on the meta leader.
	moveWait       atomic.Pointer[string]
	dropFaults     atomic.Int64
	httpLn, grpcLn net.Listener
	servers        []serving.Server
	loops          []*loop
	keyMetrics     *keyMetrics

	started, served atomic.Bool
	// ringErr is set when a peer reports another cluster or ring: this
	// node's topology file is not the one the cluster was created with.
	ringErr  atomic.Pointer[error]
	clocks   *clocks
	admit    *admission       // set by Start
	disk     *diskSpace       // set by Start
	identity datadir.Identity // as read (or written) by Start
	// seenVersion is the highest cluster version this node's meta replica
	// showed (noteClusterVersion), clusterVersionGauge its metric.
	seenVersion         atomic.Int64
	clusterVersionGauge prometheus.Gauge
	// failure is set once the Raft log failed stop; failed is then closed
	// and Serve returns the error.
	failure   atomic.Pointer[error]
	failOnce  sync.Once
	failed    chan struct{}
	closeOnce sync.Once
	closeErr  error
	closed    chan struct{} // closed by closeAll: Serve returns
}

// localNow is this node's own wall clock (shifted by
// Config.Testing.ClockOffset in fault tests).
func (n *Node) localNow() int64 { return time.Now().Add(n.cfg.Testing.ClockOffset).UnixNano() }

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
	v := n.view()
	info := v.placer.Locate(cmd.Namespace, cmd.Key)
	if cmd.Op == fsm.OpReserve && cmd.Wait > 0 {
		// A waiting reserve holds a goroutine and a stream for up to 30 s:
		// past --max-waiters on this node it is answered at once, as with
		// wait_ms 0.
		if n.waiting.Add(1) > int64(n.cfg.MaxWaiters) {
			n.waitRefusals.Inc()
			noWait := *cmd
			noWait.Wait = 0
			cmd = &noWait
		}
		defer n.waiting.Add(-1)
	}
	prefer := ""
	if s := n.shard(info.ID); s != nil {
		var done bool
		if cmd.Op == fsm.OpReserve && cmd.Wait > 0 {
			res, leader, done, cmd, err = n.reserveWaiting(ctx, s, info, cmd)
		} else {
			res, leader, done, err = n.proposeLocal(ctx, s, info, cmd)
		}
		if done {
			if err == nil && res.Outcome == fsm.OutcomeMoved {
				return n.movedAway(ctx, info, cmd.Namespace, cmd.Key, res.MovedTo, hops, func(hops int) (fsm.Result, string, error) {
					return n.ApplyRouted(ctx, cmd, hops)
				})
			}
			return res, leader, err
		}
		prefer = leader
	}
	res, err = n.fwd.Apply(ctx, v.forwardShard(info), cmd, prefer, hops)
	leader = prefer
	if err == nil {
		if id, ok := n.fwd.Leader(info.ID); ok {
			leader = id
		}
	}
	return res, leader, err
}

// maxMovedHops bounds how often a command is sent on after a shard
// answered that the key's partition moved.
const maxMovedHops = 3

// movedAway answers for a key whose shard (info) no longer serves it: its
// partition moved to shard movedTo, or is moving ("" while it is being
// imported). Once this node's view places the key on another shard, again
// (hops: how often the request travelled already) is run; until then, and
// past maxMovedHops, the caller is asked to retry in a moment, which the
// contract allows while a key's shard hands over.
func (n *Node) movedAway(ctx context.Context, info topology.Shard, namespace, key, movedTo string, hops int, again func(hops int) (fsm.Result, string, error)) (fsm.Result, string, error) {
	if next := n.view().placer.Locate(namespace, key); next.ID != info.ID && hops < maxMovedHops {
		return again(hops + 1)
	}
	where := "to another shard"
	if movedTo != "" {
		where = "to shard " + movedTo
	}
	return fsm.Result{}, "", &server.UnavailableError{RetryAfter: time.Second,
		Reason: fmt.Sprintf("shard %s: the key's partition is moving %s (a topology change): retry with the same owner token after Retry-After", info.ID, where)}
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
		if res, ok := n.repeatedComplete(ctx, s, &stamped); ok {
			return res, n.cfg.NodeID, true, nil
		}
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
		if n.keyMetrics != nil {
			n.keyMetrics.observe(info.ID, cmd, res)
		}
		return res, n.cfg.NodeID, true, nil
	}
	var nle *raftstore.NotLeaderError
	if !errors.As(err, &nle) {
		return fsm.Result{}, "", true, unavailable(info, err)
	}
	return fsm.Result{}, nle.LeaderID, false, nil
}

// errForward ends a waiting reserve's loop when this replica stopped
// leading: the rest of the wait goes to the leader.
var errForward = errors.New("node: forward the rest of the wait")

// reserveWaiting runs a reserve with a wait on this replica while it leads
// (backend.Waiters: the shard's applies wake it). When the replica does not
// lead (or stops leading), done is false and rest is cmd with the wait left,
// for the caller to forward.
func (n *Node) reserveWaiting(ctx context.Context, s *shard, info topology.Shard, cmd *fsm.Command) (res fsm.Result, leader string, done bool, rest *fsm.Command, err error) {
	if n.tracer != nil && trace.SpanFromContext(ctx).IsRecording() {
		var span trace.Span
		ctx, span = n.tracer.Start(ctx, "idem.lease_wait", trace.WithAttributes(tracing.Shard.String(info.ID),
			tracing.WaitMs.Int64(cmd.Wait/int64(time.Millisecond))))
		defer func() {
			span.SetAttributes(attribute.Bool("idem.lease_wait.here", done), tracing.Outcome.String(res.Outcome.String()))
			span.End()
		}()
	}
	res, left, err := s.waiters.Reserve(ctx, cmd, n.cfg.ClockSkewMargin, n.now, func(ctx context.Context, c *fsm.Command) (fsm.Result, error) {
		r, l, d, e := n.proposeLocal(ctx, s, info, c)
		leader = l
		if !d {
			return fsm.Result{}, errForward
		}
		return r, e
	})
	if errors.Is(err, errForward) {
		next := *cmd
		next.Wait = int64(left)
		return fsm.Result{}, leader, false, &next, nil
	}
	return res, leader, true, cmd, err
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
	v := n.view()
	info := v.placer.Locate(namespace, key)
	prefer := ""
	if s := n.shard(info.ID); s != nil {
		err := s.group.ReadBarrier(ctx)
		if err == nil {
			// Ownership and the record in one view of the state: a freeze
			// and drop applied between two reads would answer not found
			// for a key that moved.
			rec, ok, owned, movedTo, _ := s.fsm.Read(namespace, key, n.now())
			if !owned {
				var rec fsm.Record
				var found bool
				_, leader, err := n.movedAway(ctx, info, namespace, key, movedTo, hops, func(hops int) (fsm.Result, string, error) {
					var leader string
					var err error
					rec, found, leader, err = n.GetRouted(ctx, namespace, key, hops)
					return fsm.Result{}, leader, err
				})
				return rec, found, leader, err
			}
			return rec, ok, n.cfg.NodeID, nil
		}
		var nle *raftstore.NotLeaderError
		if !errors.As(err, &nle) {
			return fsm.Record{}, false, "", unavailable(info, err)
		}
		prefer = nle.LeaderID
	}
	rec, found, err := n.fwd.Get(ctx, v.forwardShard(info), namespace, key, prefer, hops)
	leader := prefer
	if id, ok := n.fwd.Leader(info.ID); ok && err == nil {
		leader = id
	}
	return rec, found, leader, err
}

// List implements backend.Backend: one page over every shard of the ring,
// each shard's part read on its leader (here after a read barrier, or
// forwarded).
func (n *Node) List(ctx context.Context, q backend.ListQuery) (backend.ListPage, error) {
	return backend.ListShards(ctx, forward.ShardIDs(n.view().placer), q, func(ctx context.Context, id string, sq backend.ShardQuery) (fsm.ListPage, error) {
		return n.ListShard(ctx, id, sq, 0)
	})
}

// ListShard answers one shard's part of a listing page: from the local
// state machine after a read barrier when this node leads the shard,
// otherwise forwarded to the leader (hops: how often it was forwarded).
func (n *Node) ListShard(ctx context.Context, id string, q backend.ShardQuery, hops int) (fsm.ListPage, error) {
	v := n.view()
	info, ok := v.placer.ShardByID(id)
	if !ok {
		return fsm.ListPage{}, &backend.Error{Code: server.CodeInvalidArgument, Message: fmt.Sprintf("no shard %q in this cluster's ring", id)}
	}
	prefer := ""
	if s := n.shard(id); s != nil {
		err := s.group.ReadBarrier(ctx)
		if err == nil {
			now := n.now()
			page, err := s.fsm.List(q.FSMQuery(now), now)
			if err != nil {
				return fsm.ListPage{}, &backend.Error{Code: contract.CodeInternal, Message: err.Error()}
			}
			return page, nil
		}
		var nle *raftstore.NotLeaderError
		if !errors.As(err, &nle) {
			return fsm.ListPage{}, unavailable(info, err)
		}
		prefer = nle.LeaderID
	}
	return n.fwd.ListShard(ctx, v.forwardShard(info), q, prefer, hops)
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
	if mv, _ := n.meta.read(); mv.active == nil {
		return errors.New("node: the cluster's topology is not known here yet (the meta group has not replicated it to this node)")
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

// hostedShard is one hosted replica and its shard id.
type hostedShard struct {
	id string
	*shard
}

// hosted returns the hosted replicas sorted by shard id, from one read of
// the shard map. A loop over them never meets a nil replica: one that a
// topology change removes meanwhile stays safe to use (its group answers as
// closed), where n.shard(id) looked up again after the change is nil.
func (n *Node) hosted() []hostedShard {
	m := n.shardMap()
	out := make([]hostedShard, 0, len(m))
	for id, s := range m {
		out = append(out, hostedShard{id: id, shard: s})
	}
	slices.SortFunc(out, func(a, b hostedShard) int { return strings.Compare(a.id, b.id) })
	return out
}
