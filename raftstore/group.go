package raftstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"go.opentelemetry.io/otel/trace"
)

// Group is one Raft group (one shard) hosted by a Host. All methods are safe
// for concurrent use.
type Group struct {
	id       string
	host     *Host
	peers    *peerBook // this node's view of the peers' addresses (the host's)
	logger   *slog.Logger
	raft     *raft.Raft
	fsm      *fsmAdapter
	logs     *logCache // log cache over counting store over store
	counted  *countingLogStore
	store    groupStore // own bolt file, or its part of the host's pebble log
	logStore string     // which of them: a LogStore* value
	snaps    *raft.FileSnapshotStore
	trans    *gatedTransport
	stream   *streamLayer
	metrics  *groupMetrics
	buf      *propBuffer // nil unless Config.Packer is set

	observer *raft.Observer
	obsCh    chan raft.Observation
	obsDone  chan struct{}

	leaderMu      sync.Mutex
	lastLeaderID  string
	leaderChanged chan struct{} // closed (and replaced) on every leader change

	// readyApplied and readyMoved are the applied index a readiness check
	// last saw while behind and when it changed; zero readyMoved: the last
	// check found the group caught up (caughtUp).
	readyMu      sync.Mutex
	readyApplied uint64
	readyMoved   time.Time

	closed       atomic.Bool
	closedCh     chan struct{}
	shutdownOnce sync.Once
	shutdownErr  error
}

// ID returns the group's shard id.
func (g *Group) ID() string { return g.id }

// opContext bounds an operation by Config.ApplyTimeout unless the caller's
// context ends earlier.
func (g *Group) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, g.host.cfg.ApplyTimeout)
}

// waitFuture waits for f or for ctx or the group to end, whichever is first.
// raft futures have no channel, so a goroutine blocks on f.Error(); raft
// resolves every future eventually (at the latest on shutdown), so it does
// not leak.
func (g *Group) waitFuture(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-g.closedCh:
		return raft.ErrRaftShutdown
	}
}

// remaining is the time left before ctx's deadline (ctx always has one here).
func remaining(ctx context.Context) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0
	}
	return time.Until(dl)
}

// Apply proposes data and waits until it is committed and applied, returning
// the StateMachine's result for it. It waits at most until ctx ends (and at
// most Config.ApplyTimeout).
//
// Errors: a *NotLeaderError (ErrNotLeader) or ErrEnqueueTimeout mean the
// command was NOT applied; ErrUnknownOutcome (possibly together with a
// context error or ErrShutdown) means it may or may not have been; a bare
// context error or ErrShutdown means it was never proposed.
func (g *Group) Apply(ctx context.Context, data []byte) (any, error) {
	if g.closed.Load() {
		return nil, shardErr(g.id, "%w", ErrShutdown)
	}
	if err := ctx.Err(); err != nil {
		return nil, g.translate(err, phaseBeforeEnqueue)
	}
	if g.raft.State() != raft.Leader {
		return nil, g.notLeader()
	}
	ctx, cancel := g.opContext(ctx)
	defer cancel()
	if t := g.host.tracer; t != nil && trace.SpanFromContext(ctx).IsRecording() {
		return g.applyTraced(ctx, t, data)
	}
	v, _, err := g.apply(ctx, data)
	return v, err
}

// apply is Apply once checked and bounded; it also says which entry the
// command went in (trace.go).
func (g *Group) apply(ctx context.Context, data []byte) (any, proposed, error) {
	if g.buf != nil && g.buf.on.Load() {
		return g.buf.apply(ctx, data)
	}
	enqueueTimeout := remaining(ctx)
	if enqueueTimeout <= 0 { // raft reads 0 as "wait forever"
		return nil, proposed{}, g.translate(context.DeadlineExceeded, phaseBeforeEnqueue)
	}
	start := time.Now()
	// raft's timeout argument only bounds the wait to enqueue the command.
	f := g.raft.Apply(data, enqueueTimeout)
	if err := g.waitFuture(ctx, f); err != nil {
		return nil, proposed{}, g.translate(err, phaseAfterEnqueue)
	}
	g.metrics.applyDuration.Observe(time.Since(start).Seconds())
	v, err := appliedResult(g.id, f.Response())
	return v, proposed{index: f.Index(), commands: 1}, err
}

