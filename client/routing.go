package client

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/topology"
)

// Leader routing: the client learns the nodes' ring and addresses from the
// Routing RPC of any endpoint, places each key itself, and sends the call
// to the leader of the key's shard, which then needs no forwarding hop
// (forward.Forwarder keeps the same kind of leader cache on the server side).
// Nothing here ever delays a call: until routing is learned, while the
// leader is unknown, and while the connection to the leader is not up, calls
// go to the endpoints round-robin as they would without routing.

// leaderCooldown is how long the client sends no first attempt to a node
// after an attempt there failed undecided: a leader the client cannot reach
// (blackholed, or cut off from this client alone) while the nodes still
// name it costs one attempt timeout per cooldown, not one per call.
var leaderCooldown = 5 * time.Second

// routes is one routing answer in use: the ring and every node's address.
// It never changes once published; a refresh publishes a new one.
type routes struct {
	ring  *topology.Ring
	nodes map[string]string // node id -> gRPC address
}

// callRoute is where one call's key lives, looked up once per call.
type callRoute struct {
	routes *routes
	shard  topology.Shard
}

// leaderRouter keeps the routes, the leader cache and the connections to
// leaders that are not endpoints.
type leaderRouter struct {
	log      *slog.Logger
	interval time.Duration
	timeout  time.Duration
	opts     []grpc.DialOption
	// endpoints are the Client's own connections by address: a leader at an
	// endpoint's address is reached over it.
	endpoints map[string]*grpc.ClientConn
	// newStub makes the stub of a connection (Client.newStub); stubs holds
	// one per connection, endpoints' included, so that calls routed to a
	// leader and calls sent round-robin to the same node share its
	// batcher.
	newStub func(*grpc.ClientConn) idemv1.IdempotencyClient
	stubs   map[*grpc.ClientConn]idemv1.IdempotencyClient
	// ask picks the endpoint for the next Routing call.
	ask func() idemv1.IdempotencyClient

	table atomic.Pointer[routes]

	mu      sync.Mutex
	leaders map[string]string           // shard id -> node id
	conns   map[string]*grpc.ClientConn // address -> connection dialled here
	// cooling maps a node's address to when first attempts may go there
	// again (leaderCooldown).
	cooling map[string]time.Time
	closed  bool

	kick        chan struct{} // a refresh wanted now (buffered, 1)
	stop        chan struct{}
	done        chan struct{}
	cancel      context.CancelFunc
	stopOnce    sync.Once
	lastRefresh atomic.Int64 // unix nanos of the last Routing call

	leaderAttempts, endpointAttempts atomic.Uint64
}

