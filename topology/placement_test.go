package topology

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

func TestShardIDs(t *testing.T) {
	for _, tc := range []struct {
		region string
		index  int
	}{{"us-east", 0}, {"us-east", 17}, {"a", 3}, {"a-1", 0}, {"eu-west-2", 10}, {"0", 1}, {"us-east-", 1}} {
		id := ShardID(tc.region, tc.index)
		region, index, ok := ParseShardID(id)
		if !ok || region != tc.region || index != tc.index {
			t.Errorf("ParseShardID(%q) = %q, %d, %v; want %q, %d", id, region, index, ok, tc.region, tc.index)
		}
	}
	for _, bad := range []string{"", "us", "us-", "-1", "us-east-x", "us-east-01", "us-east-+1", "US-East-1", "us east-1"} {
		if region, index, ok := ParseShardID(bad); ok {
			t.Errorf("ParseShardID(%q) = %q, %d, true; want false", bad, region, index)
		}
	}
}

func TestThreeNodeSamplePlacement(t *testing.T) {
	topo := loadTestdata(t, "three-node.yaml")
	shards := topo.Shards()
	want := []Shard{
		{ID: "us-east-0", HomeRegion: "us-east", Index: 0, Voters: []string{"us-east-1", "us-east-2", "us-east-3"}},
		{ID: "us-east-1", HomeRegion: "us-east", Index: 1, Voters: []string{"us-east-2", "us-east-3", "us-east-1"}},
		{ID: "us-east-2", HomeRegion: "us-east", Index: 2, Voters: []string{"us-east-3", "us-east-1", "us-east-2"}},
		{ID: "us-east-3", HomeRegion: "us-east", Index: 3, Voters: []string{"us-east-3", "us-east-1", "us-east-2"}},
	}
	if !reflect.DeepEqual(shards, want) {
		t.Fatalf("Shards() =\n%+v\nwant\n%+v", shards, want)
	}
	if s, ok := topo.ShardByID("us-east-2"); !ok || s.Voters[0] != "us-east-3" {
		t.Fatalf("ShardByID(us-east-2) = %+v, %v", s, ok)
	}
	if _, ok := topo.ShardByID("us-east-4"); ok {
		t.Fatal("ShardByID found us-east-4")
	}
	if got := topo.ShardsOnNode("us-east-2"); len(got) != 4 {
		t.Fatalf("ShardsOnNode(us-east-2) = %d shards, want all 4", len(got))
	}
	if got := topo.ShardsOnNode("nobody"); got != nil {
		t.Fatalf("ShardsOnNode(nobody) = %v", got)
	}
}

func TestThreeRegionSamplePlacement(t *testing.T) {
	topo := loadTestdata(t, "three-region.yaml")
	shards := topo.Shards()
	if len(shards) != 12 {
		t.Fatalf("%d shards, want 12", len(shards))
	}
	// Sorted by region name, then index.
	if shards[0].ID != "ap-south-0" || shards[4].ID != "eu-west-0" || shards[11].ID != "us-east-3" {
		t.Fatalf("order: %s %s %s", shards[0].ID, shards[4].ID, shards[11].ID)
	}
	for _, s := range shards {
		regions := map[string]bool{}
		for _, v := range s.Voters {
			r, _ := topo.RegionOf(v)
			regions[r] = true
		}
		if len(regions) != 3 {
			t.Errorf("shard %s voters %v span %d regions, want 3", s.ID, s.Voters, len(regions))
		}
	}
	// Each node holds 4 of the 12 shards and leads 4/3 of its region's 4.
	for _, n := range topo.Nodes() {
		if got := len(topo.ShardsOnNode(n.ID)); got != 4 {
			t.Errorf("node %s holds %d shards, want 4", n.ID, got)
		}
	}
}

func TestShardsOfInvalidTopologyIsNil(t *testing.T) {
	topo := validTopology()
	topo.Replicas = 4 // more than the 3 nodes per region
	if got := topo.Shards(); got != nil {
		t.Fatalf("Shards() of an invalid topology = %v", got)
	}
}