// appliedResult is what a proposer gets for an applied entry: the state
// machine's result, or, when this node's durable state stopped following
// the log (the fsm adapter answers ErrStorageFailed), an unknown outcome:
// the entry is committed in the Raft log and is applied on a restart, so
// the caller must retry idempotently, never take it as not applied.
func appliedResult(shard string, res any) (any, error) {
	if err, ok := res.(error); ok && errors.Is(err, ErrStorageFailed) {
		return nil, shardErr(shard, "%w: %w", ErrUnknownOutcome, err)
	}
	return res, nil
}

// ReadBarrier returns nil once the local StateMachine reflects every command
// that was acknowledged (by any node) before ReadBarrier was called, so a
// read of local state that follows is linearizable. Only the leader can do
// this; elsewhere it returns a *NotLeaderError. The recipe (Raft thesis
// §6.4 "ReadIndex", as hashicorp/raft issue #603 suggests building it) and
// why each step is needed are in DESIGN.md.
func (g *Group) ReadBarrier(ctx context.Context) error {
	ctx, cancel := g.opContext(ctx)
	defer cancel()
	const attempts = 3
	for range attempts {
		if g.closed.Load() {
			return shardErr(g.id, "%w", ErrShutdown)
		}
		if err := ctx.Err(); err != nil {
			return shardErr(g.id, "read barrier: %w", err)
		}
		// 1. Read the term first; everything below must happen within it.
		term := g.raft.CurrentTerm()
		if g.raft.State() != raft.Leader {
			return g.notLeader()
		}
		// 2. The read index: our commit index, usable only once an entry of
		// our own term is committed (before that a new leader does not know
		// which earlier entries are committed).
		readIndex := g.raft.CommitIndex()
		ok, err := g.committedInTerm(readIndex, term)
		if err != nil {
			return shardErr(g.id, "read barrier: %w", err)
		}
		if !ok {
			// Fresh leader: commit (and apply) an entry of this term, then
			// start over with the new commit index.
			t := remaining(ctx)
			if t <= 0 {
				return shardErr(g.id, "read barrier: %w", context.DeadlineExceeded)
			}
			if err := g.waitFuture(ctx, g.raft.Barrier(t)); err != nil {
				return g.translateRead(err)
			}
			continue
		}
		// 3. Prove we are still the leader: a quorum answers a heartbeat
		// round started after the read index was taken.
		if err := g.waitFuture(ctx, g.raft.VerifyLeader()); err != nil {
			return g.translateRead(err)
		}
		// 4. The verification must belong to the term the read index was
		// taken in; if we lost and regained leadership meanwhile, a leader
		// of an intermediate term may have committed writes beyond it.
		if g.raft.CurrentTerm() != term {
			continue
		}
		// 5. Wait until the state machine has applied up to the read index.
		return g.waitApplied(ctx, readIndex)
	}
	return g.notLeader()
}

// translateRead maps errors of the read path: a read has no side effect, so
// any lost leadership is simply "not the leader".
func (g *Group) translateRead(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return g.notLeader()
	case errors.Is(err, raft.ErrRaftShutdown):
		return shardErr(g.id, "%w", ErrShutdown)
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return shardErr(g.id, "read barrier: %w: %w", ErrEnqueueTimeout, context.DeadlineExceeded)
	default:
		return shardErr(g.id, "read barrier: %w", err)
	}
}

// committedInTerm reports whether log entry idx (known committed) belongs to
// term. By the Log Matching property that proves an entry of the current
// term is committed.
func (g *Group) committedInTerm(idx, term uint64) (bool, error) {
	if idx == 0 {
		return false, nil
	}
	var l raft.Log
	switch err := g.logs.GetLog(idx, &l); {
	case errors.Is(err, raft.ErrLogNotFound):
		// Compacted into a snapshot (TrailingLogs 0): fall back to a barrier.
		return false, nil
	case err != nil:
		return false, err
	}
	return l.Term == term, nil
}

// fsmTarget returns the index the StateMachine must reach to reflect every
// committed entry up to idx: the last LogCommand/LogConfiguration entry at or
// below idx (raft never hands no-op and barrier entries to the FSM, so
// waiting for their index would never end). It returns 0 when nothing past
// the current applied index matters.
func (g *Group) fsmTarget(idx uint64) (uint64, error) {
	applied := g.fsm.applied.Load()
	for i := idx; i > applied; i-- {
		var l raft.Log
		switch err := g.logs.GetLog(i, &l); {
		case errors.Is(err, raft.ErrLogNotFound):
			// Compacted: entries this old are covered by a snapshot that was
			// taken from, or restored into, this state machine.
			return 0, nil
		case err != nil:
			return 0, fmt.Errorf("reading log entry %d: %w", i, err)
		}
		if l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			return i, nil
		}
	}
	return 0, nil
}

