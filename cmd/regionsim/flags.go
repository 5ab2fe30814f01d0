package main

import (
	"github.com/idem-dev/idem/internal/flagdoc"
)

// Sections of regionsim's --help, in order.
const (
	secRun      = "Run"
	secCluster  = "Cluster"
	secWAN      = "WAN"
	secWorkload = "Workload"
	secOutput   = "Output"
)

// flagTable is regionsim's flags: most set a field of o.cfg, which holds
// regionsim.DefaultConfig() when the table is built, so their defaults
// are the Config's.
func flagTable(o *options) flagdoc.Table {
	c := &o.cfg
	return flagdoc.Table{
		Command:  "regionsim",
		Sections: []string{secRun, secCluster, secWAN, secWorkload, secOutput},
		Flags: []flagdoc.Flag{
			{Name: "scenario", Value: &o.scenario, Section: secRun, Usage: "scenario `NAME` to run, a comma-separated list, or all"},
			{Name: "seed", Value: &c.Seed, Section: secRun, Usage: "`SEED` of every choice (fault targets and timing, workload mix); the same seed replays the same schedule"},
			{Name: "duration", Value: &c.Duration, Section: secRun, Usage: "load per scenario; the faults fall in its middle"},
			{Name: "latency", Value: &o.latency, Section: secRun, Usage: "run no scenario: measure reserve/complete latency per router region and key home region (fault-free) and report it"},
			{Name: "latency-cycles", Value: &c.LatencyCycles, Section: secRun, Usage: "with --latency: measured reserve+complete cycles per (router region, key home region)"},
			{Name: "latency-budget", Value: &c.LatencyBudget, Section: secRun, Usage: "with --latency: time limit on measuring"},

			{Name: "survival", Value: &c.Survival, Section: secCluster, Usage: "topology survival goal: zone or region"},
			{Name: "regions", Value: &c.Regions, Section: secCluster, Usage: "number of regions"},
			{Name: "nodes-per-region", Value: &c.NodesPerRegion, Section: secCluster, Usage: "idemnode processes per region"},
			{Name: "shards-per-region", Value: &c.ShardsPerRegion, Section: secCluster, Usage: "Raft groups homed in each region"},

			{Name: "latency-min", Value: &c.LatencyMin, Section: secWAN, Usage: "lowest one-way WAN latency (between the first two regions)"},
			{Name: "latency-max", Value: &c.LatencyMax, Section: secWAN, Usage: "highest one-way WAN latency"},
			{Name: "jitter", Value: &c.Jitter, Section: secWAN, Usage: "WAN jitter, +/- per chunk"},
			{Name: "loss", Value: &c.Loss, Section: secWAN, Usage: "WAN loss probability per chunk (each loss costs a retransmission delay)"},

			{Name: "workers", Value: &c.WorkersPerRegion, Section: secWorkload, Usage: "payment clients per region (per system compared)"},
			{Name: "rate", Value: &c.RatePerRegion, Section: secWorkload, Usage: "payments started per second per region"},
			{Name: "lease", Value: &c.Lease, Section: secWorkload, Usage: "lease the workload reserves with"},
			{Name: "drain", Value: &c.DrainTimeout, Section: secWorkload, Usage: "how long in-flight payments may finish after a scenario's load"},
			{Name: "compare", Value: &c.Compare, Section: secWorkload, Usage: "also run the workload against the naive SET NX lock"},

			{Name: "json", Value: &o.jsonPath, Section: secOutput, Usage: "write the report as JSON to `FILE`"},
			{Name: "html", Value: &o.htmlPath, Section: secOutput, Usage: "write the HTML report to `FILE` (empty: none)"},
			{Name: "work-dir", Value: &c.WorkDir, Section: secOutput, Usage: "`DIR` for data dirs, topology views and process logs (default: a temporary dir, removed after a passing run)"},
			{Name: "from-json", Value: &o.fromJSON, Section: secOutput, Usage: "run nothing: read a report written with --json from `FILE` and write its text and --html forms again"},
			{Name: "keep", Value: &o.keep, Section: secOutput, Usage: "keep the temporary work dir even when the run passed"},
			{Name: "quiet", Value: &o.quiet, Section: secOutput, Usage: "no progress line"},
			{Name: "log-level", Value: &o.logLevel, Section: secOutput, Usage: "log regionsim's own events to stderr at `LEVEL` (debug, info, warn, error); default none"},
			{Name: "version", Value: &o.showVersion, Section: secOutput, Usage: "print the version and exit"},
		},
	}
}
