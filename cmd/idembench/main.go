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
	"github.com/idem-dev/idem/internal/flagdoc"
	"github.com/idem-dev/idem/security/pki"
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

`

func parseFlags(args []string, stderr io.Writer) (benchConfig, error) {
	o := flagOptions{cfg: defaultBenchConfig(), user: "root"}
	cfg := &o.cfg
	set := flagdoc.NewSet(flagTable(&o))
	if err := set.Parse(args, stderr, usageHeader); err != nil {
		return *cfg, err
	}
	addrs, certsDir, user := o.addrs, o.certsDir, o.user
	durationSet := set.Given("duration")
	if cfg.Cycles > 0 && !durationSet {
		cfg.Duration = 0
	}
	if certsDir != "" {
		tlsCfg, err := pki.ClientTLS(certsDir, user)
		if err != nil {
			return *cfg, err
		}
		cfg.TLS, cfg.Secure = tlsCfg, true
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
	return *cfg, cfg.validate()
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
