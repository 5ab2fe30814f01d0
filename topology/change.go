package topology

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// MaxMetaVoters bounds the voters of the meta group (the replicated record
// of the active topology): five survive two failures, and more would only
// slow its rare writes.
const MaxMetaVoters = 5

// MetaMembers returns the members of the cluster's meta group, the small
// Raft group that replicates the active topology: voters (up to
// MaxMetaVoters, an odd number when the cluster has at least three nodes,
// spread over the regions round-robin, each region's nodes in id order) and
// every other node as a non-voting member, so that every node holds the
// topology on its own disk after any restart. A pure function of the file,
// as placement is.
func (t *Topology) MetaMembers() (voters, nonvoters []string) {
	regions := slices.Clone(t.Regions)
	slices.SortFunc(regions, func(a, b Region) int { return strings.Compare(a.Name, b.Name) })
	lists := make([][]string, len(regions))
	total := 0
	for i, r := range regions {
		for _, n := range r.Nodes {
			lists[i] = append(lists[i], n.ID)
		}
		slices.Sort(lists[i])
		total += len(lists[i])
	}
	want := min(total, MaxMetaVoters)
	if want > 1 && want%2 == 0 {
		want-- // an even count adds no fault tolerance
	}
	chosen := map[string]bool{}
	for depth := 0; len(voters) < want; depth++ {
		for _, l := range lists {
			if depth < len(l) && len(voters) < want {
				voters = append(voters, l[depth])
				chosen[l[depth]] = true
			}
		}
	}
	for _, l := range lists {
		for _, id := range l {
			if !chosen[id] {
				nonvoters = append(nonvoters, id)
			}
		}
	}
	slices.Sort(nonvoters)
	return voters, nonvoters
}

// Change is what applying a new topology file to a cluster does (Plan).
type Change struct {
	// From and To are the active and the new version.
	From int `json:"from_version"`
	To   int `json:"to_version"`
	// Joining and Leaving list the nodes only in the new or only in the
	// active file.
	Joining []string `json:"joining,omitempty"`
	Leaving []string `json:"leaving,omitempty"`
	// Shards lists, for every shard whose voters change, the voters added
	// and removed.
	Shards []ShardChange `json:"shards,omitempty"`
	// SeatsMoved is the number of voter seats the change adds (each added
	// seat is a replica that catches up from a snapshot); MinSeatsMoved is
	// a lower bound any balanced placement of the new file must add (the
	// seats of leaving nodes and of a larger replicas, or the fair share
	// of every joining node, whichever is more).
	SeatsMoved    int `json:"seats_moved"`
	MinSeatsMoved int `json:"min_seats_moved"`
	// ShardsCreated and ShardsRemoved list the shards only the new or only
	// the active file has (shards_per_region or the regions changed).
	ShardsCreated []string `json:"shards_created,omitempty"`
	ShardsRemoved []string `json:"shards_removed,omitempty"`
	// KeysMovedShare is the share of keys whose home shard changes (their
	// ring partitions move to another shard's Raft group, records and
	// all); RegionMovedShare the share whose home region changes.
	KeysMovedShare   float64 `json:"keys_moved_share"`
	RegionMovedShare float64 `json:"region_moved_share"`
	// Meta is the meta group's voters after the change.
	MetaVoters []string `json:"meta_voters"`
}

// ShardChange is one shard's voter change.
type ShardChange struct {
	ID     string   `json:"id"`
	Add    []string `json:"add,omitempty"`
	Remove []string `json:"remove,omitempty"`
	// Voters are the shard's voters in the new file, preferred leader first.
	Voters []string `json:"voters"`
}

// Empty reports whether the change moves nothing.
func (c *Change) Empty() bool {
	return len(c.Joining) == 0 && len(c.Leaving) == 0 && len(c.Shards) == 0 && len(c.ShardsCreated) == 0 && len(c.ShardsRemoved) == 0
}

// PlanError lists every reason a new file cannot be applied to the
// cluster.
type PlanError struct{ Reasons []string }

func (e *PlanError) Error() string {
	return "topology: the change cannot be applied: " + strings.Join(e.Reasons, "; ")
}

