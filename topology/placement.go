package topology

import (
	"slices"
	"strconv"
	"strings"
)

// Shard is one Raft group: a slice of the key space homed in one region.
type Shard struct {
	// ID is "<home region>-<index>", e.g. "us-east-0".
	ID string `json:"id"`
	// HomeRegion is the region whose routers and clients the shard serves
	// first: its preferred leader lives there.
	HomeRegion string `json:"home_region"`
	// Index is the shard's number within its home region,
	// 0..shards_per_region-1.
	Index int `json:"index"`
	// Voters lists the node ids of the shard's Raft voters. Voters[0] is the
	// preferred leader, always in the home region. Shared and read-only:
	// never modify it (copy with slices.Clone first).
	Voters []string `json:"voters"`
}

// HasVoter reports whether node nodeID is a voter of s.
func (s Shard) HasVoter(nodeID string) bool { return slices.Contains(s.Voters, nodeID) }

// ShardID returns the id of shard index of region: "<region>-<index>".
func ShardID(region string, index int) string { return region + "-" + strconv.Itoa(index) }

// ParseShardID splits a shard id into home region and index. Because the
// index is all digits, the split at the last "-" is unambiguous even for
// region names that contain "-" and digits. It reports false for anything
// ShardID cannot return for a valid region name.
func ParseShardID(id string) (region string, index int, ok bool) {
	i := strings.LastIndexByte(id, '-')
	if i <= 0 || i == len(id)-1 || !ValidName(id[:i]) {
		return "", 0, false
	}
	digits := id[i+1:]
	n, err := strconv.Atoi(digits)
	if err != nil || n < 0 || strconv.Itoa(n) != digits {
		return "", 0, false
	}
	return id[:i], n, true
}

// Shards returns every shard of the cluster with its voters, ordered by home
// region name and then index. It returns nil for a topology that does not
// pass Validate. The result is computed afresh on each call; a Ring keeps
// one copy.
func (t *Topology) Shards() []Shard {
	if t.Validate() != nil {
		return nil
	}
	return place(t)
}

// ShardByID returns the shard with the given id.
func (t *Topology) ShardByID(id string) (Shard, bool) {
	for _, s := range t.Shards() {
		if s.ID == id {
			return s, true
		}
	}
	return Shard{}, false
}

// ShardsOnNode returns the shards that node nodeID is a voter of, in the
// order of Shards.
func (t *Topology) ShardsOnNode(nodeID string) []Shard {
	var out []Shard
	for _, s := range t.Shards() {
		if s.HasVoter(nodeID) {
			out = append(out, s)
		}
	}
	return out
}

// regionLoad tracks, while placing, how many shards each node of one region
// leads and holds, so that each choice goes to the least loaded node.
type regionLoad struct {
	name     string
	nodes    []string // sorted by id: placement ignores file order
	leaders  []int    // preferred leaderships per node
	replicas []int    // voter seats per node
	cursor   int      // position after the last node picked
}

// pick chooses count distinct nodes of the region for one shard, updating
// the loads. With leader, the first pick is the shard's preferred leader:
// the node leading the fewest shards so far, then holding the fewest seats.
// The others are the nodes holding the fewest seats. Ties go to the node
// nearest after the previous pick in id order, which walks the region's
// nodes like a tape; exhaustive tests show leaderships and seats per node
// then never differ by more than one within a region.
func (rl *regionLoad) pick(count int, leader bool) []string {
	m := len(rl.nodes)
	dist := func(pos int) int { return ((pos-rl.cursor)%m + m) % m }
	used := make([]bool, m)
	chosen := make([]string, 0, count)
	take := func(p int) {
		rl.replicas[p]++
		used[p] = true
		chosen = append(chosen, rl.nodes[p])
		rl.cursor = (p + 1) % m
	}
	if leader && count > 0 {
		best := -1
		for p := range m {
			if best < 0 || rl.leaders[p] < rl.leaders[best] ||
				rl.leaders[p] == rl.leaders[best] && (rl.replicas[p] < rl.replicas[best] ||
					rl.replicas[p] == rl.replicas[best] && dist(p) < dist(best)) {
				best = p
			}
		}
		rl.leaders[best]++
		take(best)
	}
	for len(chosen) < count {
		best := -1
		for p := range m {
			if used[p] {
				continue
			}
			if best < 0 || rl.replicas[p] < rl.replicas[best] ||
				rl.replicas[p] == rl.replicas[best] && dist(p) < dist(best) {
				best = p
			}
		}
		take(best)
	}
	return chosen
}

// place computes the voters of every shard of a valid topology.
//
// Shards are placed in a fixed order (index-major: shard 0 of every region,
// then shard 1, ...) over regions and nodes sorted by name, so the result
// depends only on the sets of regions and nodes, and placing shard i never
// depends on how many shards follow it.
//
// A shard's voters go round-robin over k regions (k = 1 for zone survival,
// min(#regions, replicas) for region survival): voter j lives in region
// list[j mod k], where list[0] is the home region and list[1:] are k-1 of the
// other regions taken in cyclic name order after the home region, starting
// at an offset that advances with the shard index so that every other region
// takes its share. The home region thus holds ceil(replicas/k) voters, the
// most of any region, and Validate makes sure that losing it still leaves a
// majority. Inside a region, regionLoad.pick balances preferred leaders and
// replicas over nodes.
func place(t *Topology) []Shard {
	regions := make([]*regionLoad, len(t.Regions))
	for i, r := range t.Regions {
		nodes := make([]string, len(r.Nodes))
		for j, n := range r.Nodes {
			nodes[j] = n.ID
		}
		slices.Sort(nodes)
		regions[i] = &regionLoad{name: r.Name, nodes: nodes, leaders: make([]int, len(nodes)), replicas: make([]int, len(nodes))}
	}
	slices.SortFunc(regions, func(a, b *regionLoad) int { return strings.Compare(a.name, b.name) })

	numRegions, perRegion, replicas, k := len(regions), t.ShardsPerRegion, t.Replicas, t.regionSpread()
	shards := make([]Shard, numRegions*perRegion)
	lists := make([][]int, numRegions)
	chosen := make([][][]string, numRegions)
	for h := range numRegions {
		lists[h] = make([]int, k)
		chosen[h] = make([][]string, k)
	}
	voterCount := func(o int) int {
		if o < replicas%k {
			return replicas/k + 1
		}
		return replicas / k
	}
	for i := range perRegion {
		// Home voters (with the preferred leader) of every region's shard i
		// first, then the voters they place in other regions: a region
		// then chooses its leader before its guests fill the nodes.
		for h := range numRegions {
			list := lists[h]
			list[0] = h
			if k > 1 {
				others := numRegions - 1
				offset := i * (k - 1) % others
				for o := 1; o < k; o++ {
					list[o] = (h + 1 + (offset+o-1)%others) % numRegions
				}
			}
			chosen[h][0] = regions[h].pick(voterCount(0), true)
		}
		for h := range numRegions {
			for o := 1; o < k; o++ {
				chosen[h][o] = regions[lists[h][o]].pick(voterCount(o), false)
			}
		}
		for h := range numRegions {
			voters := make([]string, replicas)
			for j := range replicas {
				voters[j] = chosen[h][j%k][j/k]
			}
			home := regions[h].name
			shards[h*perRegion+i] = Shard{ID: ShardID(home, i), HomeRegion: home, Index: i, Voters: voters}
		}
	}
	return shards
}
