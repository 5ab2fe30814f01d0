package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/topology"
)

// In-process tests of a three-node region: the wiring of node (serving,
// forwarding between nodes, leader balancing, sweeps, drain) runs inside the
// test binary, so `go test -race` checks it (the process tests in cmd/ run
// it in other binaries).

// testRegion is a running one-region cluster of nodes in this process.
type testRegion struct {
	t       *testing.T
	topo    *topology.Topology
	nodes   []*Node
	regs    []*prometheus.Registry
	cancels []context.CancelFunc
	served  []chan error // Serve's result, per node
	clients []*client.Client
}

// startRegion starts n nodes (4 shards, n replicas) with production Raft
// timeouts and fsync off; mod adjusts each node's Config.
func startRegion(t *testing.T, n int, mod func(*Config)) *testRegion {
	t.Helper()
	addrs, err := freeAddrs(3 * n)
	if err != nil {
		t.Fatal(err)
	}
	topo := &topology.Topology{Cluster: "region-test", ShardsPerRegion: 4, Replicas: n, Survival: topology.SurvivalZone}
	region := topology.Region{Name: "local"}
	for i := range n {
		region.Nodes = append(region.Nodes, topology.Node{
			ID: "n" + strconv.Itoa(i+1), Region: "local",
			RaftAddr: addrs[3*i], GRPCAddr: addrs[3*i+1], HTTPAddr: addrs[3*i+2],
		})
	}
	topo.Regions = []topology.Region{region}
	if err := topo.Validate(); err != nil {
		t.Fatal(err)
	}
	r := &testRegion{t: t, topo: topo}
	// The dir first: cleanups run last-registered first, so the nodes
	// stop before their data dirs are removed.
	dir := t.TempDir()
	t.Cleanup(r.close)
	for _, nd := range region.Nodes {
		rc := raftstore.DefaultConfig()
		rc.NoFsync = true
		reg := prometheus.NewRegistry()
		cfg := Config{
			Topology: topo, NodeID: nd.ID, DataDir: dir + "/" + nd.ID, Raft: rc, Registry: reg,
			ClockSkewMargin: 200 * time.Millisecond, LeaderBalanceInterval: 200 * time.Millisecond,
			Logger: testutil.Logger(t, slog.LevelWarn).With("node", nd.ID),
		}
		if mod != nil {
			mod(&cfg)
		}
		nn, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r.nodes, r.regs = append(r.nodes, nn), append(r.regs, reg)
	}
	// Together, as a new cluster's nodes start: each waits for the others
	// to say they hold no state before it bootstraps.
	r.cancels, r.served = make([]context.CancelFunc, len(r.nodes)), make([]chan error, len(r.nodes))
	for i := range r.nodes {
		r.cancels[i], r.served[i] = func() {}, make(chan error, 1)
	}
	err = startTogether(t.Context(), r.nodes, func(i int) {
		ctx, cancel := context.WithCancel(context.Background())
		r.cancels[i] = cancel
		go func() { r.served[i] <- r.nodes[i].Serve(ctx) }()
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, nn := range r.nodes {
		ccfg := client.DefaultConfig(nn.GRPCAddr()) // one endpoint: requests land on this node
		ccfg.MaxAttempts = 1
		ccfg.DisableRouting = true // ... and not on the leader: these tests are about forwarding
		cl, err := client.New(ccfg)
		if err != nil {
			t.Fatal(err)
		}
		r.clients = append(r.clients, cl)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, nn := range r.nodes {
		if err := nn.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func (r *testRegion) close() {
	for _, cl := range r.clients {
		cl.Close()
	}
	for _, cancel := range r.cancels {
		cancel()
	}
	for _, nn := range r.nodes {
		nn.Close()
	}
}

// leaders maps every shard to the node that leads it, from the nodes' own
// view ("" while a shard has no leader a node hosting it agrees on).
func (r *testRegion) leaders() map[string]string {
	out := map[string]string{}
	for _, nn := range r.nodes {
		if nn.closedNow() {
			continue
		}
		for id, s := range nn.shardMap() {
			if s.group.IsLeader() {
				out[id] = nn.cfg.NodeID
			}
		}
	}
	return out
}

// balanced reports whether every shard is led by its preferred voter.
func (r *testRegion) balanced() (bool, string) {
	leaders := r.leaders()
	for _, s := range r.nodes[0].view().ring.Shards() {
		if leaders[s.ID] != s.Voters[0] {
			return false, fmt.Sprintf("leaders %v", leaders)
		}
	}
	return true, ""
}

func (n *Node) closedNow() bool {
	select {
	case <-n.closed:
		return true
	default:
		return false
	}
}

func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// cycle reserves key through node a, completes it through node b and reads
// it back through node c, checking every answer.
func (r *testRegion) cycle(ctx context.Context, a, b, c int, ns, key string) error {
	res, err := r.clients[a].Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key})
	if err != nil {
		return fmt.Errorf("reserve %s on %s: %w", key, r.nodes[a].cfg.NodeID, err)
	}
	if res.Outcome != client.OutcomeAcquired {
		return fmt.Errorf("reserve of fresh key %s: %v, want ACQUIRED", key, res.Outcome)
	}
	body := []byte("paid " + key)
	if _, err := r.clients[b].Complete(ctx, client.CompleteRequest{Namespace: ns, Key: key, OwnerToken: res.OwnerToken,
		Response: client.Response{Status: 201, Body: body}}); err != nil {
		return fmt.Errorf("complete %s on %s: %w", key, r.nodes[b].cfg.NodeID, err)
	}
	rec, err := r.clients[c].Get(ctx, ns, key)
	if err != nil {
		return fmt.Errorf("get %s on %s: %w", key, r.nodes[c].cfg.NodeID, err)
	}
	if rec.State != client.StateCompleted || rec.Response == nil || string(rec.Response.Body) != string(body) || rec.FencingToken != res.FencingToken {
		return fmt.Errorf("record of %s read on %s: %+v, want COMPLETED with %q and fencing token %d", key, r.nodes[c].cfg.NodeID, rec, body, res.FencingToken)
	}
	return nil
}

// TestRegionServesForwardsAndBalances: requests that land on any node are
// served (forwarded to the shard's leader when the node does not lead it),
// concurrent reserves of one key spread over the nodes give one owner, and
// a leadership moved away from a shard's preferred voter comes back.
func TestRegionServesForwardsAndBalances(t *testing.T) {
	r := startRegion(t, 3, nil)
	ctx := t.Context()
	testutil.Eventually(t, 30*time.Second, "leaders on their preferred voters", r.balanced)

	for i := range 24 {
		if err := r.cycle(ctx, i%3, (i+1)%3, (i+2)%3, "pay", fmt.Sprintf("order-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	var forwarded float64
	for _, reg := range r.regs {
		forwarded += counterSum(t, reg, "idem_forward_requests_total")
	}
	if forwarded == 0 {
		t.Fatal("no request was forwarded: every node led every key's shard?")
	}

	// One owner among concurrent reserves of the same key on every node.
	var acquired, inProgress atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 30)
	for g := range 30 {
		wg.Go(func() {
			res, err := r.clients[g%3].Reserve(ctx, client.ReserveRequest{Namespace: "pay", Key: "contended",
				OwnerToken: fmt.Sprintf("worker-%04d-abcdefgh", g)})
			switch {
			case err != nil:
				errs <- err
			case res.Outcome == client.OutcomeAcquired:
				acquired.Add(1)
			case res.Outcome == client.OutcomeInProgress:
				inProgress.Add(1)
			default:
				errs <- fmt.Errorf("outcome %v", res.Outcome)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if acquired.Load() != 1 || inProgress.Load() != 29 {
		t.Fatalf("30 concurrent reserves: %d ACQUIRED, %d IN_PROGRESS; want 1 and 29", acquired.Load(), inProgress.Load())
	}

	// Move a shard's leadership off its preferred voter: the balancer
	// (tick 200 ms) hands it back.
	shard := r.nodes[0].view().ring.Shards()[0]
	preferred := r.index(shard.Voters[0])
	other := shard.Voters[1]
	if err := r.nodes[preferred].shard(shard.ID).group.TransferLeadership(other); err != nil {
		t.Fatalf("transfer %s to %s: %v", shard.ID, other, err)
	}
	testutil.Eventually(t, 10*time.Second, "the leadership of "+shard.ID+" to leave "+shard.Voters[0], func() (bool, string) {
		l := r.leaders()[shard.ID]
		return l != "" && l != shard.Voters[0], "leader " + l
	})
	testutil.Eventually(t, 30*time.Second, "the balancer to hand "+shard.ID+" back", r.balanced)
}

func (r *testRegion) index(nodeID string) int {
	for i, nn := range r.nodes {
		if nn.cfg.NodeID == nodeID {
			return i
		}
	}
	r.t.Fatalf("no node %s", nodeID)
	return -1
}

// TestRegionSweepsExpiredRecords: a record past its retention is swept from
// every replica, one within it stays.
func TestRegionSweepsExpiredRecords(t *testing.T) {
	r := startRegion(t, 3, func(c *Config) { c.SweepInterval = 100 * time.Millisecond })
	ctx := t.Context()
	complete := func(key string, retention time.Duration) {
		t.Helper()
		res, err := r.clients[0].Reserve(ctx, client.ReserveRequest{Namespace: "pay", Key: key})
		if err != nil || res.Outcome != client.OutcomeAcquired {
			t.Fatalf("reserve %s: %+v %v", key, res, err)
		}
		if _, err := r.clients[0].Complete(ctx, client.CompleteRequest{Namespace: "pay", Key: key, OwnerToken: res.OwnerToken,
			Response: client.Response{Status: 200}, Retention: retention}); err != nil {
			t.Fatalf("complete %s: %v", key, err)
		}
	}
	complete("short-lived", time.Second)
	complete("kept", time.Hour)
	// Reads see an expired record as its tombstone at once; the sweep
	// replaces the record by the tombstone in the state, on every replica:
	// each node then holds the kept record and one tombstone.
	testutil.Eventually(t, 30*time.Second, "the expired record to be swept into a tombstone on every node", func() (bool, string) {
		for _, nn := range r.nodes {
			var completed, tombstones int
			for _, s := range nn.shardMap() {
				st := s.fsm.Stats()
				completed += st.Completed
				tombstones += st.Tombstones
			}
			if completed != 1 || tombstones != 1 {
				return false, fmt.Sprintf("%s holds %d completed records and %d tombstones", nn.cfg.NodeID, completed, tombstones)
			}
		}
		return true, ""
	})
	for i := range r.clients {
		if rec, err := r.clients[i].Get(ctx, "pay", "short-lived"); err != nil || rec.State != client.StateExpired || rec.Response != nil {
			t.Fatalf("get of the swept record on %s: %+v %v, want its tombstone", r.nodes[i].cfg.NodeID, rec, err)
		}
		if rec, err := r.clients[i].Get(ctx, "pay", "kept"); err != nil || rec.State != client.StateCompleted {
			t.Fatalf("the record within retention on %s: %+v %v", r.nodes[i].cfg.NodeID, rec, err)
		}
	}
}

// TestRegionDrainLosesNothing: a node drained (Serve's context cancelled)
// under a write load hands its leaderships over and returns nil; every
// acknowledged completion reads back from the remaining nodes, which keep
// serving.
func TestRegionDrainLosesNothing(t *testing.T) {
	r := startRegion(t, 3, nil)
	ctx := t.Context()
	testutil.Eventually(t, 30*time.Second, "leaders on their preferred voters", r.balanced)
	victim := 0
	var mu sync.Mutex
	var acked []string
	var ok atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d", w, i)
				// The survivors take the load; the victim's shards move.
				if err := r.cycle(ctx, 1+w%2, 1+(w+1)%2, 1+w%2, "pay", key); err != nil {
					if errors.Is(err, client.ErrUnavailable) {
						continue // a leader change under the call: not acknowledged
					}
					t.Errorf("worker %d: %v", w, err)
					return
				}
				mu.Lock()
				acked = append(acked, key)
				mu.Unlock()
				ok.Add(1)
			}
		})
	}
	testutil.Until(t, 30*time.Second, "completions before the drain", func() bool { return ok.Load() >= 30 })
	led := 0
	for _, l := range r.leaders() {
		if l == r.nodes[victim].cfg.NodeID {
			led++
		}
	}
	r.cancels[victim]()
	select {
	case err := <-r.served[victim]:
		if err != nil {
			t.Fatalf("drain of %s: %v", r.nodes[victim].cfg.NodeID, err)
		}
	case <-time.After(time.Minute):
		t.Fatal("drain did not finish within a minute")
	}
	before := ok.Load()
	testutil.Until(t, 30*time.Second, "completions after the drain", func() bool { return ok.Load() >= before+30 })
	close(stop)
	wg.Wait()
	if led == 0 {
		t.Logf("%s led no shard when drained", r.nodes[victim].cfg.NodeID)
	}
	for _, s := range r.nodes[1].view().ring.Shards() {
		if l := r.leaders()[s.ID]; l == "" || l == r.nodes[victim].cfg.NodeID {
			t.Errorf("shard %s led by %q after the drain", s.ID, l)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i, key := range acked {
		rec, err := r.clients[1+i%2].Get(ctx, "pay", key)
		if err != nil || rec.State != client.StateCompleted || string(rec.Response.Body) != "paid "+key {
			t.Fatalf("acknowledged completion of %s after the drain: %+v %v", key, rec, err)
		}
	}
}

// TestLoopsSurviveShardRemoval: the background loops and Admin.Status walk
// the hosted replicas while a topology change removes one (the replica
// leaves the shard map between the loop's read of the ids and its use of
// one). Each must skip or finish with the replica it read, never meet a nil
// one: a node once crashed in its sweep right after a reshard removed two
// shards. The removal is toggled as fast as the loops run, a bounded number
// of times.
func TestLoopsSurviveShardRemoval(t *testing.T) {
	r := startRegion(t, 1, nil)
	n := r.nodes[0]
	ids := make([]string, 0)
	for id := range n.shardMap() {
		ids = append(ids, id)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	b := newBalancer()
	adm := &admin{n: n}
	for _, fn := range []func(){
		func() { n.sweep(t.Context()) },
		func() { n.balance(b) },
		func() { n.gatePacking() },
		func() {
			if _, err := adm.Status(t.Context(), nil); err != nil {
				t.Errorf("status: %v", err)
			}
		},
	} {
		wg.Go(func() {
			for !stop.Load() {
				fn()
			}
		})
	}
	for i := range 3000 {
		id := ids[i%len(ids)]
		s := n.shard(id)
		n.setShard(id, nil)
		runtime.Gosched()
		n.setShard(id, s)
	}
	stop.Store(true)
	wg.Wait()
}
