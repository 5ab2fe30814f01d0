package raftstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Config configures a Host: one node, one Raft port, many groups.
type Config struct {
	// NodeID is this node's Raft server id, the same in every group it hosts
	// and in every peer's GroupConfig.Voters. Required.
	NodeID string

	// RaftListenAddr is the host:port the single Raft listener binds; every
	// group's traffic arrives here. Port 0 picks a free port (tests). Required.
	RaftListenAddr string

	// RaftAdvertiseAddr is the host:port peers dial to reach this node. Empty
	// means the address actually bound (RaftListenAddr with its port
	// resolved), which must then not be a wildcard such as 0.0.0.0.
	RaftAdvertiseAddr string

	// DataDir holds one directory per group, DataDir/shards/<id>/, with the
	// group's snapshots (and its raft.db with LogStoreBolt), and the host's
	// pebble log shared by its groups (raftlog/, see LogStore).
	// Required.
	DataDir string

	// Logger receives raftstore's and raft's logs (raft's own INFO chatter at
	// debug level). Nil discards logs.
	Logger *slog.Logger

	// Registry receives the per-shard Prometheus metrics (idem_raft_*). Nil
	// means metrics are not exported (Stats still works).
	Registry *prometheus.Registry

	// OnStorageFailure, if set, is called once (from the log's writer
	// goroutine; it must not block) when a write or fsync of the node's
	// Raft log failed: the log has stopped taking writes (ErrStorageFailed)
	// and the host is no longer ready. A process typically logs it and
	// exits, so a supervisor restarts it on what is durable.
	OnStorageFailure func(error)

	// ExtraSeats, if set, admits node to group's Raft port (secure mode)
	// when the group's own configuration does not list it: a replica that
	// rejoins from an old configuration must still hear a leader that
	// joined the group after it left. The node answers from the cluster's
	// replicated topology (the voters of a running change included).
	ExtraSeats func(group, node string) bool

	// HeartbeatTimeout is how long a follower goes without hearing from the
	// leader before it campaigns (randomised in [1x, 2x)). The leader
	// heartbeats every HeartbeatTimeout/10.
	HeartbeatTimeout time.Duration

	// ElectionTimeout is how long a candidate waits for votes before it starts
	// a new election (randomised in [1x, 2x)). Must be >= HeartbeatTimeout.
	ElectionTimeout time.Duration

	// LeaderLeaseTimeout is how long a leader keeps leading without hearing
	// from a quorum before it steps down. Must be <= HeartbeatTimeout.
	LeaderLeaseTimeout time.Duration

	// CommitTimeout bounds how long a follower may wait for the leader's
	// commit index to advance when there is no new entry to carry it.
	CommitTimeout time.Duration

	// MaxAppendEntries caps the entries per AppendEntries RPC, per group
	// commit on the leader (one fsync) and per ApplyBatch call. 1..1024.
	MaxAppendEntries int

	// SnapshotThreshold is how many new log entries trigger an automatic
	// snapshot (checked every SnapshotInterval). Must be >= 1.
	SnapshotThreshold uint64

	// SnapshotInterval is how often raft checks whether to snapshot
	// (randomised in [1x, 2x)). The default, 10 s, suits state machines
	// whose snapshots are references (LiveSnapshotter: one sync each): the
	// log between two snapshots stays small. A state machine that copies
	// its state into every snapshot wants a longer one.
	SnapshotInterval time.Duration

	// TrailingLogs is how many log entries are kept behind a snapshot so a
	// slightly lagging follower catches up from the log, not a snapshot.
	TrailingLogs uint64

	// TrailingLogsBytes bounds the log kept behind a snapshot by bytes as
	// well: a group keeps min(TrailingLogs, TrailingLogsBytes / mean entry
	// size) entries (at least 1), re-sized as it writes. 0 means 256 MiB.
	TrailingLogsBytes int64

	// LogCacheBytes bounds the recent log entries each group keeps in
	// memory (at most 1024 entries): 0 means 64 MiB.
	LogCacheBytes int64

	// ApplyTimeout bounds Group.Apply and Group.ReadBarrier when the caller's
	// context has no earlier deadline.
	ApplyTimeout time.Duration

	// LogStore is where the host's groups keep their Raft logs and stable
	// stores (DESIGN.md "Storage"):
	//
	//   - LogStorePebble ("pebble", the default; "" means it too): one
	//     pebble instance per host (DataDir/raftlog), every group under its
	//     own key prefix, one synced batch per write; pebble merges the
	//     syncs of concurrent writes into one WAL fdatasync.
	//   - LogStoreBolt ("bolt"): a raft-boltdb/v2 file per group
	//     (DataDir/shards/<id>/raft.db).
	//
	// A data dir keeps the store it was created with: NewHost refuses a
	// data dir holding the other store (ErrLogStoreMismatch), both
	// (ErrStoreConflict), or a shared bolt log of development builds,
	// DataDir/log.db (ErrUnsupportedLog).
	LogStore string

	// TestingFailCommitsAfter, when > 0, makes every commit of the host's
	// pebble log after the first TestingFailCommitsAfter fail as a failed fsync
	// would (the log then fails stop). Fault injection for tests only.
	TestingFailCommitsAfter uint64

	// NoFsync skips fsync on log writes. UNSAFE: a power loss can lose
	// acknowledged writes. Tests and benchmarks only; false (fsync) by default.
	NoFsync bool

	// TLS secures the Raft port (mutual TLS, node certificates only). Nil
	// means plaintext: anyone who reaches the port can speak Raft, so nil is
	// for loopback and tests only.
	TLS *TLSConfig

	// MaxInboundConns caps the inbound Raft connections open at once
	// (handshaking, sending their header, or routed to a group); past it an
	// accepted connection is closed at once and counted. Zero means
	// DefaultMaxInboundConns.
	MaxInboundConns int

	// Packer, when set, turns on the proposal buffer (propbuf.go,
	// DESIGN.md "Many commands per entry"): commands proposed while a group's
	// leader is still storing its previous entry are packed into one Raft
	// entry by Packer,
	// and the StateMachine's Apply of such an entry must return a []any
	// with one result per command, in order. A lone command is proposed as
	// itself, unpacked. The StateMachine must tell packed entries from
	// single commands by their bytes. Every replica must understand packed
	// entries before any leader packs: either every node of the cluster
	// runs a version that does, or PackingGated is set and the caller
	// enables packing per group once it knows. nil: one entry per command.
	Packer CommandPacker
	// PackingGated (with Packer): a group starts without packing (every
	// command its own entry, exactly as without Packer) and packs from
	// Group.EnablePacking on, which the caller calls once every voter of
	// the group is known to read packed entries (package node's feature
	// gate). The switch is one-way. false: groups pack from the start.
	PackingGated bool
	// TracerProvider, when set, traces the proposals whose context carries
	// a recorded span: propose, commit and apply spans as its children, and
	// a packed entry's span linking every proposer (trace.go). Nil: off.
	TracerProvider trace.TracerProvider
}