func newLeaderRouter(c *Client, opts []grpc.DialOption) *leaderRouter {
	r := &leaderRouter{
		log:       c.log,
		interval:  c.cfg.RoutingRefresh,
		timeout:   c.cfg.RequestTimeout,
		opts:      opts,
		endpoints: make(map[string]*grpc.ClientConn, len(c.conns)),
		newStub:   c.newStub,
		stubs:     make(map[*grpc.ClientConn]idemv1.IdempotencyClient, len(c.conns)),
		leaders:   map[string]string{},
		conns:     map[string]*grpc.ClientConn{},
		cooling:   map[string]time.Time{},
		kick:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	for i, ep := range c.cfg.Endpoints {
		r.endpoints[ep] = c.conns[i]
		r.stubs[c.conns[i]] = c.stubs[i]
	}
	// Its own turn over the endpoints, so that refreshes do not disturb the
	// calls' round-robin.
	var turn atomic.Uint64
	turn.Store(rand.Uint64N(uint64(len(c.stubs))))
	r.ask = func() idemv1.IdempotencyClient {
		return c.stubs[int(turn.Add(1)%uint64(len(c.stubs)))]
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go r.run(ctx)
	return r
}

// close stops the refresher, waits for it, and closes the connections
// dialled to leaders (the Client closes the endpoints').
func (r *leaderRouter) close() error {
	r.stopOnce.Do(func() {
		r.cancel() // ends a Routing call in flight
		close(r.stop)
	})
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	var errs []error
	for addr, conn := range r.conns {
		errs = append(errs, conn.Close())
		delete(r.conns, addr)
		delete(r.stubs, conn)
	}
	return errors.Join(errs...)
}

// run refreshes the routes until close: at once, then every interval, sooner
// on a kick; after a failure it tries again with backoff. A process that
// does not serve routing (a router answers UNIMPLEMENTED) is asked again
// only at the interval.
func (r *leaderRouter) run(ctx context.Context) {
	defer close(r.done)
	var wait time.Duration
	failures := 0
	for {
		t := time.NewTimer(wait)
		select {
		case <-r.stop:
			t.Stop()
			return
		case <-r.kick:
			t.Stop()
		case <-t.C:
		}
		err := r.refresh(ctx)
		switch {
		case err == nil:
			failures = 0
			wait = r.interval
		case status.Code(err) == codes.Unimplemented:
			r.log.Debug("routing: endpoint does not serve routing; calls stay round-robin", "err", err)
			wait = r.interval
		default:
			failures++
			r.log.Debug("routing: refresh failed", "attempt", failures, "err", err)
			wait = min(r.interval, 100*time.Millisecond<<min(failures, 10))
		}
		wait = wait/2 + rand.N(wait/2+1) // clients started together spread out
	}
}

// refresh asks one endpoint for routing and installs the answer. An answer
// whose rebuilt ring does not match its fingerprint removes the routes in
// use: calls go round-robin until a good answer comes.
func (r *leaderRouter) refresh(ctx context.Context) error {
	r.lastRefresh.Store(time.Now().UnixNano())
	actx, cancel := context.WithTimeout(ctx, r.timeout)
	resp, err := r.ask().Routing(actx, &idemv1.RoutingRequest{})
	cancel()
	if err != nil {
		return err
	}
	rt, err := idemv1.RoutingFromProto(resp)
	if err != nil {
		if r.table.Swap(nil) != nil {
			r.log.Warn("routing: refused the routing answer; calls go round-robin", "node", resp.GetNodeId(), "err", err)
		}
		return err
	}
	next := &routes{ring: rt.Ring, nodes: make(map[string]string, len(rt.Nodes))}
	for id, n := range rt.Nodes {
		next.nodes[id] = n.GRPCAddr
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.table.Load()
	if old == nil || old.ring.Fingerprint() != next.ring.Fingerprint() {
		// Another ring: the shard ids may mean other key ranges.
		clear(r.leaders)
		r.log.Info("routing: learned the ring", "node", rt.NodeID, "fingerprint", next.ring.Fingerprint(), "shards", len(next.ring.Shards()), "nodes", len(next.nodes))
	}
	for shard, leader := range rt.Leaders {
		r.leaders[shard] = leader
	}
	r.table.Store(next)
	return nil
}

// route looks up where (namespace, key) lives; ok is false without routes.
func (r *leaderRouter) route(namespace, key string) (callRoute, bool) {
	t := r.table.Load()
	if t == nil {
		return callRoute{}, false
	}
	return callRoute{routes: t, shard: t.ring.Locate(namespace, key)}, true
}

// leaderStub returns a stub on the connection to the leader of cr's shard,
// and the leader's id, when the leader is known and its connection is up.
// A connection not yet (or no longer) up is asked to connect, and the call
// goes to an endpoint meanwhile, so an unreachable leader never delays one.
func (r *leaderRouter) leaderStub(cr callRoute) (idemv1.IdempotencyClient, string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, "", false
	}
	leader := r.leaders[cr.shard.ID]
	addr, ok := cr.routes.nodes[leader]
	if leader == "" || !ok {
		return nil, "", false
	}
	if until, ok := r.cooling[addr]; ok {
		if time.Now().Before(until) {
			return nil, "", false
		}
		delete(r.cooling, addr)
	}
	conn := r.endpoints[addr]
	if conn == nil {
		conn = r.conns[addr]
	}
	if conn == nil {
		var err error
		if conn, err = grpc.NewClient(addr, r.opts...); err != nil {
			r.log.Debug("routing: cannot dial the leader; using the endpoints", "shard", cr.shard.ID, "node", leader, "addr", addr, "err", err)
			delete(r.leaders, cr.shard.ID)
			return nil, "", false
		}
		r.conns[addr] = conn
		r.stubs[conn] = r.newStub(conn)
	}
	switch conn.GetState() {
	case connectivity.Ready:
		return r.stubs[conn], leader, true
	case connectivity.Idle:
		conn.Connect()
	}
	return nil, "", false
}

// learn updates the leader cache after an attempt of a call routed by cr:
// from the leader the answering node named in its header, and by
// forgetting a leader that failed undecided without naming another (and
// cooling its address down). tried is the leader the attempt was sent to
// ("" for an endpoint).
func (r *leaderRouter) learn(cr callRoute, tried string, header metadata.MD, err error) {
	named := ""
	if v := header.Get(idemv1.LeaderHeader); len(v) > 0 {
		named = v[0]
	}
	if named != "" && !cr.shard.HasVoter(named) {
		// A leader outside the voters we know: the topology changed.
		r.kickRefresh()
		named = ""
	}
	if _, known := cr.routes.nodes[named]; named != "" && !known {
		r.kickRefresh()
		named = ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if tried != "" && err != nil && retryable(err) {
		r.cooling[cr.routes.nodes[tried]] = time.Now().Add(leaderCooldown)
	}
	switch {
	case named != "":
		r.leaders[cr.shard.ID] = named
	case tried != "" && err != nil && retryable(err) && r.leaders[cr.shard.ID] == tried:
		delete(r.leaders, cr.shard.ID)
	}
}

// kickRefresh asks the refresher for a refresh now, at most once a second.
func (r *leaderRouter) kickRefresh() {
	if time.Since(time.Unix(0, r.lastRefresh.Load())) < time.Second {
		return
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// stats fills the routing part of Stats.
func (r *leaderRouter) stats(s *Stats) {
	s.LeaderAttempts = r.leaderAttempts.Load()
	s.EndpointAttempts = r.endpointAttempts.Load()
	if t := r.table.Load(); t != nil {
		s.RingFingerprint = t.ring.Fingerprint()
	}
	r.mu.Lock()
	s.KnownLeaders = len(r.leaders)
	r.mu.Unlock()
}
