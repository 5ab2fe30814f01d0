package raftstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem/internal/tracing"
)

const (
	// transportTimeout is the NetworkTransport I/O deadline per RPC (scaled
	// up for snapshot installs) and its dial timeout.
	transportTimeout = 10 * time.Second
	// transportMaxPool is how many idle outbound connections a group keeps
	// per peer.
	transportMaxPool = 3
	// logCacheSize keeps the most recent entries in memory, so replication
	// to slightly lagging followers and ReadBarrier's log lookups do not hit
	// bolt.
	logCacheSize = 1024
	// snapshotsRetained is how many snapshots each group keeps on disk.
	snapshotsRetained = 2
	// readyPollInterval is how often WaitReady re-checks.
	readyPollInterval = 20 * time.Millisecond
)

// Host runs every Raft group of one node over a single TCP listener.
type Host struct {
	cfg     Config
	logger  *slog.Logger
	tracer  trace.Tracer // nil: tracing off
	mux     *mux
	metrics *hostMetrics

	mu      sync.RWMutex
	groups  map[string]*Group
	opening map[string]bool // ids being opened by AddGroup
	closing bool

	logMu     sync.Mutex
	logStore  string     // the LogStore* every group of this host uses (dataDirLogStore)
	pebbleLog *pebbleLog // opened on first use; nil until then
	logClosed bool       // stop closed (or skipped) the host's logs: open no more

	stopOnce sync.Once
	stopErr  error

	handOvers atomic.Uint64 // successful leadership hand-overs on Shutdown

	book peerBook // every peer's Raft address, in this node's view

	// stateFailure is the first storage failure reported (a host log's
	// or a durable state machine's), wrapping ErrStorageFailed.
	stateFailure atomic.Pointer[error]
}

