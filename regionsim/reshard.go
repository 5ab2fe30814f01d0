package regionsim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/regionsim/wan"
	"github.com/idem-dev/idem/topology"
)

// Changes that move keys between shards: shards_per_region grows, or a
// region is added. Each is applied online while the workload runs, and
// once the first partitions moved, a node is SIGKILLed (restarted
// killDown later) and the link between two regions is cut both ways for
// cutFor; later the meta leader driving the change is partitioned from
// the other regions for metaCutFor: the move must go on, or resume,
// without breaking a promise.
const (
	killDown = 2 * time.Second
	cutFor   = 3 * time.Second
	// firstBatchWait bounds the wait for the first partitions to move
	// (every shard that takes part adopts a partition table first, one
	// mover step each).
	firstBatchWait = 3 * time.Minute
	// After those faults healed, the meta leader (the change's driver) is
	// partitioned once another batch moved (or after metaCutWait): its
	// region cut from every other for metaCutFor, longer than a meta
	// election over the WAN.
	metaCutWait = 30 * time.Second
	metaCutFor  = 6 * time.Second
)

// growShards changes shards_per_region to to (topology version +1).
func growShards(at, d time.Duration, to int) *Fault {
	return &Fault{Name: fmt.Sprintf("shards per region grow to %d, applied online (partitions move between shards); a shard leader SIGKILLed and a link cut mid-move, then the meta leader partitioned", to),
		At: at, For: d,
		start: func(ctx context.Context, e *faultEnv) (string, error) {
			next := e.c.topology().Clone()
			from := next.ShardsPerRegion
			if to <= from || to > topology.MaxShardsPerRegion {
				return fmt.Sprintf("no growth: %d shards per region, asked %d (at most %d)", from, to, topology.MaxShardsPerRegion), nil
			}
			next.Version = next.EffectiveVersion() + 1
			next.ShardsPerRegion = to
			if err := e.c.setTopology(next); err != nil {
				return "", err
			}
			res, err := e.c.changeUnderFaults(ctx, e, next, func(ctx context.Context) string {
				id, _ := e.c.busiestLeader(ctx, e.c.killable())
				return id
			})
			return fmt.Sprintf("%d -> %d shards per region: %s", from, to, res), err
		},
	}
}

// addRegion adds a region of cfg.NodesPerRegion nodes (topology version
// +1): the WAN learns the region, its nodes start with its view of the new
// version, and the change is applied. The region gets no router and no
// clients; the keys that move to it are reached through the others'.
func addRegion(at, d time.Duration) *Fault {
	return &Fault{Name: "a region is added, applied online (partitions move to its shards); the meta leader SIGKILLed and a link cut mid-move, then the meta leader partitioned",
		At: at, For: d,
		start: func(ctx context.Context, e *faultEnv) (string, error) {
			region := e.c.spareRegion()
			if region == "" {
				return "no region name left to add (the cluster has every region regionsim names)", nil
			}
			next, err := e.c.startRegion(region)
			if err != nil {
				return "", err
			}
			res, err := e.c.changeUnderFaults(ctx, e, next, func(ctx context.Context) string {
				if id := e.c.metaLeader(ctx); id != "" && slices.Contains(e.c.killable(), id) {
					return id
				}
				id, _ := e.c.busiestLeader(ctx, e.c.killable())
				return id
			})
			return fmt.Sprintf("region %s added (%d nodes): %s", region, e.c.cfg.NodesPerRegion, res), err
		},
	}
}

// setTopology makes next the cluster's topology and writes its views.
func (c *simCluster) setTopology(next *topology.Topology) error {
	c.nodesMu.Lock()
	c.topo = next
	c.nodesMu.Unlock()
	return c.writeViews()
}

// spareRegion is the name of the next region to add, "" when regionsim
// names no more.
func (c *simCluster) spareRegion() string {
	all := regionNames(8)
	for _, name := range all {
		if !slices.ContainsFunc(c.topology().Regions, func(r topology.Region) bool { return r.Name == name }) {
			return name
		}
	}
	return ""
}

// startRegion declares region on the WAN, makes the next topology version
// with cfg.NodesPerRegion nodes in it, writes every region's view and
// starts the new nodes.
func (c *simCluster) startRegion(region string) (*topology.Topology, error) {
	if err := c.net.AddRegion(region); err != nil {
		return nil, err
	}
	ports, err := launch.FreePorts(3 * c.cfg.NodesPerRegion)
	if err != nil {
		return nil, err
	}
	next := c.topology().Clone()
	next.Version = next.EffectiveVersion() + 1
	added := topology.Region{Name: region}
	for i := range c.cfg.NodesPerRegion {
		addr := func(p int) string { return "127.0.0.1:" + strconv.Itoa(p) }
		added.Nodes = append(added.Nodes, topology.Node{ID: region + "-" + strconv.Itoa(i+1), Region: region,
			RaftAddr: addr(ports[3*i]), GRPCAddr: addr(ports[3*i+1]), HTTPAddr: addr(ports[3*i+2])})
	}
	next.Regions = append(next.Regions, added)
	if err := c.setTopology(next); err != nil {
		return nil, err
	}
	for _, n := range added.Nodes {
		if err := c.startNewNode(n); err != nil {
			return nil, err
		}
	}
	return next, nil
}

