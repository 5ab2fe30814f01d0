package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/rpcbatch"
	"github.com/idem-dev/idem/internal/tracing"
	"github.com/idem-dev/idem/internal/wire"
	"github.com/idem-dev/idem/security/auth"

	"github.com/idem-dev/idem/topology"
)

// Metadata keys of forwarded requests, defined with the wire protocol in
// api/idem/v1.
const (
	HopsHeader   = idemv1.HopsHeader
	LeaderHeader = idemv1.LeaderHeader
	MaxHops      = idemv1.MaxHops
)

// ForwarderConfig configures a Forwarder.
type ForwarderConfig struct {
	// Topology names the nodes and their gRPC addresses. Required.
	Topology *topology.Topology
	// Self is this process's node id, never dialled; empty for a router.
	Self string
	// AttemptTimeout bounds one forwarded attempt, so a node that swallows
	// traffic (a partition) costs one attempt, not the whole deadline.
	// Zero means 2s.
	AttemptTimeout time.Duration
	// DialOptions for the gRPC connections; nil means DefaultDialOptions().
	DialOptions []grpc.DialOption
	// Logger; nil discards.
	Logger *slog.Logger
	// Registry for forwarding metrics; nil registers nothing.
	Registry prometheus.Registerer
	// TracerProvider, when set, gives every forwarded attempt a span
	// (shard, target region and node, hop count) and sends the W3C
	// traceparent with it, so that the next node's spans join the trace.
	// Nil: tracing off.
	TracerProvider trace.TracerProvider
}

// DefaultDialOptions are the dial options of a Forwarder whose config names
// none: insecure credentials, and reconnect backoff capped at two seconds
// (gRPC's own cap is two minutes), so that a node or region that comes back
// after a long outage is reached again within seconds.
func DefaultDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
}

// Forwarder sends commands for a shard to the node that leads it, over the
// public gRPC API. It keeps a leader cache fed by the LeaderHeader of
// answers, tries the shard's voters when the cached leader fails, and
// retries only where a retry cannot apply a command twice: a reserve carries
// its owner token (a retry is the same reservation), heartbeat and complete
// are idempotent for the same owner token, and a release whose retry answers
// NOT_OWNER after an ambiguous first attempt is reported as UNAVAILABLE
// (outcome unknown) rather than as a false NOT_OWNER.
type Forwarder struct {
	cfg   ForwarderConfig
	log   *slog.Logger
	nodes map[string]topology.Node

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	// waitConns are second connections to the nodes, for reserves with a
	// wait only: a wait holds its stream for up to 30 s, and a thousand of
	// them on conns would take every stream ordinary forwarded calls need.
	waitConns map[string]*grpc.ClientConn
	leaders   map[string]string // shard id -> node id
	// stubs are the nodes' Idempotency stubs (node id -> stub), which
	// coalesce concurrent forwarded calls into Batch RPCs; batchers holds
	// one Batcher per node, principal and outgoing metadata (the hop
	// count), since a batch carries one set of each. Their number is
	// bounded by nodes x principals x hops.
	stubs    map[string]*rpcbatch.Stub
	batchers map[string]*rpcbatch.Batcher
	batch    rpcbatch.Stats

	tracer      trace.Tracer // nil: tracing off
	requests    *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	cacheMisses prometheus.Counter
}

// NewForwarder returns a Forwarder for the nodes of cfg.Topology.
func NewForwarder(cfg ForwarderConfig) (*Forwarder, error) {
	if cfg.Topology == nil {
		return nil, errors.New("forward: forwarder needs a topology")
	}
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = 2 * time.Second
	}
	if cfg.DialOptions == nil {
		cfg.DialOptions = DefaultDialOptions()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &Forwarder{
		cfg:       cfg,
		log:       log,
		nodes:     map[string]topology.Node{},
		conns:     map[string]*grpc.ClientConn{},
		waitConns: map[string]*grpc.ClientConn{},
		leaders:   map[string]string{},
		tracer:    tracing.Tracer(cfg.TracerProvider),
		stubs:     map[string]*rpcbatch.Stub{},
		batchers:  map[string]*rpcbatch.Batcher{},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_forward_requests_total",
			Help: "Requests forwarded to another node, by destination region and outcome (ok, not_found, not_owner, unavailable, error).",
		}, []string{"region", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_forward_duration_seconds",
			Help:    "Latency of one forwarded attempt, by destination region.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"region"}),
		cacheMisses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idem_forward_leader_cache_misses_total",
			Help: "Forwarded attempts that did not reach the shard's leader first (no cached leader, or the cached one failed or moved).",
		}),
	}
	for _, n := range cfg.Topology.Nodes() {
		f.nodes[n.ID] = n
	}
	if cfg.Registry != nil {
		for _, c := range []prometheus.Collector{f.requests, f.latency, f.cacheMisses} {
			if err := cfg.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("forward: register forwarder metrics: %w", err)
			}
		}
	}
	return f, nil
}

