package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/datadir"
	"github.com/idem-dev/idem/topology"
)

// PackMode is --raft-pack-commands: whether this node, when it leads a
// shard, packs commands queued behind in-flight Raft entries into one entry.
type PackMode int

const (
	// PackAuto (the default) packs once the cluster version reached
	// VersionPackedEntries (it never goes down again).
	PackAuto PackMode = iota
	// PackOn always packs: every node must run a release that reads
	// packed entries (the operator vouches for it).
	PackOn
	// PackOff never packs, and the node advertises VersionBaseline: while
	// it is in the cluster the cluster version stays below packing (and
	// partition handoff), so going back to a release without packing stays
	// possible. It does not lower a cluster version already past it (see
	// DESIGN.md "Switching packing on").
	PackOff
)

func (m PackMode) String() string {
	switch m {
	case PackAuto:
		return "auto"
	case PackOn:
		return "on"
	case PackOff:
		return "off"
	}
	return fmt.Sprintf("PackMode(%d)", int(m))
}

// Set implements flag.Value (ParsePackMode).
func (m *PackMode) Set(s string) error {
	v, err := ParsePackMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// IsBoolFlag lets a bare --raft-pack-commands mean on (the flag package
// then calls Set("true")), as when the flag was a bool.
func (*PackMode) IsBoolFlag() bool { return true }

// ParsePackMode reads auto, on or off; true and false (and the other
// spellings strconv.ParseBool accepts) mean on and off.
func ParsePackMode(s string) (PackMode, error) {
	switch strings.ToLower(s) {
	case "auto":
		return PackAuto, nil
	case "on", "true", "1", "t":
		return PackOn, nil
	case "off", "false", "0", "f":
		return PackOff, nil
	}
	return 0, fmt.Errorf("%q is not a packing mode (auto, on or off)", s)
}

// The cluster version, as etcd's: every release supports one (its
// ReleaseVersion), each node advertises it on Admin.Clock, the meta group's
// leader raises the cluster version to the minimum over every node of the
// topology (a node not heard from counts as VersionBaseline) and stores it
// in the meta group, so that every node reads the same one from its replica
// and it never goes down. A feature that changes what replicas must
// understand switches on when the cluster version reaches the version that
// brought it; a node refuses to start on a data dir whose cluster version is
// above its release's (going back below the cluster version is not
// supported).
const (
	// VersionBaseline: a release that neither reads packed Raft entries
	// nor applies the partition commands; what a node that does not
	// advertise a version (a release before the cluster version) counts
	// as, unless its Clock answer lists "packed-entries".
	VersionBaseline = 1
	// VersionPackedEntries: replicas read many commands in one Raft entry
	// (raftstore's proposal buffer); --raft-pack-commands=auto packs from
	// here on.
	VersionPackedEntries = 2
	// VersionPartitionHandoff: replicas apply the partition commands
	// (adopt, freeze, import, open, drop); the mover moves keys between
	// shards from here on.
	VersionPartitionHandoff = 3
	// VersionFencedHandoff: replicas apply fenced partition commands (the
	// attempt, the source's clock and the open's digest: fsm DESIGN.md,
	// "Fenced attempts"); the mover moves keys between shards from here on,
	// and only with them.
	VersionFencedHandoff = 4

	// ReleaseVersion is the cluster version this release supports.
	ReleaseVersion = VersionFencedHandoff
)

// featurePackedEntries is what releases before the cluster version
// advertised on Admin.Clock for VersionPackedEntries, and
// featurePartitionHandoff what they listed in ShardState answers for
// VersionPartitionHandoff: still sent for their leaders during a rolling
// upgrade, and the first read from a peer that advertises no version.
const (
	featurePackedEntries    = "packed-entries"
	featurePartitionHandoff = "partition-handoff"
)

// versionNames says what each cluster version brought (log lines, errors).
var versionNames = map[int]string{
	VersionBaseline:         "baseline",
	VersionPackedEntries:    "packed entries",
	VersionPartitionHandoff: "partition handoff",
	VersionFencedHandoff:    "fenced handoff",
}

// versionName is v with what it brought, e.g. "2 (packed entries)".
func versionName(v int) string {
	if name, ok := versionNames[v]; ok {
		return fmt.Sprintf("%d (%s)", v, name)
	}
	return strconv.Itoa(v)
}

// ErrClusterVersion: the cluster version is below the version a feature
// needs, or above this release's (the node refuses to start).
var ErrClusterVersion = errors.New("node: cluster version")

// advertisedVersion is the cluster version this node advertises: its
// release's, or VersionBaseline with --raft-pack-commands=off (which keeps
// going back to a release without packing possible).
func (n *Node) advertisedVersion() int {
	if n.cfg.PackCommands == PackOff {
		return VersionBaseline
	}
	return ReleaseVersion
}

// clockFeatures is the features field of this node's Clock answer, for the
// leaders of a release before the cluster version.
func clockFeatures(advertised int) []string {
	if advertised >= VersionPackedEntries {
		return []string{featurePackedEntries}
	}
	return nil
}

// peerVersion is the cluster version a peer's Clock answer advertises: its
// advertised_version, or for a release before the cluster version what its
// features say.
func peerVersion(resp *idemv1.ClockResponse) int {
	if v := resp.GetAdvertisedVersion(); v > 0 {
		return int(v)
	}
	if slices.Contains(resp.GetFeatures(), featurePackedEntries) {
		return VersionPackedEntries
	}
	return VersionBaseline
}

// effectiveVersion is a stored cluster version read as one: 0 (none
// recorded yet) is VersionBaseline.
func effectiveVersion(stored int) int { return max(stored, VersionBaseline) }

// clusterVersion is the cluster version as this node's meta replica holds
// it.
func (n *Node) clusterVersion() int {
	mv, _ := n.meta.read()
	return effectiveVersion(mv.clusterVersion)
}

// versionCount is the nodes the meta group's leader counts for the cluster
// version: every node of the active topology and of a running change's
// target, but those the change declared dead (they never answer again).
func versionCount(mv metaView) []string {
	seen := map[string]bool{}
	var out []string
	for _, t := range []*topology.Topology{mv.active, mv.target} {
		if t == nil {
			continue
		}
		for _, nd := range t.Nodes() {
			if !seen[nd.ID] && !slices.Contains(mv.dead, nd.ID) {
				seen[nd.ID] = true
				out = append(out, nd.ID)
			}
		}
	}
	slices.Sort(out)
	return out
}

// minVersion is the cluster version nodes support together: the minimum
// of what each advertised (versions; self's own is given), a node missing
// from versions counting as VersionBaseline; behind lists the nodes below
// want, each with what it advertised ("not heard from" when nothing).
func minVersion(nodes []string, self string, own int, versions map[string]int, want int) (low int, behind []string) {
	low = own
	for _, id := range nodes {
		v, ok := own, true
		if id != self {
			v, ok = versions[id]
			if !ok {
				v = VersionBaseline
			}
		}
		low = min(low, v)
		switch {
		case !ok && want > VersionBaseline:
			behind = append(behind, id+" (not heard from)")
		case v < want:
			behind = append(behind, fmt.Sprintf("%s (advertises %d)", id, v))
		}
	}
	return low, behind
}

// raiseClusterVersion runs on the meta group's leader (every
// clockProbeInterval): it asks every node it must count and has no fresh answer
// from, and when the minimum of what they advertise is above the stored
// cluster version, proposes it. Never lower: the meta state machine
// ignores a version at or below the stored one.
func (n *Node) raiseClusterVersion(ctx context.Context) {
	mv, _ := n.meta.read()
	own := n.advertisedVersion()
	if mv.active == nil || !n.metaGroup.IsLeader() || effectiveVersion(mv.clusterVersion) >= own {
		return
	}
	nodes := versionCount(mv)
	n.clocks.askVersions(ctx, nodes)
	low, _ := minVersion(nodes, n.cfg.NodeID, own, n.clocks.versions(), own)
	if low <= effectiveVersion(mv.clusterVersion) {
		return
	}
	if err := n.proposeMeta(ctx, metaCommand{Op: "cluster-version", ClusterVersion: low}); err != nil {
		n.log.Warn("raising the cluster version failed; trying again", "cluster_version", low, "error", err)
	}
}

// needVersion returns nil when the cluster version is at least want, or
// an error naming the nodes that hold it back (as this node last heard
// them: the meta group's leader asks every node).
func (n *Node) needVersion(mv metaView, want int, what string) error {
	if short := n.versionShortfall(mv, want, what); short != "" {
		return fmt.Errorf("%w %s", ErrClusterVersion, short)
	}
	return nil
}

// versionShortfall is needVersion's reason without the error's prefix:
// "1 (baseline) is below 3 (...), which <what> needs; held back by ...",
// or "" when the cluster version is want or above.
func (n *Node) versionShortfall(mv metaView, want int, what string) string {
	cv := effectiveVersion(mv.clusterVersion)
	if cv >= want {
		return ""
	}
	_, behind := minVersion(versionCount(mv), n.cfg.NodeID, n.advertisedVersion(), n.clocks.versions(), want)
	held := "no node; the meta group's leader raises it within seconds"
	if len(behind) > 0 {
		held = strings.Join(behind, ", ") + ": upgrade them (or drop --raft-pack-commands=off)"
	}
	return fmt.Sprintf("%s is below %s, which %s needs; held back by %s", versionName(cv), versionName(want), what, held)
}

// noteClusterVersion follows the cluster version of this node's meta
// replica: the gauge, a log line when it rises, and the data dir's record
// (checkClusterVersion reads it at start).
//
// A replica showing a cluster version above this release's (a node of an
// older release that joined, or caught up with, a newer cluster) stops the
// node: its release cannot read what the cluster's logs may hold.
func (n *Node) noteClusterVersion() {
	cv := n.clusterVersion()
	prev := int(n.seenVersion.Swap(int64(cv)))
	if cv <= prev {
		return
	}
	if err := writeClusterVersion(n.cfg.DataDir, cv); err != nil {
		n.log.Warn("recording the cluster version in the data dir failed", "error", err)
	}
	if cv > ReleaseVersion {
		n.failStop("the cluster version is above this release's: this node exits (run a release that supports it)",
			fmt.Errorf("%w %s is above this release's %s: going back below the cluster version is not supported", ErrClusterVersion, versionName(cv), versionName(ReleaseVersion)))
		return
	}
	n.clusterVersionGauge.Set(float64(cv))
	if prev > 0 {
		n.log.Info("cluster version rose", "cluster_version", cv, "from", prev, "brings", versionNames[cv])
	} else {
		n.log.Info("cluster version", "cluster_version", cv, "release_version", ReleaseVersion, "advertised_version", n.advertisedVersion())
	}
}

// clusterVersionFile records in the data dir the highest cluster version
// the node saw ({"cluster_version": N}), so that a release below it refuses
// to start before it opens anything.
const clusterVersionFile = "cluster_version.json"

type clusterVersionRecord struct {
	ClusterVersion int `json:"cluster_version"`
}

func writeClusterVersion(dir string, v int) error {
	if old, err := readClusterVersion(dir); err == nil && old >= v {
		return nil
	}
	return datadir.WriteFile(filepath.Join(dir, clusterVersionFile), clusterVersionRecord{ClusterVersion: v})
}

// readClusterVersion is the recorded cluster version, 0 without a record.
func readClusterVersion(dir string) (int, error) {
	var rec clusterVersionRecord
	_, err := datadir.ReadFile(filepath.Join(dir, clusterVersionFile), &rec)
	return rec.ClusterVersion, err
}

// checkClusterVersion refuses a data dir whose cluster version (recorded,
// or in the meta state restored from it) is above this release's.
func checkClusterVersion(dir string, stored int) error {
	rec, err := readClusterVersion(dir)
	if err != nil {
		return err
	}
	if v := max(rec, stored); v > ReleaseVersion {
		return fmt.Errorf("%w: the data dir %s holds cluster version %s, above this release's %s: going back below the cluster version is not supported; run a release that supports %d or later",
			ErrClusterVersion, dir, versionName(v), versionName(ReleaseVersion), v)
	}
	return nil
}

// gatePacking is --raft-pack-commands=auto's gate: once the cluster
// version reached VersionPackedEntries, it switches on the proposal buffer
// of every hosted shard (run every clockProbeInterval, so shards
// opened later switch too). The cluster version never goes down, so
// neither does a shard's packing.
func (n *Node) gatePacking() {
	if n.cfg.PackCommands != PackAuto {
		return
	}
	cv := n.clusterVersion()
	if cv < VersionPackedEntries {
		return
	}
	for _, s := range n.hosted() {
		if !s.group.Packing() && s.group.EnablePacking() {
			n.log.Info("shard packs commands into Raft entries from now on (--raft-pack-commands=auto)", "shard", s.id, "cluster_version", cv)
		}
	}
}

// followClusterVersion is the cluster version's round (its own loop, every
// clockProbeInterval, so that a slow meta proposal never delays the clock
// probes): the meta group's leader raises it, every node notes what its
// replica holds and switches packing on when it allows.
func (n *Node) followClusterVersion(ctx context.Context) {
	n.raiseClusterVersion(ctx)
	n.noteClusterVersion()
	n.gatePacking()
}
