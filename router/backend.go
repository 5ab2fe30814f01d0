package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/forward"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/topology"
)

// Errors of the router's Backend.
var (
	// ErrInvalidBackendConfig: BackendConfig.Validate failed; the joined
	// errors say which fields and why.
	ErrInvalidBackendConfig = errors.New("router: invalid backend config")
	// ErrNoNodeReachable: Backend.Ready found no storage node it can reach
	// (none started yet, or a network problem between router and nodes).
	ErrNoNodeReachable = errors.New("router: no storage node reachable")
)

// Defaults of BackendConfig.
const (
	// DefaultRequestTimeout bounds one request forwarded by the router,
	// retries included (the contract's --request-timeout default).
	DefaultRequestTimeout = 5 * time.Second
	// DefaultAttemptTimeout bounds one attempt to one node.
	DefaultAttemptTimeout = 2 * time.Second
	// DefaultRetryAfter is the Retry-After hint of an UNAVAILABLE answer.
	DefaultRetryAfter = time.Second
	// DefaultMaxMessageBytes is the largest gRPC message exchanged with a
	// node: a 1 MiB stored response plus room for headers and fields, the
	// same as contract.GRPCMaxMessageBytes for the default limit.
	DefaultMaxMessageBytes = 4 << 20
)

// BackendConfig configures a Backend, the backend.Backend of a stateless
// router (idemrouter).
type BackendConfig struct {
	// Topology is the cluster topology, the same file as the nodes'.
	// Required.
	Topology *topology.Topology
	// Ring maps keys to shards. Nil builds it from Topology; when set it
	// must have been built from the same topology (its cluster is checked).
	Ring *topology.Ring
	// Region is the region this router runs in; it must be a region of
	// Topology. Its nodes are probed first for readiness and it labels the
	// router's log lines.
	Region string
	// RequestTimeout bounds one forwarded request, retries included; past
	// it the answer is 503 UNAVAILABLE. 0 means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// AttemptTimeout bounds one attempt to one node, so that a node that
	// swallows traffic costs one attempt, not the whole request. 0 means
	// DefaultAttemptTimeout (capped at RequestTimeout).
	AttemptTimeout time.Duration
	// RetryAfter is the Retry-After hint sent with 503 UNAVAILABLE when the
	// home shard could not be reached. 0 means DefaultRetryAfter.
	RetryAfter time.Duration
	// MaxMessageBytes is the largest gRPC message sent to or accepted from a
	// node; match the nodes' contract.GRPCMaxMessageBytes. 0 means
	// DefaultMaxMessageBytes.
	MaxMessageBytes int
	// DialOptions, when set, replace forward.DefaultDialOptions (credentials and
	// reconnect backoff); the message size limits are added either way.
	DialOptions []grpc.DialOption
	// Logger; nil discards.
	Logger *slog.Logger
	// Registry receives the forwarding metrics (idem_forward_*) and the
	// router's (idem_router_*). Nil registers nothing (Stats still counts).
	Registry *prometheus.Registry
	// TracerProvider, when set, gives each forward a span and sends the
	// W3C traceparent to the nodes (forward.ForwarderConfig). Nil: off.
	TracerProvider trace.TracerProvider
}

// DefaultBackendConfig returns a BackendConfig with the defaults filled in;
// set Topology and Region before use.
func DefaultBackendConfig() BackendConfig {
	return BackendConfig{
		RequestTimeout:  DefaultRequestTimeout,
		AttemptTimeout:  DefaultAttemptTimeout,
		RetryAfter:      DefaultRetryAfter,
		MaxMessageBytes: DefaultMaxMessageBytes,
	}
}

// Validate reports every problem of c at once; each wraps
// ErrInvalidBackendConfig.
func (c BackendConfig) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidBackendConfig}, args...)...))
	}
	if c.Topology == nil {
		bad("a topology is required")
	} else {
		if c.Region == "" {
			bad("a region is required (one of %v)", topologyRegions(c.Topology))
		} else if _, ok := c.Topology.RegionByName(c.Region); !ok {
			bad("region %q is not in the topology of cluster %q (regions: %v)", c.Region, c.Topology.Cluster, topologyRegions(c.Topology))
		}
		if c.Ring != nil && c.Ring.Cluster() != c.Topology.Cluster {
			bad("the ring is of cluster %q, the topology of cluster %q", c.Ring.Cluster(), c.Topology.Cluster)
		}
	}
	if c.RequestTimeout < 0 {
		bad("request timeout %s is negative", c.RequestTimeout)
	}
	if c.AttemptTimeout < 0 {
		bad("attempt timeout %s is negative", c.AttemptTimeout)
	}
	if c.RetryAfter < 0 {
		bad("retry-after %s is negative", c.RetryAfter)
	}
	if c.MaxMessageBytes < 0 {
		bad("max message bytes %d is negative", c.MaxMessageBytes)
	}
	return errors.Join(errs...)
}

