package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/idem-dev/idem/internal/cli"
)

func main() { cli.Main("idembench", run) }

// Default addresses per target: the dev node's.
const (
	defaultJSONAddr = "127.0.0.1:8080"
	defaultGRPCAddr = "127.0.0.1:7070"
)

const usageHeader = `idembench: load generator for idem.

Each of --concurrency workers loops: reserve a fresh key (UUIDv7), then
complete it with a --body-bytes response. It runs for --duration, or for
--cycles cycles in all, after an unmeasured --warmup, then prints cycles/s,
p50/p90/p99/max latency of whole cycles and of each step, errors by kind, and
the configuration it ran with. On SIGINT it stops early and still reports.

Usage:
  idembench [flags]

Flags:
`

func parseFlags(args []string, stderr io.Writer) (benchConfig, error) {
	cfg := benchConfig{}
	var addrs string
	fs := flag.NewFlagSet("idembench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.Target, "target", "json", "API to load: `json` (HTTP) or grpc")
	fs.StringVar(&addrs, "addr", "", "comma-separated `HOST:PORT` list of nodes or routers; requests rotate over them (default 127.0.0.1:8080 for json, 127.0.0.1:7070 for grpc)")
	fs.StringVar(&cfg.Namespace, "namespace", "bench", "`NAMESPACE` the keys are made in")
	fs.IntVar(&cfg.Concurrency, "concurrency", 16, "number of workers, each with one cycle in flight")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to measure; with --cycles and no --duration, no time limit")
	fs.IntVar(&cfg.Cycles, "cycles", 0, "stop after `N` measured cycles in all (0: run for --duration)")
	fs.IntVar(&cfg.BodyBytes, "body-bytes", 512, "size of the response body each complete stores")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "run this long before measuring; warmup cycles are not counted")
	fs.DurationVar(&cfg.Lease, "lease", 0, "lease of each reserve (0: the store's default, 30s)")
	fs.DurationVar(&cfg.RequestTimeout, "request-timeout", 10*time.Second, "deadline of one request")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", 1, "grpc only: attempts per request, with the client's backoff (1: no retries, every failure counts)")
	fs.BoolVar(&cfg.JSON, "json", false, "print the figures as one JSON object instead of text")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, usageHeader)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
		}
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q; idembench takes flags only", fs.Arg(0))
	}
	durationSet := false
	fs.Visit(func(f *flag.Flag) { durationSet = durationSet || f.Name == "duration" })
	if cfg.Cycles > 0 && !durationSet {
		cfg.Duration = 0
	}
	if addrs == "" {
		addrs = defaultJSONAddr
		if cfg.Target == "grpc" {
			addrs = defaultGRPCAddr
		}
	}
	for _, a := range strings.Split(addrs, ",") {
		cfg.Addrs = append(cfg.Addrs, strings.TrimSpace(a))
	}
	return cfg, cfg.validate()
}

func (c benchConfig) validate() error {
	var errs []error
	if c.Target != "json" && c.Target != "grpc" {
		errs = append(errs, fmt.Errorf("--target %q: want json or grpc", c.Target))
	}
	for _, a := range c.Addrs {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("--addr %q is not HOST:PORT", a))
		}
	}
	if c.Namespace == "" {
		errs = append(errs, errors.New("--namespace is empty"))
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("--concurrency %d: want at least 1", c.Concurrency))
	}
	if c.Duration < 0 || (c.Duration == 0 && c.Cycles == 0) {
		errs = append(errs, fmt.Errorf("--duration %v: want a positive duration (or --cycles)", c.Duration))
	}
	if c.Cycles < 0 {
		errs = append(errs, fmt.Errorf("--cycles %d is negative", c.Cycles))
	}
	if c.BodyBytes < 0 {
		errs = append(errs, fmt.Errorf("--body-bytes %d is negative", c.BodyBytes))
	}
	if c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("--warmup %v is negative", c.Warmup))
	}
	if c.Lease != 0 && (c.Lease < 100*time.Millisecond || c.Lease > 10*time.Minute) {
		errs = append(errs, fmt.Errorf("--lease %v: want 100ms..10m (or 0)", c.Lease))
	}
	if c.RequestTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--request-timeout %v: want a positive duration", c.RequestTimeout))
	}
	if c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("--max-attempts %d: want at least 1", c.MaxAttempts))
	}
	return errors.Join(errs...)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	tgt, err := newTarget(cfg)
	if err != nil {
		return err
	}
	defer tgt.Close()
	rep := runBench(ctx, cfg, tgt)
	if cfg.JSON {
		err = rep.writeJSON(stdout)
	} else {
		err = rep.writeText(stdout)
	}
	if err != nil {
		return err
	}
	if rep.CyclesOK == 0 {
		return fmt.Errorf("no cycle succeeded (%d failed); see the errors above", rep.CyclesFailed)
	}
	return nil
}
