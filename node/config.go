package node

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/security/transport"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/statedb"
	"github.com/idem-dev/idem/topology"
)

// Defaults of the Config fields whose zero value means "the default".
const (
	DefaultSweepInterval = 10 * time.Second
	// DefaultMaxWaiters is the contract's --max-waiters default.
	DefaultMaxWaiters = 10000
	// DefaultMaxInflightBytes is --max-inflight-bytes' default: sixteen
	// of the largest batch bodies.
	DefaultMaxInflightBytes      int64 = 256 << 20
	DefaultMaxSweep                    = 10000
	DefaultAbandonAfter                = 7 * 24 * time.Hour
	DefaultLeaderBalanceInterval       = 5 * time.Second
)

// Config configures a storage node.
type Config struct {
	// Topology is the cluster topology; required.
	Topology *topology.Topology
	// NodeID is this node's id in Topology; required.
	NodeID string
	// DataDir holds Raft logs, snapshots and the identity file; required.
	DataDir string
	// HTTPAddr, GRPCAddr and RaftAddr are where this process listens; empty
	// means the topology's address. Other processes always dial the
	// topology's addresses.
	HTTPAddr, GRPCAddr, RaftAddr string
	// MaxResponseBytes is the largest stored response body (decoded bytes);
	// 0 means 1 MiB.
	MaxResponseBytes int64
	// MaxStateBytes is the node's stored state (statedb.DB.StateBytes) at
	// which requests that would add data get 429 RESOURCE_EXHAUSTED; 0
	// means 80% of the free space of DataDir's filesystem at start.
	MaxStateBytes int64
	// StateCacheBytes is the state engine's block cache, which holds its
	// memtables too and is most of a node's resident memory; 0 means
	// statedb.DefaultCacheBytes (256 MiB).
	StateCacheBytes int64
	// ClockSkewMargin is how long past a lease's end before another caller
	// may reclaim the key. Zero means no margin (not recommended).
	ClockSkewMargin time.Duration
	// SweepInterval is how often a shard's leader proposes a sweep of
	// expired records; 0 means 10s.
	SweepInterval time.Duration
	// MaxSweep bounds the records one sweep drops; 0 means 10000.
	MaxSweep int
	// AbandonAfter: an in-progress record whose lease ended this long ago
	// and that nobody reclaimed is dropped by the sweep; 0 means 7 days.
	AbandonAfter time.Duration
	// LeaderBalanceInterval is how often the node checks the shards it leads
	// and hands each one whose preferred voter (Voters[0], in the home
	// region) is another node back to it; 0 means 5s, negative disables.
	LeaderBalanceInterval time.Duration
	// ForwardAttemptTimeout bounds one attempt to forward a request to
	// another node; 0 means 2s.
	ForwardAttemptTimeout time.Duration
	// Raft tunes the Raft groups; NodeID, addresses and DataDir are filled
	// in from the fields above, and Packer and PackingGated from
	// PackCommands. Zero value: raftstore.DefaultConfig().
	Raft raftstore.Config
	// PackCommands is --raft-pack-commands: whether a shard this node leads
	// packs commands queued behind in-flight Raft entries into one entry.
	// The zero value, PackAuto, packs once the cluster version reached
	// VersionPackedEntries (version.go); PackOff also holds the cluster
	// version below it.
	PackCommands PackMode
	// MaxClockOffset bounds how far this node's clock may be from its
	// peers' (measured on the Admin.Clock RPC): past it the node leads no
	// shard, hands over what it leads and is not ready; and the voters'
	// clocks a command is stamped with must agree within it (fsm.QuorumTime).
	// 0 means 500ms; negative turns the check off (a one-node cluster has
	// no peers to compare with anyway).
	MaxClockOffset time.Duration
	// DiskReserveBytes is the free space of the data dir's filesystem below
	// which writes that add data are refused (429 RESOURCE_EXHAUSTED), so a
	// filling disk never reaches the Raft log's fail-stop: 0 means 5% of
	// the filesystem, at most 1 GiB.
	DiskReserveBytes uint64
	// DiskFree reports the free and total bytes of dir's filesystem; nil
	// means statfs. Tests inject a fake.
	DiskFree func(dir string) (free, total uint64, err error)
	// FaultInjection names the fault-injection settings in force (the
	// --testing-* flags, which cmd/idemnode allows only with
	// IDEM_ENABLE_FAULT_INJECTION=1); the node logs a warning naming them at
	// start and every minute. Empty in production.
	FaultInjection []string
	// MaxWaiters bounds the reserves with a wait (wait_ms) this node serves
	// at once, waiting here or forwarded to the key's leader; past it a
	// reserve is answered at once, as with wait_ms 0. 0 means
	// DefaultMaxWaiters.
	MaxWaiters int
	// MaxInflightBytes bounds the request bytes (JSON bodies, gRPC
	// messages) this node holds at once in requests not yet answered;
	// past it, while others are in flight, a request gets 503 UNAVAILABLE
	// with Retry-After (server.Config.MaxInflightBytes). 0 means
	// DefaultMaxInflightBytes.
	MaxInflightBytes int64
	// UnsafeSettings are the settings in force that turn a safety check
	// off, as the operator typed them ("--insecure", "--max-clock-offset
	// 0", "--testing-...=..."); the node warns of them at start and every
	// ten minutes, lists them in /readyz's body and sets
	// idem_node_unsafe_settings{setting} (insecure, clock_check_off,
	// fault_injection: unsafeSettingLabel) to 1 for each, 0 for the others.
	// Empty in production.
	UnsafeSettings []string
	// Testing holds the fault-injection knobs of tests; zero in
	// production.
	Testing Testing
	// Logger; nil discards.
	Logger *slog.Logger
	// Registry receives every metric of the node and is what /metrics
	// serves; nil creates a private one.
	Registry *prometheus.Registry
	// Version is reported by status and the start-up line.
	Version string
	// Security is the trust boundary (certificates, auth file, listener
	// limits) of every listener and dial; nil means transport.Insecure():
	// plaintext, every caller root.
	Security *transport.Kit
	// TracerProvider, when set, traces every request through this node:
	// the API's spans, each forward, and the Raft proposal, commit and
	// apply of the commands it leads (Raft.TracerProvider takes it unless
	// set), plus a reserve's wait for a lease. Nil: tracing off.
	TracerProvider trace.TracerProvider
	// TraceKeys puts keys in clear on spans (--trace-keys).
	TraceKeys bool
}

