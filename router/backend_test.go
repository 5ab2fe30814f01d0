package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/topology"
)

// Tests of the router's Backend (and the Forwarder under it) against fake
// storage nodes: real gRPC servers on loopback serving the public API
// (package server) over a fake backend that keeps one fsm.FSM per shard and
// a leader per shard that the test moves at will.

// fakeCluster is the shared state of the fake nodes: which node leads each
// shard, and each shard's state machine.
type fakeCluster struct {
	topo *topology.Topology
	ring *topology.Ring
	// maxResponseBytes is the nodes' --max-response-bytes (0: default).
	maxResponseBytes int64

	mu      sync.Mutex
	leaders map[string]string
	fsms    map[string]*fsm.FSM
	index   map[string]uint64
	nodes   map[string]*fakeNode
}

// fakeNode is one storage node: a gRPC server at the topology's address.
type fakeNode struct {
	c  *fakeCluster
	id string

	mu    sync.Mutex
	srv   *grpc.Server
	calls atomic.Int64
	// hold, when set, makes every request wait until its context ends (a
	// node that swallows traffic).
	hold atomic.Bool
	// loseAnswers > 0: apply the command, then fail the answer as if it
	// had been lost on the way back (decremented per lost answer).
	loseAnswers atomic.Int32
}

// newFakeCluster builds a topology over free loopback ports (regions of
// three nodes, one shard per region, three replicas) and starts every node.
func newFakeCluster(t *testing.T, regions ...string) *fakeCluster {
	t.Helper()
	topo := &topology.Topology{Cluster: "fake", ShardsPerRegion: 1, Replicas: 3, Survival: topology.SurvivalZone}
	addrs := freeAddrs(t, 9*len(regions))
	for _, r := range regions {
		region := topology.Region{Name: r}
		for j := 1; j <= 3; j++ {
			region.Nodes = append(region.Nodes, topology.Node{ID: fmt.Sprintf("%s-%d", r, j),
				RaftAddr: addrs[0], GRPCAddr: addrs[1], HTTPAddr: addrs[2], Region: r})
			addrs = addrs[3:]
		}
		topo.Regions = append(topo.Regions, region)
	}
	if err := topo.Validate(); err != nil {
		t.Fatal(err)
	}
	c := &fakeCluster{topo: topo, ring: newRing(t, topo), leaders: map[string]string{},
		fsms: map[string]*fsm.FSM{}, index: map[string]uint64{}, nodes: map[string]*fakeNode{}}
	for _, s := range c.ring.Shards() {
		c.leaders[s.ID] = s.Voters[0]
		c.fsms[s.ID] = fsm.New()
	}
	for _, n := range topo.Nodes() {
		c.nodes[n.ID] = &fakeNode{c: c, id: n.ID}
		c.nodes[n.ID].start(t)
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.stop()
		}
	})
	return c
}

// freeAddrs returns n distinct loopback addresses nobody listens on.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close() // held until all are picked, so none repeats
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs
}