func topologyRegions(t *topology.Topology) []string {
	names := make([]string, 0, len(t.Regions))
	for _, r := range t.Regions {
		names = append(names, r.Name)
	}
	return names
}

func (c *BackendConfig) fillDefaults() {
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.AttemptTimeout == 0 {
		c.AttemptTimeout = min(DefaultAttemptTimeout, c.RequestTimeout)
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.DialOptions == nil {
		c.DialOptions = forward.DefaultDialOptions()
	}
	c.DialOptions = append(append([]grpc.DialOption(nil), c.DialOptions...),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.MaxMessageBytes), grpc.MaxCallSendMsgSize(c.MaxMessageBytes)))
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Backend is the backend.Backend of a stateless router: it locates each
// key's shard on the ring and forwards the request to the shard's leader
// through a Forwarder (leader cache, bounded retries that cannot apply a
// command twice), within RequestTimeout. A shard it cannot reach in time,
// such as one homed in a lost region, gets a *backend.UnavailableError
// (503 UNAVAILABLE with Retry-After), never any other answer; when the
// background probes see every voter of the shard refuse connections, that
// answer comes at once instead of after a round of retries. Ready holds
// once a node is reachable and stays while a remote region is lost.
type Backend struct {
	cfg BackendConfig
	log *slog.Logger
	// ringp is the ring the backend routes with: the file's until a node
	// reports a newer topology version (follow.go), then the cluster's.
	ringp atomic.Pointer[topology.Ring]
	// version is the topology version ringp reflects (active and target).
	version atomic.Pointer[followedVersion]
	fwd     *forward.Forwarder

	// Readiness: one gRPC connection per node, watched in the background.
	probeCtx    context.Context
	stopProbes  context.CancelFunc
	probes      sync.WaitGroup
	probeConns  map[string]*grpc.ClientConn
	nodeReady   map[string]*atomic.Bool
	nodeDown    map[string]*atomic.Bool
	readyNodes  atomic.Int64
	closeOnce   sync.Once
	unavailable atomic.Uint64
	forwarded   atomic.Uint64
	// ringErr is set (once) when a node reports another cluster or ring.
	ringErr   atomic.Pointer[error]
	ringCheck chan struct{} // closed once a node answered the ring check

	unavailableTotal *prometheus.CounterVec
	requestDuration  *prometheus.HistogramVec
	reachableNodes   *prometheus.GaugeVec
}

// BackendStats are the figures of a Backend's metrics, for tests and status
// pages.
type BackendStats struct {
	// Nodes is the number of storage nodes in the topology.
	Nodes int
	// ReachableNodes is how many of them have a ready gRPC connection now.
	ReachableNodes int
	// Forwarded counts requests the router answered with the store's
	// decision.
	Forwarded uint64
	// Unavailable counts requests answered 503 UNAVAILABLE.
	Unavailable uint64
}

