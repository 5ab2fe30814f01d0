package regionsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/regionsim/naive"
	"github.com/idem-dev/idem/regionsim/wan"
	"github.com/idem-dev/idem/topology"
)

// simCluster is the simulated multi-region deployment: idemnode and
// idemrouter processes on loopback, each region with its own view of the
// topology in which every other region's address is a WAN proxy, and the
// naive lock server for the comparison.
type simCluster struct {
	cfg Config
	log *slog.Logger
	dir string
	// regions are the regions with a router and clients: those the
	// cluster started with (a region added by a topology change has
	// nodes only).
	regions []string
	topo    *topology.Topology // real addresses
	net     *wan.Network
	views   map[string]string // region -> topology file

	// nodes and nodeIDs (topology order) change when a node joins or
	// leaves (reconfigure.go): read them with node and ids.
	nodesMu sync.Mutex
	nodes   map[string]*simNode
	nodeIDs []string
	// unfinished is a topology version applied that never became active
	// (0: none); no later change is tried.
	unfinished int
	routers    map[string]*simRouter

	// via[clientRegion][routerRegion] is the gRPC address a client in
	// clientRegion dials to reach routerRegion's router.
	via map[string]map[string]string

	naive     *naive.Server
	naiveVia  map[string]string // client region -> address of the lock server
	naiveHost string            // the node whose fate the lock server shares

	adminMu sync.Mutex
	admin   map[string]*grpc.ClientConn
}

type simNode struct {
	id, region string
	real       topology.Node
	proc       *launch.Process
	baseArgs   []string

	mu     sync.Mutex
	offset time.Duration
	// clockChecked keeps the node's --max-clock-offset while it runs with
	// an offset; otherwise the check is off (--max-clock-offset 0), so a
	// node seconds off still leads (its clock alone never reaches the
	// state: commands take a majority's time whatever the check), which is
	// what the leadership flips of the clock-skew scenario exercise.
	clockChecked bool
	paused       bool
	killed       bool // down on purpose (a fault); otherwise a dead process is a crash
}

type simRouter struct {
	region             string
	proc               *launch.Process
	httpAddr, grpcAddr string
}

// ringPartitions is the simulated cluster's ring.partition_count (a prime,
// like the default 16411), unless its largest shape needs more.
const ringPartitions = 4099