// NewHost validates cfg, binds the Raft listener and returns a Host with no
// groups; add them with AddGroup.
func NewHost(cfg Config) (*Host, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logStore, err := dataDirLogStore(cfg)
	if err != nil {
		return nil, err
	}
	if err := mkdirDurable(filepath.Join(cfg.DataDir, "shards"), cfg.NoFsync); err != nil {
		return nil, fmt.Errorf("raftstore: creating data dir: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.RaftListenAddr)
	if err != nil {
		return nil, fmt.Errorf("raftstore: raft listener: %w", err)
	}
	advertise := cfg.RaftAdvertiseAddr
	if advertise == "" {
		advertise = ln.Addr().String()
	}
	if err := checkDialable(advertise); err != nil {
		ln.Close()
		return nil, fmt.Errorf("raftstore: advertise address: %w", err)
	}
	h := &Host{
		cfg:      cfg,
		logger:   logger,
		logStore: logStore,
		groups:   map[string]*Group{},
		opening:  map[string]bool{},
		tracer:   tracing.Tracer(cfg.TracerProvider),
	}
	h.mux = newMux(ln, advertise, logger, cfg.TLS, cfg.maxInboundConns())
	m, err := newHostMetrics(h, cfg.Registry)
	if err != nil {
		h.mux.close()
		return nil, err
	}
	h.metrics = m
	logger.Info("raft host listening", "listen", ln.Addr().String(), "advertise", advertise, "tls", cfg.TLS != nil)
	return h, nil
}

// NodeID returns this node's Raft server id.
func (h *Host) NodeID() string { return h.cfg.NodeID }

// Addr returns the Raft address peers dial (the advertise address).
func (h *Host) Addr() string { return h.mux.advertise }

// AddGroup starts hosting the group gc with sm as its state machine. A group
// with no state under DataDir/shards/<id>/ is bootstrapped with gc.Voters
// (every voter bootstraps with the same list, which is safe); a group with
// existing state restarts from it and ignores gc.Voters.
func (h *Host) AddGroup(gc GroupConfig, sm StateMachine) (*Group, error) {
	if err := gc.validate(h.cfg.NodeID); err != nil {
		return nil, err
	}
	if sm == nil {
		return nil, fmt.Errorf("raftstore: group %q: nil StateMachine", gc.ID)
	}
	h.mu.Lock()
	switch {
	case h.closing:
		h.mu.Unlock()
		return nil, fmt.Errorf("raftstore: add group %s: %w", gc.ID, ErrShutdown)
	case h.groups[gc.ID] != nil || h.opening[gc.ID]:
		h.mu.Unlock()
		return nil, shardErr(gc.ID, "%w", ErrGroupExists)
	}
	// Open without holding the lock: restoring a large snapshot can take a
	// while, and Groups (metrics scrapes, Ready) must not wait for it.
	h.opening[gc.ID] = true
	h.mu.Unlock()

	g, err := h.openGroup(gc, sm)

	h.mu.Lock()
	delete(h.opening, gc.ID)
	closing := h.closing
	if err == nil && !closing {
		h.groups[gc.ID] = g
	}
	h.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if closing { // Shutdown began while we were opening
		g.shutdown()
		return nil, fmt.Errorf("raftstore: add group %s: %w", gc.ID, ErrShutdown)
	}
	return g, nil
}

func (h *Host) openGroup(gc GroupConfig, sm StateMachine) (_ *Group, err error) {
	id := gc.ID
	dir := filepath.Join(h.cfg.DataDir, "shards", id)
	if err := mkdirDurable(dir, h.cfg.NoFsync); err != nil {
		return nil, shardErr(id, "creating dir: %w", err)
	}
	logger := h.logger.With("shard", id)
	rlog := newHclogAdapter(logger)

	var cleanup []func()
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()

	store, err := h.openGroupStore(id, dir)
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { store.Close() })

	gm := h.metrics.forGroup(id)
	cleanup = append(cleanup, func() { h.metrics.forgetGroup(id) })
	counted := &countingLogStore{LogStore: store, metrics: gm}
	cacheBytes := h.cfg.LogCacheBytes
	if cacheBytes == 0 {
		cacheBytes = 64 << 20
	}
	logs := newLogCache(counted, logCacheSize, cacheBytes)
	files, err := raft.NewFileSnapshotStoreWithLogger(dir, snapshotsRetained, rlog.Named("snapshot"))
	if err != nil {
		return nil, shardErr(id, "snapshot store: %w", err)
	}
	var snaps raft.SnapshotStore = files
	if live, ok := sm.(LiveSnapshotter); ok {
		snaps = &liveSnapshotStore{FileSnapshotStore: files, live: live}
	}

	stream, err := h.mux.register(id)
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { stream.Close() })
	for _, p := range append(slices.Clip(gc.Voters), gc.Learners...) {
		h.book.set(p.ID, p.Addr)
	}
	addrs := &h.book
	trans := &gatedTransport{NetworkTransport: raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  stream,
		MaxPool: transportMaxPool,
		// 1 turns pipelined replication off (DESIGN.md, "Replication
		// without pipelining"): hashicorp/raft v1.7's pipeline can
		// deadlock when a follower answers Success=false (pipelineDecode
		// returns, the sender parks on a full pipeline), leaving that
		// follower without entries for good while heartbeats hide it, and
		// hanging Shutdown; batching gives the throughput pipelining would.
		MaxRPCsInFlight:       1,
		Timeout:               transportTimeout,
		Logger:                rlog.Named("raft-net"),
		ServerAddressProvider: addrs,
	})}
	cleanup = append(cleanup, func() { trans.Close() })

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(h.cfg.NodeID)
	rc.HeartbeatTimeout = cmpDuration(gc.Timing.HeartbeatTimeout, h.cfg.HeartbeatTimeout)
	rc.ElectionTimeout = cmpDuration(gc.Timing.ElectionTimeout, h.cfg.ElectionTimeout)
	rc.LeaderLeaseTimeout = cmpDuration(gc.Timing.LeaderLeaseTimeout, h.cfg.LeaderLeaseTimeout)
	rc.CommitTimeout = h.cfg.CommitTimeout
	rc.MaxAppendEntries = h.cfg.MaxAppendEntries
	rc.SnapshotThreshold = h.cfg.SnapshotThreshold
	rc.SnapshotInterval = h.cfg.SnapshotInterval
	rc.TrailingLogs = h.cfg.trailingLogsFor(0)
	rc.Logger = rlog.Named("raft")
	rc.NoLegacyTelemetry = true
	// Buffer applyCh to MaxAppendEntries so proposers hand their command
	// over without waiting for the leader loop; the loop drains up to
	// MaxAppendEntries queued commands into one StoreLogs (group commit).
	rc.BatchApplyCh = true
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, shardErr(id, "%w", err)
	}

	existing, err := raft.HasExistingState(logs, store, snaps)
	if err != nil {
		return nil, shardErr(id, "checking existing state: %w", err)
	}

	if existing {
		// Every group that ever held state has a current term of at least 1
		// in its stable store (the bootstrap writes it; a joiner gets one
		// from the first leader it hears). Snapshots without it mean the
		// log and stable store were lost while the snapshot files stayed:
		// starting would forget the votes this node gave, so it could vote
		// twice in one term. hashicorp/raft reports an absent key as an
		// error, so any error reads as no term here.
		if term, err := store.GetUint64(keyCurrentTerm); err != nil || term == 0 {
			return nil, shardErr(id, "%w: snapshots remain under %s but the Raft log with its stored term and vote is gone (current term: %d, %v); "+
				"starting would forget the votes this node gave", ErrStateMissing, h.cfg.DataDir, term, err)
		}
	}
	if err := checkStateNotAhead(sm, logs, snaps); err != nil {
		return nil, shardErr(id, "%w", err)
	}

	switch {
	case !existing && gc.Start == StartRequireState:
		return nil, shardErr(id, "%w: no log or snapshot under %s although this node held the group before", ErrStateMissing, h.cfg.DataDir)
	case !existing && gc.Start == StartJoin:
		logger.Info("raft group starting empty, waiting to be added by its leader")
	case !existing:
		// Write the initial configuration straight into the stores before
		// raft starts. Bootstrapping a running raft instead races with peers:
		// a vote request or an append from a peer that started first makes
		// the state non-empty and the bootstrap fail.
		servers := make([]raft.Server, 0, len(gc.Voters))
		for _, p := range gc.Voters {
			servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)})
		}
		for _, p := range gc.Learners {
			servers = append(servers, raft.Server{Suffrage: raft.Nonvoter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)})
		}
		if err := raft.BootstrapCluster(rc, logs, store, snaps, trans, raft.Configuration{Servers: servers}); err != nil {
			return nil, shardErr(id, "bootstrap: %w", err)
		}
		logger.Info("raft group bootstrapped", "voters", len(servers))
	}

	fsm := newFSMAdapter(sm, gm)
	fsm.onFail = h.storageFailed
	if h.tracer != nil {
		fsm.times = &applyTimes{}
	}
	if fsm.durable != nil {
		// The state is on disk with the index it covers: a restart neither
		// restores a snapshot nor re-applies what the state holds, unless
		// the state is older than the newest snapshot.
		rc.NoSnapshotRestoreOnStart = true
		if err := catchUpFromSnapshot(fsm, files, logger); err != nil {
			return nil, shardErr(id, "%w", err)
		}
	}
	r, err := raft.NewRaft(rc, fsm, logs, store, snaps, trans)
	if err != nil {
		return nil, shardErr(id, "starting raft: %w", err)
	}
	cleanup = append(cleanup, func() { r.Shutdown().Error() })
	stream.setSeat(h.seatCheck(id, raftSeat(r)))
	if existing {
		logger.Info("raft group restarted from existing state", "last_index", r.LastIndex(), "log_store", h.logStore)
	}

	g := &Group{
		id:            id,
		host:          h,
		peers:         addrs,
		logger:        logger,
		raft:          r,
		fsm:           fsm,
		logs:          logs,
		counted:       counted,
		store:         store,
		logStore:      h.logStore,
		snaps:         files,
		trans:         trans,
		stream:        stream,
		metrics:       gm,
		obsCh:         make(chan raft.Observation, 16),
		obsDone:       make(chan struct{}),
		leaderChanged: make(chan struct{}),
		closedCh:      make(chan struct{}),
	}
	if h.cfg.Packer != nil && !gc.NoPacking {
		g.buf = newPropBuffer(g, h.cfg.Packer.PackCommands, !h.cfg.PackingGated)
		go g.buf.dispatch()
	}
	g.observer = raft.NewObserver(g.obsCh, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	r.RegisterObserver(g.observer)
	go g.watchLeader()
	go g.boundTrailingLogs()
	return g, nil
}