// killable is the running nodes a change's fault may kill: not the naive
// lock server's host, whose crash would change the comparison.
func (c *simCluster) killable() []string {
	return slices.DeleteFunc(c.running(), func(id string) bool { return id == c.naiveHost })
}

// metaLeader returns the node that leads the meta group ("" if none
// answers).
func (c *simCluster) metaLeader(ctx context.Context) string {
	return c.metaLeaderAmong(ctx, c.running())
}

// metaLeaderAmong returns the first of ids that says it leads the meta
// group ("" if none does).
func (c *simCluster) metaLeaderAmong(ctx context.Context, ids []string) string {
	for _, id := range ids {
		conn, err := c.adminConn(id)
		if err != nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := idemv1.NewTopologyClient(conn).ShardState(sctx, &idemv1.ShardStateRequest{Shard: "meta"})
		cancel()
		if err == nil && st.GetLeader() {
			return id
		}
	}
	return ""
}

// changeResult is what one change did, from the harness and the nodes'
// logs.
type changeResult struct {
	took    time.Duration
	moves   moveStats
	faults  []string // what was injected, and when
	midMove bool     // every fault was injected after the first batch moved and before the change was active
}

func (r changeResult) String() string {
	where := "mid-move"
	if !r.midMove {
		where = "NOT all mid-move"
	}
	return fmt.Sprintf("active after %s; %s; %s: %s", r.took.Round(100*time.Millisecond), r.moves, where, strings.Join(r.faults, ", "))
}

// changeUnderFaults applies next (already the cluster's topology, its new
// nodes started) and, once the nodes log the first batch of partitions
// moved, SIGKILLs the node pick returns and cuts the link between the
// meta leader's region and another region both ways (refuse or blackhole,
// by the fault's seed); the node restarts after killDown, the link heals
// after cutFor. Then it partitions the meta leader (partitionMetaLeader).
// It returns once next is active.
func (c *simCluster) changeUnderFaults(ctx context.Context, e *faultEnv, next *topology.Topology, pick func(context.Context) string) (changeResult, error) {
	var res changeResult
	offsets := map[string]int64{}
	for _, n := range c.allNodes() {
		if fi, err := os.Stat(n.proc.Log); err == nil {
			offsets[n.proc.Log] = fi.Size()
		}
	}
	var took time.Duration
	var applyErr error
	applied := make(chan struct{})
	go func() {
		defer close(applied)
		took, applyErr = c.applyTopology(ctx, next, nil, partitionsWithin)
	}()
	active := func() bool {
		select {
		case <-applied:
			return true
		default:
			return false
		}
	}
	start := time.Now()
	for !active() && time.Since(start) < firstBatchWait && c.movedSince(offsets).batches == 0 {
		if !sleepOrStop(ctx, applied, 100*time.Millisecond) {
			break
		}
	}
	if !active() && ctx.Err() == nil {
		at := time.Since(start).Round(100 * time.Millisecond)
		victim := pick(ctx)
		cutA, cutB := c.cutPair(ctx, e)
		mode := wan.Blackhole
		if e.rng.IntN(2) == 0 {
			mode = wan.Refuse
		}
		if victim != "" {
			c.kill(victim)
			res.faults = append(res.faults, fmt.Sprintf("%s SIGKILLed at +%s for %s", victim, at, killDown))
		}
		if cutB != "" {
			if err := errors.Join(c.net.SetCut(cutA, cutB, mode), c.net.SetCut(cutB, cutA, mode)); err != nil {
				return res, err
			}
			res.faults = append(res.faults, fmt.Sprintf("%s<->%s %s at +%s for %s", cutA, cutB, mode, at, cutFor))
		}
		res.midMove = !active() && victim != "" && cutB != ""
		sleepOrStop(ctx, nil, killDown)
		if victim != "" {
			if err := c.start(victim); err != nil {
				return res, err
			}
		}
		sleepOrStop(ctx, nil, cutFor-killDown)
		if cutB != "" {
			if err := errors.Join(c.net.SetCut(cutA, cutB, wan.Up), c.net.SetCut(cutB, cutA, wan.Up)); err != nil {
				return res, err
			}
		}
	}
	if !active() && ctx.Err() == nil {
		f, ok := c.partitionMetaLeader(ctx, e, start, offsets, applied)
		if f != "" {
			res.faults = append(res.faults, f)
		}
		res.midMove = res.midMove && ok
	}
	<-applied
	res.took, res.moves = took, c.movedSince(offsets)
	if len(res.faults) == 0 {
		res.faults = []string{"no fault injected: no batch moved before the change was active"}
	}
	return res, applyErr
}

