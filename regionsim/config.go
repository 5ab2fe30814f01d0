package regionsim

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Errors of package regionsim.
var (
	// ErrInvalidConfig: Config.Validate failed; the joined errors say why.
	ErrInvalidConfig = errors.New("regionsim: invalid config")
	// ErrUnknownScenario: a scenario name that is not in Scenarios().
	ErrUnknownScenario = errors.New("regionsim: unknown scenario")
	// ErrClusterNotReady: the simulated cluster did not become ready in
	// time (at start, or when healing after a scenario).
	ErrClusterNotReady = errors.New("regionsim: cluster not ready")
)

// Config configures a run.
type Config struct {
	// Scenarios names the scenarios to run, in order; empty or ["all"]
	// runs every scenario (see Scenarios()).
	Scenarios []string
	// Seed drives every choice the run makes (fault targets and timing,
	// workload mix, jitter); the same seed replays the same schedule.
	// Zero picks 1.
	Seed uint64
	// Duration is how long each scenario generates load; its faults fall in
	// the middle of it. In-flight payments then get DrainTimeout to finish.
	Duration time.Duration
	// DrainTimeout bounds how long in-flight payments may keep retrying
	// after a scenario's load stops (with every fault healed).
	DrainTimeout time.Duration
	// Survival is the topology's survival goal: "zone" (a shard's replicas
	// in its home region) or "region" (spread over three regions).
	Survival string
	// Regions is the number of regions (>= 1; region survival needs 3).
	Regions int
	// NodesPerRegion is the number of idemnode processes per region.
	NodesPerRegion int
	// ShardsPerRegion is the number of Raft groups homed in each region.
	ShardsPerRegion int
	// LatencyMin and LatencyMax bound the one-way WAN latency: region
	// pairs get latencies spread evenly between them (first pair lowest).
	LatencyMin, LatencyMax time.Duration
	// Jitter widens each chunk's WAN delay by up to +/- Jitter.
	Jitter time.Duration
	// Loss is the WAN's background loss probability per chunk (each loss
	// costs a retransmission delay).
	Loss float64
	// WorkersPerRegion is the number of concurrent payment clients per
	// region (for each system compared).
	WorkersPerRegion int
	// RatePerRegion bounds new payments started per second per region.
	RatePerRegion float64
	// Lease is the lease the workload reserves with.
	Lease time.Duration
	// ClockSkewMargin is the nodes' --clock-skew-margin.
	ClockSkewMargin time.Duration
	// AttemptTimeout is how long a client waits for one attempt before it
	// gives up and retries (it must exceed the routers' RouterTimeout).
	AttemptTimeout time.Duration
	// RouterTimeout is the routers' --request-timeout.
	RouterTimeout time.Duration
	// Compare runs the naive SET NX lock alongside idem under the same
	// workload and faults.
	Compare bool
	// WorkDir holds data dirs, topology views and process logs. Empty
	// means a temporary directory, removed after a run that passed.
	WorkDir string
	// Binaries maps "idemnode" and "idemrouter" to prebuilt binaries; the
	// missing ones are built with go build into WorkDir/bin.
	Binaries map[string]string
	// Logger receives regionsim's own events; nil discards them.
	Logger *slog.Logger
	// Progress receives a live progress line; nil prints none.
	Progress io.Writer
	// ProgressInPlace rewrites the progress line in place (a terminal);
	// otherwise a line is printed every few seconds.
	ProgressInPlace bool
	// LatencyCycles is how many reserve+complete cycles MeasureLatency
	// measures per (router region, key home region) cell.
	LatencyCycles int
	// LatencyWarmup is how many unmeasured cycles each cell makes first
	// (connections, leader caches).
	LatencyWarmup int
	// LatencyBudget bounds MeasureLatency's measuring time once leaders
	// settled; cells stop early (with a note) when it runs out.
	LatencyBudget time.Duration
	// Command is the command line that replays this run; the report shows
	// it (regionsim cannot know how it was invoked).
	Command string
}