// openPebbleLog returns the host's pebble log, opening (or creating) it on
// first use.
func (h *Host) openPebbleLog() (*pebbleLog, error) {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	if h.logClosed {
		return nil, ErrShutdown
	}
	if h.pebbleLog != nil {
		return h.pebbleLog, nil
	}
	pl, err := openPebbleLog(pebbleLogPath(h.cfg.DataDir), h.cfg.NoFsync, h.metrics, h.logger, h.storageFailed)
	if err != nil {
		return nil, err
	}
	if n := h.cfg.TestingFailCommitsAfter; n > 0 {
		pl.failCommitsAfter(n)
	}
	h.pebbleLog = pl
	return pl, nil
}

// storageFailed is told once that the pebble log failed stop, or that a
// group's durable state machine could not commit an applied batch.
// The callback, when set, says it (one line from whoever acts on it).
func (h *Host) storageFailed(err error) {
	h.stateFailure.CompareAndSwap(nil, &err)
	if h.cfg.OnStorageFailure != nil {
		h.cfg.OnStorageFailure(err)
		return
	}
	h.logger.Error("raft log storage failed: this node takes no more writes", "error", err)
}

// StorageFailure returns the error that made this node's Raft log fail stop
// (wrapping ErrStorageFailed), or nil.
func (h *Host) StorageFailure() error {
	if p := h.stateFailure.Load(); p != nil {
		return *p
	}
	h.logMu.Lock()
	pl := h.pebbleLog
	h.logMu.Unlock()
	if pl != nil {
		return pl.failure()
	}
	return nil
}