// startCluster generates the topology and its per-region views, starts the
// WAN proxies and every process, and waits until all are ready.
func startCluster(ctx context.Context, cfg Config, dir string, bins map[string]string, log *slog.Logger) (_ *simCluster, err error) {
	regions := regionNames(cfg.Regions)
	replicas := min(3, cfg.NodesPerRegion)
	if cfg.Survival == "region" {
		replicas = 3
	}
	topo, err := launch.Topology(launch.Spec{
		Cluster: "regionsim", Regions: regions, NodesPerRegion: cfg.NodesPerRegion,
		ShardsPerRegion: cfg.ShardsPerRegion, Replicas: replicas, Survival: cfg.Survival,
		WANRTTMs: int(2 * cfg.LatencyMax / time.Millisecond),
	})
	if err != nil {
		return nil, fmt.Errorf("regionsim: topology: %w", err)
	}
	// Re-address every process outside the ephemeral port range, so that
	// neither the proxies (which listen on :0) nor outgoing connections can
	// take a port between its pick and a (re)start of the process.
	ports, err := launch.FreePorts(3*len(topo.Nodes()) + 2*len(regions))
	if err != nil {
		return nil, err
	}
	next := func() string { p := ports[0]; ports = ports[1:]; return "127.0.0.1:" + strconv.Itoa(p) }
	for i := range topo.Regions {
		for j := range topo.Regions[i].Nodes {
			n := &topo.Regions[i].Nodes[j]
			n.RaftAddr, n.GRPCAddr, n.HTTPAddr = next(), next(), next()
		}
	}
	// Fewer ring partitions than the default: a change moves partitions
	// in batches of one shard pair (128 first, then sized by the records
	// they hold: node/handoff.go), and over the simulated WAN each batch
	// takes seconds, so the default ring's batches would make the
	// reconfigure scenario's partition moves take minutes. Enough for every
	// shard the scenario can create.
	topo.Ring.PartitionCount = max(ringPartitions, (cfg.ShardsPerRegion+1)*(len(regions)+1)*topology.MinPartitionsPerShard)
	if err := topo.Validate(); err != nil {
		return nil, fmt.Errorf("regionsim: topology: %w", err)
	}
	network, err := wan.New(wan.Config{Regions: regions, Seed: cfg.Seed, Logger: log,
		Default: wan.Link{Latency: cfg.LatencyMax, Jitter: cfg.Jitter, Loss: cfg.Loss}})
	if err != nil {
		return nil, err
	}
	c := &simCluster{
		cfg: cfg, log: log, dir: dir, regions: regions, topo: topo, net: network,
		views: map[string]string{}, nodes: map[string]*simNode{}, routers: map[string]*simRouter{},
		via: map[string]map[string]string{}, naiveVia: map[string]string{}, admin: map[string]*grpc.ClientConn{},
	}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	for i, p := range regionPairs(regions) {
		l := wan.Link{Latency: pairLatency(cfg, i, len(regionPairs(regions))), Jitter: cfg.Jitter, Loss: cfg.Loss}
		if err := errors.Join(network.SetLink(p[0], p[1], l), network.SetLink(p[1], p[0], l)); err != nil {
			return nil, err
		}
	}
	for _, sub := range []string{"logs", "data"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, err
		}
	}
	if err := c.writeViews(); err != nil {
		return nil, err
	}
	for _, n := range topo.Nodes() {
		sn := &simNode{id: n.ID, region: n.Region, real: n}
		sn.baseArgs = []string{"--config", c.views[n.Region], "--id", n.ID, "--data-dir", filepath.Join(dir, "data", n.ID),
			"--log-level", "info", "--clock-skew-margin", cfg.ClockSkewMargin.String()}
		// The clock-skew fault restarts nodes with --testing-clock-offset,
		// which idemnode accepts only with fault injection enabled.
		sn.proc = &launch.Process{Name: n.ID, Bin: bins["idemnode"], Args: sn.baseArgs, Log: filepath.Join(dir, "logs", n.ID+".log"),
			Env: []string{launch.FaultInjectionEnv}}
		c.nodes[n.ID] = sn
		c.nodeIDs = append(c.nodeIDs, n.ID)
	}
	for _, r := range regions {
		sr := &simRouter{region: r, httpAddr: next(), grpcAddr: next()}
		sr.proc = &launch.Process{Name: "router-" + r, Bin: bins["idemrouter"], Log: filepath.Join(dir, "logs", "router-"+r+".log"),
			Args: []string{"--config", c.views[r], "--region", r, "--http-addr", sr.httpAddr, "--grpc-addr", sr.grpcAddr,
				"--request-timeout", cfg.RouterTimeout.String(), "--log-level", "info"}}
		c.routers[r] = sr
	}
	for _, from := range regions {
		c.via[from] = map[string]string{}
		for _, to := range regions {
			addr := c.routers[to].grpcAddr
			if from != to {
				if addr, err = network.Listen(from, to, addr); err != nil {
					return nil, err
				}
			}
			c.via[from][to] = addr
		}
	}
	if cfg.Compare {
		if c.naive, err = naive.NewServer(naive.ServerConfig{}); err != nil {
			return nil, err
		}
		c.naiveHost = c.ids()[0]
		home := c.node(c.naiveHost).region
		for _, from := range regions {
			addr := c.naive.Addr()
			if from != home {
				if addr, err = network.Listen(from, home, addr); err != nil {
					return nil, err
				}
			}
			c.naiveVia[from] = addr
		}
	}
	for _, id := range c.ids() {
		if err := c.node(id).proc.Start(); err != nil {
			return nil, err
		}
	}
	for _, r := range regions {
		if err := c.routers[r].proc.Start(); err != nil {
			return nil, err
		}
	}
	if err := c.waitReady(ctx, 90*time.Second); err != nil {
		return nil, err
	}
	return c, nil
}

// topology returns the cluster's current topology (real addresses).
func (c *simCluster) topology() *topology.Topology {
	c.nodesMu.Lock()
	defer c.nodesMu.Unlock()
	return c.topo
}

// node returns node id (nil if it never existed).
func (c *simCluster) node(id string) *simNode {
	c.nodesMu.Lock()
	defer c.nodesMu.Unlock()
	return c.nodes[id]
}