// checkPlacement asserts the properties every placement must have, and the
// per-region balance of preferred leaders and voter seats.
func checkPlacement(t *testing.T, topo *Topology) {
	t.Helper()
	shards := topo.Shards()
	if want := topo.ShardsPerRegion * len(topo.Regions); len(shards) != want {
		t.Fatalf("%d shards, want %d", len(shards), want)
	}
	k := 1
	if topo.Survival == SurvivalRegion {
		k = min(len(topo.Regions), topo.Replicas)
	}
	leaders := map[string]int{}
	seats := map[string]int{}
	ids := map[string]bool{}
	for _, s := range shards {
		if ids[s.ID] {
			t.Fatalf("duplicate shard id %s", s.ID)
		}
		ids[s.ID] = true
		if s.ID != ShardID(s.HomeRegion, s.Index) {
			t.Fatalf("shard %s has home %s index %d", s.ID, s.HomeRegion, s.Index)
		}
		if len(s.Voters) != topo.Replicas {
			t.Fatalf("shard %s has %d voters, want %d", s.ID, len(s.Voters), topo.Replicas)
		}
		perRegion := map[string]int{}
		seen := map[string]bool{}
		for _, v := range s.Voters {
			region, ok := topo.RegionOf(v)
			if !ok {
				t.Fatalf("shard %s voter %q is not a node of the topology", s.ID, v)
			}
			if seen[v] {
				t.Fatalf("shard %s has voter %s twice: %v", s.ID, v, s.Voters)
			}
			seen[v] = true
			perRegion[region]++
			seats[v]++
		}
		leaders[s.Voters[0]]++
		if region, _ := topo.RegionOf(s.Voters[0]); region != s.HomeRegion {
			t.Fatalf("shard %s preferred leader %s is in %s, not the home region", s.ID, s.Voters[0], region)
		}
		if len(perRegion) != k {
			t.Fatalf("shard %s voters %v span %d regions, want %d", s.ID, s.Voters, len(perRegion), k)
		}
		majority := topo.Replicas/2 + 1
		for region, n := range perRegion {
			if topo.Survival == SurvivalRegion && n >= majority {
				t.Fatalf("shard %s: region %s holds %d of %d voters, a majority", s.ID, region, n, topo.Replicas)
			}
			if topo.Survival == SurvivalRegion && topo.Replicas-n < majority {
				t.Fatalf("shard %s: losing region %s leaves %d of %d voters, no quorum", s.ID, region, topo.Replicas-n, topo.Replicas)
			}
		}
	}
	for _, r := range topo.Regions {
		loL, hiL, loS, hiS := 1<<30, -1, 1<<30, -1
		for _, n := range r.Nodes {
			loL, hiL = min(loL, leaders[n.ID]), max(hiL, leaders[n.ID])
			loS, hiS = min(loS, seats[n.ID]), max(hiS, seats[n.ID])
		}
		if hiL-loL > 1 || hiS-loS > 1 {
			t.Fatalf("region %s unbalanced: preferred leaders per node %d..%d, seats per node %d..%d", r.Name, loL, hiL, loS, hiS)
		}
	}
}

func TestPlacementPropertiesZone(t *testing.T) {
	for nodes := 1; nodes <= 9; nodes++ {
		for replicas := 1; replicas <= min(nodes, MaxReplicas); replicas++ {
			for _, spr := range []int{1, 2, 3, 4, 5, 7, 8, 12, 16, 31} {
				topo := genTopology([]string{"us-east", "eu-west"}, nodes, spr, replicas, SurvivalZone)
				t.Run(fmt.Sprintf("nodes=%d/replicas=%d/shards=%d", nodes, replicas, spr), func(t *testing.T) {
					checkPlacement(t, topo)
					for _, s := range topo.Shards() {
						for _, v := range s.Voters {
							if r, _ := topo.RegionOf(v); r != s.HomeRegion {
								t.Fatalf("zone survival: shard %s has voter %s in %s", s.ID, v, r)
							}
						}
					}
				})
			}
		}
	}
}