// NewBackend validates cfg, builds the ring (unless given) and the
// Forwarder, and starts watching the connections to the nodes. Close it
// when done.
func NewBackend(cfg BackendConfig) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.fillDefaults()
	ring := cfg.Ring
	if ring == nil {
		var err error
		if ring, err = topology.NewRing(cfg.Topology); err != nil {
			return nil, err
		}
	}
	b := &Backend{
		cfg:        cfg,
		log:        cfg.Logger.With("region", cfg.Region),
		probeConns: map[string]*grpc.ClientConn{},
		ringCheck:  make(chan struct{}),
		nodeReady:  map[string]*atomic.Bool{},
		nodeDown:   map[string]*atomic.Bool{},
		unavailableTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_router_unavailable_total",
			Help: "Requests the router answered 503 UNAVAILABLE because the key's shard could not be reached in time, by the shard's home region.",
		}, []string{"region"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_router_request_duration_seconds",
			Help:    "Time to answer one forwarded request, retries included, by the key's home region and outcome (decided, unavailable, error).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"region", "outcome"}),
		reachableNodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idem_router_reachable_nodes",
			Help: "Storage nodes this router has a ready gRPC connection to, by the nodes' region.",
		}, []string{"region"}),
	}
	var reg prometheus.Registerer
	if cfg.Registry != nil {
		reg = cfg.Registry
		for _, c := range []prometheus.Collector{b.unavailableTotal, b.requestDuration, b.reachableNodes} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("router: register backend metrics: %w", err)
			}
		}
	}
	var err error
	b.fwd, err = forward.NewForwarder(forward.ForwarderConfig{
		Topology: cfg.Topology, AttemptTimeout: cfg.AttemptTimeout, DialOptions: cfg.DialOptions,
		Logger: b.log, Registry: reg, TracerProvider: cfg.TracerProvider,
	})
	if err != nil {
		return nil, err
	}
	for _, r := range cfg.Topology.Regions {
		b.reachableNodes.WithLabelValues(r.Name).Set(0)
		for _, n := range r.Nodes {
			conn, err := grpc.NewClient(n.GRPCAddr, append(cfg.DialOptions, grpc.WithIdleTimeout(0))...)
			if err != nil {
				b.closeConns()
				b.fwd.Close()
				return nil, fmt.Errorf("router: dial %s (%s): %w", n.ID, n.GRPCAddr, err)
			}
			b.probeConns[n.ID] = conn
			b.nodeReady[n.ID] = new(atomic.Bool)
			b.nodeDown[n.ID] = new(atomic.Bool)
		}
	}
	b.ringp.Store(ring)
	b.version.Store(&followedVersion{active: cfg.Topology.EffectiveVersion()})
	b.probeCtx, b.stopProbes = context.WithCancel(context.Background())
	b.probes.Add(1)
	go func() {
		defer b.probes.Done()
		b.follow(b.probeCtx)
	}()
	for _, id := range b.probeOrder() {
		b.probes.Add(1)
		go b.watch(id)
	}
	b.probes.Add(1)
	go func() {
		defer b.probes.Done()
		forward.NewRingCheck(cfg.Topology, ring, "", b.fwd.Conn).Watch(b.probeCtx, time.Second, func(err error) {
			if err != nil {
				b.ringErr.Store(&err)
				b.log.Error("refusing to route: the cluster was created with another ring", "error", err)
			}
			close(b.ringCheck)
		})
	}()
	return b, nil
}

// RingError waits until a node has answered the ring check (or ctx ends)
// and returns a non-nil error wrapping forward.ErrRingMismatch when the cluster was
// created with another cluster name or ring than this router's topology.
// It returns nil when the rings match or no node answered in time.
func (b *Backend) RingError(ctx context.Context) error {
	select {
	case <-b.ringCheck:
	case <-ctx.Done():
	}
	if p := b.ringErr.Load(); p != nil {
		return *p
	}
	return nil
}

// misrouted is the error of every request while the ring does not match.
func (b *Backend) misrouted() error {
	if p := b.ringErr.Load(); p != nil {
		return &backend.UnavailableError{RetryAfter: time.Minute, Reason: (*p).Error()}
	}
	return nil
}

// probeOrder lists the nodes of this router's region first, so that the
// connections it most likely needs are established first.
func (b *Backend) probeOrder() []string {
	ids := make([]string, 0, len(b.probeConns))
	for id := range b.probeConns {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		ri, _ := b.cfg.Topology.RegionOf(ids[i])
		rj, _ := b.cfg.Topology.RegionOf(ids[j])
		if (ri == b.cfg.Region) != (rj == b.cfg.Region) {
			return ri == b.cfg.Region
		}
		return ids[i] < ids[j]
	})
	return ids
}

// watch follows the connectivity of one node's probe connection: it keeps
// the connection trying to connect (gRPC paces retries with its backoff) and
// records whether it is READY, and whether it is down: its last connection
// attempt failed and none has succeeded since.
func (b *Backend) watch(id string) {
	defer b.probes.Done()
	conn := b.probeConns[id]
	region, _ := b.cfg.Topology.RegionOf(id)
	conn.Connect()
	for {
		st := conn.GetState()
		up := st == connectivity.Ready
		switch st {
		case connectivity.Ready:
			b.nodeDown[id].Store(false)
		case connectivity.TransientFailure:
			b.nodeDown[id].Store(true)
		}
		if b.nodeReady[id].Swap(up) != up {
			delta := 1.0
			if !up {
				delta = -1
			}
			b.readyNodes.Add(int64(delta))
			b.reachableNodes.WithLabelValues(region).Add(delta)
			b.log.Debug("node reachability changed", "node", id, "reachable", up, "state", st.String())
		}
		if st == connectivity.Idle {
			conn.Connect()
		}
		if !conn.WaitForStateChange(b.probeCtx, st) {
			return
		}
	}
}