// PebbleLogStats returns the pebble log's figures (zero if no group of this
// host uses it).
func (h *Host) PebbleLogStats() PebbleLogStats {
	h.logMu.Lock()
	pl := h.pebbleLog
	h.logMu.Unlock()
	if pl == nil {
		return PebbleLogStats{}
	}
	return pl.stats()
}

// Group returns the hosted group with the given shard id.
func (h *Host) Group(id string) (*Group, bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	g, ok := h.groups[id]
	return g, ok
}

// Groups returns the hosted groups ordered by shard id.
func (h *Host) Groups() []*Group {
	h.mu.RLock()
	gs := make([]*Group, 0, len(h.groups))
	for _, g := range h.groups {
		gs = append(gs, g)
	}
	h.mu.RUnlock()
	slices.SortFunc(gs, func(a, b *Group) int { return strings.Compare(a.id, b.id) })
	return gs
}

// Ready returns nil when every hosted group has a known leader, this node
// has applied everything it knows to be committed and its Raft log has not
// failed; otherwise an error wrapping ErrNotReady that names the lagging
// shards (or the storage failure).
func (h *Host) Ready() error {
	var errs []error
	if err := h.StorageFailure(); err != nil {
		errs = append(errs, err)
	}
	for _, g := range h.Groups() {
		if g.closed.Load() {
			errs = append(errs, fmt.Errorf("shard %s: shut down", g.id))
			continue
		}
		if id, _ := g.Leader(); id == "" {
			errs = append(errs, fmt.Errorf("shard %s: no known leader", g.id))
			continue
		}
		ok, applied, commit, err := g.caughtUp()
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("shard %s: %v", g.id, err))
		case !ok:
			errs = append(errs, fmt.Errorf("shard %s: applied %d, committed %d", g.id, applied, commit))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrNotReady, errors.Join(errs...))
}

// WaitReady waits until Ready returns nil or ctx ends; the error then says
// what was still missing.
func (h *Host) WaitReady(ctx context.Context) error {
	t := time.NewTicker(readyPollInterval)
	defer t.Stop()
	for {
		err := h.Ready()
		if err == nil {
			return nil
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("raftstore: waiting for readiness: %w (last: %w)", ctx.Err(), err)
		}
	}
}

// Shutdown stops the host gracefully: every group this node leads first
// hands leadership to another voter (best effort, all groups in parallel,
// bounded by ctx and each by ElectionTimeout), so their shards are writable
// again without waiting for an election timeout; then every group is shut
// down, its stores closed, and the listener closed. Everything acknowledged
// is already durable on a quorum, so nothing acknowledged is lost. Further
// calls return the first call's result.
func (h *Host) Shutdown(ctx context.Context) error {
	return h.stop(ctx, true)
}

