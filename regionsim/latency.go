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
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/regionsim/report"
	"github.com/idem-dev/idem/topology"
)

// latencyNamespace is the namespace MeasureLatency's keys live in.
const latencyNamespace = "latency"

// leaderSettleTimeout bounds the wait for every shard's leader to be in its
// home region before measuring.
const leaderSettleTimeout = 90 * time.Second

// MeasureLatency starts the simulated cluster (no faults, no workload) and
// measures what the survival mode costs: for every region's router and
// every key home region it makes cfg.LatencyWarmup unmeasured and then
// cfg.LatencyCycles measured reserve+complete cycles on fresh UUIDv7 keys
// homed in that region, from a client in the router's region. Cycles of a
// cell run one after another; the cells run concurrently. Measuring starts
// once every shard is led by its preferred voter, in its home region (nodes
// hand leadership back to it on their own; past a while MeasureLatency asks
// for the transfer itself). Scenario, workload and comparison settings of
// cfg are ignored. Every process it started is stopped before it returns.
func MeasureLatency(ctx context.Context, cfg Config) (rep *report.Latency, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Compare = false
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	started := time.Now()
	dir, temp := cfg.WorkDir, false
	if dir == "" {
		if dir, err = os.MkdirTemp("", "regionsim-latency-"); err != nil {
			return nil, err
		}
		temp = true
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	defer func() {
		if temp && err == nil {
			os.RemoveAll(dir)
		}
	}()
	rep = &report.Latency{Command: cfg.Command, Started: started, Setup: setup(cfg), Cycles: cfg.LatencyCycles, Warmup: cfg.LatencyWarmup}
	defer func() { rep.ElapsedS = time.Since(started).Seconds() }()
	prog := newProgress(cfg.Progress, false)
	defer prog.close()
	bins, err := binaries(cfg, dir, prog)
	if err != nil {
		return rep, err
	}
	prog.say(fmt.Sprintf("starting %d regions x %d nodes and %d routers on loopback (WAN %s..%s one way, %s survival)",
		cfg.Regions, cfg.NodesPerRegion, cfg.Regions, cfg.LatencyMin, cfg.LatencyMax, cfg.Survival))
	c, err := startCluster(ctx, cfg, dir, bins, log)
	if err != nil {
		return rep, err
	}
	defer func() {
		prog.say("stopping every process")
		if cerr := c.close(); cerr != nil {
			log.Warn("stopping the cluster", "err", cerr)
		}
	}()
	ring, err := topology.NewRing(c.topology())
	if err != nil {
		return rep, err
	}
	opts := []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: time.Second,
	})}
	clients := map[string]*client.Client{}
	defer func() {
		for _, cl := range clients {
			cl.Close()
		}
	}()
	for _, r := range c.regions {
		if clients[r], err = client.New(client.Config{Endpoints: []string{c.via[r][r]}, MaxAttempts: 1,
			RequestTimeout: cfg.AttemptTimeout, DialOptions: opts}); err != nil {
			return rep, err
		}
	}

	prog.say("waiting until every shard is led by its preferred voter (in its home region)")
	settleStart := time.Now()
	if rep.Leaders, err = c.settleLeadersHome(ctx, ring.Shards(), leaderSettleTimeout); err != nil {
		return rep, err
	}
	rep.SettleS = time.Since(settleStart).Seconds()

	type cellRun struct {
		cell              report.LatencyCell
		reserve, complete []float64
		firstErr          string
	}
	var cells []*cellRun
	for _, from := range c.regions {
		for _, home := range c.regions {
			cr := &cellRun{cell: report.LatencyCell{RouterRegion: from, HomeRegion: home}}
			if from != home {
				cr.cell.WANOneWayMs = float64(c.net.Link(from, home).Latency) / 1e6
			}
			cells = append(cells, cr)
		}
	}
	prog.say(fmt.Sprintf("measuring %d cells x %d cycles (+%d warm-up), budget %s", len(cells), cfg.LatencyCycles, cfg.LatencyWarmup, cfg.LatencyBudget))
	measureStart := time.Now()
	mctx, cancel := context.WithTimeout(ctx, cfg.LatencyBudget)
	defer cancel()
	var done atomic.Int64
	stopTicker := make(chan struct{})
	go func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopTicker:
				return
			case <-t.C:
				prog.say(fmt.Sprintf("measured %d/%d cycles", done.Load(), len(cells)*cfg.LatencyCycles))
			}
		}
	}()
	var wg sync.WaitGroup
	for _, cr := range cells {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := clients[cr.cell.RouterRegion]
			for i := 0; i < cfg.LatencyWarmup+cfg.LatencyCycles && mctx.Err() == nil; i++ {
				key, err := keyHomedIn(ring, cr.cell.HomeRegion)
				if err != nil {
					cr.firstErr = err.Error()
					return
				}
				res, com, err := latencyCycle(mctx, cl, cfg, key)
				if i < cfg.LatencyWarmup {
					continue
				}
				if err != nil {
					if mctx.Err() != nil {
						return // out of budget: not the store's failure
					}
					cr.cell.Errors++
					if cr.firstErr == "" {
						cr.firstErr = err.Error()
					}
					continue
				}
				cr.reserve = append(cr.reserve, ms(res))
				cr.complete = append(cr.complete, ms(com))
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stopTicker)
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	var localR, localC, remoteR, remoteC []float64
	var localErr, remoteErr int
	for _, cr := range cells {
		cr.cell.LatencyStats = latencyStats(cr.reserve, cr.complete, cr.cell.Errors)
		rep.Cells = append(rep.Cells, cr.cell)
		if cr.cell.RouterRegion == cr.cell.HomeRegion {
			localR, localC, localErr = append(localR, cr.reserve...), append(localC, cr.complete...), localErr+cr.cell.Errors
		} else {
			remoteR, remoteC, remoteErr = append(remoteR, cr.reserve...), append(remoteC, cr.complete...), remoteErr+cr.cell.Errors
		}
		if cr.firstErr != "" {
			rep.Notes = append(rep.Notes, fmt.Sprintf("router %s, home %s: %d failed cycles, first: %s",
				cr.cell.RouterRegion, cr.cell.HomeRegion, cr.cell.Errors, cr.firstErr))
		}
		if got := cr.cell.Cycles + cr.cell.Errors; got < cfg.LatencyCycles {
			rep.Notes = append(rep.Notes, fmt.Sprintf("router %s, home %s: budget %s ran out after %d of %d cycles",
				cr.cell.RouterRegion, cr.cell.HomeRegion, cfg.LatencyBudget, got, cfg.LatencyCycles))
		}
	}
	rep.LocalHome = latencyStats(localR, localC, localErr)
	rep.RemoteHome = latencyStats(remoteR, remoteC, remoteErr)
	after := c.shardLeaders(ctx)
	for _, s := range ring.Shards() {
		if after[s.ID] != rep.Leaders[s.ID] {
			rep.Notes = append(rep.Notes, fmt.Sprintf("shard %s: leader moved from %s to %q while measuring", s.ID, rep.Leaders[s.ID], after[s.ID]))
		}
	}
	prog.say(fmt.Sprintf("measured %d cycles in %s", done.Load(), time.Since(measureStart).Round(time.Second)))
	return rep, nil
}

