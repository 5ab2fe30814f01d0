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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/idem-dev/idem/internal/cli"
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
	dev              bool
	config           string
	id               string
	dataDir          string
	httpAddr         string
	grpcAddr         string
	raftAddr         string
	maxResponseBytes int64
	maxStateBytes    int64
	stateCacheBytes  int64
	clockSkewMargin  time.Duration
	logLevel         string
	logFormat        string
	snapshotEvery    uint64
	snapshotInterval time.Duration
	trailingLogs     uint64
	maxClockOffset   time.Duration
	maxWaiters       int
	diskReserve      uint64
	gcHeadroom       uint64
	testClockOffset  time.Duration
	testFailCommits  uint64
	testCrashRestore int
	// testingFlags are the --testing-* flags given; faultInjection is
	// whether the environment allows them (IDEM_ENABLE_FAULT_INJECTION=1).
	testingFlags   []string
	faultInjection bool
	pprofAddr      string
	packCommands   node.PackMode
	showVersion    bool
	sec            transport.Flags
	maxRaftConns   int
	logStore       string
}

const usageHeader = `idemnode: a storage node of idem, the multi-region idempotency-key store.

Usage:
  idemnode --dev                                   one node, one region, bootstraps itself
  idemnode --config FILE --id NODE_ID [flags]      a node of the cluster in FILE

It serves the JSON API, /healthz, /readyz and /metrics on --http-addr, the gRPC
API on --grpc-addr, and Raft traffic for all its shards on --raft-addr. Any
node accepts any key and forwards it to the leader of the key's shard. On
SIGTERM it hands over leadership, drains and exits 0.

` + cli.SysmonUsage + `
Flags:
`