// Close stops the host immediately, without handing over leadership: peers
// notice the silence and elect new leaders after a heartbeat timeout. It is
// what a crash looks like to the rest of the cluster (minus the data loss,
// which fsync rules out).
func (h *Host) Close() error {
	return h.stop(context.Background(), false)
}

func (h *Host) stop(ctx context.Context, handOver bool) error {
	h.stopOnce.Do(func() {
		h.mu.Lock()
		h.closing = true
		h.mu.Unlock()
		groups := h.Groups()
		var errs []error
		if handOver {
			h.handOverLeadership(ctx, groups)
		} else {
			// Sever the network first so peers see an abrupt loss.
			if err := h.mux.close(); err != nil {
				errs = append(errs, err)
			}
		}
		var wg sync.WaitGroup
		shutdownErrs := make([]error, len(groups))
		for i, g := range groups {
			wg.Go(func() { shutdownErrs[i] = g.shutdown() })
		}
		wg.Wait()
		errs = append(errs, shutdownErrs...)
		// Every group has stopped: nothing writes to the host's logs now.
		h.logMu.Lock()
		h.logClosed = true // an AddGroup still opening must not reopen them
		if h.pebbleLog != nil {
			if err := h.pebbleLog.close(); err != nil {
				errs = append(errs, err)
			}
		}
		h.logMu.Unlock()
		if handOver {
			if err := h.mux.close(); err != nil {
				errs = append(errs, fmt.Errorf("raftstore: closing listener: %w", err))
			}
		}
		h.metrics.unregister(h.cfg.Registry)
		h.stopErr = errors.Join(errs...)
		h.logger.Info("raft host stopped", "node", h.cfg.NodeID, "groups", len(groups), "graceful", handOver)
	})
	return h.stopErr
}

// handOverLeadership transfers leadership away from every group this node
// leads that has another voter, in parallel. raft picks the most up-to-date
// follower first; if that one is down the attempt times out (after
// ElectionTimeout) and each other voter is tried in turn, until ctx ends.
// Failures are logged: the group then elects a new leader after a heartbeat
// timeout, as after a crash.
func (h *Host) handOverLeadership(ctx context.Context, groups []*Group) {
	var wg sync.WaitGroup
	for _, g := range groups {
		if !g.IsLeader() {
			continue
		}
		wg.Go(func() {
			cf := g.raft.GetConfiguration()
			if cf.Error() != nil {
				return
			}
			targets := []string{""} // raft's own pick first
			for _, s := range cf.Configuration().Servers {
				if s.Suffrage == raft.Voter && string(s.ID) != h.cfg.NodeID {
					targets = append(targets, string(s.ID))
				}
			}
			if len(targets) == 1 {
				return // single-voter group: nobody to hand over to
			}
			start := time.Now()
			var err error
			for _, target := range targets {
				if ctx.Err() != nil {
					break
				}
				if !g.IsLeader() {
					g.logger.Info("leadership moved away during shutdown", "took", time.Since(start))
					return
				}
				if err = g.transferLeadership(ctx, target); err == nil || errors.Is(err, ErrNotLeader) {
					h.handOvers.Add(1)
					g.logger.Info("leadership handed over on shutdown", "took", time.Since(start))
					return
				}
				g.logger.Debug("leadership hand-over attempt failed", "target", target, "error", err)
			}
			g.logger.Warn("leadership hand-over on shutdown failed; peers will elect after a timeout",
				"error", err, "context", ctx.Err())
		})
	}
	wg.Wait()
}

// setIsolated is a test hook: it cuts this node off the network (all groups,
// both directions) while on.
func (h *Host) setIsolated(on bool) { h.mux.setIsolated(on) }

// peerBook resolves a peer's id to the address in this node's own view: the
// host's one book, shared by every group (a node has one Raft address for
// all its groups), filled from the groups' Voters and from SetPeer.
type peerBook struct {
	mu sync.RWMutex
	m  map[raft.ServerID]raft.ServerAddress
}

func (p *peerBook) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if a, ok := p.get(string(id)); ok {
		return a, nil
	}
	return "", fmt.Errorf("raftstore: no address for peer %q", id)
}