// DefaultConfig returns the configuration of the demonstration run.
func DefaultConfig() Config {
	return Config{
		Seed:             1,
		Duration:         20 * time.Second,
		DrainTimeout:     20 * time.Second,
		Survival:         "zone",
		Regions:          3,
		NodesPerRegion:   3,
		ShardsPerRegion:  2,
		LatencyMin:       30 * time.Millisecond,
		LatencyMax:       90 * time.Millisecond,
		Jitter:           5 * time.Millisecond,
		Loss:             0.002,
		WorkersPerRegion: 3,
		RatePerRegion:    8,
		Lease:            2 * time.Second,
		ClockSkewMargin:  time.Second,
		AttemptTimeout:   3 * time.Second,
		RouterTimeout:    2 * time.Second,
		Compare:          true,
		LatencyCycles:    200,
		LatencyWarmup:    5,
		LatencyBudget:    5 * time.Minute,
	}
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if _, err := c.scenarios(); err != nil {
		errs = append(errs, err)
	}
	if c.Duration < 2*time.Second {
		bad("duration %s is below 2s: a scenario needs a before, a during and an after phase", c.Duration)
	}
	if c.DrainTimeout <= 0 {
		bad("drain timeout %s must be positive", c.DrainTimeout)
	}
	switch c.Survival {
	case "zone":
	case "region":
		if c.Regions < 3 {
			bad("survival region needs at least 3 regions, got %d", c.Regions)
		}
	default:
		bad("survival %q: use zone or region", c.Survival)
	}
	if c.Regions < 1 || c.Regions > 8 {
		bad("regions %d: use 1..8", c.Regions)
	}
	if c.NodesPerRegion < 1 || c.NodesPerRegion > 7 {
		bad("nodes per region %d: use 1..7", c.NodesPerRegion)
	}
	if c.ShardsPerRegion < 1 || c.ShardsPerRegion > 16 {
		bad("shards per region %d: use 1..16", c.ShardsPerRegion)
	}
	if c.LatencyMin < 0 || c.LatencyMax < c.LatencyMin {
		bad("latency range %s..%s is not 0 <= min <= max", c.LatencyMin, c.LatencyMax)
	}
	if c.Jitter < 0 {
		bad("jitter %s is negative", c.Jitter)
	}
	if c.Loss < 0 || c.Loss > 0.2 {
		bad("loss %v: use 0..0.2", c.Loss)
	}
	if c.WorkersPerRegion < 1 || c.WorkersPerRegion > 64 {
		bad("workers per region %d: use 1..64", c.WorkersPerRegion)
	}
	if c.RatePerRegion <= 0 || c.RatePerRegion > 500 {
		bad("rate per region %v: use (0, 500]", c.RatePerRegion)
	}
	if c.Lease < 500*time.Millisecond || c.Lease > time.Minute {
		bad("lease %s: use 500ms..1m", c.Lease)
	}
	if c.ClockSkewMargin < 0 {
		bad("clock skew margin %s is negative", c.ClockSkewMargin)
	}
	if c.RouterTimeout <= 0 || c.AttemptTimeout <= c.RouterTimeout {
		bad("attempt timeout %s must exceed the router timeout %s (> 0)", c.AttemptTimeout, c.RouterTimeout)
	}
	if c.LatencyCycles < 1 || c.LatencyCycles > 100_000 {
		bad("latency cycles %d: use 1..100000", c.LatencyCycles)
	}
	if c.LatencyWarmup < 0 {
		bad("latency warm-up %d is negative", c.LatencyWarmup)
	}
	if c.LatencyBudget <= 0 {
		bad("latency budget %s must be positive", c.LatencyBudget)
	}
	return errors.Join(errs...)
}

// scenarios resolves c.Scenarios.
func (c Config) scenarios() ([]*Scenario, error) {
	all := Scenarios()
	if len(c.Scenarios) == 0 || (len(c.Scenarios) == 1 && c.Scenarios[0] == "all") {
		return all, nil
	}
	var out []*Scenario
	var errs []error
	for _, name := range c.Scenarios {
		i := slices.IndexFunc(all, func(s *Scenario) bool { return s.Name == name })
		if i < 0 {
			errs = append(errs, fmt.Errorf("%w %q (known: %s, or all)", ErrUnknownScenario, name, strings.Join(ScenarioNames(), ", ")))
			continue
		}
		out = append(out, all[i])
	}
	return out, errors.Join(errs...)
}

// regionNames returns the names of n regions.
func regionNames(n int) []string {
	known := []string{"us-east", "eu-west", "ap-south", "us-west", "eu-north", "sa-east", "ap-east", "af-south"}
	return known[:n]
}
