package raftstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/raft"
)

// Errors returned by raftstore. Library errors (hashicorp/raft, bbolt) are
// translated into these at the package boundary, so callers only ever test
// with errors.Is against this list.
var (
	// ErrNotLeader means this node does not lead the group, so the command was
	// definitely NOT applied. The error is usually a *NotLeaderError carrying
	// the leader this node knows of; send the request there.
	ErrNotLeader = errors.New("raftstore: not the leader")

	// ErrUnknownOutcome means the command was handed to Raft but the proposer
	// stopped waiting before learning its fate (leadership lost while
	// committing, deadline reached, shutdown): it may or may not have been
	// applied. Retry only with an idempotent command, or read back first.
	ErrUnknownOutcome = errors.New("raftstore: outcome unknown, the command may or may not have been applied")

	// ErrShutdown means the group or host is shut down (or shutting down).
	ErrShutdown = errors.New("raftstore: shut down")

	// ErrEnqueueTimeout means the leader was too busy to accept the command
	// before the deadline; it was NOT applied and is safe to retry.
	ErrEnqueueTimeout = errors.New("raftstore: leader too busy, command not enqueued (not applied)")

	// ErrNotReady means a hosted group has no known leader yet or this node
	// has not caught up with the log it knows is committed.
	ErrNotReady = errors.New("raftstore: not ready")

	// ErrStoreConflict is returned by NewHost when the data dir holds both
	// log stores (a pebble log and bolt files per group): which one is
	// current cannot be known, so the host refuses to start.
	ErrStoreConflict = errors.New("raftstore: data dir holds two Raft log stores")

	// ErrLogStoreMismatch is returned by NewHost when the data dir holds
	// another log store than Config.LogStore names: the groups would not
	// find their logs in the named one and would bootstrap again.
	ErrLogStoreMismatch = errors.New("raftstore: data dir holds another Raft log store than configured")

	// ErrUnsupportedLog is returned by NewHost when the data dir holds a
	// Raft log this release cannot read (the shared bolt log of development
	// builds, DataDir/log.db): ignoring it would start the node with no
	// log, as a new member, while peers count it as holding its old votes
	// and entries.
	ErrUnsupportedLog = errors.New("raftstore: data dir holds a Raft log store this release does not read")

	// ErrStateAhead is returned by AddGroup when a DurableStateMachine's
	// state covers log entries this node's Raft log and snapshots do not
	// hold (the Raft data was removed or replaced while the state was
	// kept): starting would skip new entries as if applied. Move one of the
	// two away (or replace the node) before starting.
	ErrStateAhead = errors.New("raftstore: state machine is ahead of the Raft log")

	// ErrGroupExists is returned by AddGroup for a shard id already hosted.
	ErrGroupExists = errors.New("raftstore: group already hosted")

	// ErrUnknownPeer is returned by TransferLeadership for a target that is
	// not a voter of the group.
	ErrUnknownPeer = errors.New("raftstore: not a voter of this group")

	// ErrNothingToSnapshot is returned by Snapshot when nothing was ever
	// applied, so there is no state to capture.
	ErrNothingToSnapshot = errors.New("raftstore: nothing to snapshot")

	// ErrStorageFailed means a write or an fsync of this node's Raft log
	// failed. The log fails stop: it takes no more writes (what the failed
	// commit carried may or may not be on disk, and an fsync error may have
	// dropped pages), so this node acknowledges nothing more; its groups
	// lose this replica until the disk is fixed and the node restarted.
	ErrStorageFailed = errors.New("raftstore: storage failed")

	// ErrCorruptLog means the node's Raft log file cannot be read (a damaged
	// or foreign file). The host refuses to open rather than guess.
	ErrCorruptLog = errors.New("raftstore: Raft log file is corrupt")

	// ErrCorruptSnapshot means a snapshot's header is damaged (its checksum
	// does not match, or its magic or version is unknown): nothing of it was
	// applied. The state machine's own checks of the state bytes report
	// their own errors (fsm.ErrCorrupt), wrapped the same way.
	ErrCorruptSnapshot = errors.New("raftstore: snapshot is corrupt")

	// ErrStateMissing is returned by AddGroup with StartRequireState for a
	// group that has no state on disk: it was lost.
	ErrStateMissing = errors.New("raftstore: the group's Raft state is missing")
)