// waitApplied waits until the StateMachine reflects every committed entry up
// to idx.
func (g *Group) waitApplied(ctx context.Context, idx uint64) error {
	target, err := g.fsmTarget(idx)
	if err != nil {
		return shardErr(g.id, "%w", err)
	}
	for {
		applied, changed := g.fsm.appliedChanged()
		if applied >= target {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return shardErr(g.id, "waiting to apply index %d (at %d): %w", target, applied, ctx.Err())
		case <-g.closedCh:
			return shardErr(g.id, "%w", ErrShutdown)
		}
	}
}

// caughtUp reports whether the StateMachine reflects the commit index this
// node knows.
func (g *Group) caughtUp() (bool, uint64, uint64, error) {
	commit := g.raft.CommitIndex()
	target, err := g.fsmTarget(commit)
	applied := g.fsm.applied.Load()
	if err != nil {
		return false, applied, commit, err
	}
	g.readyMu.Lock()
	defer g.readyMu.Unlock()
	if applied >= target {
		g.readyMoved = time.Time{} // a later lag is a new one
		return true, applied, commit, nil
	}
	now := time.Now()
	if g.readyMoved.IsZero() || applied != g.readyApplied {
		g.readyApplied, g.readyMoved = applied, now
	}
	return applyLagOK(target-applied, now.Sub(g.readyMoved)), applied, commit, nil
}

// A replica learns that an entry is committed a moment before it applies
// it, so under load every replica is usually an entry or two behind the
// commit index it knows. That is caught up for readiness: a probe that
// required applied >= commit answered 503 to 4-6% of probes on every node
// of a loaded region (a load balancer would drop healthy nodes). A replica
// counts as caught up while it lags by at most readyLagEntries entries and
// its applied index moved within readyLagGrace (checked at the probes): one
// replaying a long log after a restart, or whose state machine stalls, is
// not ready.
const (
	readyLagEntries = 16
	readyLagGrace   = 2 * time.Second
)

// applyLagOK is that rule: lag entries behind, the applied index last
// moved stalled ago.
func applyLagOK(lag uint64, stalled time.Duration) bool {
	return lag <= readyLagEntries && stalled < readyLagGrace
}

// IsLeader reports whether this node currently believes it leads the group.
// Use ReadBarrier, not IsLeader, before serving a read.
func (g *Group) IsLeader() bool { return g.raft.State() == raft.Leader }

// Leader returns the leader this node knows of ("" if none).
func (g *Group) Leader() (id, addr string) {
	a, i := g.raft.LeaderWithID()
	return string(i), string(a)
}

// LeaderChanged returns a channel that is closed at the next change of the
// known leader (including to "none"). Re-read Leader after it fires.
func (g *Group) LeaderChanged() <-chan struct{} {
	g.leaderMu.Lock()
	defer g.leaderMu.Unlock()
	return g.leaderChanged
}

// WaitLeader waits until the group has a known leader and returns it.
func (g *Group) WaitLeader(ctx context.Context) (id, addr string, err error) {
	for {
		changed := g.LeaderChanged()
		if id, addr := g.Leader(); id != "" {
			return id, addr, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return "", "", shardErr(g.id, "waiting for a leader: %w", ctx.Err())
		case <-g.closedCh:
			return "", "", shardErr(g.id, "%w", ErrShutdown)
		}
	}
}

// watchLeader consumes raft's leader observations: it counts and logs
// changes and wakes LeaderChanged waiters.
func (g *Group) watchLeader() {
	defer close(g.obsDone)
	for obs := range g.obsCh {
		lo, ok := obs.Data.(raft.LeaderObservation)
		if !ok {
			continue
		}
		id := string(lo.LeaderID)
		g.leaderMu.Lock()
		if id != g.lastLeaderID {
			if id != "" {
				g.metrics.leaderChanges.Inc()
				g.logger.Info("raft leader changed", "leader", id, "leader_addr", string(lo.LeaderAddr),
					"self", id == g.host.cfg.NodeID, "term", g.raft.CurrentTerm())
			}
			g.lastLeaderID = id
		}
		close(g.leaderChanged)
		g.leaderChanged = make(chan struct{})
		g.leaderMu.Unlock()
	}
}