// Close stops the probes and closes every connection.
func (b *Backend) Close() error {
	var err error
	b.closeOnce.Do(func() {
		b.stopProbes()
		b.probes.Wait()
		err = errors.Join(b.closeConns(), b.fwd.Close())
	})
	return err
}

func (b *Backend) closeConns() error {
	var errs []error
	for _, c := range b.probeConns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// Ring returns the ring the backend routes with.
func (b *Backend) Ring() *topology.Ring { return b.ringp.Load() }

// Forwarder returns the backend's Forwarder (its leader cache).
func (b *Backend) Forwarder() *forward.Forwarder { return b.fwd }

// Stats returns the backend's figures.
func (b *Backend) Stats() BackendStats {
	return BackendStats{
		Nodes:          len(b.probeConns),
		ReachableNodes: int(b.readyNodes.Load()),
		Forwarded:      b.forwarded.Load(),
		Unavailable:    b.unavailable.Load(),
	}
}

// Ready implements backend.Backend: the topology is loaded (it is, once
// NewBackend returned) and at least one node has a ready connection. It
// reads what the background probes found and never blocks. Losing a remote
// region keeps the router ready: it answers 503 for that region's keys.
func (b *Backend) Ready(ctx context.Context) error {
	if p := b.ringErr.Load(); p != nil {
		return *p
	}
	if b.readyNodes.Load() > 0 {
		return nil
	}
	return fmt.Errorf("%w: none of the %d nodes of cluster %q answers on its gRPC address yet",
		ErrNoNodeReachable, len(b.probeConns), b.cfg.Topology.Cluster)
}

// unreachable reports whether every voter of shard is down: its connection
// attempts fail (refused or timed out: a lost region). Forwarding would
// only cycle through the voters' refusals, so the answer is UNAVAILABLE at
// once. A voter whose state is not known yet counts as reachable.
func (b *Backend) unreachable(shard topology.Shard) bool {
	for _, v := range shard.Voters {
		if down, ok := b.nodeDown[v]; !ok || !down.Load() {
			return false
		}
	}
	return true
}

// errUnreachable is the cause of a fast UNAVAILABLE: every voter is down.
var errUnreachable = errors.New("router: no voter of the shard can be connected to")

// Apply implements backend.Backend: it forwards cmd to the leader of its
// key's shard. The server has set the owner token of a reserve, so a
// forwarded retry is the same reservation.
func (b *Backend) Apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, error) {
	res, _, err := b.ApplyRouted(ctx, cmd, 0)
	return res, err
}

// ApplyRouted implements backend.Routed: Apply for a request forwarded hops
// times already. A router names no leader to its callers (clients).
func (b *Backend) ApplyRouted(ctx context.Context, cmd *fsm.Command, hops int) (fsm.Result, string, error) {
	if err := b.misrouted(); err != nil {
		return fsm.Result{}, "", err
	}
	shard := b.Ring().Locate(cmd.Namespace, cmd.Key)
	if b.unreachable(shard) {
		return fsm.Result{}, "", b.finish(ctx, shard, time.Now(), errUnreachable)
	}
	// A waiting reserve is held on the leader on purpose: its wait adds to
	// the deadline, as does the time a large payload takes to replicate.
	ctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout+time.Duration(cmd.Wait)+forward.PayloadAllowance(cmd))
	defer cancel()
	start := time.Now()
	res, err := b.fwd.Apply(ctx, shard, cmd, "", hops)
	return res, "", b.finish(ctx, shard, start, err)
}

// Get implements backend.Backend with a linearizable read on the shard's
// leader.
func (b *Backend) Get(ctx context.Context, namespace, key string) (fsm.Record, bool, error) {
	rec, found, _, err := b.GetRouted(ctx, namespace, key, 0)
	return rec, found, err
}