// The log stores of Config.LogStore.
const (
	LogStorePebble = "pebble"
	LogStoreBolt   = "bolt"
)

// LogStores lists the valid Config.LogStore values, the default first.
var LogStores = []string{LogStorePebble, LogStoreBolt}

// logStore is c.LogStore with "" resolved to the default.
func (c Config) logStore() string {
	if c.LogStore == "" {
		return LogStorePebble
	}
	return c.LogStore
}

// CommandPacker packs commands into the bytes of one Raft entry, in a form
// the StateMachine recognises (an interface rather than a func, so Config
// stays comparable).
type CommandPacker interface {
	PackCommands(cmds [][]byte) []byte
}

// DefaultMaxInboundConns is the default Config.MaxInboundConns: far above
// what peers open (each group keeps up to transportMaxPool idle connections
// plus a pipeline per peer) for the shard counts idem runs.
const DefaultMaxInboundConns = 4096

// TLSConfig is the Raft port's mutual TLS.
type TLSConfig struct {
	// Server handshakes every accepted connection before any byte of it is
	// read as a header. It must require and verify client certificates and
	// accept only node certificates of the cluster CA
	// (pki.Reloader.NodeServerTLS does); a handshake that ends without a
	// verified peer certificate is refused whatever the config says.
	Server *tls.Config
	// Client returns the config to dial a peer at host (the host part of
	// its Raft address): present this node's certificate, accept only a
	// node certificate valid for host (pki.Reloader.NodeClientTLS).
	Client func(host string) *tls.Config
}

func (c Config) maxInboundConns() int {
	if c.MaxInboundConns == 0 {
		return DefaultMaxInboundConns
	}
	return c.MaxInboundConns
}

