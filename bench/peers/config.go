package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The systems the benchmark knows, in the order rows are printed.
const (
	sysIdem3GRPC = "idem3-grpc" // three-node idem region, Go client over gRPC
	sysIdem3JSON = "idem3-json" // three-node idem region, JSON API over HTTP
	sysIdem1GRPC = "idem1-grpc" // one-node dev node, Go client over gRPC
	sysIdem1JSON = "idem1-json" // one-node dev node, JSON API over HTTP
	// The same with --raft-pack-commands=on (many commands per Raft entry);
	// the plain ones run with =off, since idemnode packs by default (auto).
	sysIdem3PackGRPC = "idem3pack-grpc"
	sysIdem3PackJSON = "idem3pack-json"
	sysIdem1PackGRPC = "idem1pack-grpc"
	// A three-node region with one shard (one Raft group) instead of four:
	// fewer, fuller groups (docs/lab/2026-12-01-raft-groups-and-levers.md).
	sysIdem3S1GRPC     = "idem3s1-grpc"
	sysIdem3S1PackGRPC = "idem3s1pack-grpc"
	sysIdem3S1PackJSON = "idem3s1pack-json"
	// The replicated peers: every acknowledged write is on more than one
	// machine's worth of processes, as idem's region writes are.
	sysRedisWait   = "redis3-wait"    // Redis primary + two replicas, AOF always on all three, each script followed by WAIT 2
	sysPostgresSyn = "postgres2-sync" // PostgreSQL primary + one synchronous standby (remote flush)
	sysEtcd        = "etcd"           // etcd, three members, transactions
	// A three-node Raft KV on dragonboat, which steps a node's groups
	// together: in idem's default shape (four groups) and with one group.
	sysDragonboat   = "dragonboat3"
	sysDragonboatS1 = "dragonboat3s1"
	// The single-copy peers, the dev node's counterparts.
	sysRedis    = "redis"    // Redis, AOF appendfsync always, Lua scripts
	sysPostgres = "postgres" // PostgreSQL, fsync + synchronous_commit
)

var allSystems = []string{sysIdem3GRPC, sysIdem3JSON, sysIdem3PackGRPC, sysIdem3PackJSON, sysIdem3S1GRPC, sysIdem3S1PackGRPC, sysIdem3S1PackJSON, sysIdem1GRPC, sysIdem1JSON, sysIdem1PackGRPC, sysRedisWait, sysPostgresSyn, sysEtcd, sysDragonboat, sysDragonboatS1, sysRedis, sysPostgres}

// The systems idem rows are compared with, in two ratio tables: the
// replicated peers first (a region's counterparts), then the single-copy
// ones (the dev node's).
var (
	replicatedPeers = []string{sysRedisWait, sysPostgresSyn, sysEtcd, sysDragonboat, sysDragonboatS1}
	singleCopyPeers = []string{sysRedis, sysPostgres}
)

func isIdem(sys string) bool { return strings.HasPrefix(sys, "idem") }

// regionShape is a three-node region with any shard count (idem3s3pack-grpc:
// three shards, so the leaders spread one per node).
var regionShape = regexp.MustCompile(`^idem3s([1-9][0-9]{0,2})(pack)?-(grpc|json)$`)

func isRegionShape(sys string) bool {
	m := regionShape.FindStringSubmatch(sys)
	if m == nil {
		return false
	}
	n, _ := strconv.Atoi(m[1])
	return n <= 256
}

// bSuffix names an idem system's twin run with --idemnode-b.
const bSuffix = "@b"

// traceSuffix starts the name of an idem system's twin run with tracing on
// at a sample ratio (--trace-ratios): SYSTEM@trace0.01.
const traceSuffix = "@trace"

// twinOf splits an idem system's name into the system it is a twin of and
// the twin's suffix ("" for the system itself).
func twinOf(sys string) (base, suffix string) {
	if i := strings.IndexByte(sys, '@'); i >= 0 {
		return sys[:i], sys[i:]
	}
	return sys, ""
}

// config is one benchmark run.
type config struct {
	Duration       time.Duration // measured time of one (system, clients, round) cell
	Warmup         time.Duration // unmeasured load before each cell
	Rounds         int           // interleaved rounds; the table shows medians and ranges
	Concurrency    []int         // client counts, one column of cells each
	Systems        []string      // which systems to start and load
	BodyBytes      int           // size of the stored response
	RaceKeys       int           // keys of the race phase (0: no race phase)
	RaceContenders int           // concurrent reserves per race key
	WorkDir        string        // where data dirs and logs go ("": a fresh temp dir)
	Keep           bool          // keep WorkDir afterwards
	Install        bool          // apt-get install missing servers
	IdemNode       string        // a prebuilt idemnode ("": build it from the repository)
	IdemNodeB      string        // a second idemnode: every idem system also runs as SYSTEM@b with it ("": none)
	ProfileDir     string        // write pprof profiles of the three idem nodes here ("": none)
	TimelineDir    string        // write every cell's latency over time here ("": none)
	ProfileClients int           // the client count of the profiled cell
	ProfileSystem  string        // the idem system profiled
	RequestTimeout time.Duration // deadline of one request
	JSONLeader     bool          // idem's JSON client sends a key's complete to its reserve's Idem-Leader
	TraceRatios    []float64     // every idem system also runs as SYSTEM@trace<R> with tracing on at sample ratio R
}

