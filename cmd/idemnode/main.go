// Command idemnode runs one idem storage node: the Raft groups of the shards
// it hosts, the JSON and gRPC API, probes and metrics. Any node accepts any
// key and forwards what it does not lead.
//
//	idemnode --dev                                  # one node, one region, no config
//	idemnode --config topology.yaml --id us-east-1  # a node of a cluster
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/attribute"

	"github.com/idem-dev/idem/internal/cli"
	"github.com/idem-dev/idem/internal/flagdoc"
	"github.com/idem-dev/idem/node"
	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/security/transport"
	"github.com/idem-dev/idem/statedb"
	"github.com/idem-dev/idem/topology"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "v0.1.0-dev"

func main() {
	cli.ReadSysmon() // GODEBUG's schedtrace: an operator's opt-in, logged at start
	cli.Main("idemnode", run)
}

type options struct {
	// cfg holds the settings the flags set straight into the node's
	// Config; it starts as node.DefaultConfig(), so those flags' defaults
	// are the Config's.
	cfg              node.Config
	dev              bool
	config           string
	id               string
	dataDir          string
	httpAddr         string
	grpcAddr         string
	raftAddr         string
	logLevel         string
	logFormat        string
	gcHeadroom       uint64
	testCrashRestore int
	// testingFlags are the --testing-* flags given; faultInjection is
	// whether the environment allows them (IDEM_ENABLE_FAULT_INJECTION=1).
	testingFlags   []string
	faultInjection bool
	pprofAddr      string
	showVersion    bool
	sec            transport.Flags
	trace          cli.TraceOptions
	// flags is the parsed flag table (its deprecated names are warned of
	// once the logger exists).
	flags *flagdoc.Set
}

const usageHeader = `idemnode: a storage node of idem, the multi-region idempotency-key store.

Usage:
  idemnode --dev                                   one node, one region, bootstraps itself
  idemnode --config FILE --id NODE_ID [flags]      a node of the cluster in FILE

It serves the JSON API, /healthz, /readyz and /metrics on --http-addr, the gRPC
API on --grpc-addr, and Raft traffic for all its shards on --raft-addr. Any
node accepts any key and forwards it to the leader of the key's shard. On
SIGTERM it hands over leadership, drains and exits 0.

` + cli.SysmonUsage + "\n"

func parseFlags(args []string, stdout io.Writer) (*options, error) {
	o := &options{cfg: node.DefaultConfig(), logLevel: "info", logFormat: "text",
		gcHeadroom: defaultGCHeadroom, sec: transport.DefaultFlags(), trace: cli.DefaultTraceOptions()}
	o.flags = flagdoc.NewSet(flagTable(o))
	if err := o.flags.Parse(args, stdout, usageHeader); err != nil {
		return nil, err
	}
	o.flags.FlagSet().Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "testing-") {
			o.testingFlags = append(o.testingFlags, "--"+f.Name+"="+f.Value.String())
		}
	})
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	o.faultInjection = os.Getenv(faultInjectionEnv) == "1"
	if o.showVersion {
		fmt.Fprintln(stdout, "idemnode", version)
		return nil
	}
	logger, err := cli.NewLogger(stderr, o.logLevel, o.logFormat)
	if err != nil {
		return err
	}
	o.flags.Warn(logger)
	cfg, err := nodeConfig(o)
	if err != nil {
		return err
	}
	self, _ := cfg.Topology.NodeByID(cfg.NodeID)
	tp, stopTracing, err := cli.StartTracing(ctx, o.trace, "idemnode", version, logger,
		attribute.String("service.instance.id", cfg.NodeID), attribute.String("idem.region", self.Region))
	if err != nil {
		return err
	}
	defer stopTracing()
	logger = cli.TraceLogger(logger, tp)
	cfg.Logger = logger
	cfg.TracerProvider, cfg.TraceKeys = tp, o.trace.Keys
	// In a static CGO_ENABLED=0 build most of a warm node's heap is the
	// state engine's block cache and memtables (pebble allocates them on
	// the Go heap there): long-lived and pointer-free, cheap to mark.
	// Go's default (GOGC=100) lets the heap grow to twice what is live
	// before collecting, which at 10M retained records put RSS at 600
	// MiB; GOGC=50 keeps it nearer what is live. A small live heap (a
	// cgo build, a cold cache) gets --gc-headroom-bytes of room instead,
	// or it would collect several times a second under load
	// (internal/gctune). GOGC in the environment wins.
	defer cli.PaceGC(logger, defaultGCPercent, o.gcHeadroom)()
	cli.LogSysmon(logger)
	if o.testCrashRestore > 0 {
		cfg.Testing.RestoreFault = &statedb.RestoreFault{AfterRecords: o.testCrashRestore, Crash: func(shard string, n int) {
			logger.Error("FAULT INJECTION: crashing during a snapshot restore (--testing-crash-during-restore)",
				"shard", shard, "records_written", n, "exit_status", restoreCrashExitStatus)
			os.Exit(restoreCrashExitStatus) // as a crash: no deferred cleanup, nothing closed
		}}
	}
	cfg.Registry = prometheus.NewRegistry()
	cfg.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	certID := cfg.NodeID
	if o.dev {
		certID = "" // any node certificate of the CA
	}
	if cfg.Security, err = o.sec.Kit(certID, logger, cfg.Registry); err != nil {
		return err
	}
	cfg.Security.ReloadOnSIGHUP(ctx)
	n, err := node.New(cfg)
	if err != nil {
		return err
	}
	if o.pprofAddr != "" {
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if _, err := cli.ServePprof(pctx, o.pprofAddr, logger); err != nil {
			return err
		}
	}
	return n.Run(ctx)
}