// Testing is fault injection for tests only (cmd/idemnode's --testing-*
// flags, which it allows only with IDEM_ENABLE_FAULT_INJECTION=1). The zero
// value injects nothing.
type Testing struct {
	// ClockOffset is added to this node's wall clock when it stamps
	// commands (regionsim's clock skew).
	ClockOffset time.Duration
	// FailLogCommitsAfter, when > 0, makes every Raft log commit after the
	// first FailLogCommitsAfter fail as a failed fsync would
	// (raftstore.Config.TestingFailCommitsAfter).
	FailLogCommitsAfter uint64
	// RestoreFault injects a crash into snapshot restores (see
	// statedb.RestoreFault).
	RestoreFault *statedb.RestoreFault
	// FailDrops, when > 0, fails the first FailDrops commands this node
	// sends, as the mover of a topology change, to drop a source's copy of
	// moved partitions, as a source leader lost right after a move would.
	FailDrops int
}

// DefaultClockSkewMargin is DefaultConfig's ClockSkewMargin (a zero
// ClockSkewMargin means no margin).
const DefaultClockSkewMargin = time.Second

// DefaultConfig returns a Config with every default spelled out; set
// Topology, NodeID and DataDir before use. A zero field means the same
// default, so a Config built by hand works as well.
func DefaultConfig() Config {
	return Config{
		MaxResponseBytes:      server.DefaultMaxResponseBytes,
		StateCacheBytes:       statedb.DefaultCacheBytes,
		ClockSkewMargin:       DefaultClockSkewMargin,
		MaxClockOffset:        DefaultMaxClockOffset,
		MaxWaiters:            DefaultMaxWaiters,
		MaxInflightBytes:      DefaultMaxInflightBytes,
		SweepInterval:         DefaultSweepInterval,
		MaxSweep:              DefaultMaxSweep,
		AbandonAfter:          DefaultAbandonAfter,
		LeaderBalanceInterval: DefaultLeaderBalanceInterval,
		Raft:                  raftstore.DefaultConfig(),
	}
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.Topology == nil {
		bad("a topology is required")
	} else if _, ok := c.Topology.NodeByID(c.NodeID); !ok {
		bad("node id %q is not in the topology of cluster %q", c.NodeID, c.Topology.Cluster)
	}
	if c.DataDir == "" {
		bad("a data dir is required")
	}
	if c.StateCacheBytes < 0 {
		bad("state cache bytes %d is negative", c.StateCacheBytes)
	}
	if c.MaxWaiters < 0 {
		bad("max waiters %d is negative", c.MaxWaiters)
	}
	if c.MaxInflightBytes < 0 {
		bad("max in-flight bytes %d is negative", c.MaxInflightBytes)
	}
	if c.MaxStateBytes < 0 {
		bad("max state bytes %d is negative", c.MaxStateBytes)
	}
	if c.MaxResponseBytes < 0 {
		bad("max response bytes %d is negative", c.MaxResponseBytes)
	}
	if c.ClockSkewMargin < 0 {
		bad("clock skew margin %s is negative", c.ClockSkewMargin)
	}
	if c.PackCommands < PackAuto || c.PackCommands > PackOff {
		bad("unknown packing mode %d", int(c.PackCommands))
	}
	if c.SweepInterval < 0 || c.MaxSweep < 0 || c.AbandonAfter < 0 || c.ForwardAttemptTimeout < 0 {
		bad("sweep interval, max sweep, abandon-after and forward attempt timeout must not be negative")
	}
	return errors.Join(errs...)
}

// withDefaults returns c with every zero field that has a default filled in.
func (c Config) withDefaults() Config {
	c.SweepInterval = cmp.Or(c.SweepInterval, DefaultSweepInterval)
	c.LeaderBalanceInterval = cmp.Or(c.LeaderBalanceInterval, DefaultLeaderBalanceInterval)
	c.MaxSweep = cmp.Or(c.MaxSweep, DefaultMaxSweep)
	c.MaxClockOffset = cmp.Or(c.MaxClockOffset, DefaultMaxClockOffset)
	c.MaxWaiters = cmp.Or(c.MaxWaiters, DefaultMaxWaiters)
	c.MaxInflightBytes = cmp.Or(c.MaxInflightBytes, DefaultMaxInflightBytes)
	c.AbandonAfter = cmp.Or(c.AbandonAfter, DefaultAbandonAfter)
	if reflect.ValueOf(c.Raft).IsZero() { // not ==: the config holds a callback
		c.Raft = raftstore.DefaultConfig()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.Security == nil {
		c.Security = transport.Insecure()
	}
	return c
}