// ids returns the ids of the cluster's nodes in topology order (not those
// that left it).
func (c *simCluster) ids() []string {
	c.nodesMu.Lock()
	defer c.nodesMu.Unlock()
	return slices.Clone(c.nodeIDs)
}

// allNodes returns every node process ever started, including those that
// left the cluster.
func (c *simCluster) allNodes() []*simNode {
	c.nodesMu.Lock()
	defer c.nodesMu.Unlock()
	out := make([]*simNode, 0, len(c.nodes))
	for _, n := range c.nodes {
		out = append(out, n)
	}
	return out
}

// regionPairs lists unordered region pairs in a fixed order.
func regionPairs(regions []string) [][2]string {
	var out [][2]string
	for i := range regions {
		for j := i + 1; j < len(regions); j++ {
			out = append(out, [2]string{regions[i], regions[j]})
		}
	}
	return out
}

func pairLatency(cfg Config, i, n int) time.Duration {
	if n <= 1 {
		return cfg.LatencyMin
	}
	return cfg.LatencyMin + (cfg.LatencyMax-cfg.LatencyMin)*time.Duration(i)/time.Duration(n-1)
}

// writeViews writes one topology file per region: the region's own nodes at
// their real addresses, every other node at a proxy that stands for it as
// seen from this region. The ring ignores addresses, so every view places
// keys and voters identically.
func (c *simCluster) writeViews() error {
	topo := c.topology()
	for _, region := range topo.Regions {
		from := region.Name
		view := *topo
		view.Regions = nil
		for _, r := range topo.Regions {
			vr := topology.Region{Name: r.Name}
			for _, n := range r.Nodes {
				if r.Name != from {
					var err error
					for _, addr := range []*string{&n.RaftAddr, &n.GRPCAddr, &n.HTTPAddr} {
						if *addr, err = c.net.Listen(from, r.Name, *addr); err != nil {
							return err
						}
					}
				}
				vr.Nodes = append(vr.Nodes, n)
			}
			view.Regions = append(view.Regions, vr)
		}
		if err := view.Validate(); err != nil {
			return fmt.Errorf("regionsim: view of %s: %w", from, err)
		}
		path := filepath.Join(c.dir, "topology-"+from+".yaml")
		if v := topo.EffectiveVersion(); v > 1 {
			path = filepath.Join(c.dir, fmt.Sprintf("topology-%s.v%d.yaml", from, v))
		}
		if err := launch.WriteTopology(&view, path); err != nil {
			return err
		}
		c.views[from] = path
	}
	return nil
}

// waitReady waits until every node and every router answers /readyz with
// 200; a node that is not running is an error.
func (c *simCluster) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, id := range c.ids() {
		n := c.node(id)
		if !n.proc.Running() {
			return fmt.Errorf("%w: node %s is not running (log: %s)", ErrClusterNotReady, id, n.proc.Log)
		}
		if err := launch.WaitHTTP(ctx, "http://"+n.real.HTTPAddr+"/readyz"); err != nil {
			return fmt.Errorf("%w: node %s: %v (log: %s)", ErrClusterNotReady, id, err, n.proc.Log)
		}
	}
	for _, r := range c.regions {
		sr := c.routers[r]
		if err := launch.WaitHTTP(ctx, "http://"+sr.httpAddr+"/readyz"); err != nil {
			return fmt.Errorf("%w: router %s: %v (log: %s)", ErrClusterNotReady, r, err, sr.proc.Log)
		}
	}
	return nil
}

// nodesIn returns region's node ids.
func (c *simCluster) nodesIn(region string) []string {
	var out []string
	for _, id := range c.ids() {
		if c.node(id).region == region {
			out = append(out, id)
		}
	}
	return out
}

// kill SIGKILLs node id (a crash). The naive lock server shares the fate
// of its host node.
func (c *simCluster) kill(id string) {
	n := c.node(id)
	n.mu.Lock()
	n.paused, n.killed = false, true
	n.mu.Unlock()
	n.proc.Kill()
	if c.naive != nil && id == c.naiveHost {
		c.naive.Crash()
	}
}