// restoreCrashExitStatus is the exit status of --testing-crash-during-restore.
const restoreCrashExitStatus = 86

// defaultGCPercent is the node's GOGC for a large live heap, and
// defaultGCHeadroom the least room between collections (--gc-headroom-bytes),
// unless the environment sets GOGC.
const (
	defaultGCPercent  = 50
	defaultGCHeadroom = 128 << 20
)

// faultInjectionEnv must be "1" in the environment for any --testing-* flag.
const faultInjectionEnv = "IDEM_ENABLE_FAULT_INJECTION"

// nodeConfig turns flags into a node.Config, reporting every problem at once.
func nodeConfig(o *options) (node.Config, error) {
	var errs []error
	cfg := o.cfg
	cfg.HTTPAddr, cfg.GRPCAddr, cfg.RaftAddr = o.httpAddr, o.grpcAddr, o.raftAddr
	cfg.DataDir = o.dataDir
	cfg.Version = version
	if !slices.Contains(raftstore.LogStores, cfg.Raft.LogStore) {
		errs = append(errs, fmt.Errorf("--raft-log-store %q: want one of %s", cfg.Raft.LogStore, strings.Join(raftstore.LogStores, ", ")))
	}
	if cfg.Testing.FailDrops < 0 {
		errs = append(errs, fmt.Errorf("--testing-fail-drops must not be negative, got %d", cfg.Testing.FailDrops))
	}
	if o.testCrashRestore < 0 {
		errs = append(errs, fmt.Errorf("--testing-crash-during-restore must not be negative, got %d", o.testCrashRestore))
	}
	if len(o.testingFlags) > 0 {
		if !o.faultInjection {
			return cfg, fmt.Errorf("%s: fault injection for tests only; it works only with %s=1 in the environment, never set it in production",
				strings.Join(o.testingFlags, ", "), faultInjectionEnv)
		}
		cfg.FaultInjection = o.testingFlags
	}
	// Settings that turn a safety check off are warned of at start and every
	// ten minutes, and shown in /readyz and idem_node_unsafe_settings. --dev
	// is loopback-only and single-node by design: nothing of it is unsafe.
	// They are named as the operator typed them.
	if o.sec.Insecure {
		cfg.UnsafeSettings = append(cfg.UnsafeSettings, "--insecure")
	}
	if o.cfg.MaxClockOffset == 0 && !o.dev {
		cfg.UnsafeSettings = append(cfg.UnsafeSettings, "--max-clock-offset 0")
	}
	cfg.UnsafeSettings = append(cfg.UnsafeSettings, cfg.FaultInjection...)
	// 0 means the Raft default, as it did before --help showed the number.
	def := raftstore.DefaultConfig()
	cfg.Raft.SnapshotThreshold = cmp.Or(cfg.Raft.SnapshotThreshold, def.SnapshotThreshold)
	cfg.Raft.TrailingLogs = cmp.Or(cfg.Raft.TrailingLogs, def.TrailingLogs)
	cfg.Raft.SnapshotInterval = cmp.Or(cfg.Raft.SnapshotInterval, def.SnapshotInterval)
	if cfg.Raft.MaxInboundConns <= 0 {
		errs = append(errs, fmt.Errorf("--raft-max-conns must be positive, got %d", cfg.Raft.MaxInboundConns))
	}
	if o.pprofAddr != "" {
		if err := transport.CheckLoopback("--pprof-addr", o.pprofAddr); err != nil {
			errs = append(errs, err)
		}
	}
	if cfg.MaxResponseBytes <= 0 {
		errs = append(errs, fmt.Errorf("--max-response-bytes must be positive, got %d", cfg.MaxResponseBytes))
	}
	if cfg.MaxWaiters <= 0 {
		errs = append(errs, fmt.Errorf("--max-waiters must be positive, got %d", cfg.MaxWaiters))
	}
	if cfg.MaxClockOffset < 0 {
		errs = append(errs, fmt.Errorf("--max-clock-offset must not be negative, got %s", cfg.MaxClockOffset))
	} else if cfg.MaxClockOffset == 0 || o.dev {
		cfg.MaxClockOffset = -1 // off
	}
	if cfg.StateCacheBytes != 0 && cfg.StateCacheBytes < 64<<20 {
		errs = append(errs, fmt.Errorf("--state-cache-bytes must be 0 (the default) or at least 64 MiB (67108864): the engine's memtables live in it, got %d", cfg.StateCacheBytes))
	}
	if cfg.MaxStateBytes < 0 {
		errs = append(errs, fmt.Errorf("--max-state-bytes must not be negative, got %d", cfg.MaxStateBytes))
	}
	if cfg.ClockSkewMargin < 0 {
		errs = append(errs, fmt.Errorf("--clock-skew-margin must not be negative, got %s", cfg.ClockSkewMargin))
	}
	switch {
	case o.dev && o.config != "":
		errs = append(errs, errors.New("--dev and --config exclude each other"))
	case o.dev:
		if o.id != "" && o.id != "dev" {
			errs = append(errs, errors.New("--id is only for --config (dev mode's node is \"dev\")"))
		}
		cfg.NodeID = "dev"
		cfg.HTTPAddr, cfg.GRPCAddr, cfg.RaftAddr = "", "", ""
		t := devTopology(cmp.Or(o.raftAddr, "127.0.0.1:7000"), cmp.Or(o.grpcAddr, "127.0.0.1:7070"), cmp.Or(o.httpAddr, "127.0.0.1:8080"))
		if err := t.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("dev topology: %w", err))
		}
		cfg.Topology = t
		cfg.DataDir = cmp.Or(o.dataDir, filepath.Join("idem-data", "dev"))
	case o.config == "":
		errs = append(errs, errors.New("either --dev or --config FILE is required (see --help)"))
	default:
		if o.id == "" {
			errs = append(errs, errors.New("--id is required with --config"))
		}
		t, err := topology.LoadFile(o.config)
		if err != nil {
			errs = append(errs, err)
		} else {
			cfg.Topology = t
			if _, ok := t.NodeByID(o.id); o.id != "" && !ok {
				errs = append(errs, fmt.Errorf("--id %q is not a node of %s", o.id, o.config))
			}
		}
		cfg.NodeID = o.id
		cfg.DataDir = cmp.Or(o.dataDir, filepath.Join("idem-data", o.id))
	}
	if cfg.Topology != nil {
		if self, ok := cfg.Topology.NodeByID(cfg.NodeID); ok {
			addrs := map[string]string{"--http-addr": cmp.Or(cfg.HTTPAddr, self.HTTPAddr),
				"--grpc-addr": cmp.Or(cfg.GRPCAddr, self.GRPCAddr), "--raft-addr": cmp.Or(cfg.RaftAddr, self.RaftAddr)}
			if err := o.sec.Check(addrs); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return cfg, cli.OneLine(errs...)
	}
	return cfg, nil
}

// devTopology is the embedded default: one region, one node, one shard,
// no replication. One shard, because on one node more shards buy nothing:
// that node leads every shard anyway, and each shard is a Raft group of
// its own whose rounds (log write, sync, apply) are paid separately, so a
// four-shard dev node did ~0.8x the cycles/s of a one-shard one at 1.25x
// the CPU per cycle (docs/performance.md). A data dir made with another
// shard count keeps the shape its metadata group stored; the shard count
// of a running dev node changes online like any cluster's (idemctl
// topology apply).
func devTopology(raftAddr, grpcAddr, httpAddr string) *topology.Topology {
	return &topology.Topology{
		Cluster:         "dev",
		ShardsPerRegion: 1,
		Replicas:        1,
		Survival:        topology.SurvivalZone,
		Regions: []topology.Region{{
			Name:  "local",
			Nodes: []topology.Node{{ID: "dev", RaftAddr: raftAddr, GRPCAddr: grpcAddr, HTTPAddr: httpAddr, Region: "local"}},
		}},
	}
}