func TestPlacementPropertiesRegion(t *testing.T) {
	for regions := 3; regions <= 6; regions++ {
		for replicas := 3; replicas <= MaxReplicas; replicas++ {
			for nodes := 1; nodes <= 5; nodes++ {
				for _, spr := range []int{1, 2, 3, 4, 6, 9, 16} {
					topo := genTopology(regionNames(regions), nodes, spr, replicas, SurvivalRegion)
					if topo.Validate() != nil {
						continue // e.g. 4 replicas over 3 regions, or too few nodes
					}
					t.Run(fmt.Sprintf("regions=%d/replicas=%d/nodes=%d/shards=%d", regions, replicas, nodes, spr), func(t *testing.T) {
						checkPlacement(t, topo)
					})
				}
			}
		}
	}
}

func TestRegionSurvivalUsesOtherRegionsEvenly(t *testing.T) {
	// 5 regions, 3 replicas: each shard uses its home and 2 of the 4 others.
	topo := genTopology(regionNames(5), 3, 8, 3, SurvivalRegion)
	guest := map[string]map[string]int{} // home -> other region -> shards
	for _, s := range topo.Shards() {
		for _, v := range s.Voters[1:] {
			r, _ := topo.RegionOf(v)
			if guest[s.HomeRegion] == nil {
				guest[s.HomeRegion] = map[string]int{}
			}
			guest[s.HomeRegion][r]++
		}
	}
	for home, counts := range guest {
		if len(counts) != 4 {
			t.Fatalf("home %s uses %d other regions, want 4: %v", home, len(counts), counts)
		}
		for r, n := range counts {
			if n != 4 { // 8 shards x 2 guest voters / 4 regions
				t.Errorf("home %s puts %d voters in %s, want 4: %v", home, n, r, counts)
			}
		}
	}
}

func TestPlacementIgnoresFileOrder(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	for _, survival := range []Survival{SurvivalZone, SurvivalRegion} {
		topo := genTopology(regionNames(4), 4, 6, 3, survival)
		want := topo.Shards()
		for range 10 {
			shuffled := topo.Clone()
			rng.Shuffle(len(shuffled.Regions), func(i, j int) {
				shuffled.Regions[i], shuffled.Regions[j] = shuffled.Regions[j], shuffled.Regions[i]
			})
			for _, r := range shuffled.Regions {
				rng.Shuffle(len(r.Nodes), func(i, j int) { r.Nodes[i], r.Nodes[j] = r.Nodes[j], r.Nodes[i] })
			}
			if got := shuffled.Shards(); !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: reordering the file changed placement", survival)
			}
		}
	}
}

func TestPlacementOfShardDoesNotDependOnLaterShards(t *testing.T) {
	for _, survival := range []Survival{SurvivalZone, SurvivalRegion} {
		small := genTopology(regionNames(3), 4, 3, 3, survival)
		large := genTopology(regionNames(3), 4, 10, 3, survival)
		bigger := map[string][]string{}
		for _, s := range large.Shards() {
			bigger[s.ID] = s.Voters
		}
		for _, s := range small.Shards() {
			if !slices.Equal(bigger[s.ID], s.Voters) {
				t.Fatalf("%s: shard %s voters %v with 3 shards per region, %v with 10", survival, s.ID, s.Voters, bigger[s.ID])
			}
		}
	}
}

func TestZoneAddingRegionKeepsExistingVoters(t *testing.T) {
	before := genTopology([]string{"eu-west", "us-east"}, 3, 4, 3, SurvivalZone)
	after := genTopology([]string{"eu-west", "us-east", "ap-south"}, 3, 4, 3, SurvivalZone)
	voters := map[string][]string{}
	for _, s := range after.Shards() {
		voters[s.ID] = s.Voters
	}
	for _, s := range before.Shards() {
		if !slices.Equal(voters[s.ID], s.Voters) {
			t.Fatalf("shard %s moved from %v to %v when a region was added", s.ID, s.Voters, voters[s.ID])
		}
	}
}