// DefaultConfig returns the tuned defaults; NodeID, RaftListenAddr and
// DataDir must still be set.
//
// The timeouts are hashicorp/raft's own defaults (1 s heartbeat and election
// timeout, 500 ms lease, 50 ms commit timeout), which Consul and Nomad run in
// production on LANs. They are well above a LAN round trip, but the point of
// keeping them this large is the loaded case: on a 2-core box running the
// test suite with -race, GC and scheduler stalls of 100+ ms happen, and
// shorter timeouts made leaders step down and elections flap there (measured
// numbers in DESIGN.md). A crashed leader costs 1-2 s of unavailability for
// its shards; a graceful stop hands leadership over without that wait.
func DefaultConfig() Config {
	return Config{
		HeartbeatTimeout:   1000 * time.Millisecond,
		ElectionTimeout:    1000 * time.Millisecond,
		LeaderLeaseTimeout: 500 * time.Millisecond,
		CommitTimeout:      50 * time.Millisecond,
		MaxAppendEntries:   512,
		SnapshotThreshold:  8192,
		SnapshotInterval:   10 * time.Second,
		TrailingLogs:       10240,
		TrailingLogsBytes:  256 << 20,
		LogCacheBytes:      64 << 20,
		ApplyTimeout:       10 * time.Second,
		LogStore:           LogStorePebble,
		MaxInboundConns:    DefaultMaxInboundConns,
	}
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("raftstore: config: "+format, args...))
	}
	if c.NodeID == "" {
		bad("NodeID is required")
	} else if len(c.NodeID) > 255 {
		bad("NodeID %q is longer than 255 bytes", c.NodeID)
	}
	if c.RaftListenAddr == "" {
		bad("RaftListenAddr is required (host:port)")
	} else if _, _, err := net.SplitHostPort(c.RaftListenAddr); err != nil {
		bad("RaftListenAddr %q is not host:port: %v", c.RaftListenAddr, err)
	}
	if c.RaftAdvertiseAddr != "" {
		if err := checkDialable(c.RaftAdvertiseAddr); err != nil {
			bad("RaftAdvertiseAddr: %v", err)
		}
	} else if host, _, err := net.SplitHostPort(c.RaftListenAddr); err == nil {
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			bad("RaftAdvertiseAddr is required when RaftListenAddr (%q) binds a wildcard address", c.RaftListenAddr)
		}
	}
	if c.DataDir == "" {
		bad("DataDir is required")
	}
	minTimeout := 5 * time.Millisecond // hashicorp/raft's floor
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"HeartbeatTimeout", c.HeartbeatTimeout},
		{"ElectionTimeout", c.ElectionTimeout},
		{"LeaderLeaseTimeout", c.LeaderLeaseTimeout},
		{"SnapshotInterval", c.SnapshotInterval},
	} {
		if d.v < minTimeout {
			bad("%s is %v, must be >= %v", d.name, d.v, minTimeout)
		}
	}
	if c.CommitTimeout < time.Millisecond {
		bad("CommitTimeout is %v, must be >= 1ms", c.CommitTimeout)
	}
	if c.ElectionTimeout < c.HeartbeatTimeout {
		bad("ElectionTimeout (%v) must be >= HeartbeatTimeout (%v)", c.ElectionTimeout, c.HeartbeatTimeout)
	}
	if c.LeaderLeaseTimeout > c.HeartbeatTimeout {
		bad("LeaderLeaseTimeout (%v) must be <= HeartbeatTimeout (%v)", c.LeaderLeaseTimeout, c.HeartbeatTimeout)
	}
	if c.MaxAppendEntries < 1 || c.MaxAppendEntries > 1024 {
		bad("MaxAppendEntries is %d, must be in 1..1024", c.MaxAppendEntries)
	}
	if c.SnapshotThreshold < 1 {
		bad("SnapshotThreshold must be >= 1")
	}
	if c.TrailingLogsBytes < 0 || c.LogCacheBytes < 0 {
		bad("TrailingLogsBytes and LogCacheBytes must not be negative")
	}
	if c.ApplyTimeout <= 0 {
		bad("ApplyTimeout must be > 0")
	}
	if c.TLS != nil && (c.TLS.Server == nil || c.TLS.Client == nil) {
		bad("TLS needs both Server and Client")
	}
	switch c.logStore() {
	case LogStorePebble, LogStoreBolt:
	default:
		bad("LogStore %q is not one of %q", c.LogStore, LogStores)
	}
	if c.MaxInboundConns < 0 {
		bad("MaxInboundConns is %d, must be >= 0 (0: %d)", c.MaxInboundConns, DefaultMaxInboundConns)
	}
	return errors.Join(errs...)
}

// checkDialable reports whether addr is a host:port a peer can dial.
func checkDialable(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %v", addr, err)
	}
	if port == "" || port == "0" {
		return fmt.Errorf("%q has no fixed port", addr)
	}
	if host == "" {
		return fmt.Errorf("%q has no host; peers cannot dial it", addr)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("%q is a wildcard address; peers cannot dial it", addr)
	}
	return nil
}

// Peer is one voter of a group.
type Peer struct {
	ID   string // the peer node's Config.NodeID
	Addr string // the peer node's RaftAdvertiseAddr
}