const usageHeader = `peers: idem against Redis, PostgreSQL, etcd and dragonboat on this machine.

Starts the replicated peers (Redis primary + two replicas with WAIT 2,
PostgreSQL primary + a synchronous standby, a three-member etcd, a
three-member Raft KV on dragonboat with four groups and with one), the
single-copy ones (Redis with AOF appendfsync always, PostgreSQL with fsync and
synchronous_commit on), a three-node idem region and a one-node idem dev
node, all on 127.0.0.1 in a temporary directory, then runs the same cycle
against each: reserve a fresh key, complete it with a --body-bytes response.
Systems and client counts are interleaved in --rounds rounds; the table shows
the median cycles/s over rounds, the p50 and p99 ranges, and idem's ratio to
each peer. A race phase then sends --race-contenders concurrent reserves of
one fresh key to each system, --race-keys times, and requires exactly one
winner per key (exit status 1 otherwise). Every process is stopped at the
end, on failure and on Ctrl-C.

Usage (from bench/peers):
  go run . [flags]

Flags:
`

func parseFlags(args []string, stderr io.Writer) (config, error) {
	cfg := config{}
	var conc, systems, traceRatios string
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.DurationVar(&cfg.Duration, "duration", 8*time.Second, "measured time of each (system, clients) cell per round")
	fs.DurationVar(&cfg.Warmup, "warmup", time.Second, "unmeasured load before each cell")
	fs.IntVar(&cfg.Rounds, "rounds", 3, "interleaved rounds")
	fs.StringVar(&conc, "concurrency", "1,64,256", "comma-separated client `COUNTS`")
	fs.StringVar(&systems, "systems", strings.Join(allSystems, ","), "comma-separated `SYSTEMS` to run: "+strings.Join(allSystems, ", ")+"; or a three-node region of any shard count, idem3s<shards>[pack]-<grpc|json>")
	fs.IntVar(&cfg.BodyBytes, "body-bytes", 512, "size of the response each complete stores")
	fs.IntVar(&cfg.RaceKeys, "race-keys", 20, "keys of the race phase per system (0: skip it)")
	fs.IntVar(&cfg.RaceContenders, "race-contenders", 16, "concurrent reserves of each race key")
	fs.StringVar(&cfg.WorkDir, "work-dir", "", "`DIR` for data and logs (default: a new temporary directory, removed afterwards)")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the work directory (data and logs) afterwards")
	fs.BoolVar(&cfg.Install, "install", true, "apt-get install redis-server, postgresql, etcd-server and etcd-client when missing")
	fs.StringVar(&cfg.IdemNode, "idemnode", "", "prebuilt idemnode `BINARY` (default: go build ./cmd/idemnode of this repository)")
	fs.StringVar(&cfg.IdemNodeB, "idemnode-b", "", "a second idemnode `BINARY` to compare: every idem system also runs as SYSTEM@b with it, in the same interleaved rounds, and a table gives b / a")
	fs.StringVar(&cfg.ProfileDir, "profile-dir", "", "write CPU and allocation profiles of the idem nodes under load to `DIR` (taken in round 1 of --profile-system at --profile-clients; allocations as two heap profiles, read with pprof -base: see DIR/cell.txt)")
	fs.StringVar(&cfg.TimelineDir, "timeline-dir", "", "write every cell's cycles and latency per 100 ms of its measured window to `DIR` (one file per cell), to tell stalls from steady latency")
	fs.StringVar(&cfg.ProfileSystem, "profile-system", sysIdem3GRPC, "the idem `SYSTEM` whose nodes --profile-dir profiles")
	fs.IntVar(&cfg.ProfileClients, "profile-clients", 64, "client count of the profiled cell")
	fs.DurationVar(&cfg.RequestTimeout, "request-timeout", 10*time.Second, "deadline of one request")
	fs.BoolVar(&cfg.JSONLeader, "json-follow-leader", true, "idem's JSON client sends a key's complete to the node named by its reserve's Idem-Leader header (the leader's JSON address); false: every call round-robin over the nodes")
	fs.StringVar(&traceRatios, "trace-ratios", "", "comma-separated sample `RATIOS` (0..1): every idem system also runs as SYSTEM@trace<R>, its nodes exporting OTLP traces (--otlp-endpoint, --trace-sample-ratio R) to a sink in this process, in the same interleaved rounds, and the b / a table gives the cost")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, usageHeader)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
		}
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q; peers takes flags only", fs.Arg(0))
	}
	var errs []error
	for _, f := range splitList(conc) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("--concurrency: %q is not a positive integer", f))
			continue
		}
		if !slices.Contains(cfg.Concurrency, n) {
			cfg.Concurrency = append(cfg.Concurrency, n)
		}
	}
	for _, s := range splitList(systems) {
		if !slices.Contains(allSystems, s) && !isRegionShape(s) {
			errs = append(errs, fmt.Errorf("--systems: unknown system %q (known: %s; or any idem3s<shards>[pack]-<grpc|json>, 1..256 shards)", s, strings.Join(allSystems, ", ")))
			continue
		}
		if !slices.Contains(cfg.Systems, s) {
			cfg.Systems = append(cfg.Systems, s)
		}
	}
	// Rows follow the canonical order whatever order the flag gave.
	// Other region shapes go after the listed idem systems, by shard count.
	order := func(sys string) int {
		if i := slices.Index(allSystems, sys); i >= 0 {
			return 1000 * i
		}
		_, shards := idemShape(strings.SplitN(sys, "-", 2)[0])
		return 1000*slices.Index(allSystems, replicatedPeers[0]) - 500 + shards
	}
	slices.SortStableFunc(cfg.Systems, func(a, b string) int { return order(a) - order(b) })
	for _, f := range splitList(traceRatios) {
		r, err := strconv.ParseFloat(f, 64)
		if err != nil || r < 0 || r > 1 {
			errs = append(errs, fmt.Errorf("--trace-ratios: %q is not a ratio in 0..1", f))
			continue
		}
		cfg.TraceRatios = append(cfg.TraceRatios, r)
	}
	var with []string
	for _, sys := range cfg.Systems {
		with = append(with, sys)
		if !isIdem(sys) {
			continue
		}
		if cfg.IdemNodeB != "" {
			with = append(with, sys+bSuffix)
		}
		for _, r := range cfg.TraceRatios {
			with = append(with, sys+traceSuffix+strconv.FormatFloat(r, 'g', -1, 64))
		}
	}
	cfg.Systems = with
	errs = append(errs, cfg.validate())
	return cfg, errors.Join(errs...)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func (c config) validate() error {
	var errs []error
	if c.Duration <= 0 {
		errs = append(errs, fmt.Errorf("--duration %v: want a positive duration", c.Duration))
	}
	if c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("--warmup %v is negative", c.Warmup))
	}
	if c.Rounds < 1 {
		errs = append(errs, fmt.Errorf("--rounds %d: want at least 1", c.Rounds))
	}
	if len(c.Concurrency) == 0 {
		errs = append(errs, errors.New("--concurrency is empty"))
	}
	if len(c.Systems) == 0 {
		errs = append(errs, errors.New("--systems is empty"))
	}
	if c.BodyBytes < 0 {
		errs = append(errs, fmt.Errorf("--body-bytes %d is negative", c.BodyBytes))
	}
	if c.RaceKeys < 0 {
		errs = append(errs, fmt.Errorf("--race-keys %d is negative", c.RaceKeys))
	}
	if c.RaceKeys > 0 && c.RaceContenders < 2 {
		errs = append(errs, fmt.Errorf("--race-contenders %d: want at least 2", c.RaceContenders))
	}
	if c.ProfileDir != "" && !strings.HasPrefix(c.ProfileSystem, "idem") {
		errs = append(errs, fmt.Errorf("--profile-system %s: only idem systems can be profiled", c.ProfileSystem))
	} else if c.ProfileDir != "" && !slices.Contains(c.Systems, c.ProfileSystem) {
		errs = append(errs, fmt.Errorf("--profile-dir profiles %s, which --systems leaves out", c.ProfileSystem))
	}
	if c.ProfileDir != "" && !slices.Contains(c.Concurrency, c.ProfileClients) {
		errs = append(errs, fmt.Errorf("--profile-clients %d is not one of --concurrency", c.ProfileClients))
	}
	if c.IdemNodeB != "" && !slices.ContainsFunc(c.Systems, isIdem) {
		errs = append(errs, errors.New("--idemnode-b compares idem systems, and --systems has none"))
	}
	if len(c.TraceRatios) > 0 && !slices.ContainsFunc(c.Systems, isIdem) {
		errs = append(errs, errors.New("--trace-ratios measures idem systems, and --systems has none"))
	}
	if c.RequestTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--request-timeout %v: want a positive duration", c.RequestTimeout))
	}
	return errors.Join(errs...)
}

// packArgs are the idemnode flags of an idem variant: the pack variants
// always pack, the plain ones never do (the default, auto, would pack too
// once the nodes have seen each other, and the comparison would be gone).
func packArgs(variant string) []string {
	if strings.HasSuffix(variant, "pack") {
		return []string{"--raft-pack-commands=on"}
	}
	return []string{"--raft-pack-commands=off"}
}