// TransferLeadership hands leadership to the voter targetID ("" lets raft
// pick the most up-to-date follower) and waits until this node has stepped
// down or the attempt failed (bounded by ElectionTimeout). Only the leader
// can transfer; elsewhere it returns a *NotLeaderError.
func (g *Group) TransferLeadership(targetID string) error {
	return g.transferLeadership(context.Background(), targetID)
}

func (g *Group) transferLeadership(ctx context.Context, targetID string) error {
	if g.closed.Load() {
		return shardErr(g.id, "%w", ErrShutdown)
	}
	if g.raft.State() != raft.Leader {
		return g.notLeader()
	}
	if targetID == g.host.cfg.NodeID {
		return nil
	}
	var f raft.Future
	if targetID == "" {
		f = g.raft.LeadershipTransfer()
	} else {
		cf := g.raft.GetConfiguration()
		if err := cf.Error(); err != nil {
			return g.translateRead(err)
		}
		var addr raft.ServerAddress
		for _, s := range cf.Configuration().Servers {
			if string(s.ID) == targetID && s.Suffrage == raft.Voter {
				addr = s.Address
			}
		}
		if addr == "" {
			return shardErr(g.id, "transfer to %q: %w", targetID, ErrUnknownPeer)
		}
		f = g.raft.LeadershipTransferToServer(raft.ServerID(targetID), addr)
	}
	if err := g.waitFuture(ctx, f); err != nil {
		if errors.Is(err, raft.ErrNotLeader) {
			return g.notLeader()
		}
		if errors.Is(err, raft.ErrRaftShutdown) {
			return shardErr(g.id, "%w", ErrShutdown)
		}
		return shardErr(g.id, "leadership transfer: %w", err)
	}
	return nil
}

// ReplaceVoter rebuilds voter id's membership: it removes id from the
// group's configuration and adds it back as a voter at the same address,
// each a committed configuration change. Run it on the leader after the
// replica id lost its data dir and was restarted empty with StartJoin: the
// leader then replicates to it from scratch (a snapshot, or the log) and it
// votes again only as the new member. A voter that is already missing (an
// earlier ReplaceVoter stopped half-way) is only added. Only the leader can
// do it (elsewhere a *NotLeaderError); it refuses to replace itself
// (transfer the leadership first) and waits at most ApplyTimeout per change.
//
// While id is out, the group runs on the other voters: a three-voter group
// needs both others up for the removal and the re-add to commit.
func (g *Group) ReplaceVoter(ctx context.Context, id string) error {
	return g.ReplaceMember(ctx, id, true)
}

// ReplaceMember is ReplaceVoter for a member that votes (voter) or is a
// non-voting member (a learner, as most nodes are in the meta group): it
// is added back as what it was.
func (g *Group) ReplaceMember(ctx context.Context, id string, voter bool) error {
	if g.closed.Load() {
		return shardErr(g.id, "%w", ErrShutdown)
	}
	if g.raft.State() != raft.Leader {
		return g.notLeader()
	}
	if id == g.host.cfg.NodeID {
		return shardErr(g.id, "replace %q: this node leads the group; transfer the leadership first", id)
	}
	cf := g.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return g.translateRead(err)
	}
	var addr raft.ServerAddress
	present := false
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == id {
			present, addr = true, s.Address
		}
	}
	if !present {
		// Only an earlier, interrupted replacement removes a voter; its
		// address is this node's view of the peer.
		peer, ok := g.peerAddr(id)
		if !ok {
			return shardErr(g.id, "replace %q: %w", id, ErrUnknownPeer)
		}
		addr = peer
	}
	change := func(what string, f func(time.Duration) raft.IndexFuture) error {
		ctx, cancel := g.opContext(ctx)
		defer cancel()
		if err := g.waitFuture(ctx, f(remaining(ctx))); err != nil {
			if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
				return g.notLeader()
			}
			return shardErr(g.id, "replace %q: %s: %w", id, what, err)
		}
		return nil
	}
	if present {
		if err := change("removing it", func(d time.Duration) raft.IndexFuture {
			return g.raft.RemoveServer(raft.ServerID(id), 0, d)
		}); err != nil {
			return err
		}
	}
	if err := change("adding it back", func(d time.Duration) raft.IndexFuture {
		if !voter {
			return g.raft.AddNonvoter(raft.ServerID(id), addr, 0, d)
		}
		return g.raft.AddVoter(raft.ServerID(id), addr, 0, d)
	}); err != nil {
		return err
	}
	g.logger.Info("voter replaced: it catches up from this leader", "voter", id)
	return nil
}

