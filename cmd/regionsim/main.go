// Command regionsim runs a multi-region idem cluster on this machine (real
// processes on loopback, the WAN between regions simulated), drives a
// payment workload through it while injecting faults, checks that idem's
// guarantees held, compares it with a naive SET NX lock, and reports.
//
//	go run ./cmd/regionsim                         # every scenario, then a verdict
//	go run ./cmd/regionsim --scenario clock-skew --seed 7 --duration 30s
//	go run ./cmd/regionsim --latency --survival region  # what a survival mode costs
//
// See docs/regionsim.md and package regionsim.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/idem-dev/idem/internal/cli"
	"github.com/idem-dev/idem/internal/flagdoc"
	"github.com/idem-dev/idem/regionsim"
	"github.com/idem-dev/idem/regionsim/report"
)

var version = "v0.1.0-dev"

// errViolations: the run finished and some invariant broke.
var errViolations = errors.New("invariants broke (see the report)")

func main() { cli.Main("regionsim", run) }

const usageHeader = `regionsim: shows that idem holds when the world misbehaves.

It starts a multi-region idem cluster as real processes on loopback (idemnode
and idemrouter, built with go build into a temporary directory), simulates
the WAN between regions (latency, jitter, loss, partitions that refuse or
blackhole), runs a payment workload in every region while it injects the
faults of each scenario, then checks: no key charged twice, every completed
key charged exactly once, replays identical, per-key linearizability
(porcupine), no acknowledged completion lost; and reports availability and
latency per phase and region. The same workload runs against a naive SET NX
lock for comparison. Exit status 1 when an invariant broke.

With --latency it runs no scenario: it measures reserve and complete
latency per router region and key home region on the fault-free cluster
(--latency-cycles per cell) and prints the table; run it once per
--survival mode to see what each costs.

Usage:
  regionsim [flags]

Scenarios: ` + "%s" + `

`

type options struct {
	cfg         regionsim.Config
	scenario    string
	jsonPath    string
	htmlPath    string
	keep        bool
	fromJSON    string
	quiet       bool
	logLevel    string
	showVersion bool
	latency     bool
	htmlSet     bool
}

func parseFlags(args []string, stdout io.Writer) (*options, error) {
	o := &options{cfg: regionsim.DefaultConfig()}
	o.scenario, o.htmlPath = "all", "regionsim-report.html"
	set := flagdoc.NewSet(flagTable(o))
	header := fmt.Sprintf(usageHeader, strings.Join(regionsim.ScenarioNames(), ", "))
	if err := set.Parse(args, stdout, header); err != nil {
		return nil, err
	}
	c := &o.cfg
	o.htmlSet = set.Given("html")
	if o.latency && !o.htmlSet {
		o.htmlPath = "regionsim-latency-" + c.Survival + ".html"
	}
	if o.scenario != "" {
		c.Scenarios = strings.Split(o.scenario, ",")
	}
	return o, nil
}

// replayCommand is the command line that replays this run.
func replayCommand(o *options) string {
	d := regionsim.DefaultConfig()
	c := o.cfg
	parts := []string{"go run ./cmd/regionsim", "--scenario " + o.scenario, fmt.Sprintf("--seed %d", c.Seed),
		"--duration " + c.Duration.String(), "--survival " + c.Survival,
		fmt.Sprintf("--regions %d", c.Regions), fmt.Sprintf("--nodes-per-region %d", c.NodesPerRegion)}
	add := func(cond bool, s string) {
		if cond {
			parts = append(parts, s)
		}
	}
	add(c.ShardsPerRegion != d.ShardsPerRegion, fmt.Sprintf("--shards-per-region %d", c.ShardsPerRegion))
	add(c.LatencyMin != d.LatencyMin, "--latency-min "+c.LatencyMin.String())
	add(c.LatencyMax != d.LatencyMax, "--latency-max "+c.LatencyMax.String())
	add(c.Jitter != d.Jitter, "--jitter "+c.Jitter.String())
	add(c.Loss != d.Loss, fmt.Sprintf("--loss %v", c.Loss))
	add(c.WorkersPerRegion != d.WorkersPerRegion, fmt.Sprintf("--workers %d", c.WorkersPerRegion))
	add(c.RatePerRegion != d.RatePerRegion, fmt.Sprintf("--rate %v", c.RatePerRegion))
	add(c.Lease != d.Lease, "--lease "+c.Lease.String())
	add(c.DrainTimeout != d.DrainTimeout, "--drain "+c.DrainTimeout.String())
	add(c.Compare != d.Compare, fmt.Sprintf("--compare=%v", c.Compare))
	return strings.Join(parts, " ")
}