// GroupConfig describes a group (one shard) to host.
type GroupConfig struct {
	// ID is the shard id: 1-64 bytes of [A-Za-z0-9._-], not "." or "..". It
	// names the directory DataDir/shards/<ID> and travels in the connection
	// header, so it must be identical on every replica.
	ID string

	// Voters are the group's initial members, this node included. They are
	// used only to bootstrap a brand-new group; a group with existing state
	// on disk restarts from its stored configuration. Their addresses are
	// also how this node dials each peer, always (a raft
	// ServerAddressProvider), whatever address a replicated configuration
	// or snapshot carries: every node dials at the addresses of its own
	// view, so a node's topology file decides the route to each peer.
	Voters []Peer

	// Learners are initial non-voting members, written with Voters when a
	// brand-new group bootstraps (this node may be one of them). They get
	// the log and vote nowhere.
	Learners []Peer

	// NoPacking keeps Config.Packer's proposal buffer off for this group:
	// its state machine reads its own commands, not packed entries.
	NoPacking bool

	// Timing overrides the host's Raft timeouts for this group; zero fields
	// keep the host's. Shards whose voters span regions need WAN-sized
	// timeouts (see WANTiming).
	Timing Timing

	// Start says what to do when the group has no state on disk (no log, no
	// snapshot). The zero value, StartBootstrap, is for a brand-new node.
	Start StartMode
}

// StartMode says how a group without state on disk starts.
type StartMode uint8

const (
	// StartBootstrap writes the initial configuration (Voters) and starts:
	// the first start of a brand-new cluster's node.
	StartBootstrap StartMode = iota
	// StartRequireState refuses to start (ErrStateMissing): the node held
	// this group before, so state missing now means it was lost, and
	// bootstrapping again would restart fencing tokens and forget the term
	// and vote this node gave (it could vote twice in one term).
	StartRequireState
	// StartJoin starts with no configuration and waits for the group's
	// leader to add this node (ReplaceVoter) and send it a snapshot: a
	// replica rebuilt from an empty data dir.
	StartJoin
)

// Timing is the set of Raft timeouts a group may override.
type Timing struct {
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
}

// WANTiming derives Raft timeouts for a group whose voters are rtt apart
// (the worst round trip between two voters): a follower waits several round
// trips before it campaigns, so one slow or lost heartbeat does not start an
// election, and a leader keeps its lease for two round trips beyond its
// heartbeats. Never below base, the LAN defaults.
func WANTiming(base Config, rtt time.Duration) Timing {
	t := Timing{
		HeartbeatTimeout:   max(base.HeartbeatTimeout, 8*rtt),
		ElectionTimeout:    max(base.ElectionTimeout, 8*rtt),
		LeaderLeaseTimeout: max(base.LeaderLeaseTimeout, 4*rtt),
	}
	return t
}

var shardIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

func validShardID(id string) bool {
	return shardIDPattern.MatchString(id) && id != "." && id != ".."
}

// validate checks gc for a host whose node id is self.
func (gc GroupConfig) validate(self string) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("raftstore: group %q: "+format, append([]any{gc.ID}, args...)...))
	}
	if !validShardID(gc.ID) {
		bad("id must be 1-64 bytes of [A-Za-z0-9._-] and not . or ..")
	}
	if len(gc.Voters) == 0 {
		bad("needs at least one voter")
	}
	seenID := map[string]bool{}
	seenAddr := map[string]bool{}
	hasSelf := false
	for i, p := range append(slices.Clip(gc.Voters), gc.Learners...) {
		switch {
		case p.ID == "":
			bad("voter %d has no ID", i)
		case seenID[p.ID]:
			bad("voter id %q listed twice", p.ID)
		}
		seenID[p.ID] = true
		if err := checkDialable(p.Addr); err != nil {
			bad("voter %q address: %v", p.ID, err)
		} else if seenAddr[p.Addr] {
			bad("voter address %q listed twice", p.Addr)
		}
		seenAddr[p.Addr] = true
		if p.ID == self {
			hasSelf = true
		}
	}
	if len(gc.Voters) > 0 && !hasSelf {
		bad("this node (%q) is not among its members", self)
	}
	return errors.Join(errs...)
}

// trailingLogsFor is how many entries to keep behind a snapshot when they
// are meanBytes large on average (0: unknown yet).
func (c Config) trailingLogsFor(meanBytes int64) uint64 {
	n := c.TrailingLogs
	budget := c.TrailingLogsBytes
	if budget == 0 {
		budget = 256 << 20
	}
	if meanBytes > 0 {
		n = min(n, max(uint64(budget/meanBytes), 1))
	}
	return n
}