// AddNodes makes nodes reachable (a node that joined the cluster after the
// forwarder was built), or updates their addresses; connections to a node
// whose gRPC address changed are redialled.
func (f *Forwarder) AddNodes(nodes []topology.Node) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range nodes {
		old, known := f.nodes[n.ID]
		if known && old.GRPCAddr == n.GRPCAddr {
			continue
		}
		f.nodes[n.ID] = n
		for _, conns := range []map[string]*grpc.ClientConn{f.conns, f.waitConns} {
			if c, ok := conns[n.ID]; ok {
				c.Close()
				delete(conns, n.ID)
			}
		}
	}
}

// Close closes every connection.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for _, conns := range []map[string]*grpc.ClientConn{f.conns, f.waitConns} {
		for id, c := range conns {
			errs = append(errs, c.Close())
			delete(conns, id)
		}
	}
	clear(f.stubs)
	clear(f.batchers)
	return errors.Join(errs...)
}

// NoteLeader records that nodeID leads shardID (from a not-leader answer or
// Raft's own view on a node).
func (f *Forwarder) NoteLeader(shardID, nodeID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.nodes[nodeID]; ok {
		f.leaders[shardID] = nodeID
	}
}

// regionOf is node id's region ("" for a node this forwarder does not know).
func (f *Forwarder) regionOf(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodes[id].Region
}

// forgetLeader drops nodeID as the cached leader of shardID (it failed).
func (f *Forwarder) forgetLeader(shardID, nodeID string) {
	f.mu.Lock()
	if f.leaders[shardID] == nodeID {
		delete(f.leaders, shardID)
	}
	f.mu.Unlock()
}

// Leader returns the cached leader of shardID, if any.
func (f *Forwarder) Leader(shardID string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id, ok := f.leaders[shardID]
	return id, ok
}

// nodeClient is both services of a node on one connection.
type nodeClient struct {
	idemv1.IdempotencyClient
	idemv1.AdminClient
}