// Plan compares next with the cluster's active topology and returns the
// change applying it makes, or a *PlanError with every reason it cannot be
// applied: a changed cluster name or ring section (never allowed), a
// version other than the active one + 1, a node that changes region, or a
// file Validate refuses. Regions and shards_per_region may change: whole
// ring partitions then move to other shards (Change.KeysMovedShare). Both must be valid topologies
// unless the error says otherwise.
func Plan(active, next *Topology) (*Change, error) {
	var reasons []string
	if err := next.Validate(); err != nil {
		reasons = append(reasons, err.Error())
	}
	if active.Cluster != next.Cluster {
		reasons = append(reasons, fmt.Sprintf("cluster: %q, the cluster is %q: the cluster name never changes", next.Cluster, active.Cluster))
	}
	if active.Ring.effective() != next.Ring.effective() {
		reasons = append(reasons, "ring: the ring section differs from the cluster's: ring parameters never change (every key would move)")
	}
	if want := active.EffectiveVersion() + 1; next.EffectiveVersion() != want {
		reasons = append(reasons, fmt.Sprintf("version: %d, the active version is %d: a change must say version: %d",
			next.EffectiveVersion(), active.EffectiveVersion(), want))
	}
	for _, n := range next.Nodes() {
		if o, ok := active.NodeByID(n.ID); ok && o.Region != n.Region {
			reasons = append(reasons, fmt.Sprintf("node %s: moved from region %s to %s: remove it and add a node with a new id instead", n.ID, o.Region, n.Region))
		}
	}
	if len(reasons) > 0 {
		return nil, &PlanError{Reasons: reasons}
	}
	c := diff(active, next)
	from, err1 := NewRing(active)
	to, err2 := NewRing(next)
	if err := errors.Join(err1, err2); err != nil {
		return nil, &PlanError{Reasons: []string{err.Error()}}
	}
	c.KeysMovedShare, c.RegionMovedShare = from.MovedShares(to)
	return c, nil
}

// diff computes the change between two valid topologies with the same
// shard set.
func diff(active, next *Topology) *Change {
	c := &Change{From: active.EffectiveVersion(), To: next.EffectiveVersion()}
	has := func(t *Topology, id string) bool { _, ok := t.NodeByID(id); return ok }
	for _, n := range next.Nodes() {
		if !has(active, n.ID) {
			c.Joining = append(c.Joining, n.ID)
		}
	}
	for _, n := range active.Nodes() {
		if !has(next, n.ID) {
			c.Leaving = append(c.Leaving, n.ID)
		}
	}
	slices.Sort(c.Joining)
	slices.Sort(c.Leaving)
	before := map[string]Shard{}
	for _, s := range active.Shards() {
		before[s.ID] = s
	}
	after := map[string]bool{}
	for _, s := range next.Shards() {
		after[s.ID] = true
		if _, ok := before[s.ID]; !ok {
			c.ShardsCreated = append(c.ShardsCreated, s.ID)
		}
	}
	for _, s := range active.Shards() {
		if !after[s.ID] {
			c.ShardsRemoved = append(c.ShardsRemoved, s.ID)
		}
	}
	filled := 0 // seats that must be filled: of leaving nodes, or new ones
	for _, s := range next.Shards() {
		old := before[s.ID]
		sc := ShardChange{ID: s.ID, Voters: slices.Clone(s.Voters)}
		for _, v := range s.Voters {
			if !old.HasVoter(v) {
				sc.Add = append(sc.Add, v)
			}
		}
		staying := 0
		for _, v := range old.Voters {
			if !s.HasVoter(v) {
				sc.Remove = append(sc.Remove, v)
			}
			if has(next, v) {
				staying++
			}
		}
		filled += max(0, len(s.Voters)-staying)
		c.SeatsMoved += len(sc.Add)
		if len(sc.Add) > 0 || len(sc.Remove) > 0 {
			c.Shards = append(c.Shards, sc)
		}
	}
	// Every joining node must take at least its fair share of its region's
	// seats in any balanced placement.
	share := 0
	seats := map[string]int{}
	for _, s := range next.Shards() {
		for _, v := range s.Voters {
			r, _ := next.RegionOf(v)
			seats[r]++
		}
	}
	for _, id := range c.Joining {
		r, _ := next.RegionOf(id)
		reg, _ := next.RegionByName(r)
		share += seats[r] / len(reg.Nodes)
	}
	c.MinSeatsMoved = max(filled, share)
	c.MetaVoters, _ = next.MetaMembers()
	return c
}

// SameShape reports whether a and b describe the same cluster shape: equal
// after defaults, whatever the order of regions and nodes in the files.
// Two files of one version must have the same shape.
func SameShape(a, b *Topology) bool {
	norm := func(t *Topology) *Topology {
		c := t.Clone()
		c.Version = c.EffectiveVersion()
		c.Ring = c.Ring.effective()
		slices.SortFunc(c.Regions, func(x, y Region) int { return strings.Compare(x.Name, y.Name) })
		for i := range c.Regions {
			slices.SortFunc(c.Regions[i].Nodes, func(x, y Node) int { return strings.Compare(x.ID, y.ID) })
		}
		return c
	}
	return reflect.DeepEqual(norm(a), norm(b))
}