// shardErr builds "raftstore: shard <id>: <message>" from a fmt format,
// wrapping every %w operand. The package prefix of wrapped raftstore errors
// is dropped from the text so it appears once.
func shardErr(id, format string, args ...any) error {
	return &shardError{shard: id, err: fmt.Errorf(format, args...)}
}

type shardError struct {
	shard string
	err   error
}

func (e *shardError) Error() string {
	return "raftstore: shard " + e.shard + ": " + strings.ReplaceAll(e.err.Error(), "raftstore: ", "")
}

func (e *shardError) Unwrap() error { return e.err }

// NotLeaderError is ErrNotLeader with the leader this node knows of. Both
// fields are empty when no leader is known (election in progress, or a
// leadership transfer is under way). It unwraps to ErrNotLeader.
type NotLeaderError struct {
	Shard      string // group (shard) id
	LeaderID   string // raft server id (node id) of the leader, "" if unknown
	LeaderAddr string // raft address of the leader, "" if unknown
}

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return fmt.Sprintf("raftstore: not the leader of shard %s (leader unknown, retry shortly)", e.Shard)
	}
	return fmt.Sprintf("raftstore: not the leader of shard %s (leader is %s at %s)", e.Shard, e.LeaderID, e.LeaderAddr)
}

// Unwrap makes errors.Is(err, ErrNotLeader) true.
func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// phase says how far a proposal got before an error, which decides whether
// an ambiguous library error means "not applied" or "outcome unknown".
type phase int

const (
	phaseBeforeEnqueue phase = iota // raft never accepted the command
	phaseAfterEnqueue               // raft accepted it; its fate may be unknown
)

// translate maps an error from hashicorp/raft (or a context error) for an
// operation on group g onto raftstore's sentinels. It returns nil for nil.
func (g *Group) translate(err error, p phase) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		// raft only returns these before the command was dispatched into the
		// log (follower loop, or a leader that is stepping down or handing
		// over), so the command was not applied.
		return g.notLeader()
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return shardErr(g.id, "%w: %w", ErrEnqueueTimeout, context.DeadlineExceeded)
	case errors.Is(err, raft.ErrRaftShutdown):
		if p == phaseBeforeEnqueue {
			return shardErr(g.id, "%w", ErrShutdown)
		}
		return shardErr(g.id, "%w: %w", ErrShutdown, ErrUnknownOutcome)
	case errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrAbortedByRestore):
		return shardErr(g.id, "%w: %v", ErrUnknownOutcome, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		if p == phaseBeforeEnqueue {
			return shardErr(g.id, "%w", err)
		}
		return shardErr(g.id, "%w: %w", ErrUnknownOutcome, err)
	default:
		// Anything else (a failed log write, ...) after enqueueing leaves the
		// outcome open; before, nothing happened.
		if p == phaseBeforeEnqueue {
			return shardErr(g.id, "%v", err)
		}
		return shardErr(g.id, "%w: %v", ErrUnknownOutcome, err)
	}
}

// notLeader builds the NotLeaderError from what raft currently believes.
func (g *Group) notLeader() error {
	addr, id := g.raft.LeaderWithID()
	e := &NotLeaderError{Shard: g.id, LeaderID: string(id), LeaderAddr: string(addr)}
	if e.LeaderID == g.host.cfg.NodeID {
		// We were told we are not (or no longer) the leader while raft still
		// names us: a stepdown or transfer is in flight. Pointing the caller
		// at ourselves would make it loop, so report "unknown".
		e.LeaderID, e.LeaderAddr = "", ""
	}
	return e
}