func (f *Forwarder) conn(nodeID string) (nodeClient, error) {
	c, err := f.Conn(nodeID)
	if err != nil {
		return nodeClient{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	stub := f.stubs[nodeID]
	if stub == nil {
		raw := idemv1.NewIdempotencyClient(c)
		stub = &rpcbatch.Stub{IdempotencyClient: raw, Pick: func(ctx context.Context) *rpcbatch.Batcher { return f.batcher(nodeID, raw, ctx) }}
		f.stubs[nodeID] = stub
	}
	return nodeClient{stub, idemv1.NewAdminClient(c)}, nil
}

// BatchStats reports how many Batch RPCs the Forwarder sent and how many
// forwarded calls they answered.
func (f *Forwarder) BatchStats() (rpcs, calls uint64) {
	return f.batch.Batches.Load(), f.batch.BatchedCalls.Load()
}

// batcher is the Batcher of the calls to nodeID with ctx's principal and
// outgoing metadata: only calls that would send the same metadata (the
// hop count, the forwarded principal) share a Batch RPC, so that the node
// authorizes each operation as the principal it was forwarded for.
func (f *Forwarder) batcher(nodeID string, raw idemv1.IdempotencyClient, ctx context.Context) *rpcbatch.Batcher {
	var key strings.Builder
	key.WriteString(nodeID)
	key.WriteByte(0)
	if p, ok := auth.PrincipalFrom(ctx); ok && !p.Internal {
		key.WriteString(p.Name)
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	for _, k := range slices.Sorted(maps.Keys(md)) {
		if k == auth.ForwardedPrincipalMetadata {
			continue // replaced by the client interceptor from the principal
		}
		for _, v := range md[k] {
			key.WriteByte(0)
			key.WriteString(k)
			key.WriteByte('=')
			key.WriteString(v)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if b := f.batchers[key.String()]; b != nil {
		return b
	}
	b := rpcbatch.New(rpcbatch.Config{Stats: &f.batch, SharedMetadata: true,
		Send: func(ctx context.Context, ops []context.Context, req *idemv1.BatchRequest) (*idemv1.BatchResponse, error) {
			// The batch sends the operations' common metadata and
			// principal (ops[0]'s values), and counts as sent for each
			// operation when it was.
			var sent atomic.Bool
			values := ops[0]
			if f.tracer != nil {
				// One RPC carries one traceparent: ops[0]'s. The batch's span
				// links every operation's, so each trace finds the batch.
				var span trace.Span
				values, span = f.tracer.Start(values, "idem.forward_batch",
					trace.WithLinks(tracing.Links(ops)...), trace.WithAttributes(tracing.Node.String(nodeID), tracing.Items.Int(len(ops))))
				defer span.End()
			}
			resp, err := raw.Batch(&batchContext{Context: ctx, values: values, sent: &sent}, req)
			if err == nil || sent.Load() {
				for _, op := range ops {
					if s, ok := op.Value(sentKey{}).(*atomic.Bool); ok {
						s.Store(true)
					}
				}
			}
			return resp, err
		}})
	f.batchers[key.String()] = b
	return b
}

// batchContext is a Batch RPC's context: the deadline of ctx and the values
// of values (the metadata and principal the batch's operations share), with
// its own sent flag for sendTracker.
type batchContext struct {
	context.Context
	values context.Context
	sent   *atomic.Bool
}

func (c *batchContext) Value(key any) any {
	if _, ok := key.(sentKey); ok {
		return c.sent
	}
	return c.values.Value(key)
}

// Conn returns the (shared, lazily dialled) gRPC connection to nodeID.
func (f *Forwarder) Conn(nodeID string) (*grpc.ClientConn, error) {
	return f.dial(f.conns, nodeID)
}

// waitClient is the client of nodeID for reserves with a wait: on a
// connection of their own, and never batched (a batch would hold its other
// calls until the wait ends).
func (f *Forwarder) waitClient(nodeID string) (nodeClient, error) {
	c, err := f.dial(f.waitConns, nodeID)
	if err != nil {
		return nodeClient{}, err
	}
	return nodeClient{idemv1.NewIdempotencyClient(c), idemv1.NewAdminClient(c)}, nil
}

// dial returns conns[nodeID], dialling it lazily.
func (f *Forwarder) dial(conns map[string]*grpc.ClientConn, nodeID string) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := conns[nodeID]; ok {
		return c, nil
	}
	n, ok := f.nodes[nodeID]
	if !ok {
		return nil, fmt.Errorf("forward: unknown node %q", nodeID)
	}
	opts := append(slices.Clip(f.cfg.DialOptions), grpc.WithStatsHandler(sendTracker{}))
	if f.cfg.TracerProvider != nil {
		opts = append(opts, grpc.WithStatsHandler(otelgrpc.NewClientHandler(
			otelgrpc.WithTracerProvider(f.cfg.TracerProvider), otelgrpc.WithPropagators(tracing.Propagator))))
	}
	c, err := grpc.NewClient(n.GRPCAddr, opts...)
	if err != nil {
		return nil, fmt.Errorf("forward: dial %s (%s): %w", nodeID, n.GRPCAddr, err)
	}
	conns[nodeID] = c
	return c, nil
}

// candidates lists whom to try for shard: the cached leader, then the
// voters in preference order, never this process itself.
func (f *Forwarder) candidates(shard topology.Shard, prefer string) []string {
	out := make([]string, 0, len(shard.Voters)+1)
	add := func(id string) {
		if id != "" && id != f.cfg.Self && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	add(prefer)
	if id, ok := f.Leader(shard.ID); ok {
		add(id)
	}
	for _, v := range shard.Voters {
		add(v)
	}
	return out
}

// attempt runs call against the candidates of shard until one answers, ctx
// ends, or every candidate failed twice. prefer is tried first. wait is
// how long the node may hold the call on purpose (a waiting reserve), and
// payload the command's PayloadAllowance: both lengthen the attempt timeout.
func (f *Forwarder) attempt(ctx context.Context, shard topology.Shard, prefer string, hops int, wait, payload time.Duration,
	call func(ctx context.Context, c nodeClient, opts ...grpc.CallOption) error) (ambiguous bool, err error) {
	if hops >= MaxHops {
		return false, status.Errorf(codes.Unavailable, "shard %s: request already forwarded %d times; the leader is moving, retry", shard.ID, hops)
	}
	cands := f.candidates(shard, prefer)
	if len(cands) == 0 {
		// Only this process votes in the shard (a dev node, a one-node
		// region) and it does not lead it now: starting up, or unready.
		return false, status.Errorf(codes.Unavailable, "shard %s has no leader right now and this node is its only voter: it is starting up or unready, see /readyz", shard.ID)
	}
	cached, _ := f.Leader(shard.ID)
	ctx = metadata.AppendToOutgoingContext(ctx, HopsHeader, strconv.Itoa(hops+1))
	// Every candidate gets two tries. A leader hint learnt from a failed
	// answer is tried next (at most len(cands) times in all), and a
	// candidate that failed is dropped from the leader cache, so that a dead
	// leader is not the first node every later request tries.
	queue := append(append(make([]string, 0, 2*len(cands)), cands...), cands...)
	hints := len(cands)
	begun := time.Now()
	backoff := 10 * time.Millisecond
	var lastErr error
	for i := 0; len(queue) > 0; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return ambiguous, unavailable(shard, time.Since(begun), ctx.Err(), lastErr)
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 250*time.Millisecond)
		}
		target := queue[0]
		queue = queue[1:]
		if target != cached || i > 0 {
			f.cacheMisses.Inc()
		}
		var client nodeClient
		if wait > 0 {
			client, err = f.waitClient(target)
		} else {
			client, err = f.conn(target)
		}
		if err != nil {
			lastErr = err
			continue
		}
		region := f.regionOf(target)
		actx, cancel := context.WithTimeout(ctx, f.cfg.AttemptTimeout+wait+payload)
		var sent atomic.Bool
		actx = context.WithValue(actx, sentKey{}, &sent)
		var header metadata.MD
		var span trace.Span
		if f.tracer != nil {
			actx, span = f.tracer.Start(actx, "idem.forward", trace.WithAttributes(tracing.Shard.String(shard.ID),
				tracing.Region.String(region), tracing.Node.String(target), tracing.Hops.Int(hops+1), tracing.Attempt.Int(i+1)))
		}
		start := time.Now()
		err = call(actx, client, grpc.Header(&header))
		cancel()
		if span != nil {
			if err != nil {
				span.SetStatus(otelcodes.Error, status.Code(err).String())
			}
			span.End()
		}
		f.latency.WithLabelValues(region).Observe(time.Since(start).Seconds())
		hinted := false
		if leaders := header.Get(LeaderHeader); len(leaders) > 0 {
			f.NoteLeader(shard.ID, leaders[0])
			hinted = true
		}
		code := status.Code(err)
		switch code {
		case codes.OK:
			f.requests.WithLabelValues(region, "ok").Inc()
			if !hinted {
				// The target answered without naming the leader (it led,
				// or it forwarded without knowing whom it reached).
				f.NoteLeader(shard.ID, target)
			}
			return ambiguous, nil
		case codes.FailedPrecondition, codes.NotFound, codes.InvalidArgument, codes.ResourceExhausted,
			codes.PermissionDenied, codes.Unauthenticated:
			// The store decided; pass the answer through.
			f.requests.WithLabelValues(region, outcomeLabel(code)).Inc()
			return ambiguous, err
		}
		f.requests.WithLabelValues(region, "unavailable").Inc()
		f.log.DebugContext(actx, "forward attempt failed", "shard", shard.ID, "node", target, "error", err)
		lastErr = err
		// A request handed to an established connection may have reached
		// the leader and been applied, whatever the error says; one that
		// failed before (no connection could be made, the deadline ran out
		// while connecting) cannot have been.
		ambiguous = ambiguous || sent.Load()
		if ctx.Err() != nil {
			return ambiguous, unavailable(shard, time.Since(begun), ctx.Err(), lastErr)
		}
		f.forgetLeader(shard.ID, target)
		// Follow a fresh leader hint first.
		if id, ok := f.Leader(shard.ID); ok && hints > 0 && id != target && id != f.cfg.Self && (len(queue) == 0 || queue[0] != id) {
			queue = append([]string{id}, queue...)
			hints--
		}
	}
	return ambiguous, unavailable(shard, time.Since(begun), nil, lastErr)
}

func outcomeLabel(c codes.Code) string {
	switch c {
	case codes.FailedPrecondition:
		return "not_owner"
	case codes.NotFound:
		return "not_found"
	}
	return "error"
}

// sentKey keys the *atomic.Bool in a call's context that sendTracker sets.
type sentKey struct{}

// sendTracker is the stats.Handler of the Forwarder's connections. It marks
// a call as sent when grpc-go hands its request headers to an established
// transport (stats.OutHeader on the client), so that attempt decides whether
// a failed call may have been applied from connection state rather than
// from error text.
type sendTracker struct{}

func (sendTracker) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (sendTracker) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if h, ok := s.(*stats.OutHeader); ok && h.Client {
		if sent, ok := ctx.Value(sentKey{}).(*atomic.Bool); ok {
			sent.Store(true)
		}
	}
}

func (sendTracker) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (sendTracker) HandleConn(context.Context, stats.ConnStats) {}

// unavailable is the answer when no voter of shard decided the request in
// took (the request's whole budget when ctxErr is set: its timeout plus
// any wait and payload allowance, which is what the caller should know).
func unavailable(shard topology.Shard, took time.Duration, ctxErr, last error) error {
	msg := fmt.Sprintf("shard %s (home region %s) could not be reached in %s", shard.ID, shard.HomeRegion, took.Round(time.Millisecond))
	if last != nil {
		msg += ": " + status.Convert(last).Message()
	} else if ctxErr != nil {
		msg += ": " + ctxErr.Error()
	}
	return status.Error(codes.Unavailable, msg)
}

// PayloadAllowance is the time a forwarded command gets on top of an
// attempt's timeout (and a router's request timeout) for the bytes it
// carries: a second per MiB of stored response or checkpoint. A
// multi-megabyte completion is sent to the leader, written to every voter's
// log and synced before it is answered, which on a loaded machine takes
// seconds; cut off at the attempt timeout meant for small commands, it was
// sent again and again, each copy adding to the load that made it slow.
func PayloadAllowance(cmd *fsm.Command) time.Duration {
	n := 0
	if r := cmd.Response; r != nil {
		n += len(r.Body)
		for k, v := range r.Headers {
			n += len(k) + len(v)
		}
	}
	if c := cmd.Checkpoint; c != nil {
		n += len(c.Name) + len(c.Data)
	}
	return time.Duration(n) * time.Second / (1 << 20)
}

// Apply forwards a reserve, heartbeat, complete or release for shard and
// returns the store's decision, or an error of package backend's closed
// set. prefer (may be empty) is tried first; hops
// is how often the request was forwarded already.
func (f *Forwarder) Apply(ctx context.Context, shard topology.Shard, cmd *fsm.Command, prefer string, hops int) (fsm.Result, error) {
	var res fsm.Result
	var call func(ctx context.Context, c nodeClient, opts ...grpc.CallOption) error
	switch cmd.Op {
	case fsm.OpReserve:
		req := &idemv1.ReserveRequest{Namespace: cmd.Namespace, Key: cmd.Key, Fingerprint: cmd.Fingerprint,
			LeaseMs: leaseMs(cmd), OwnerToken: cmd.OwnerToken, WaitMs: cmd.Wait / int64(time.Millisecond)}
		if cmd.IfExpiredAcquire {
			req.IfExpired = "acquire"
		}
		call = func(ctx context.Context, c nodeClient, opts ...grpc.CallOption) error {
			resp, err := c.Reserve(ctx, req, opts...)
			if err == nil {
				res = wire.ReserveFromProto(resp)
			}
			return err
		}
	case fsm.OpHeartbeat:
		req := &idemv1.HeartbeatRequest{Namespace: cmd.Namespace, Key: cmd.Key, OwnerToken: cmd.OwnerToken,
			LeaseMs: leaseMs(cmd)}
		call = func(ctx context.Context, c nodeClient, opts ...grpc.CallOption) error {
			resp, err := c.Heartbeat(ctx, req, opts...)
			if err == nil {
				res = fsm.Result{Outcome: fsm.OutcomeOK, LeaseExpiresAt: idemv1.TimeFromProto(resp.GetLeaseExpiresAt())}
			}
			return err
		}
	case fsm.OpComplete:
		req := &idemv1.CompleteRequest{Namespace: cmd.Namespace, Key: cmd.Key, OwnerToken: cmd.OwnerToken,
			Response: wire.ResponseToProto(cmd.Response), RetentionS: cmd.Retention / int64(time.Second)}
		if cmd.RetentionIsDefault {
			req.RetentionS = 0 // the namespace's default, decided where it is applied
		}
		call = func(ctx context.Context, c nodeClient, opts ...grpc.CallOption) error {
			resp, err := c.Complete(ctx, req, opts...)
			if err == nil {
				res = fsm.Result{Outcome: fsm.OutcomeOK, CompletedAt: idemv1.TimeFromProto(resp.GetCompletedAt()), ExpiresAt: idemv1.TimeFromProto(resp.GetExpiresAt())}
			}
			return err
		}
	case fsm.OpRelease:
		req := &idemv1.ReleaseRequest{Namespace: cmd.Namespace, Key: cmd.Key, OwnerToken: cmd.OwnerToken}
		call = func(ctx context.Context, c nodeClient, opts ...grpc.CallOption) error {
			_, err := c.Release(ctx, req, opts...)
			if err == nil {
				res = fsm.Result{Outcome: fsm.OutcomeOK}
			}
			return err
		}
	case fsm.OpCheckpoint:
		req := &idemv1.CheckpointRequest{Namespace: cmd.Namespace, Key: cmd.Key, OwnerToken: cmd.OwnerToken,
			Name: cmd.Checkpoint.Name, Data: cmd.Checkpoint.Data}
		call = func(ctx context.Context, c nodeClient, opts ...grpc.CallOption) error {
			resp, err := c.Checkpoint(ctx, req, opts...)
			if err == nil {
				res = fsm.Result{Outcome: fsm.OutcomeOK, Checkpoint: &fsm.Checkpoint{Name: req.Name, Data: req.Data,
					At: idemv1.TimeFromProto(resp.GetCheckpointedAt())}}
			}
			return err
		}
	case fsm.OpForceRelease:
		req := &idemv1.ForceReleaseRequest{Namespace: cmd.Namespace, Key: cmd.Key, Reason: cmd.Reason}
		call = func(ctx context.Context, c nodeClient, opts ...grpc.CallOption) error {
			resp, err := c.ForceRelease(ctx, req, opts...)
			if err == nil {
				res = fsm.Result{Outcome: fsm.OutcomeOK, PreviousFencingToken: resp.GetPreviousFencingToken()}
			}
			return err
		}
	case fsm.OpDelete:
		req := &idemv1.DeleteKeyRequest{Namespace: cmd.Namespace, Key: cmd.Key, Reason: cmd.Reason}
		call = func(ctx context.Context, c nodeClient, opts ...grpc.CallOption) error {
			_, err := c.DeleteKey(ctx, req, opts...)
			if err == nil {
				res = fsm.Result{Outcome: fsm.OutcomeOK}
			}
			return err
		}
	default:
		return fsm.Result{}, fmt.Errorf("forward: cannot forward %s", cmd.Op)
	}
	ambiguous, err := f.attempt(ctx, shard, prefer, hops, time.Duration(cmd.Wait), PayloadAllowance(cmd), call)
	if cmd.Op == fsm.OpForceRelease || cmd.Op == fsm.OpDelete {
		return operatorResult(cmd, shard, res, ambiguous, err)
	}
	if status.Code(err) == codes.FailedPrecondition {
		if cmd.Op == fsm.OpRelease && ambiguous {
			return fsm.Result{}, &backend.UnavailableError{Reason: fmt.Sprintf(
				"release of shard %s: an earlier attempt may have released the key before its answer was lost; check with GET", shard.ID)}
		}
		return fsm.Result{Outcome: fsm.OutcomeNotOwner}, nil
	}
	return res, wire.BackendError(err)
}

// leaseMs is the lease_ms a forwarded command carries: 0 when the caller
// left it to the default, so that the namespace's policy decides it where
// the command is applied.
func leaseMs(cmd *fsm.Command) int64 {
	if cmd.LeaseIsDefault {
		return 0
	}
	return cmd.Lease / int64(time.Millisecond)
}

// Get forwards a linearizable read for shard.
func (f *Forwarder) Get(ctx context.Context, shard topology.Shard, namespace, key, prefer string, hops int) (fsm.Record, bool, error) {
	var rec fsm.Record
	req := &idemv1.GetRequest{Namespace: namespace, Key: key}
	_, err := f.attempt(ctx, shard, prefer, hops, 0, 0, func(ctx context.Context, c nodeClient, opts ...grpc.CallOption) error {
		resp, err := c.Get(ctx, req, opts...)
		if err == nil {
			rec = wire.RecordFromProto(resp)
		}
		return err
	})
	switch status.Code(err) {
	case codes.OK:
		return rec, true, nil
	case codes.NotFound:
		return fsm.Record{}, false, nil
	}
	return fsm.Record{}, false, wire.BackendError(err)
}

// operatorResult turns the answer to a forwarded force-release or delete
// into the state machine's outcome. A retried force-release answers the
// same as the first; a delete retried after an ambiguous first attempt that
// answers NOT_FOUND may be the first attempt's own doing, so it is reported
// as UNAVAILABLE (outcome unknown), as for release.
func operatorResult(cmd *fsm.Command, shard topology.Shard, res fsm.Result, ambiguous bool, err error) (fsm.Result, error) {
	if err == nil {
		return res, nil
	}
	code, _, _ := idemv1.StatusToError(status.Convert(err))
	switch {
	case code == contract.CodeNotFound && cmd.Op == fsm.OpDelete && ambiguous:
		return fsm.Result{}, &backend.UnavailableError{Reason: fmt.Sprintf(
			"delete on shard %s: an earlier attempt may have deleted the key before its answer was lost; check with GET", shard.ID)}
	case code == contract.CodeNotFound:
		return fsm.Result{Outcome: fsm.OutcomeNotFound}, nil
	case status.Code(err) == codes.FailedPrecondition:
		return fsm.Result{Outcome: fsm.OutcomeFailedPrecondition, State: fsm.StateCompleted}, nil
	}
	return fsm.Result{}, wire.BackendError(err)
}

// SetShardPolicy asks the leader of shard to apply the set-policy cmd, and
// returns once it did.
func (f *Forwarder) SetShardPolicy(ctx context.Context, shard topology.Shard, cmd *fsm.Command, prefer string, hops int) error {
	req := &idemv1.SetShardPolicyRequest{Shard: shard.ID, Namespace: cmd.Namespace, Policy: wire.PolicyRequestToProto(*cmd.Policy)}
	_, err := f.attempt(ctx, shard, prefer, hops, 0, 0, func(ctx context.Context, c nodeClient, opts ...grpc.CallOption) error {
		_, err := c.SetShardPolicy(ctx, req, opts...)
		return err
	})
	return wire.BackendError(err)
}

// GetPolicy asks the leader of shard for the policy in force of namespace
// (every field filled in).
func (f *Forwarder) GetPolicy(ctx context.Context, shard topology.Shard, namespace, prefer string, hops int) (fsm.Policy, error) {
	var p fsm.Policy
	_, err := f.attempt(ctx, shard, prefer, hops, 0, 0, func(ctx context.Context, c nodeClient, opts ...grpc.CallOption) error {
		resp, err := c.GetPolicy(ctx, &idemv1.GetPolicyRequest{Namespace: namespace}, opts...)
		if err == nil {
			p = wire.PolicyFromProto(resp.GetPolicy())
		}
		return err
	})
	return p, wire.BackendError(err)
}

// ListShard asks the leader of shard for its part of a listing page.
func (f *Forwarder) ListShard(ctx context.Context, shard topology.Shard, q backend.ShardQuery, prefer string, hops int) (fsm.ListPage, error) {
	var page fsm.ListPage
	req := &idemv1.ListShardRequest{Shard: shard.ID, Namespace: q.Namespace, State: wire.StateToProto(q.State),
		OlderThanS: int64(q.OlderThan / time.Second), Limit: int32(q.Limit), After: q.After}
	_, err := f.attempt(ctx, shard, prefer, hops, 0, 0, func(ctx context.Context, c nodeClient, opts ...grpc.CallOption) error {
		resp, err := c.ListShard(ctx, req, opts...)
		if err == nil {
			page = wire.ListShardFromProto(resp)
		}
		return err
	})
	return page, wire.BackendError(err)
}
