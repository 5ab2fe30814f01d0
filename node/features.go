package node

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// FeaturePackedEntries is the feature a node advertises on Admin.Clock
// (ClockResponse.features) when its release reads packed Raft entries
// (many commands in one entry, raftstore's proposal buffer) and it agrees
// to their being written to the logs of the shards it votes in.
const FeaturePackedEntries = "packed-entries"

// PackMode is --raft-pack-commands: whether this node, when it leads a
// shard, packs commands queued behind in-flight Raft entries into one entry.
type PackMode int

const (
	// PackAuto (the default) packs in a shard once every voter of it was
	// seen advertising FeaturePackedEntries, and from then on (latched).
	PackAuto PackMode = iota
	// PackOn always packs: every node must run a release that reads
	// packed entries (the operator vouches for it).
	PackOn
	// PackOff never packs, and the node does not advertise
	// FeaturePackedEntries: its Clock answer is on the wire what a release
	// without packing sends, so no shard it votes in starts packing
	// (shards that already pack go on: see DESIGN.md "Switching packing on").
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

// features is what this node advertises to its peers on Admin.Clock.
func (n *Node) features() []string {
	if n.cfg.PackCommands == PackOff {
		return nil
	}
	return []string{FeaturePackedEntries}
}

// packGate is the feature gate of PackAuto: a shard packs once every voter
// of it is known to read packed entries, and stays packing (latched). This
// node counts as one (it runs this release); every other voter must have
// advertised FeaturePackedEntries in a fresh Clock answer (clocks.fresh:
// younger than clockEstimateTTL). A voter never heard from, or whose last
// answer is stale, lacks the feature or came from a release without
// Admin.Clock, counts as not supporting it.
type packGate struct {
	self string
	mu   sync.Mutex
	on   map[string]bool // shards latched on
}

func newPackGate(self string) *packGate { return &packGate{self: self, on: map[string]bool{}} }

// decide reports whether the shard with voters packs: on is the latched
// verdict, switched is true only on the call that latched it, and why says
// what decided (for the log line) or, while off, which voters hold it back.
// packedBefore is fsm.PackedTokens of this replica: a packed entry was
// committed in the shard already (so its voters read packed entries; and a
// release without packing could not carry the shard on anyway).
func (g *packGate) decide(shard string, voters []string, fresh map[string]peerClock, packedBefore bool) (on, switched bool, why string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.on[shard] {
		return true, false, "latched"
	}
	var missing []string
	for _, v := range voters {
		if v == g.self {
			continue
		}
		if r, ok := fresh[v]; !ok || !r.packedEntries {
			missing = append(missing, v)
		}
	}
	switch {
	case packedBefore:
		why = "the shard's state already holds packed entries"
	case len(missing) == 0:
		why = "every voter advertises " + FeaturePackedEntries + ": " + strings.Join(slices.Sorted(slices.Values(voters)), ", ")
	default:
		return false, false, "not known to read packed entries: " + strings.Join(missing, ", ")
	}
	g.on[shard] = true
	return true, true, why
}

// gatePacking runs the gate over every hosted shard (after each round of
// clock probes) and switches on the proposal buffer of each shard it
// latches.
func (n *Node) gatePacking() {
	if n.cfg.PackCommands != PackAuto || n.packGate == nil {
		return
	}
	fresh := n.clocks.fresh()
	for _, id := range n.shardIDs() {
		s := n.shard(id)
		if s.group.Packing() {
			continue
		}
		on, _, why := n.packGate.decide(id, n.voters(id, true), fresh, s.fsm.PackedTokens())
		if on && s.group.EnablePacking() {
			n.log.Info("shard packs commands into Raft entries from now on (--raft-pack-commands=auto)", "shard", id, "reason", why)
		}
	}
}