// latencyCommand is the command line that repeats a latency measurement.
func latencyCommand(o *options) string {
	d := regionsim.DefaultConfig()
	c := o.cfg
	parts := []string{"go run ./cmd/regionsim --latency", "--survival " + c.Survival}
	add := func(cond bool, s string) {
		if cond {
			parts = append(parts, s)
		}
	}
	add(c.LatencyCycles != d.LatencyCycles, fmt.Sprintf("--latency-cycles %d", c.LatencyCycles))
	add(c.LatencyBudget != d.LatencyBudget, "--latency-budget "+c.LatencyBudget.String())
	add(c.Seed != d.Seed, fmt.Sprintf("--seed %d", c.Seed))
	add(c.Regions != d.Regions, fmt.Sprintf("--regions %d", c.Regions))
	add(c.NodesPerRegion != d.NodesPerRegion, fmt.Sprintf("--nodes-per-region %d", c.NodesPerRegion))
	add(c.ShardsPerRegion != d.ShardsPerRegion, fmt.Sprintf("--shards-per-region %d", c.ShardsPerRegion))
	add(c.LatencyMin != d.LatencyMin, "--latency-min "+c.LatencyMin.String())
	add(c.LatencyMax != d.LatencyMax, "--latency-max "+c.LatencyMax.String())
	add(c.Jitter != d.Jitter, "--jitter "+c.Jitter.String())
	add(c.Loss != d.Loss, fmt.Sprintf("--loss %v", c.Loss))
	add(c.Lease != d.Lease, "--lease "+c.Lease.String())
	return strings.Join(parts, " ")
}

// measureLatency runs regionsim.MeasureLatency and writes its table (and
// --json, --html).
func measureLatency(ctx context.Context, o *options, stdout io.Writer) error {
	rep, err := regionsim.MeasureLatency(ctx, o.cfg)
	if err != nil {
		return fmt.Errorf("latency measurement: %w", err)
	}
	if err := report.WriteLatencyText(stdout, rep); err != nil {
		return err
	}
	if err := writeAny(o.jsonPath, rep, report.WriteLatencyJSON); err != nil {
		return err
	}
	if err := writeAny(o.htmlPath, rep, report.WriteLatencyHTML); err != nil {
		return err
	}
	if o.htmlPath != "" {
		fmt.Fprintf(stdout, "HTML report: %s\n", o.htmlPath)
	}
	if o.jsonPath != "" {
		fmt.Fprintf(stdout, "JSON report: %s\n", o.jsonPath)
	}
	return nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if o.showVersion {
		fmt.Fprintln(stdout, "regionsim", version)
		return nil
	}
	if o.fromJSON != "" {
		return rerender(o, stdout)
	}
	if o.logLevel != "" {
		if o.cfg.Logger, err = cli.NewLogger(stderr, o.logLevel, "text"); err != nil {
			return err
		}
	}
	if !o.quiet {
		o.cfg.Progress, o.cfg.ProgressInPlace = stderr, isTerminal(stderr)
	}
	o.cfg.Command = replayCommand(o)
	if o.latency {
		o.cfg.Command = latencyCommand(o)
	}
	if err := o.cfg.Validate(); err != nil {
		return cli.OneLine(err)
	}
	if o.keep && o.cfg.WorkDir == "" {
		if o.cfg.WorkDir, err = os.MkdirTemp("", "regionsim-"); err != nil {
			return err
		}
	}
	if o.latency {
		return measureLatency(ctx, o, stdout)
	}
	started := time.Now()
	rep, runErr := regionsim.Run(ctx, o.cfg)
	if rep == nil {
		return runErr
	}
	if len(rep.Scenarios) > 0 {
		if err := report.WriteText(stdout, rep); err != nil {
			return err
		}
		if err := writeFile(o.jsonPath, rep, report.WriteJSON); err != nil {
			return err
		}
		if err := writeFile(o.htmlPath, rep, report.WriteHTML); err != nil {
			return err
		}
		if o.htmlPath != "" {
			fmt.Fprintf(stdout, "HTML report: %s\n", o.htmlPath)
		}
		if o.jsonPath != "" {
			fmt.Fprintf(stdout, "JSON report: %s\n", o.jsonPath)
		}
	}
	if runErr != nil {
		return fmt.Errorf("run stopped after %s: %w (seed %d; replay: %s)", time.Since(started).Round(time.Second), runErr, rep.Seed, rep.Command)
	}
	if !rep.Passed {
		return fmt.Errorf("%w; seed %d; replay: %s", errViolations, rep.Seed, rep.Command)
	}
	return nil
}

// rerender writes the text and HTML forms of a saved JSON report.
func rerender(o *options, stdout io.Writer) error {
	data, err := os.ReadFile(o.fromJSON)
	if err != nil {
		return err
	}
	var rep report.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		return fmt.Errorf("%s is not a regionsim JSON report: %w", o.fromJSON, err)
	}
	if err := report.WriteText(stdout, &rep); err != nil {
		return err
	}
	return writeFile(o.htmlPath, &rep, report.WriteHTML)
}

func writeFile(path string, rep *report.Report, write func(io.Writer, *report.Report) error) error {
	return writeAny(path, rep, write)
}

func writeAny[T any](path string, rep T, write func(io.Writer, T) error) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f, rep); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