// start starts node id (after a kill) with its current clock offset.
func (c *simCluster) start(id string) error {
	n := c.node(id)
	if n.proc.Running() {
		return nil
	}
	n.mu.Lock()
	args := append([]string(nil), n.baseArgs...)
	if n.offset != 0 {
		args = append(args, "--testing-clock-offset", n.offset.String())
		if !n.clockChecked {
			args = append(args, "--max-clock-offset", "0")
		}
	}
	n.mu.Unlock()
	n.proc.Args = args
	if err := n.proc.Start(); err != nil {
		return err
	}
	n.mu.Lock()
	n.killed = false
	n.mu.Unlock()
	if c.naive != nil && id == c.naiveHost {
		c.naive.Restart()
	}
	return nil
}

// restartWithOffset stops node id gracefully (it hands its leaderships
// over) and starts it again with clock offset d.
func (c *simCluster) restartWithOffset(id string, d time.Duration, checked bool) error {
	n := c.node(id)
	n.mu.Lock()
	n.offset, n.clockChecked = d, checked
	n.paused, n.killed = false, true
	n.mu.Unlock()
	if err := n.proc.Stop(15 * time.Second); err != nil {
		c.log.Warn("graceful stop failed", "node", id, "err", err)
	}
	if c.naive != nil && id == c.naiveHost {
		c.naive.SetClockOffset(d)
	}
	return c.start(id)
}

// pause SIGSTOPs node id (a GC pause or a frozen VM); resume SIGCONTs it.
func (c *simCluster) pause(id string) error {
	n := c.node(id)
	n.mu.Lock()
	n.paused = true
	n.mu.Unlock()
	if c.naive != nil && id == c.naiveHost {
		c.naive.Pause()
	}
	return n.proc.Signal(syscall.SIGSTOP)
}

func (c *simCluster) resume(id string) error {
	n := c.node(id)
	n.mu.Lock()
	n.paused = false
	n.mu.Unlock()
	if c.naive != nil && id == c.naiveHost {
		c.naive.Resume()
	}
	return n.proc.Signal(syscall.SIGCONT)
}