// partitionMetaLeader waits until another batch moved since the first
// faults (or metaCutWait passed) and then cuts the region of the node that
// leads the meta group (and so drives the change) from every other region
// for metaCutFor, refusing or blackholing by the fault's seed: the meta
// voters elsewhere are a majority, so it loses meta leadership while it
// still reaches its own region's shards, and may go on driving the batch it
// had begun while its successor resumes the same one. It returns what it
// did ("" if the change was active first) and whether the cut fell
// mid-move.
func (c *simCluster) partitionMetaLeader(ctx context.Context, e *faultEnv, changeStart time.Time, offsets map[string]int64, applied <-chan struct{}) (string, bool) {
	start, before := time.Now(), c.movedSince(offsets).batches
	for time.Since(start) < metaCutWait && c.movedSince(offsets).batches == before {
		if !sleepOrStop(ctx, applied, 100*time.Millisecond) {
			return "", false
		}
	}
	leader := c.metaLeader(ctx)
	if leader == "" {
		return "no meta leader answered: its partition skipped", false
	}
	region := c.node(leader).region
	mode := wan.Blackhole
	if e.rng.IntN(2) == 0 {
		mode = wan.Refuse
	}
	select {
	case <-applied:
		return "", false
	default:
	}
	at := time.Since(changeStart).Round(100 * time.Millisecond)
	if err := c.net.Isolate(region, mode); err != nil {
		return "", false
	}
	midMove := true
	sleepOrStop(ctx, nil, metaCutFor)
	successor := c.metaLeaderAmong(ctx, slices.DeleteFunc(c.running(), func(id string) bool { return c.node(id).region == region }))
	select {
	case <-applied:
		midMove = false // the change finished while the region was cut
	default:
	}
	if err := c.net.Isolate(region, wan.Up); err != nil {
		c.log.Warn("healing the meta leader's region", "region", region, "err", err)
	}
	moved := "no other meta leader seen"
	if successor != "" {
		moved = "meta leadership moved to " + successor
	}
	return fmt.Sprintf("meta leader %s's region %s cut from every other (%s) at +%s for %s (%s)", leader, region, mode,
		at, metaCutFor, moved), midMove
}

// cutPair picks the region pair to cut: the meta leader's region (the
// mover's RPCs leave from it) and another region the cluster started
// with, whose nodes all reach each other through the WAN. "" when there
// is no second region.
func (c *simCluster) cutPair(ctx context.Context, e *faultEnv) (string, string) {
	if len(c.regions) < 2 {
		return "", ""
	}
	a := c.regions[0]
	if id := c.metaLeader(ctx); id != "" && slices.Contains(c.regions, c.node(id).region) {
		a = c.node(id).region
	}
	others := slices.DeleteFunc(slices.Clone(c.regions), func(r string) bool { return r == a })
	return a, others[e.rng.IntN(len(others))]
}

// moveStats sums the nodes' "topology change: partitions moved" lines.
type moveStats struct {
	batches, partitions, records, bytes int
	pauses                              []time.Duration
}

func (m moveStats) String() string {
	if m.batches == 0 {
		return "no partitions moved"
	}
	p := slices.Sorted(slices.Values(m.pauses))
	return fmt.Sprintf("%d partitions in %d batches, %d records (%d bytes) moved, pause per batch p50 %s max %s",
		m.partitions, m.batches, m.records, m.bytes, p[len(p)/2].Round(time.Millisecond), p[len(p)-1].Round(time.Millisecond))
}

var movedLine = regexp.MustCompile(`topology change: partitions moved.* partitions=(\d+) (?:.* )?records=(\d+) bytes=(\d+) paused=(\S+)`)

// movedSince reads what every node logged past offsets (log path -> size
// when the change started; a log not in it is read whole).
func (c *simCluster) movedSince(offsets map[string]int64) moveStats {
	var m moveStats
	for _, n := range c.allNodes() {
		f, err := os.Open(n.proc.Log)
		if err != nil {
			continue
		}
		if _, err := f.Seek(offsets[n.proc.Log], io.SeekStart); err == nil {
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				g := movedLine.FindStringSubmatch(sc.Text())
				if g == nil {
					continue
				}
				parts, _ := strconv.Atoi(g[1])
				records, _ := strconv.Atoi(g[2])
				bytes, _ := strconv.Atoi(g[3])
				pause, _ := time.ParseDuration(g[4])
				m.batches++
				m.partitions, m.records, m.bytes = m.partitions+parts, m.records+records, m.bytes+bytes
				m.pauses = append(m.pauses, pause)
			}
		}
		f.Close()
	}
	return m
}