func (p *peerBook) get(id string) (raft.ServerAddress, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	a, ok := p.m[raft.ServerID(id)]
	return a, ok
}

func (p *peerBook) set(id, addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[raft.ServerID]raft.ServerAddress{}
	}
	p.m[raft.ServerID(id)] = raft.ServerAddress(addr)
}

// SetPeer tells every group of the host (and every group added later) that
// node id is reached at addr: how a node learns the Raft address of a node
// that joins the cluster after it started.
func (h *Host) SetPeer(id, addr string) { h.book.set(id, addr) }

func cmpDuration(override, fallback time.Duration) time.Duration {
	if override > 0 {
		return override
	}
	return fallback
}

// catchUpFromSnapshot restores the newest snapshot into a durable state
// machine whose state on disk is older than it. raft, started with
// NoSnapshotRestoreOnStart, hands only the entries after the newest
// snapshot to the state machine, so a state behind the snapshot (a data dir
// of a release that kept the state in memory, or an engine that lost
// unsynced writes the snapshot covers) must first get the snapshot's state.
func catchUpFromSnapshot(f *fsmAdapter, snaps raft.SnapshotStore, logger *slog.Logger) error {
	metas, err := snaps.List()
	if err != nil {
		return fmt.Errorf("listing snapshots: %w", err)
	}
	if len(metas) == 0 || metas[0].Index <= f.onDisk {
		return nil
	}
	// raft's file store checks its CRC-64 of the whole file here: a damaged
	// file is refused before any of it reaches the state machine.
	meta, rc, err := snaps.Open(metas[0].ID)
	if err != nil {
		return fmt.Errorf("the state on disk (index %d) is behind the newest snapshot %s, which cannot be opened: %w; "+
			"nothing was applied: restore the data dir from a backup, or rebuild this node with idemctl replace-node", f.onDisk, metas[0].ID, err)
	}
	defer rc.Close()
	version, applied, err := readSnapHeader(rc)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w; nothing was applied: restore the data dir from a backup, or rebuild this node with idemctl replace-node", meta.ID, err)
	}
	if applied <= f.onDisk {
		return nil // only no-op or barrier entries lie between
	}
	if version == snapVersionRef {
		// The snapshot is the state on disk itself, which was synced up to
		// applied before the snapshot was written: it lost what it had.
		return fmt.Errorf("%w: snapshot %s refers to the state at index %d, the state on disk covers %d", ErrReferenceAhead, meta.ID, applied, f.onDisk)
	}
	start := time.Now()
	if err := f.durable.RestoreApplied(rc, applied); err != nil {
		return fmt.Errorf("restoring snapshot %s into the state on disk: %w; the state on disk is as it was (index %d): "+
			"restore the data dir from a backup, or rebuild this node with idemctl replace-node", meta.ID, err, f.onDisk)
	}
	logger.Info("state on disk was behind the newest snapshot; restored it", "snapshot", meta.ID,
		"applied_before", f.onDisk, "applied", applied, "took", time.Since(start))
	f.onDisk = applied
	f.applied.Store(applied)
	f.restores.Add(1)
	f.metrics.restores.Inc()
	return nil
}

// checkStateNotAhead refuses a durable state that covers more of the log
// than this node's Raft log and snapshots hold.
//
// keyCurrentTerm is where hashicorp/raft keeps its current term in the
// stable store (its unexported keyCurrentTerm).
var keyCurrentTerm = []byte("CurrentTerm")

func checkStateNotAhead(sm StateMachine, logs raft.LogStore, snaps raft.SnapshotStore) error {
	d, ok := sm.(DurableStateMachine)
	if !ok || d.AppliedIndex() == 0 {
		return nil
	}
	last, err := logs.LastIndex()
	if err != nil {
		return fmt.Errorf("reading the log: %w", err)
	}
	metas, err := snaps.List()
	if err != nil {
		return fmt.Errorf("listing snapshots: %w", err)
	}
	if len(metas) > 0 {
		last = max(last, metas[0].Index)
	}
	if d.AppliedIndex() > last {
		return fmt.Errorf("%w: the state covers index %d, the Raft log and snapshots end at %d", ErrStateAhead, d.AppliedIndex(), last)
	}
	return nil
}