func parseFlags(args []string, stdout io.Writer) (*options, error) {
	var o options
	fs := flag.NewFlagSet("idemnode", flag.ContinueOnError)
	fs.BoolVar(&o.dev, "dev", false, "run a one-node, one-region cluster that bootstraps itself; needs no config file")
	fs.StringVar(&o.config, "config", "", "cluster topology `FILE` (YAML or JSON); required unless --dev")
	fs.StringVar(&o.id, "id", "", "this node's `ID` in the topology; required with --config")
	fs.StringVar(&o.dataDir, "data-dir", "", "`DIR` for Raft logs, snapshots and state, created if missing (default ./idem-data/<id>, dev: ./idem-data/dev)")
	fs.StringVar(&o.httpAddr, "http-addr", "", "`HOST:PORT` for the JSON API, /metrics, /healthz, /readyz (dev default 127.0.0.1:8080; else the topology's; with --config only where this process listens)")
	fs.StringVar(&o.grpcAddr, "grpc-addr", "", "`HOST:PORT` for the gRPC API (dev default 127.0.0.1:7070; else the topology's)")
	fs.StringVar(&o.raftAddr, "raft-addr", "", "`HOST:PORT` for Raft traffic of all shards of this node (dev default 127.0.0.1:7000; else the topology's)")
	fs.Int64Var(&o.maxResponseBytes, "max-response-bytes", 1<<20, "largest stored response body in decoded `BYTES`")
	fs.Int64Var(&o.stateCacheBytes, "state-cache-bytes", 0, "the state engine's block cache in `BYTES`, memtables included: most of the node's resident memory, which it bounds whatever the retained state (0: the default, 256 MiB; at least 64 MiB)")
	fs.Int64Var(&o.maxStateBytes, "max-state-bytes", 0, "stored state in `BYTES` at which requests that add data (a reserve of a new key, a complete) get 429 RESOURCE_EXHAUSTED until sweeps free space (0: 80% of the data dir's free space at start)")
	fs.DurationVar(&o.clockSkewMargin, "clock-skew-margin", time.Second, "how long past a lease's end before another caller may reclaim the key")
	fs.IntVar(&o.maxWaiters, "max-waiters", node.DefaultMaxWaiters, "most reserves with a wait (wait_ms) this node serves at once, waiting or forwarded; past it a reserve is answered at once, as with wait_ms 0 (idem_node_wait_refusals_total)")
	fs.DurationVar(&o.maxClockOffset, "max-clock-offset", node.DefaultMaxClockOffset, "largest offset `D` of this node's clock from its peers' (measured on node-to-node gRPC): past it the node leads no shard and is not ready; 0 turns that check off (an unsafe setting, warned of; commands are still stamped with a majority's clock, within 500ms); not used in --dev")
	fs.Uint64Var(&o.diskReserve, "disk-reserve-bytes", 0, "free `BYTES` kept on the data dir's filesystem: below it, writes that add data (a reserve of a new key, a complete) get 429 and resume by themselves when space returns (0: 5% of the filesystem, at most 1 GiB)")
	fs.Uint64Var(&o.gcHeadroom, "gc-headroom-bytes", defaultGCHeadroom, "let the Go heap grow by at least `BYTES` past what the last garbage collection found live before the next (the node collects at GOGC=50, or later while 50% of the live heap is less than this); 0: GOGC=50 alone. GOGC in the environment replaces both")
	fs.StringVar(&o.logLevel, "log-level", "info", "log `LEVEL`: debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "log `FORMAT`: text or json")
	fs.Uint64Var(&o.snapshotEvery, "snapshot-threshold", 0, "take a Raft snapshot of a shard after this many new log `ENTRIES` (0: the default, 8192)")
	fs.DurationVar(&o.snapshotInterval, "snapshot-interval", 0, "how often each shard checks whether to snapshot (0: the default, 10s; a snapshot is a reference to the state on disk and costs one sync)")
	fs.Uint64Var(&o.trailingLogs, "trailing-logs", 0, "log `ENTRIES` kept behind a snapshot for slow followers (0: the default, 10240)")
	fs.DurationVar(&o.testClockOffset, "testing-clock-offset", 0, "TESTING ONLY (needs "+faultInjectionEnv+"=1): shift this node's clock by `D` (fault injection for clock-skew scenarios)")
	fs.Uint64Var(&o.testFailCommits, "testing-fail-log-commits-after", 0, "TESTING ONLY (needs "+faultInjectionEnv+"=1): make every Raft log commit after the first `N` fail as a failed fsync would")
	fs.StringVar(&o.logStore, "raft-log-store", raftstore.LogStorePebble, "where the shards keep their Raft logs: `STORE` pebble (one pebble instance per node, DATA_DIR/raft/raftlog) or bolt (a bbolt file per shard); a data dir keeps the store it was created with")
	fs.IntVar(&o.testCrashRestore, "testing-crash-during-restore", 0, "TESTING ONLY (needs "+faultInjectionEnv+"=1): exit at once with status 86, no cleanup (a crash), when a snapshot restore has written `N` records into the new state generation, before it switches to it")
	fs.Var(&o.packCommands, "raft-pack-commands", "=auto, =on or =off (with the =): pack commands proposed while a shard's leader stores its previous Raft entry into one entry (faster under load). auto packs in a shard once every voter of it advertises that it reads packed entries; on always packs (every node must run a release that has this flag; a bare --raft-pack-commands means on, =true and =false mean on and off); off never packs and holds back every shard this node votes in that does not pack yet")
	fs.StringVar(&o.pprofAddr, "pprof-addr", "", "serve Go's profiles (/debug/pprof/) on this loopback `HOST:PORT`, e.g. 127.0.0.1:6060 (default: off)")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	o.sec.AddFlags(fs)
	fs.IntVar(&o.maxRaftConns, "max-raft-conns", raftstore.DefaultMaxInboundConns, "cap on the inbound Raft connections open at once; past it new ones are closed and counted")
	if err := cli.Parse(fs, args, stdout, usageHeader); err != nil {
		return nil, err
	}
	fs.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "testing-") {
			o.testingFlags = append(o.testingFlags, "--"+f.Name+"="+f.Value.String())
		}
	})
	return &o, nil
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
	cfg, err := nodeConfig(o)
	if err != nil {
		return err
	}
	cfg.Logger = logger
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
		cfg.TestingRestoreFault = &statedb.RestoreFault{AfterRecords: o.testCrashRestore, Crash: func(shard string, n int) {
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
	cfg := node.Config{
		HTTPAddr:         o.httpAddr,
		GRPCAddr:         o.grpcAddr,
		RaftAddr:         o.raftAddr,
		DataDir:          o.dataDir,
		MaxResponseBytes: o.maxResponseBytes,
		MaxStateBytes:    o.maxStateBytes,
		StateCacheBytes:  o.stateCacheBytes,
		ClockSkewMargin:  o.clockSkewMargin,
		ClockOffset:      o.testClockOffset,
		MaxClockOffset:   o.maxClockOffset,
		MaxWaiters:       o.maxWaiters,
		DiskReserveBytes: o.diskReserve,
		Version:          version,
		Raft:             raftstore.DefaultConfig(),
		PackCommands:     o.packCommands,
	}
	cfg.Raft.TestingFailCommitsAfter = o.testFailCommits
	if !slices.Contains(raftstore.LogStores, o.logStore) {
		errs = append(errs, fmt.Errorf("--raft-log-store %q: want one of %s", o.logStore, strings.Join(raftstore.LogStores, ", ")))
	}
	cfg.Raft.LogStore = o.logStore
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
	if o.sec.Insecure {
		cfg.UnsafeSettings = append(cfg.UnsafeSettings, "insecure")
	}
	if o.maxClockOffset == 0 && !o.dev {
		cfg.UnsafeSettings = append(cfg.UnsafeSettings, "clock_check_off")
	}
	if len(cfg.FaultInjection) > 0 {
		cfg.UnsafeSettings = append(cfg.UnsafeSettings, "fault_injection")
	}
	if o.snapshotEvery > 0 {
		cfg.Raft.SnapshotThreshold = o.snapshotEvery
	}
	if o.trailingLogs > 0 {
		cfg.Raft.TrailingLogs = o.trailingLogs
	}
	if o.snapshotInterval > 0 {
		cfg.Raft.SnapshotInterval = o.snapshotInterval
	}
	if o.maxRaftConns <= 0 {
		errs = append(errs, fmt.Errorf("--max-raft-conns must be positive, got %d", o.maxRaftConns))
	}
	cfg.Raft.MaxInboundConns = o.maxRaftConns
	if o.pprofAddr != "" {
		if err := transport.CheckLoopback("--pprof-addr", o.pprofAddr); err != nil {
			errs = append(errs, err)
		}
	}
	if o.maxResponseBytes <= 0 {
		errs = append(errs, fmt.Errorf("--max-response-bytes must be positive, got %d", o.maxResponseBytes))
	}
	if o.maxWaiters <= 0 {
		errs = append(errs, fmt.Errorf("--max-waiters must be positive, got %d", o.maxWaiters))
	}
	if o.maxClockOffset < 0 {
		errs = append(errs, fmt.Errorf("--max-clock-offset must not be negative, got %s", o.maxClockOffset))
	} else if o.maxClockOffset == 0 || o.dev {
		cfg.MaxClockOffset = -1 // off
	}
	if o.stateCacheBytes != 0 && o.stateCacheBytes < 64<<20 {
		errs = append(errs, fmt.Errorf("--state-cache-bytes must be 0 (the default) or at least 64 MiB (67108864): the engine's memtables live in it, got %d", o.stateCacheBytes))
	}
	if o.maxStateBytes < 0 {
		errs = append(errs, fmt.Errorf("--max-state-bytes must not be negative, got %d", o.maxStateBytes))
	}
	if o.clockSkewMargin < 0 {
		errs = append(errs, fmt.Errorf("--clock-skew-margin must not be negative, got %s", o.clockSkewMargin))
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

// devTopology is the embedded default: one region, one node, four shards,
// no replication.
func devTopology(raftAddr, grpcAddr, httpAddr string) *topology.Topology {
	return &topology.Topology{
		Cluster:         "dev",
		ShardsPerRegion: 4,
		Replicas:        1,
		Survival:        topology.SurvivalZone,
		Regions: []topology.Region{{
			Name:  "local",
			Nodes: []topology.Node{{ID: "dev", RaftAddr: raftAddr, GRPCAddr: grpcAddr, HTTPAddr: httpAddr, Region: "local"}},
		}},
	}
}