// IsMember reports whether this node is a voter in the group's latest
// configuration: false for a replica started with StartJoin until its
// leader has added it (ReplaceVoter) and sent it the log or a snapshot.
func (g *Group) IsMember() bool {
	cf := g.raft.GetConfiguration()
	if cf.Error() != nil {
		return false
	}
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == g.host.cfg.NodeID && s.Suffrage == raft.Voter {
			return true
		}
	}
	return false
}

// peerAddr returns this node's address of peer id (from GroupConfig.Voters).
func (g *Group) peerAddr(id string) (raft.ServerAddress, bool) {
	return g.peers.get(id)
}

// Snapshot forces a snapshot now and returns the Raft index and term it
// covers. If nothing was applied since the last snapshot it returns that
// snapshot's index and term; if nothing was ever applied, ErrNothingToSnapshot.
func (g *Group) Snapshot() (index, term uint64, err error) {
	if g.closed.Load() {
		return 0, 0, shardErr(g.id, "%w", ErrShutdown)
	}
	f := g.raft.Snapshot()
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNothingNewToSnapshot) {
			metas, lerr := g.snaps.List()
			if lerr != nil {
				return 0, 0, shardErr(g.id, "listing snapshots: %w", lerr)
			}
			if len(metas) == 0 {
				return 0, 0, shardErr(g.id, "%w", ErrNothingToSnapshot)
			}
			return metas[0].Index, metas[0].Term, nil
		}
		if errors.Is(err, raft.ErrRaftShutdown) {
			return 0, 0, shardErr(g.id, "%w", ErrShutdown)
		}
		return 0, 0, shardErr(g.id, "snapshot: %w", err)
	}
	meta, rc, err := f.Open()
	if err != nil {
		return 0, 0, shardErr(g.id, "opening new snapshot: %w", err)
	}
	rc.Close()
	g.logger.Info("raft snapshot taken on request", "index", meta.Index, "term", meta.Term, "size", meta.Size)
	return meta.Index, meta.Term, nil
}

// GroupStats is a point-in-time view of a group for tests and status pages;
// it carries the same figures as the Prometheus metrics.
type GroupStats struct {
	Shard        string
	State        string // "Follower", "Candidate", "Leader" or "Shutdown"
	LeaderID     string // "" if no leader is known
	LeaderAddr   string
	Term         uint64
	CommitIndex  uint64    // highest index this node knows is committed
	AppliedIndex uint64    // last command/configuration entry applied to the StateMachine
	LastLogIndex uint64    // last index in stable storage (log or snapshot)
	LastContact  time.Time // when a follower last heard from the leader; zero on the leader or if never

	ApplyBatches    uint64        // ApplyBatch calls that carried commands
	AppliedCommands uint64        // commands applied, so AppliedCommands/ApplyBatches is the mean batch
	LogStore        string        // where the group's log lives: LogStorePebble or LogStoreBolt
	LogCommits      uint64        // log store writes (StoreLogs): own fsync'd bolt transactions, or pebble log batches
	LogEntries      uint64        // entries written by those writes
	LogCommitTime   time.Duration // total time spent in those writes (until durable)

	// Packing: this replica's proposal buffer packs commands when it leads
	// (Config.Packer, and Group.EnablePacking when Config.PackingGated).
	Packing          bool
	ProposedEntries  uint64 // entries proposed through the proposal buffer (0 without Config.Packer)
	ProposedCommands uint64 // commands in those entries: ProposedCommands/ProposedEntries per entry
	// SnapshotRestores counts snapshots restored into the state machine
	// since the group opened (installs from a leader, and a catch-up at
	// open of a durable state behind the newest snapshot).
	SnapshotRestores uint64
}

