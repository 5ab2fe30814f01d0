package topology

import (
	"errors"
	"slices"
	"testing"
)

// TestNewRingFromShardsMatchesNewRing: a ring rebuilt from what a node
// reports (cluster, effective parameters, shards in ring order) has the
// node's fingerprint and places every key on the same shard.
func TestNewRingFromShardsMatchesNewRing(t *testing.T) {
	for _, topo := range []*Topology{
		genTopology([]string{"us-east"}, 3, 4, 3, SurvivalZone),
		genTopology(regionNames(3), 3, 8, 3, SurvivalRegion),
		func() *Topology {
			t := genTopology(regionNames(2), 3, 5, 3, SurvivalZone)
			t.Ring = RingConfig{PartitionCount: 2039, ReplicationFactor: 20, Load: 1.5}
			return t
		}(),
	} {
		want := mustRing(t, topo)
		got, err := NewRingFromShards(want.Cluster(), want.Config(), want.Shards(), want.Fingerprint())
		if err != nil {
			t.Fatal(err)
		}
		if got.Fingerprint() != want.Fingerprint() {
			t.Fatalf("fingerprint %s, want %s", got.Fingerprint(), want.Fingerprint())
		}
		for _, k := range randomKeys(testSeed(t), 5000) {
			if g, w := got.Locate("ns", k), want.Locate("ns", k); g.ID != w.ID || g.Index != w.Index || !slices.Equal(g.Voters, w.Voters) {
				t.Fatalf("key %q: rebuilt ring says %+v, node's ring %+v", k, g, w)
			}
		}
	}
}

// TestNewRingFromShardsRefuses: a changed voter order, shard order, parameter
// or cluster gives another fingerprint and is refused; malformed input is an
// invalid topology.
func TestNewRingFromShardsRefuses(t *testing.T) {
	r := mustRing(t, genTopology([]string{"us-east"}, 3, 4, 3, SurvivalZone))
	shards := r.Shards()
	swappedVoters := slices.Clone(shards)
	swappedVoters[0].Voters = []string{shards[0].Voters[1], shards[0].Voters[0], shards[0].Voters[2]}
	swappedShards := slices.Clone(shards)
	swappedShards[0], swappedShards[1] = swappedShards[1], swappedShards[0]
	cfg := r.Config()
	cfg.Load = 1.3
	for name, build := range map[string]func() (*Ring, error){
		"voter order": func() (*Ring, error) {
			return NewRingFromShards(r.Cluster(), r.Config(), swappedVoters, r.Fingerprint())
		},
		"shard order": func() (*Ring, error) {
			return NewRingFromShards(r.Cluster(), r.Config(), swappedShards, r.Fingerprint())
		},
		"ring load": func() (*Ring, error) { return NewRingFromShards(r.Cluster(), cfg, shards, r.Fingerprint()) },
		"cluster":   func() (*Ring, error) { return NewRingFromShards("other", r.Config(), shards, r.Fingerprint()) },
	} {
		if _, err := build(); !errors.Is(err, ErrFingerprintMismatch) {
			t.Errorf("%s: got %v, want ErrFingerprintMismatch", name, err)
		}
	}
	bad := slices.Clone(shards)
	bad[1] = Shard{ID: "us-east-x", HomeRegion: "us-east", Voters: shards[1].Voters}
	dup := slices.Clone(shards)
	dup[1] = dup[0]
	wrongHome := slices.Clone(shards)
	wrongHome[0].HomeRegion = "eu-west"
	for name, in := range map[string][]Shard{"bad id": bad, "duplicate": dup, "wrong home": wrongHome, "none": nil,
		"no voters": {{ID: "us-east-0", HomeRegion: "us-east"}}} {
		if _, err := NewRingFromShards(r.Cluster(), r.Config(), in, ""); !errors.Is(err, ErrInvalidTopology) {
			t.Errorf("%s: got %v, want ErrInvalidTopology", name, err)
		}
	}
	if _, err := NewRingFromShards(r.Cluster(), RingConfig{PartitionCount: 10}, shards, ""); !errors.Is(err, ErrInvalidTopology) {
		t.Errorf("too few partitions: got %v, want ErrInvalidTopology", err)
	}
}
