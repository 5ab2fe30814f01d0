package node

import (
	"testing"

	"github.com/idem-dev/idem/topology"
)

// The cache hands out one ring per topology shape, whatever the *Topology
// value (the meta group parses its topologies again on every apply), and a
// changed shape gets its own.
func TestRingCacheBuildsOncePerShape(t *testing.T) {
	topo := &topology.Topology{Cluster: "rings", ShardsPerRegion: 2, Replicas: 3, Survival: topology.SurvivalZone,
		Regions: []topology.Region{{Name: "local"}}}
	for _, p := range []string{"1", "2", "3"} {
		topo.Regions[0].Nodes = append(topo.Regions[0].Nodes, topology.Node{ID: "n" + p, Region: "local",
			RaftAddr: "127.0.0.1:1" + p + "00", GRPCAddr: "127.0.0.1:1" + p + "01", HTTPAddr: "127.0.0.1:1" + p + "02"})
	}
	var c ringCache
	a, err := c.ring(topo)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.ring(topo.Clone())
	if err != nil || a != b {
		t.Fatalf("the same shape again built another ring (%p, %p, %v)", a, b, err)
	}
	grown := topo.Clone()
	grown.Version = 2
	grown.ShardsPerRegion++
	g, err := c.ring(grown)
	if err != nil || g == a || len(g.Shards()) == len(a.Shards()) {
		t.Fatalf("a grown topology got ring %p with %d shards (first %p, %d)", g, len(g.Shards()), a, len(a.Shards()))
	}
}
