package regionsim

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/regionsim/check"
	"github.com/idem-dev/idem/regionsim/history"
	"github.com/idem-dev/idem/regionsim/ledger"
	"github.com/idem-dev/idem/regionsim/naive"
	"github.com/idem-dev/idem/regionsim/report"
)

// maxOpsPerScenario bounds the history kept per scenario (memory and
// checking time); past it calls are counted but not checked.
const maxOpsPerScenario = 300_000

// runEnv is what every scenario of a run shares.
type runEnv struct {
	cfg      Config
	log      *slog.Logger
	c        *simCluster
	idem     map[string]map[string]*client.Client
	final    *client.Client
	naive    map[string]*naive.Client
	naiveDir *naive.Client
	progress *progress
}

// Run builds (if needed) and starts the simulated cluster, runs the
// configured scenarios one after another on it, checks every invariant and
// returns the report. Every process it started is stopped before it
// returns, also when ctx is cancelled (the report then holds the scenarios
// that finished). An error means the run itself failed (bad config, a
// cluster that would not start); violations are in the report, not errors.
func Run(ctx context.Context, cfg Config) (rep *report.Report, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	scenarios, _ := cfg.scenarios()
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	started := time.Now()
	dir, temp := cfg.WorkDir, false
	if dir == "" {
		if dir, err = os.MkdirTemp("", "regionsim-"); err != nil {
			return nil, err
		}
		temp = true
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	rep = &report.Report{Seed: cfg.Seed, Command: cfg.Command, Started: started, WorkDir: dir, Setup: setup(cfg)}
	defer func() {
		rep.ElapsedS = time.Since(started).Seconds()
		if temp && err == nil && rep.Passed {
			os.RemoveAll(dir)
			rep.WorkDir = ""
		}
	}()
	prog := newProgress(cfg.Progress, cfg.ProgressInPlace)
	defer prog.close()
	bins, err := binaries(cfg, dir, prog)
	if err != nil {
		return rep, err
	}
	prog.say(fmt.Sprintf("starting %d regions x %d nodes and %d routers on loopback (WAN %s..%s one way)",
		cfg.Regions, cfg.NodesPerRegion, cfg.Regions, cfg.LatencyMin, cfg.LatencyMax))
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
	env := &runEnv{cfg: cfg, log: log, c: c, progress: prog}
	if env.idem, env.final, err = newIdemClients(c, cfg); err != nil {
		return rep, err
	}
	defer closeClients(env)
	if cfg.Compare {
		env.naive = map[string]*naive.Client{}
		for _, r := range c.regions {
			env.naive[r] = naive.NewClient(c.naiveVia[r], cfg.AttemptTimeout)
		}
		env.naiveDir = naive.NewClient(c.naive.Addr(), 5*time.Second)
	}
	rep.Passed = true
	for i, sc := range scenarios {
		if ctx.Err() != nil {
			rep.Passed = false
			return rep, ctx.Err()
		}
		res := env.runScenario(ctx, sc, i, len(scenarios))
		rep.Scenarios = append(rep.Scenarios, res)
		rep.Passed = rep.Passed && res.Passed
		if ctx.Err() != nil {
			prog.say(fmt.Sprintf("[%d/%d] %s: interrupted", i+1, len(scenarios), sc.Name))
			return rep, ctx.Err()
		}
		prog.say(fmt.Sprintf("[%d/%d] %s: %s", i+1, len(scenarios), sc.Name, verdictWord(res.Passed)))
	}
	return rep, nil
}

func verdictWord(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

func closeClients(env *runEnv) {
	for _, m := range env.idem {
		for _, cl := range m {
			cl.Close()
		}
	}
	if env.final != nil {
		env.final.Close()
	}
	for _, cl := range env.naive {
		cl.Close()
	}
	if env.naiveDir != nil {
		env.naiveDir.Close()
	}
}

// binaries returns cfg.Binaries with the missing ones built into dir/bin.
func binaries(cfg Config, dir string, prog *progress) (map[string]string, error) {
	out := map[string]string{}
	var missing []string
	for _, name := range []string{"idemnode", "idemrouter"} {
		if p := cfg.Binaries[name]; p != "" {
			out[name] = p
		} else {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		prog.say("building " + strings.Join(missing, " and ") + " (go build) into " + filepath.Join(dir, "bin"))
		if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
			return nil, err
		}
		built, err := launch.Build(filepath.Join(dir, "bin"), missing...)
		if err != nil {
			return nil, fmt.Errorf("regionsim: building the binaries (run regionsim from inside the idem module): %w", err)
		}
		for k, v := range built {
			out[k] = v
		}
	}
	return out, nil
}

func setup(cfg Config) report.Setup {
	regions := regionNames(cfg.Regions)
	replicas := min(3, cfg.NodesPerRegion)
	if cfg.Survival == "region" {
		replicas = 3
	}
	s := report.Setup{
		Regions: regions, NodesPerRegion: cfg.NodesPerRegion, ShardsPerRegion: cfg.ShardsPerRegion, Replicas: replicas,
		Survival: cfg.Survival, JitterMs: float64(cfg.Jitter) / 1e6, Loss: cfg.Loss, DurationS: cfg.Duration.Seconds(),
		LeaseMs: cfg.Lease.Milliseconds(), ClockSkewMarginS: cfg.ClockSkewMargin.Seconds(),
		WorkersPerRegion: cfg.WorkersPerRegion, RatePerRegion: cfg.RatePerRegion, Routers: true,
	}
	pairs := regionPairs(regions)
	for i, p := range pairs {
		s.Links = append(s.Links, report.Link{A: p[0], B: p[1], LatencyMs: float64(pairLatency(cfg, i, len(pairs))) / 1e6})
	}
	return s
}

// schedEvent is a fault starting or stopping.
type schedEvent struct {
	at    time.Duration
	fault int
	start bool
}

// runScenario runs one scenario: load with its faults, drain, heal, final
// reads, checks.
func (env *runEnv) runScenario(ctx context.Context, sc *Scenario, idx, total int) report.Scenario {
	cfg := env.cfg
	out := report.Scenario{Name: sc.Name, FailureMode: sc.FailureMode, Description: sc.Description}
	rng := rand.New(rand.NewPCG(streamSeed(cfg.Seed, sc.Name, "faults"), 0))
	faults := sc.plan(cfg, cfg.Duration, rng)
	load, lastEvent := cfg.Duration, time.Duration(0)
	for _, f := range faults {
		load = max(load, f.At+f.For+cfg.Duration/4)
		lastEvent = max(lastEvent, f.At+f.For)
	}
	start := time.Now()
	r := &scenarioRun{
		cfg: cfg, sc: sc, c: env.c, start: start,
		rec:   history.NewRecorder(start, maxOpsPerScenario),
		guard: ledger.New("g", true), shadow: ledger.New("u", false), naiveLedger: ledger.New("n", false),
		plannedLoad: load, tail: load - lastEvent,
		results: map[string]*systemResults{}, cur: baseMix(cfg),
	}
	instCtx, cancelInst := context.WithCancel(ctx)
	defer cancelInst()
	r.instCtx = instCtx
	systems := []system{&idemSystem{r: r, clients: env.idem, final: env.final, rng: rand.New(rand.NewPCG(cfg.Seed, 11))}}
	if cfg.Compare {
		systems = append(systems, &naiveSystem{r: r, clients: env.naive, direct: env.naiveDir, rng: rand.New(rand.NewPCG(cfg.Seed, 12))})
	}
	for _, sys := range systems {
		r.result(sys.name())
		for _, region := range env.c.regions {
			for w := 0; w < cfg.WorkersPerRegion; w++ {
				r.clients.Add(1)
				go r.clientLoop(sys, region, w)
			}
		}
	}
	stopProgress := env.progress.track(r, idx, total)
	faultEnvs := make([]*faultEnv, len(faults))
	reported := make([]report.Fault, len(faults))
	for i, f := range faults {
		faultEnvs[i] = &faultEnv{c: env.c, rng: rand.New(rand.NewPCG(rng.Uint64(), uint64(i)))}
		reported[i] = report.Fault{Name: f.Name, StartS: f.At.Seconds(), EndS: (f.At + f.For).Seconds()}
	}
	var events []schedEvent
	for i, f := range faults {
		events = append(events, schedEvent{f.At, i, true}, schedEvent{f.At + f.For, i, false})
	}
	sort.SliceStable(events, func(i, j int) bool { return events[i].at < events[j].at })
	active := map[int]bool{}
	var scenarioErr []string
	for _, ev := range events {
		if !sleepUntil(ctx, start.Add(ev.at)) {
			break
		}
		f := faults[ev.fault]
		if ev.start {
			active[ev.fault] = true
			r.setMix(faults, active)
			reported[ev.fault].StartS = time.Since(start).Seconds()
			if f.start != nil {
				detail, err := f.start(ctx, faultEnvs[ev.fault])
				reported[ev.fault].Detail = detail
				if err != nil {
					reported[ev.fault].Error = err.Error()
					scenarioErr = append(scenarioErr, fmt.Sprintf("fault %q: %v", f.Name, err))
				}
			}
			env.log.Info("fault started", "scenario", sc.Name, "fault", f.Name, "detail", reported[ev.fault].Detail)
		} else {
			if f.stop != nil {
				if err := f.stop(ctx, faultEnvs[ev.fault]); err != nil {
					reported[ev.fault].Error = err.Error()
					scenarioErr = append(scenarioErr, fmt.Sprintf("ending fault %q: %v", f.Name, err))
				}
			}
			delete(active, ev.fault)
			r.setMix(faults, active)
			reported[ev.fault].EndS = time.Since(start).Seconds()
			env.log.Info("fault ended", "scenario", sc.Name, "fault", f.Name)
		}
	}
	out.Faults = reported
	r.scheduleDone()
	sleepUntil(ctx, r.loadEnd())
	out.LoadS = time.Since(start).Seconds()
	if ctx.Err() != nil {
		// Interrupted: no healing, no checks; Run stops every process.
		cancelInst()
		waitGroup(&r.clients, 10*time.Second)
		waitGroup(&r.instances, 10*time.Second)
		stopProgress()
		out.Error = "interrupted: " + context.Cause(ctx).Error()
		return out
	}
	// Heal whatever is left (a fault that failed to end) while in-flight
	// payments drain.
	if err := env.c.heal(ctx); err != nil {
		scenarioErr = append(scenarioErr, "healing: "+err.Error())
	}
	waitGroup(&r.clients, time.Until(r.drainEnd())+cfg.AttemptTimeout+5*time.Second)
	waitGroup(&r.instances, cfg.Lease+cfg.ClockSkewMargin+cfg.AttemptTimeout+5*time.Second)
	cancelInst()
	waitGroup(&r.instances, 10*time.Second)
	out.DrainS = time.Since(start).Seconds() - out.LoadS
	stopProgress()
	if ctx.Err() != nil {
		out.Error = "interrupted: " + context.Cause(ctx).Error()
		return out
	}
	env.progress.say(fmt.Sprintf("[%d/%d] %s: load done, reading back every acknowledged completion and checking", idx+1, total, sc.Name))

	finals := map[string]map[string]check.FinalRead{}
	for _, sys := range systems {
		finals[sys.name()] = env.finalReads(ctx, sys, r.result(sys.name()).acks)
	}
	env.fill(&out, r, faults, finals)
	if len(scenarioErr) > 0 {
		out.Error = strings.Join(scenarioErr, "; ")
		out.Passed = false
	}
	return out
}

// setMix recomputes the workload mix from the active faults.
func (r *scenarioRun) setMix(faults []*Fault, active map[int]bool) {
	m := baseMix(r.cfg)
	var names []string
	for i, f := range faults {
		if active[i] {
			if f.mix != nil {
				f.mix(&m)
			}
			names = append(names, fmt.Sprintf("F%d %s", i+1, f.Name))
		}
	}
	r.mixMu.Lock()
	r.cur, r.active = m, names
	r.mixMu.Unlock()
}

func (r *scenarioRun) activeFaults() []string {
	r.mixMu.Lock()
	defer r.mixMu.Unlock()
	return append([]string(nil), r.active...)
}

// waitGroup waits for wg up to d; false on timeout.
func waitGroup(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// finalReads reads back every acknowledged completion, 16 at a time.
func (env *runEnv) finalReads(ctx context.Context, sys system, acks []check.Completion) map[string]check.FinalRead {
	out := map[string]check.FinalRead{}
	var mu sync.Mutex
	keys := map[string]bool{}
	for _, a := range acks {
		keys[a.Key] = true
	}
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			fr := sys.finalRead(rctx, k)
			cancel()
			mu.Lock()
			out[k] = fr
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}