// GetRouted implements backend.Routed: Get for a request forwarded hops
// times already.
func (b *Backend) GetRouted(ctx context.Context, namespace, key string, hops int) (fsm.Record, bool, string, error) {
	if err := b.misrouted(); err != nil {
		return fsm.Record{}, false, "", err
	}
	shard := b.Ring().Locate(namespace, key)
	if b.unreachable(shard) {
		return fsm.Record{}, false, "", b.finish(ctx, shard, time.Now(), errUnreachable)
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
	defer cancel()
	start := time.Now()
	rec, found, err := b.fwd.Get(ctx, shard, namespace, key, "", hops)
	return rec, found, "", b.finish(ctx, shard, start, err)
}

// finish records the request's metrics and turns every failure to reach
// the shard into a *backend.UnavailableError. Answers the store decided
// (a *backend.Error: INVALID_ARGUMENT, PAYLOAD_TOO_LARGE, ...) pass through
// unchanged.
func (b *Backend) finish(ctx context.Context, shard topology.Shard, start time.Time, err error) error {
	outcome := "decided"
	defer func() {
		b.requestDuration.WithLabelValues(shard.HomeRegion, outcome).Observe(time.Since(start).Seconds())
	}()
	if err == nil {
		b.forwarded.Add(1)
		return nil
	}
	unreachable := err == errUnreachable || errors.Is(err, backend.ErrUnavailable) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || ctx.Err() != nil
	if !unreachable {
		var be *backend.Error
		if errors.As(err, &be) {
			b.forwarded.Add(1)
			return err
		}
		outcome = "error"
		return err
	}
	outcome = "unavailable"
	b.unavailable.Add(1)
	b.unavailableTotal.WithLabelValues(shard.HomeRegion).Inc()
	reason := fmt.Sprintf("shard %s (home region %s) could not be reached in %s", shard.ID, shard.HomeRegion, time.Since(start).Round(time.Millisecond))
	if err == errUnreachable {
		reason = fmt.Sprintf("shard %s (home region %s): no voter (%v) can be connected to", shard.ID, shard.HomeRegion, shard.Voters)
	} else if ue := (*backend.UnavailableError)(nil); errors.As(err, &ue) && ue.Reason != "" {
		reason = ue.Reason
	}
	b.log.Debug("shard unavailable", "shard", shard.ID, "home_region", shard.HomeRegion, "error", err)
	return &backend.UnavailableError{
		RetryAfter: b.cfg.RetryAfter,
		Reason:     reason,
	}
}

// SetPolicy implements backend.Policies: the set-policy goes to the leader
// of every shard, within RequestTimeout.
func (b *Backend) SetPolicy(ctx context.Context, cmd *fsm.Command) (fsm.Policy, error) {
	if err := b.misrouted(); err != nil {
		return fsm.Policy{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
	defer cancel()
	err := backend.SetPolicyShards(ctx, forward.ShardIDs(b.Ring()), func(ctx context.Context, id string) error {
		shard, _ := b.Ring().ShardByID(id)
		start := time.Now()
		return b.finish(ctx, shard, start, b.fwd.SetShardPolicy(ctx, shard, cmd, "", 0))
	})
	if err != nil {
		return fsm.Policy{}, err
	}
	return *cmd.Policy, nil
}

// GetPolicy implements backend.Policies: the policy as the first shard's
// leader holds it (every shard holds the same once a set-policy returned).
func (b *Backend) GetPolicy(ctx context.Context, namespace string) (fsm.Policy, bool, error) {
	if err := b.misrouted(); err != nil {
		return fsm.Policy{}, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
	defer cancel()
	shard, _ := b.Ring().ShardByID(forward.ShardIDs(b.Ring())[0])
	start := time.Now()
	p, err := b.fwd.GetPolicy(ctx, shard, namespace, "", 0)
	return p, err == nil, b.finish(ctx, shard, start, err)
}

// List implements backend.Backend: one page across the shards, each
// shard's part read on its leader, the page within RequestTimeout.
func (b *Backend) List(ctx context.Context, q backend.ListQuery) (backend.ListPage, error) {
	if err := b.misrouted(); err != nil {
		return backend.ListPage{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
	defer cancel()
	return backend.ListShards(ctx, forward.ShardIDs(b.Ring()), q, func(ctx context.Context, id string, sq backend.ShardQuery) (fsm.ListPage, error) {
		shard, _ := b.Ring().ShardByID(id)
		if b.unreachable(shard) {
			return fsm.ListPage{}, b.finish(ctx, shard, time.Now(), errUnreachable)
		}
		start := time.Now()
		page, err := b.fwd.ListShard(ctx, shard, sq, "", 0)
		return page, b.finish(ctx, shard, start, err)
	})
}