func (c *simCluster) adminConn(id string) (*grpc.ClientConn, error) {
	c.adminMu.Lock()
	defer c.adminMu.Unlock()
	if conn, ok := c.admin[id]; ok {
		return conn, nil
	}
	conn, err := grpc.NewClient(c.node(id).real.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	c.admin[id] = conn
	return conn, nil
}

// shardLeaders asks every running, unpaused node which shards it leads
// (the harness reads status directly, not through the WAN).
func (c *simCluster) shardLeaders(ctx context.Context) map[string]string {
	leaders := map[string]string{}
	for _, id := range c.ids() {
		n := c.node(id)
		n.mu.Lock()
		paused := n.paused
		n.mu.Unlock()
		if paused || !n.proc.Running() {
			continue
		}
		conn, err := c.adminConn(id)
		if err != nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := idemv1.NewAdminClient(conn).Status(sctx, &idemv1.StatusRequest{})
		cancel()
		if err != nil {
			continue
		}
		for _, s := range st.Shards {
			if s.RaftState == "Leader" {
				leaders[s.Shard] = id
			}
		}
	}
	return leaders
}

// busiestLeader returns the node leading the most shards (ties: the first
// in topology order among candidates), restricted to candidates when given.
func (c *simCluster) busiestLeader(ctx context.Context, candidates []string) (string, int) {
	counts := map[string]int{}
	for _, id := range c.shardLeaders(ctx) {
		counts[id]++
	}
	best, most := "", -1
	for _, id := range c.ids() {
		if len(candidates) > 0 && !slices.Contains(candidates, id) {
			continue
		}
		if counts[id] > most {
			best, most = id, counts[id]
		}
	}
	return best, most
}

// leaderCount is how many shards node id leads, as the nodes report.
func (c *simCluster) leaderCount(ctx context.Context, id string) int {
	n := 0
	for _, l := range c.shardLeaders(ctx) {
		if l == id {
			n++
		}
	}
	return n
}

// transferLeadership asks the leader of every shard node id hosts to hand
// leadership to id; it returns how many shards id leads once the transfers
// settled (a transfer completes asynchronously).

func (c *simCluster) transferLeadership(ctx context.Context, id string) int {
	leaders := c.shardLeaders(ctx)
	hosted := c.topology().ShardsOnNode(id)
	for _, s := range hosted {
		cur, ok := leaders[s.ID]
		if !ok || cur == id {
			continue
		}
		conn, err := c.adminConn(cur)
		if err != nil {
			continue
		}
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = idemv1.NewAdminClient(conn).TransferLeader(tctx, &idemv1.TransferLeaderRequest{Shard: s.ID, TargetNodeId: id})
		cancel()
		if err != nil {
			c.log.Info("leadership transfer failed", "shard", s.ID, "to", id, "err", err)
		}
	}
	led := 0
	deadline := time.Now().Add(3 * time.Second)
	for {
		led = 0
		now := c.shardLeaders(ctx)
		for _, s := range hosted {
			if now[s.ID] == id {
				led++
			}
		}
		if led == len(hosted) || time.Now().After(deadline) || !sleepUntil(ctx, time.Now().Add(200*time.Millisecond)) {
			return led
		}
	}
}

// transferAway asks node id to hand the leadership of every shard it leads
// to another voter.
func (c *simCluster) transferAway(ctx context.Context, id string) {
	conn, err := c.adminConn(id)
	if err != nil {
		return
	}
	for shard, leader := range c.shardLeaders(ctx) {
		if leader != id {
			continue
		}
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := idemv1.NewAdminClient(conn).TransferLeader(tctx, &idemv1.TransferLeaderRequest{Shard: shard})
		cancel()
		if err != nil {
			c.log.Info("leadership transfer failed", "shard", shard, "from", id, "err", err)
		}
	}
}

// heal ends every fault: the WAN heals, paused nodes resume, skewed nodes
// restart without skew, dead nodes start; then it waits for readiness.
func (c *simCluster) heal(ctx context.Context) error {
	c.net.HealAll()
	var errs []error
	for _, id := range c.ids() {
		n := c.node(id)
		n.mu.Lock()
		paused, offset, killed := n.paused, n.offset, n.killed
		n.mu.Unlock()
		if paused {
			errs = append(errs, c.resume(id))
		}
		if !n.proc.Running() && !killed {
			errs = append(errs, fmt.Errorf("node %s exited on its own (a crash nobody injected); see %s, which ends:\n%s", id, n.proc.Log, n.proc.LogTail(40)))
		}
		switch {
		case offset != 0:
			errs = append(errs, c.restartWithOffset(id, 0, false))
		case !n.proc.Running():
			errs = append(errs, c.start(id))
		}
	}
	if c.naive != nil {
		c.naive.Resume()
		c.naive.Restart()
		c.naive.SetClockOffset(0)
	}
	return errors.Join(append(errs, c.waitReady(ctx, 60*time.Second))...)
}

// offsets returns the nodes running with a clock offset.
func (c *simCluster) offsets() map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, id := range c.ids() {
		n := c.node(id)
		n.mu.Lock()
		if n.offset != 0 {
			out[id] = n.offset
		}
		n.mu.Unlock()
	}
	return out
}

// down returns the nodes not running or paused, sorted.
func (c *simCluster) down() []string {
	var out []string
	for _, id := range c.ids() {
		n := c.node(id)
		n.mu.Lock()
		paused := n.paused
		n.mu.Unlock()
		switch {
		case paused:
			out = append(out, id+"(stopped)")
		case !n.proc.Running():
			out = append(out, id+"(dead)")
		}
	}
	sort.Strings(out)
	return out
}

// close stops everything it started, even after a failure: resumed first
// (a stopped process cannot act on SIGTERM), then SIGTERM, then SIGKILL.
func (c *simCluster) close() error {
	var errs []error
	var wg sync.WaitGroup
	var mu sync.Mutex
	stop := func(p *launch.Process) {
		defer wg.Done()
		if err := p.Stop(15 * time.Second); err != nil {
			mu.Lock()
			errs = append(errs, fmt.Errorf("%s: %w", p.Name, err))
			mu.Unlock()
		}
	}
	for _, r := range c.routers {
		wg.Add(1)
		go stop(r.proc)
	}
	wg.Wait()
	for _, n := range c.allNodes() {
		n.proc.Signal(syscall.SIGCONT)
		wg.Add(1)
		go stop(n.proc)
	}
	wg.Wait()
	c.adminMu.Lock()
	for _, conn := range c.admin {
		conn.Close()
	}
	c.adminMu.Unlock()
	if c.naive != nil {
		c.naive.Close()
	}
	c.net.Close()
	return errors.Join(errs...)
}