func (n *fakeNode) start(t *testing.T) {
	t.Helper()
	node, _ := n.c.topo.NodeByID(n.id)
	var ln net.Listener
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; {
		if ln, err = net.Listen("tcp", node.GRPCAddr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // the port was ours a moment ago; the OS may still hold it
	}
	if err != nil {
		t.Fatalf("fake node %s: %v", n.id, err)
	}
	api, err := server.New(server.Config{Backend: n, MaxResponseBytes: n.c.maxResponseBytes})
	if err != nil {
		t.Fatal(err)
	}
	srv := api.NewGRPCServer()
	n.mu.Lock()
	n.srv = srv
	n.mu.Unlock()
	go srv.Serve(ln)
}

// stop kills the node's server: its port refuses connections.
func (n *fakeNode) stop() {
	n.mu.Lock()
	srv := n.srv
	n.srv = nil
	n.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

func (n *fakeNode) wait(ctx context.Context) error {
	n.calls.Add(1)
	if n.hold.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (n *fakeNode) Apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, error) {
	res, _, err := n.ApplyRouted(ctx, cmd, 0)
	return res, err
}

// ApplyRouted answers as a node does: the leader applies, a follower
// refuses with the leader as a hint (data, which the server sends as the
// LeaderHeader).
func (n *fakeNode) ApplyRouted(ctx context.Context, cmd *fsm.Command, _ int) (fsm.Result, string, error) {
	if err := n.wait(ctx); err != nil {
		return fsm.Result{}, "", err
	}
	shard := n.c.ring.Locate(cmd.Namespace, cmd.Key)
	n.c.mu.Lock()
	leader := n.c.leaders[shard.ID]
	if leader != n.id {
		n.c.mu.Unlock()
		return fsm.Result{}, leader, &backend.NotLeaderError{Shard: shard.ID, Leader: leader}
	}
	stamped := *cmd
	stamped.Now = time.Now().UnixNano()
	n.c.index[shard.ID]++
	res := n.c.fsms[shard.ID].Apply(n.c.index[shard.ID], &stamped)
	n.c.mu.Unlock()
	if n.loseAnswers.Load() > 0 && n.loseAnswers.Add(-1) >= 0 {
		return fsm.Result{}, n.id, &backend.UnavailableError{Reason: "answer lost"}
	}
	return res, n.id, nil
}

// List is not used: the router lists through ListShard, which fake nodes
// do not serve; cmd/idemrouter's tests list over real nodes.
func (n *fakeNode) List(context.Context, backend.ListQuery) (backend.ListPage, error) {
	return backend.ListPage{}, &backend.Error{Code: contract.CodeInternal, Message: "fake node does not list"}
}

func (n *fakeNode) Get(ctx context.Context, namespace, key string) (fsm.Record, bool, error) {
	rec, ok, _, err := n.GetRouted(ctx, namespace, key, 0)
	return rec, ok, err
}

func (n *fakeNode) GetRouted(ctx context.Context, namespace, key string, _ int) (fsm.Record, bool, string, error) {
	if err := n.wait(ctx); err != nil {
		return fsm.Record{}, false, "", err
	}
	shard := n.c.ring.Locate(namespace, key)
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	if leader := n.c.leaders[shard.ID]; leader != n.id {
		return fsm.Record{}, false, leader, &backend.NotLeaderError{Shard: shard.ID, Leader: leader}
	}
	rec, ok := n.c.fsms[shard.ID].Get(namespace, key, time.Now().UnixNano())
	return rec, ok, "", nil
}

func (n *fakeNode) Ready(context.Context) error { return nil }

func (c *fakeCluster) setLeader(shardID, nodeID string) {
	c.mu.Lock()
	c.leaders[shardID] = nodeID
	c.mu.Unlock()
}

// keyIn returns a key of namespace ns whose shard is homed in region.
func (c *fakeCluster) keyIn(t *testing.T, ns, region string) (string, topology.Shard) {
	t.Helper()
	for i := 0; i < 10000; i++ {
		key := fmt.Sprintf("key-%d", i)
		if s := c.ring.Locate(ns, key); s.HomeRegion == region {
			return key, s
		}
	}
	t.Fatalf("no key homed in %s", region)
	return "", topology.Shard{}
}

// newTestBackend starts a Backend for region over c and an HTTP server for
// it, closing both when the test ends.
func newTestBackend(t *testing.T, c *fakeCluster, region string, tweak func(*BackendConfig)) (*Backend, *httptest.Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := DefaultBackendConfig()
	cfg.Topology, cfg.Ring, cfg.Region, cfg.Registry = c.topo, c.ring, region, reg
	cfg.Logger = testutil.Logger(t, slog.LevelDebug)
	if tweak != nil {
		tweak(&cfg)
	}
	b, err := NewBackend(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	api, err := server.New(server.Config{Backend: b, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(api.HTTPHandler())
	t.Cleanup(hs.Close)
	testutil.Until(t, 10*time.Second, "the backend to become ready", func() bool { return b.Ready(t.Context()) == nil })
	return b, hs, reg
}

func reserve(ctx context.Context, b *Backend, ns, key, owner string) (fsm.Result, error) {
	return b.Apply(ctx, &fsm.Command{Op: fsm.OpReserve, Namespace: ns, Key: key, OwnerToken: owner,
		Lease: int64(30 * time.Second)})
}

func TestBackendForwardsToLeaderAndCachesIt(t *testing.T) {
	c := newFakeCluster(t, "r1", "r2")
	b, _, reg := newTestBackend(t, c, "r1", nil)
	ctx := t.Context()
	for _, region := range []string{"r1", "r2"} {
		key, shard := c.keyIn(t, "pay", region)
		// Make a non-preferred voter lead, so the first try misses.
		leader := shard.Voters[2]
		c.setLeader(shard.ID, leader)
		res, err := reserve(ctx, b, "pay", key, "owner-aaaaaaaaaaaaaaaa")
		if err != nil || res.Outcome != fsm.OutcomeAcquired {
			t.Fatalf("%s: reserve = %+v, %v", region, res, err)
		}
		if got, _ := b.Forwarder().Leader(shard.ID); got != leader {
			t.Fatalf("%s: cached leader %q, want %q", region, got, leader)
		}
		// Later requests go straight to the leader.
		before := map[string]int64{}
		for _, v := range shard.Voters {
			before[v] = c.nodes[v].calls.Load()
		}
		for i := 0; i < 5; i++ {
			res, err := reserve(ctx, b, "pay", key, "owner-bbbbbbbbbbbbbbbb")
			if err != nil || res.Outcome != fsm.OutcomeInProgress {
				t.Fatalf("second owner: %+v, %v", res, err)
			}
		}
		for _, v := range shard.Voters {
			want := before[v]
			if v == leader {
				want += 5
			}
			if got := c.nodes[v].calls.Load(); got != want {
				t.Fatalf("%s: node %s got %d calls, want %d (requests should go to the cached leader only)", region, v, got, want)
			}
		}
	}
	if n := metricValue(t, reg, "idem_forward_requests_total", "region", "r2", "outcome", "ok"); n < 6 {
		t.Fatalf("idem_forward_requests_total{region=r2,outcome=ok} = %v, want >= 6", n)
	}
	if n := metricValue(t, reg, "idem_forward_leader_cache_misses_total"); n < 2 {
		t.Fatalf("idem_forward_leader_cache_misses_total = %v, want >= 2 (one per region's first try)", n)
	}
	if n := metricValue(t, reg, "idem_router_request_duration_seconds", "region", "r1", "outcome", "decided"); n != 6 {
		t.Fatalf("idem_router_request_duration_seconds{region=r1,outcome=decided} counted %v requests, want 6", n)
	}
}

// TestBackendFailsOverFromDeadLeader: the cached leader dies and another
// voter takes over; the router must find it rather than keep trying the
// dead node until the deadline.
func TestBackendFailsOverFromDeadLeader(t *testing.T) {
	c := newFakeCluster(t, "r1")
	b, _, reg := newTestBackend(t, c, "r1", func(cfg *BackendConfig) { cfg.RequestTimeout = time.Minute })
	ctx := t.Context()
	key, shard := c.keyIn(t, "pay", "r1")
	if res, err := reserve(ctx, b, "pay", key, "owner-aaaaaaaaaaaaaaaa"); err != nil || res.Outcome != fsm.OutcomeAcquired {
		t.Fatalf("reserve = %+v, %v", res, err)
	}
	if got, _ := b.Forwarder().Leader(shard.ID); got != shard.Voters[0] {
		t.Fatalf("cached leader %q, want %q", got, shard.Voters[0])
	}
	c.nodes[shard.Voters[0]].stop()
	c.setLeader(shard.ID, shard.Voters[2])
	// The first retry finds the new leader (the request timeout is a
	// minute: a router stuck on the dead node would not answer at all);
	// every later one goes straight to it: one forward attempt per request,
	// none spent on the dead node. Counted, not timed.
	for i := 0; i < 10; i++ {
		attempts := metricValue(t, reg, "idem_forward_requests_total")
		res, err := reserve(ctx, b, "pay", key, "owner-aaaaaaaaaaaaaaaa")
		if err != nil || res.Outcome != fsm.OutcomeAcquired {
			t.Fatalf("retry %d after the leader died: %+v, %v", i, res, err)
		}
		if n := metricValue(t, reg, "idem_forward_requests_total") - attempts; i > 0 && n != 1 {
			t.Fatalf("retry %d took %v forward attempts, want 1: the dead leader is still tried", i, n)
		}
	}
	if got, _ := b.Forwarder().Leader(shard.ID); got != shard.Voters[2] {
		t.Fatalf("cached leader %q, want the new leader %q", got, shard.Voters[2])
	}
}

// TestBackendUnreachableRegionIs503: with every voter of a region's shard
// down, its keys get 503 UNAVAILABLE with Retry-After, quickly; the other
// region's keys keep working and the router stays ready.
func TestBackendUnreachableRegionIs503(t *testing.T) {
	c := newFakeCluster(t, "r1", "r2")
	b, hs, reg := newTestBackend(t, c, "r1", func(cfg *BackendConfig) {
		cfg.RetryAfter = 3 * time.Second
		cfg.RequestTimeout = time.Minute
	})
	ctx := t.Context()
	lostKey, lostShard := c.keyIn(t, "pay", "r2")
	liveKey, _ := c.keyIn(t, "pay", "r1")
	if res, err := reserve(ctx, b, "pay", lostKey, "owner-aaaaaaaaaaaaaaaa"); err != nil || res.Outcome != fsm.OutcomeAcquired {
		t.Fatalf("reserve before the loss = %+v, %v", res, err)
	}
	for _, r := range c.topo.Regions[1].Nodes {
		c.nodes[r.ID].stop()
	}
	start := time.Now()
	_, err := reserve(ctx, b, "pay", lostKey, "owner-aaaaaaaaaaaaaaaa")
	var ue *backend.UnavailableError
	if !errors.As(err, &ue) || ue.RetryAfter != 3*time.Second || !strings.Contains(ue.Reason, "r2") {
		t.Fatalf("reserve of a key of the lost region: %v (%T), want an UnavailableError naming r2 with RetryAfter 3s", err, err)
	}
	// Refused connections answer at once, not at the one-minute deadline;
	// half of it is a margin no loaded box needs.
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("refused connections took %s to answer; want well under the request timeout (1m)", d)
	}
	if _, _, err := b.Get(ctx, "pay", lostKey); !errors.As(err, &ue) {
		t.Fatalf("get of a key of the lost region: %v", err)
	}
	// Over HTTP: 503 with Retry-After.
	resp, err := http.Post(hs.URL+"/v1/namespaces/pay/keys/"+lostKey+":reserve", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "3" || !strings.Contains(string(body), `"UNAVAILABLE"`) {
		t.Fatalf("HTTP reserve of a lost key: %d Retry-After=%q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if res, err := reserve(ctx, b, "pay", liveKey, "owner-aaaaaaaaaaaaaaaa"); err != nil || res.Outcome != fsm.OutcomeAcquired {
		t.Fatalf("a key of the live region: %+v, %v", res, err)
	}
	if err := b.Ready(ctx); err != nil {
		t.Fatalf("router not ready while only a remote region is lost: %v", err)
	}
	// Once the probes saw every voter down, the answer comes without a
	// round of forwarding attempts.
	testutil.Until(t, 10*time.Second, "the probes to see r2 down", func() bool { return b.unreachable(lostShard) })
	attempts := metricValue(t, reg, "idem_forward_requests_total", "region", "r2")
	if _, err := reserve(ctx, b, "pay", lostKey, "owner-aaaaaaaaaaaaaaaa"); !errors.As(err, &ue) || !strings.Contains(ue.Reason, "can be connected to") {
		t.Fatalf("reserve of a key of a region known down: %v", err)
	}
	if n := metricValue(t, reg, "idem_forward_requests_total", "region", "r2"); n != attempts {
		t.Fatalf("%v forward attempts to a region known down, want none", n-attempts)
	}
	if n := metricValue(t, reg, "idem_router_unavailable_total", "region", "r2"); n != 4 {
		t.Fatalf("idem_router_unavailable_total{region=r2} = %v, want 4", n)
	}
	if st := b.Stats(); st.Unavailable != 4 || st.ReachableNodes > 3 {
		t.Fatalf("stats %+v", st)
	}
	// The region returns: its keys work again, the reservation held.
	for _, r := range c.topo.Regions[1].Nodes {
		c.nodes[r.ID].start(t)
	}
	testutil.Until(t, 10*time.Second, "the region's keys to answer again", func() bool {
		res, err := reserve(ctx, b, "pay", lostKey, "owner-bbbbbbbbbbbbbbbb")
		return err == nil && res.Outcome == fsm.OutcomeInProgress
	})
}

// swallowingBackend returns a router backend with a 400 ms request timeout
// (100 ms attempts) over a region whose nodes swallow every call, and a
// key of namespace "pay" homed there.
func swallowingBackend(t *testing.T) (*Backend, string) {
	t.Helper()
	c := newFakeCluster(t, "r1")
	b, _, _ := newTestBackend(t, c, "r1", func(cfg *BackendConfig) {
		cfg.RequestTimeout = 400 * time.Millisecond
		cfg.AttemptTimeout = 100 * time.Millisecond
	})
	key, shard := c.keyIn(t, "pay", "r1")
	for _, v := range shard.Voters {
		c.nodes[v].hold.Store(true)
	}
	return b, key
}

// TestBackendRequestTimeout: a node that swallows requests costs at most
// the request timeout, and the answer is UNAVAILABLE.
func TestBackendRequestTimeout(t *testing.T) {
	b, key := swallowingBackend(t)
	start := time.Now()
	_, err := reserve(t.Context(), b, "pay", key, "owner-aaaaaaaaaaaaaaaa")
	d := time.Since(start)
	if !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("reserve against swallowing nodes: %v, want UNAVAILABLE", err)
	}
	// Not before the request timeout (the swallowing nodes never answer),
	// and bounded by it: the margin covers a loaded box, not a router that
	// keeps retrying past its deadline.
	if d < 400*time.Millisecond || d > 400*time.Millisecond+10*time.Second {
		t.Fatalf("answered after %s, want the 400ms request timeout", d)
	}
}

// A completion carrying megabytes gets a second per MiB on top of the
// request timeout (forward.PayloadAllowance): replicating it takes that
// long on a loaded region, and cutting it off makes the caller send it all
// again. Against nodes that swallow every call, the router's 503 comes no
// earlier than the extended deadline.
func TestBackendRequestTimeoutGrowsWithPayload(t *testing.T) {
	b, key := swallowingBackend(t)
	cmd := &fsm.Command{Op: fsm.OpComplete, Namespace: "pay", Key: key, OwnerToken: "owner-aaaaaaaaaaaaaaaa",
		Response: &fsm.Response{Status: 200, Body: make([]byte, 1<<20)}}
	start := time.Now()
	_, _, err := b.ApplyRouted(t.Context(), cmd, 0)
	d := time.Since(start)
	if !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("complete against swallowing nodes: %v, want UNAVAILABLE", err)
	}
	if d < 400*time.Millisecond+time.Second {
		t.Fatalf("a 1 MiB completion was answered after %s, before its 400ms request timeout plus 1s for its payload", d)
	}
	// The reason names the time the request had, not the bare timeout.
	m := regexp.MustCompile(`could not be reached in (\S+?):`).FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("the 503's reason names no duration: %v", err)
	}
	if took, perr := time.ParseDuration(m[1]); perr != nil || took < 400*time.Millisecond+time.Second {
		t.Fatalf("the 503's reason says %q: want the 1.4s the request had (%v)", m[1], err)
	}
}

// When the forwarder gives no reason of its own (a bare deadline error),
// the router's 503 names the time it tried, not its configured request
// timeout (400 ms here): a request that had 1.5 s says so.
func TestBackendFallbackReasonNamesTimeTried(t *testing.T) {
	b, key := swallowingBackend(t)
	shard := b.Ring().Locate("pay", key)
	err := b.finish(t.Context(), shard, time.Now().Add(-1500*time.Millisecond), context.DeadlineExceeded)
	var ue *backend.UnavailableError
	if !errors.As(err, &ue) {
		t.Fatalf("finish with a deadline error: %v, want UNAVAILABLE", err)
	}
	m := regexp.MustCompile(`could not be reached in (\S+)$`).FindStringSubmatch(ue.Reason)
	if m == nil {
		t.Fatalf("the 503's reason names no duration: %q", ue.Reason)
	}
	if took, perr := time.ParseDuration(m[1]); perr != nil || took < 1500*time.Millisecond {
		t.Fatalf("the 503's reason says %q: want the 1.5s the request had (%q)", m[1], ue.Reason)
	}
}

// TestBackendRetryIsSameReservation: the leader applies a reserve but its
// answer is lost; the router's retry must come back as the same reservation
// (same owner, same fencing token), and nobody else can acquire the key.
func TestBackendRetryIsSameReservation(t *testing.T) {
	c := newFakeCluster(t, "r1")
	b, hs, _ := newTestBackend(t, c, "r1", nil)
	key, shard := c.keyIn(t, "pay", "r1")
	c.nodes[shard.Voters[0]].loseAnswers.Store(1)
	resp, err := http.Post(hs.URL+"/v1/namespaces/pay/keys/"+key+":reserve", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"ACQUIRED"`) || !strings.Contains(string(body), `"fencing_token":"1"`) {
		t.Fatalf("reserve whose first answer was lost: %d %s; want ACQUIRED with fencing token 1 (one application)", resp.StatusCode, body)
	}
	if c.nodes[shard.Voters[0]].loseAnswers.Load() > 0 {
		t.Fatal("the fake never lost an answer; the test did not exercise a retry")
	}
	res, err := reserve(t.Context(), b, "pay", key, "owner-bbbbbbbbbbbbbbbb")
	if err != nil || res.Outcome != fsm.OutcomeInProgress {
		t.Fatalf("another owner after the retried reserve: %+v, %v; want IN_PROGRESS", res, err)
	}
}

// TestBackendPassesDecisionsThrough: NOT_OWNER and NOT_FOUND are the
// store's decisions, not unavailability.
func TestBackendPassesDecisionsThrough(t *testing.T) {
	c := newFakeCluster(t, "r1")
	b, _, reg := newTestBackend(t, c, "r1", nil)
	ctx := t.Context()
	res, err := b.Apply(ctx, &fsm.Command{Op: fsm.OpHeartbeat, Namespace: "pay", Key: "nobody", OwnerToken: "owner-aaaaaaaaaaaaaaaa", Lease: int64(time.Second)})
	if err != nil || res.Outcome != fsm.OutcomeNotOwner {
		t.Fatalf("heartbeat of an absent key: %+v, %v; want NOT_OWNER", res, err)
	}
	if _, found, err := b.Get(ctx, "pay", "nobody"); err != nil || found {
		t.Fatalf("get of an absent key: found=%v, %v", found, err)
	}
	if b.Stats().Unavailable != 0 {
		t.Fatal("a decided answer counted as unavailable")
	}
	if n := metricValue(t, reg, "idem_router_unavailable_total", "region", "r1"); n != 0 {
		t.Fatalf("idem_router_unavailable_total{region=r1} = %v after decided answers", n)
	}
}

func TestBackendReadiness(t *testing.T) {
	c := newFakeCluster(t, "r1", "r2")
	for _, n := range c.nodes {
		n.stop()
	}
	cfg := DefaultBackendConfig()
	cfg.Topology, cfg.Region = c.topo, "r1"
	b, err := NewBackend(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Ready(t.Context()); !errors.Is(err, ErrNoNodeReachable) {
		t.Fatalf("Ready with every node down: %v", err)
	}
	// One node of the remote region is enough.
	c.nodes["r2-3"].start(t)
	testutil.Until(t, 10*time.Second, "ready once one node listens", func() bool { return b.Ready(t.Context()) == nil })
	c.nodes["r2-3"].stop()
	testutil.Until(t, 10*time.Second, "not ready once no node listens", func() bool { return b.Ready(t.Context()) != nil })
	if st := b.Stats(); st.Nodes != 6 || st.ReachableNodes != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestBackendConfigValidate(t *testing.T) {
	c := newFakeCluster(t, "r1")
	other := c.topo.Clone()
	other.Cluster = "other"
	for _, tc := range []struct {
		name string
		cfg  BackendConfig
		want []string
	}{
		{"ok", BackendConfig{Topology: c.topo, Region: "r1"}, nil},
		{"no topology", BackendConfig{Region: "r1"}, []string{"a topology is required"}},
		{"no region", BackendConfig{Topology: c.topo}, []string{"a region is required"}},
		{"unknown region", BackendConfig{Topology: c.topo, Region: "mars"}, []string{`region "mars" is not in the topology`}},
		{"foreign ring", BackendConfig{Topology: c.topo, Region: "r1", Ring: newRing(t, other)}, []string{`ring is of cluster "other"`}},
		{"negatives", BackendConfig{Topology: c.topo, Region: "r1", RequestTimeout: -1, AttemptTimeout: -1, RetryAfter: -1, MaxMessageBytes: -1},
			[]string{"request timeout", "attempt timeout", "retry-after", "max message bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidBackendConfig) {
				t.Fatalf("Validate = %v, want ErrInvalidBackendConfig", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate = %q, want it to say %q", err, w)
				}
			}
			if _, err := NewBackend(tc.cfg); err == nil {
				t.Fatal("NewBackend accepted an invalid config")
			}
		})
	}
}

// metricValue sums the samples of metric name in reg whose labels include
// the given name/value pairs: a counter's or gauge's value, a histogram's
// sample count.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metrics
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// TestBackendLargeReplay: with nodes that store bodies over gRPC's default
// 4 MiB message limit, a router whose MaxMessageBytes matches relays them.
func TestBackendLargeReplay(t *testing.T) {
	c := newFakeCluster(t, "r1")
	const max = 6 << 20
	c.maxResponseBytes = max
	for _, n := range c.nodes {
		n.stop()
		n.start(t)
	}
	b, _, _ := newTestBackend(t, c, "r1", func(cfg *BackendConfig) {
		cfg.MaxMessageBytes = server.Config{MaxResponseBytes: max}.GRPCMaxMessageBytes()
	})
	ctx := t.Context()
	key, _ := c.keyIn(t, "pay", "r1")
	body := []byte(strings.Repeat("x", 5<<20))
	if res, err := reserve(ctx, b, "pay", key, "owner-aaaaaaaaaaaaaaaa"); err != nil || res.Outcome != fsm.OutcomeAcquired {
		t.Fatalf("reserve: %+v, %v", res, err)
	}
	if res, err := b.Apply(ctx, &fsm.Command{Op: fsm.OpComplete, Namespace: "pay", Key: key, OwnerToken: "owner-aaaaaaaaaaaaaaaa",
		Response: &fsm.Response{Status: 200, Body: body}, Retention: int64(time.Hour)}); err != nil || res.Outcome != fsm.OutcomeOK {
		t.Fatalf("complete with a 5 MiB body: %+v, %v", res, err)
	}
	res, err := reserve(ctx, b, "pay", key, "owner-bbbbbbbbbbbbbbbb")
	if err != nil || res.Outcome != fsm.OutcomeCompleted || res.Response == nil || len(res.Response.Body) != len(body) {
		t.Fatalf("replay of a 5 MiB body: outcome %v, %v", res.Outcome, err)
	}
	rec, found, err := b.Get(ctx, "pay", key)
	if err != nil || !found || len(rec.Response.Body) != len(body) {
		t.Fatalf("get of a 5 MiB body: found=%v, %v", found, err)
	}
}

func newRing(t *testing.T, topo *topology.Topology) *topology.Ring {
	t.Helper()
	r, err := topology.NewRing(topo)
	if err != nil {
		t.Fatalf("NewRing: %v", err)
	}
	return r
}
