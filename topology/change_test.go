package topology

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// withNode returns t at the next version with node id added to region.
func withNode(t *Topology, region, id string, port int) *Topology {
	c := t.Clone()
	c.Version = t.EffectiveVersion() + 1
	for i := range c.Regions {
		if c.Regions[i].Name == region {
			c.Regions[i].Nodes = append(c.Regions[i].Nodes, Node{ID: id, Region: region,
				RaftAddr: "127.0.0.1:" + itoa(port), GRPCAddr: "127.0.0.1:" + itoa(port+1), HTTPAddr: "127.0.0.1:" + itoa(port+2)})
		}
	}
	return c
}

// without returns t at the next version without node id.
func without(t *Topology, id string) *Topology {
	c := t.Clone()
	c.Version = t.EffectiveVersion() + 1
	for i := range c.Regions {
		c.Regions[i].Nodes = slices.DeleteFunc(c.Regions[i].Nodes, func(n Node) bool { return n.ID == id })
	}
	return c
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestPlanAddAndRemoveNode(t *testing.T) {
	base := loadTestdata(t, "three-node.yaml")
	grown := withNode(base, "us-east", "us-east-4", 17000)
	c, err := Plan(base, grown)
	if err != nil {
		t.Fatalf("Plan(add a node): %v", err)
	}
	if c.From != 1 || c.To != 2 || !slices.Equal(c.Joining, []string{"us-east-4"}) || len(c.Leaving) != 0 {
		t.Fatalf("change %+v", c)
	}
	if c.SeatsMoved == 0 || c.SeatsMoved < c.MinSeatsMoved {
		t.Fatalf("seats moved %d, lower bound %d", c.SeatsMoved, c.MinSeatsMoved)
	}
	added := 0
	for _, s := range c.Shards {
		if len(s.Add) != len(s.Remove) {
			t.Errorf("shard %s: adds %v removes %v: replicas unchanged, so every added seat replaces one", s.ID, s.Add, s.Remove)
		}
		added += len(s.Add)
		ring, _ := NewRing(grown)
		got, _ := ring.ShardByID(s.ID)
		if !slices.Equal(got.Voters, s.Voters) {
			t.Errorf("shard %s: plan voters %v, placement %v", s.ID, s.Voters, got.Voters)
		}
	}
	if added != c.SeatsMoved {
		t.Fatalf("seats moved %d, per-shard adds %d", c.SeatsMoved, added)
	}
	// Membership changes keep where every key lives.
	r1, _ := NewRing(base)
	r2, _ := NewRing(grown)
	if r1.LayoutFingerprint() != r2.LayoutFingerprint() {
		t.Fatal("adding a node changed the layout fingerprint")
	}
	if r1.Fingerprint() == r2.Fingerprint() {
		t.Fatal("adding a node kept the voter fingerprint")
	}
	if c.KeysMovedShare != 0 {
		t.Fatalf("keys moved %v", c.KeysMovedShare)
	}

	shrunk := without(grown, "us-east-1")
	c, err = Plan(grown, shrunk)
	if err != nil {
		t.Fatalf("Plan(remove a node): %v", err)
	}
	if !slices.Equal(c.Leaving, []string{"us-east-1"}) || c.To != 3 {
		t.Fatalf("change %+v", c)
	}
	for _, s := range c.Shards {
		if slices.Contains(s.Voters, "us-east-1") {
			t.Fatalf("shard %s keeps the leaving node: %v", s.ID, s.Voters)
		}
	}
	// The same file again is no change at the next version.
	if _, err := Plan(grown, grown); err == nil {
		t.Fatal("Plan accepted the active version as the next one")
	}
}

func TestPlanRefusesWithEveryReason(t *testing.T) {
	base := loadTestdata(t, "three-node.yaml")
	bad := base.Clone()
	bad.Version = 5
	bad.Cluster = "other"
	bad.Ring.PartitionCount = 1031
	_, err := Plan(base, bad)
	var pe *PlanError
	if !errors.As(err, &pe) {
		t.Fatalf("Plan: %v, want a *PlanError", err)
	}
	for _, want := range []string{"cluster:", "ring:", "version: 5"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// Shard-set changes move whole partitions: about the share of keys the
// new shards should own, and nothing between shards that stay.
func TestPlanShardAndRegionChanges(t *testing.T) {
	three := loadTestdata(t, "three-region.yaml")
	within := func(what string, got, want, tol float64) {
		t.Helper()
		if got < want-tol || got > want+tol {
			t.Errorf("%s: %.3f, want %.3f +- %.2f", what, got, want, tol)
		}
	}
	// Five shards per region instead of four: the ring spreads keys over
	// 15 shards instead of 12, so about a fifth of them move, each to a new
	// shard of any region (two thirds of them to another region).
	grown := three.Clone()
	grown.Version = 2
	grown.ShardsPerRegion = 5
	c, err := Plan(three, grown)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.ShardsCreated) != 3 || len(c.ShardsRemoved) != 0 {
		t.Fatalf("created %v, removed %v", c.ShardsCreated, c.ShardsRemoved)
	}
	within("grow 4->5 shards per region: keys moved", c.KeysMovedShare, 0.2, 0.08)
	within("grow 4->5 shards per region: keys changing region", c.RegionMovedShare, 0.2*2/3, 0.05)
	t.Logf("4 -> 5 shards per region: %.3f of keys change shard, %.3f change region", c.KeysMovedShare, c.RegionMovedShare)

	// A region removed (zone survival: region survival needs three): its
	// shards go, its keys (a third) are re-homed.
	three = three.Clone()
	three.Survival = SurvivalZone
	shrunk := three.Clone()
	shrunk.Version = 2
	shrunk.Regions = shrunk.Regions[:2]
	c, err = Plan(three, shrunk)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.ShardsRemoved) != 4 || len(c.ShardsCreated) != 0 || len(c.Leaving) != 3 {
		t.Fatalf("removed %v, created %v, leaving %v", c.ShardsRemoved, c.ShardsCreated, c.Leaving)
	}
	within("remove a region: keys changing region", c.RegionMovedShare, 1.0/3, 0.06)
	t.Logf("3 -> 2 regions: %.3f of keys change shard, %.3f change region", c.KeysMovedShare, c.RegionMovedShare)

	// And added back: the new region's shards take about a third.
	back := three.Clone()
	back.Version = 3
	c, err = Plan(func() *Topology { s := shrunk.Clone(); s.Version = 2; return s }(), back)
	if err != nil {
		t.Fatal(err)
	}
	within("add a region: keys changing region", c.RegionMovedShare, 1.0/3, 0.06)
	if len(c.ShardsCreated) != 4 || len(c.Joining) != 3 {
		t.Fatalf("created %v, joining %v", c.ShardsCreated, c.Joining)
	}
}

// The figure the plan command prints for the target shape: a 3-region,
// 9-node cluster adding one node moves the seats placement gives the new
// node, and how that compares with the lower bound.
func TestPlanThreeRegionsAddOneNode(t *testing.T) {
	three := loadTestdata(t, "three-region.yaml")
	c, err := Plan(three, withNode(three, "eu-west", "eu-west-4", 17100))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("3 regions x 3 nodes, survival region, 12 shards x 3 replicas: adding eu-west-4 moves %d seats (lower bound %d) in %d shards",
		c.SeatsMoved, c.MinSeatsMoved, len(c.Shards))
	if c.SeatsMoved < c.MinSeatsMoved || c.MinSeatsMoved == 0 {
		t.Fatalf("seats moved %d, lower bound %d", c.SeatsMoved, c.MinSeatsMoved)
	}
	// Survival region: only the region that gains a node changes seats.
	for _, s := range c.Shards {
		for _, id := range append(slices.Clone(s.Add), s.Remove...) {
			if r, _ := three.RegionOf(id); id != "eu-west-4" && r != "eu-west" {
				t.Errorf("shard %s moves a seat of %s in region %s", s.ID, id, r)
			}
		}
	}
}

func TestMetaMembers(t *testing.T) {
	three := loadTestdata(t, "three-region.yaml")
	v, nv := three.MetaMembers()
	if len(v) != 5 || len(nv) != 4 {
		t.Fatalf("voters %v nonvoters %v", v, nv)
	}
	regions := map[string]int{}
	for _, id := range v {
		r, _ := three.RegionOf(id)
		regions[r]++
	}
	if len(regions) != 3 {
		t.Fatalf("meta voters %v cover regions %v, want all three", v, regions)
	}
	one := loadTestdata(t, "three-node.yaml")
	v, nv = one.MetaMembers()
	if len(v) != 3 || len(nv) != 0 {
		t.Fatalf("three nodes: voters %v nonvoters %v", v, nv)
	}
	four := withNode(one, "us-east", "us-east-4", 17000)
	v, nv = four.MetaMembers()
	if len(v) != 3 || len(nv) != 1 {
		t.Fatalf("four nodes: voters %v nonvoters %v, want 3 and 1 (an even count adds nothing)", v, nv)
	}
}

func TestSameShapeIgnoresOrder(t *testing.T) {
	a := loadTestdata(t, "three-region.yaml")
	b := a.Clone()
	slices.Reverse(b.Regions)
	slices.Reverse(b.Regions[0].Nodes)
	if !SameShape(a, b) {
		t.Fatal("reordered file has another shape")
	}
	b.Replicas = 5
	if SameShape(a, b) {
		t.Fatal("replicas change kept the shape")
	}
}