// latencyCycle reserves key (it must be ACQUIRED) and completes it, and
// returns how long each call took.
func latencyCycle(ctx context.Context, cl *client.Client, cfg Config, key string) (reserve, complete time.Duration, err error) {
	t0 := time.Now()
	res, err := cl.Reserve(ctx, client.ReserveRequest{Namespace: latencyNamespace, Key: key, Lease: cfg.Lease})
	reserve = time.Since(t0)
	if err != nil {
		return 0, 0, fmt.Errorf("reserve: %w", err)
	}
	if res.Outcome != client.OutcomeAcquired {
		return 0, 0, fmt.Errorf("reserve of a fresh key answered %s, want ACQUIRED", res.Outcome)
	}
	t1 := time.Now()
	_, err = cl.Complete(ctx, client.CompleteRequest{Namespace: latencyNamespace, Key: key, OwnerToken: res.OwnerToken,
		Response: client.Response{Status: 201, Body: []byte("ok")}})
	complete = time.Since(t1)
	if err != nil {
		return 0, 0, fmt.Errorf("complete: %w", err)
	}
	return reserve, complete, nil
}

// keyHomedIn returns a fresh UUIDv7 key whose shard is homed in region.
func keyHomedIn(ring *topology.Ring, region string) (string, error) {
	for range 100_000 {
		k := client.NewKey()
		if ring.Locate(latencyNamespace, k).HomeRegion == region {
			return k, nil
		}
	}
	return "", fmt.Errorf("regionsim: no key homed in %s among 100000 fresh keys", region)
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// latencyStats summarises reserve and complete samples (milliseconds).
func latencyStats(reserve, complete []float64, errs int) report.LatencyStats {
	r, c := slices.Clone(reserve), slices.Clone(complete)
	sort.Float64s(r)
	sort.Float64s(c)
	return report.LatencyStats{Cycles: len(r), Errors: errs,
		ReserveP50Ms: quantile(r, 0.5), ReserveP99Ms: quantile(r, 0.99),
		CompleteP50Ms: quantile(c, 0.5), CompleteP99Ms: quantile(c, 0.99)}
}

// settleLeadersHome waits until every shard is led by its preferred voter
// (Voters[0], in its home region) and returns who leads what. Nodes hand
// leadership back to the preferred voter on their own every few seconds,
// so waiting only for "some node of the home region" would let leadership
// move while measuring; a shard still led by another node after 15 s is
// asked to transfer to its preferred voter (again every 5 s).
func (c *simCluster) settleLeadersHome(ctx context.Context, shards []topology.Shard, timeout time.Duration) (map[string]string, error) {
	start := time.Now()
	var lastAsk time.Time
	for {
		leaders := c.shardLeaders(ctx)
		var away []topology.Shard
		for _, s := range shards {
			if leaders[s.ID] != s.Voters[0] {
				away = append(away, s)
			}
		}
		if len(away) == 0 {
			return leaders, nil
		}
		if time.Since(start) > timeout {
			var desc []string
			for _, s := range away {
				desc = append(desc, fmt.Sprintf("%s led by %q, not %s", s.ID, leaders[s.ID], s.Voters[0]))
			}
			return leaders, fmt.Errorf("%w: after %s leaders are not the preferred voters: %v", ErrClusterNotReady, timeout, desc)
		}
		if time.Since(start) > 15*time.Second && time.Since(lastAsk) > 5*time.Second {
			lastAsk = time.Now()
			for _, s := range away {
				cur, ok := leaders[s.ID]
				if !ok {
					continue
				}
				conn, err := c.adminConn(cur)
				if err != nil {
					continue
				}
				tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err = idemv1.NewAdminClient(conn).TransferLeader(tctx, &idemv1.TransferLeaderRequest{Shard: s.ID, TargetNodeId: s.Voters[0]})
				cancel()
				if err != nil {
					c.log.Info("leadership transfer home failed", "shard", s.ID, "to", s.Voters[0], "err", err)
				}
			}
		}
		if !sleepUntil(ctx, time.Now().Add(200*time.Millisecond)) {
			return leaders, errors.Join(ErrClusterNotReady, ctx.Err())
		}
	}
}