// Stats returns the group's current figures.
func (g *Group) Stats() GroupStats {
	id, addr := g.Leader()
	s := GroupStats{
		Shard:           g.id,
		State:           g.raft.State().String(),
		LeaderID:        id,
		LeaderAddr:      addr,
		Term:            g.raft.CurrentTerm(),
		CommitIndex:     g.raft.CommitIndex(),
		AppliedIndex:    g.fsm.applied.Load(),
		LastLogIndex:    g.raft.LastIndex(),
		ApplyBatches:    g.fsm.batches.Load(),
		AppliedCommands: g.fsm.commands.Load(),
		LogStore:        g.logStore,
		LogCommits:      g.counted.commits.Load(),
		LogEntries:      g.counted.entries.Load(),
		LogCommitTime:   time.Duration(g.counted.commitNanos.Load()),

		SnapshotRestores: g.fsm.restores.Load(),
	}
	if g.raft.State() != raft.Leader {
		s.LastContact = g.raft.LastContact()
	}
	if g.buf != nil {
		s.Packing = g.buf.on.Load()
		s.ProposedEntries, s.ProposedCommands = g.buf.entries.Load(), g.buf.commands.Load()
	}
	return s
}

// EnablePacking switches the group's proposal buffer on (Config.Packer
// with Config.PackingGated): from the next command on, commands proposed
// while the leader stores its previous entry are packed into one entry. The caller must
// know that every voter of the group reads packed entries. One-way: there
// is no switching off, since a leader that stops packing is harmless but
// gains nothing once every voter reads packed entries (DESIGN.md,
// "Switching packing on"). It reports whether this call switched it on
// (false: already on, or no Packer).
func (g *Group) EnablePacking() bool {
	if g.buf == nil || !g.buf.on.CompareAndSwap(false, true) {
		return false
	}
	g.logger.Debug("proposal buffer on: commands queued behind in-flight entries are packed into one entry from now on")
	return true
}

// Packing reports whether the group packs commands when this replica
// leads (GroupStats.Packing).
func (g *Group) Packing() bool { return g.buf != nil && g.buf.on.Load() }

// shutdown stops the group's raft instance and closes its stores. It does
// not hand over leadership; Host.Shutdown does that first.
func (g *Group) shutdown() error {
	g.shutdownOnce.Do(func() {
		g.closed.Store(true)
		if g.buf != nil {
			g.buf.close() // before closedCh: queued proposals learn they were never proposed
		}
		close(g.closedCh)
		var errs []error
		if err := g.raft.Shutdown().Error(); err != nil {
			errs = append(errs, fmt.Errorf("raft: %w", err))
		}
		g.raft.DeregisterObserver(g.observer)
		close(g.obsCh)
		<-g.obsDone
		// No heartbeat may reach raft's log store from here on: raft does
		// not wait for one in flight on the transport (hbgate.go).
		g.trans.gate.close()
		g.trans.CloseStreams()
		if err := g.trans.Close(); err != nil {
			errs = append(errs, fmt.Errorf("transport: %w", err))
		}
		g.stream.Close()
		if err := g.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("log store: %w", err))
		}
		if err := errors.Join(errs...); err != nil {
			g.shutdownErr = shardErr(g.id, "shutdown: %w", err)
		}
	})
	return g.shutdownErr
}

// trailingEvery is how often a group re-sizes the log it keeps behind a
// snapshot to its entries' mean size.
const trailingEvery = 5 * time.Second

// boundTrailingLogs keeps the log behind a snapshot within
// Config.TrailingLogsBytes as well as Config.TrailingLogs entries: raft
// counts entries only, so it sets raft's TrailingLogs from the mean size of
// the entries this group has written.
func (g *Group) boundTrailingLogs() {
	t := time.NewTicker(trailingEvery)
	defer t.Stop()
	last := g.host.cfg.TrailingLogs
	for {
		select {
		case <-g.closedCh:
			return
		case <-t.C:
		}
		entries := g.counted.entries.Load()
		if entries == 0 {
			continue
		}
		want := g.host.cfg.trailingLogsFor(int64(g.counted.bytes.Load() / entries))
		if want == last {
			continue
		}
		rc := g.raft.ReloadableConfig()
		rc.TrailingLogs = want
		if err := g.raft.ReloadConfig(rc); err != nil {
			g.logger.Warn("could not re-size the trailing log", "entries", want, "error", err)
			continue
		}
		g.logger.Debug("trailing log re-sized", "entries", want, "mean_entry_bytes", g.counted.bytes.Load()/entries)
		last = want
	}
}
