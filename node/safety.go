package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/idem-dev/idem/internal/datadir"
	"github.com/idem-dev/idem/raftstore"
)

// faultWarnInterval is how often a node running with fault injection says so.
const faultWarnInterval = time.Minute

// unsafeWarnInterval is how often a node running with a safety check off
// says so.
const unsafeWarnInterval = 10 * time.Minute

// startError turns a refusal of the Raft layer at start into the one line
// an operator acts on: a lost state names the data dir and the way back, a
// corrupt file is named by raftstore's error.
func (n *Node) startError(shard string, err error) error {
	switch {
	case errors.Is(err, raftstore.ErrStateMissing), errors.Is(err, raftstore.ErrStateAhead):
		// Missing: no log at all. Ahead: the records survived (statedb)
		// but the log that produced them did not, so the term and vote
		// this node gave are gone as well.
		return fmt.Errorf("%w: data dir %s has %s but the Raft state of shard %s is missing or truncated; "+
			"starting on it would make fencing tokens go back, so this node refuses: bring it back as a fresh replica with "+
			"`idemctl replace-node --config FILE --id %s --data-dir %s` (it empties the dir and rejoins the node, which catches up from its peers)",
			ErrStateLost, n.cfg.DataDir, datadir.IdentityFile, shard, n.cfg.NodeID, n.cfg.DataDir)
	case errors.Is(err, raftstore.ErrCorruptLog):
		return fmt.Errorf("%w: %s; restore the data dir %s from a backup, or bring the node back as a fresh replica with "+
			"`idemctl replace-node --config FILE --id %s --data-dir %s`", ErrStateLost, oneLine(err), n.cfg.DataDir, n.cfg.NodeID, n.cfg.DataDir)
	case shard != "":
		return fmt.Errorf("node: shard %s: %s", shard, oneLine(err))
	}
	return err
}

// checkStateKept refuses a data dir whose identity file says it ran but
// whose Raft state is gone: with no log, this node would start its groups
// (the meta group first) over with no term and no vote, elect itself where
// it can, and never serve the shards its peers wait on.
func (n *Node) checkStateKept() error {
	entries, err := os.ReadDir(filepath.Join(n.cfg.DataDir, "raft"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("node: data dir %s: %w", n.cfg.DataDir, err)
	}
	if len(entries) > 0 {
		return nil
	}
	return fmt.Errorf("%w: data dir %s has %s but no Raft state (its raft directory is missing or empty): it ran before and lost its log, "+
		"so starting on it would make fencing tokens go back and could elect it with no vote recorded; this node refuses: bring it back as a fresh replica with "+
		"`idemctl replace-node --config FILE --id %s --data-dir %s` (it empties the dir and rejoins the node, which catches up from its peers), "+
		"or, for a single dev node whose data may go, start it on an empty --data-dir",
		ErrStateLost, n.cfg.DataDir, datadir.IdentityFile, n.cfg.NodeID, n.cfg.DataDir)
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// storageFailed is raftstore's OnStorageFailure: the node's Raft log failed
// a write or an fsync, so it acknowledges nothing more. The node logs one
// line, turns unready (the host reports the failure) and ends Serve with the
// error, so the process exits non-zero and a supervisor restarts it on what
// is durable. Exiting is safe: every acknowledged write is fsync'd on a
// quorum, and a restart re-reads exactly what reached this node's disk
// (the pebble log's synced WAL, or bbolt's last committed transaction),
// never the pages a failed fsync may have dropped.
func (n *Node) storageFailed(err error) {
	n.failStop("raft log storage failed: this node acknowledges no more writes and exits (restart it once the disk is fixed)", err)
}

// failStop logs msg with err once, turns the node unready and ends Serve
// with err: the process exits non-zero.
func (n *Node) failStop(msg string, err error) {
	n.failOnce.Do(func() {
		n.failure.Store(&err)
		n.log.Error(msg, "error", err)
		close(n.failed)
	})
}

// warnFaultInjection logs, at start and then every minute, which fault
// injection is in force (Config.FaultInjection).
func (n *Node) warnFaultInjection() {
	if len(n.cfg.FaultInjection) == 0 {
		return
	}
	warn := func(context.Context) {
		n.log.Warn("FAULT INJECTION is on: this node misbehaves on purpose, never run it in production", "faults", strings.Join(n.cfg.FaultInjection, ", "))
	}
	warn(context.Background())
	n.loops = append(n.loops, startLoop("fault injection warning", func(ctx context.Context) { every(ctx, faultWarnInterval, warn) }))
}

// unsafeSettingLabels are the setting labels of idem_node_unsafe_settings.
var unsafeSettingLabels = []string{"insecure", "clock_check_off", "fault_injection"}

// unsafeSettingLabel is the idem_node_unsafe_settings label of an unsafe
// setting as typed (Config.UnsafeSettings): a bounded set.
func unsafeSettingLabel(flag string) string {
	switch {
	case strings.HasPrefix(flag, "--insecure"):
		return "insecure"
	case strings.HasPrefix(flag, "--max-clock-offset"):
		return "clock_check_off"
	}
	return "fault_injection"
}

// warnUnsafeSettings logs, at start and then every ten minutes, the
// settings in force that turn a safety check off (Config.UnsafeSettings),
// and sets idem_node_unsafe_settings for each.
func (n *Node) warnUnsafeSettings() {
	for _, label := range unsafeSettingLabels {
		n.unsafeGauge.WithLabelValues(label).Set(0) // exported while safe too
	}
	for _, s := range n.cfg.UnsafeSettings {
		n.unsafeGauge.WithLabelValues(unsafeSettingLabel(s)).Set(1)
	}
	if len(n.cfg.UnsafeSettings) == 0 {
		return
	}
	warn := func(context.Context) {
		n.log.Warn("UNSAFE SETTINGS in force: a safety check is off on this node (see /readyz and idem_node_unsafe_settings)",
			"settings", strings.Join(n.cfg.UnsafeSettings, ", "))
	}
	warn(context.Background())
	n.loops = append(n.loops, startLoop("unsafe settings warning", func(ctx context.Context) { every(ctx, unsafeWarnInterval, warn) }))
}

// watchRejoin clears the identity's Rejoining marker once every shard of a
// node brought back by idemctl replace-node has caught up (a leader known,
// this replica a member again and holding state): from then on lost state is
// refused again.
func (n *Node) watchRejoin(ctx context.Context) {
	if !n.identity.Rejoining {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		if n.rejoined() {
			id := n.identity
			id.Rejoining = false
			if err := datadir.WriteFile(filepath.Join(n.cfg.DataDir, datadir.IdentityFile), id); err != nil {
				n.log.Error("could not clear the rejoin marker", "error", err)
			} else {
				n.log.Info("rejoined: every shard caught up; lost state is refused again from now on")
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (n *Node) rejoined() bool {
	if n.host.Ready() != nil {
		return false
	}
	for _, s := range n.shardMap() {
		if !s.group.IsMember() {
			return false
		}
	}
	return true
}
