package topology

import (
	"os"
	"testing"
)

// FuzzParse feeds bytes to the topology file parser (YAML or JSON): it never
// panics, and a topology it accepts builds a ring and places every shard on
// voters of the topology (what every process does with it at start).
// Seeds: testdata/fuzz/FuzzParse and the example files of testdata.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"testdata/three-node.yaml", "testdata/three-region.yaml", "testdata/three-region.json"} {
		if data, err := os.ReadFile(name); err == nil {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		topo, err := Parse(data)
		if err != nil {
			return
		}
		// A ring costs milliseconds per shard: the property is checked on
		// topologies of the examples' size, Parse on every input.
		if topo.ShardsPerRegion*len(topo.Regions) > 32 || len(topo.Nodes()) > 32 {
			return
		}
		ring, err := NewRing(topo)
		if err != nil {
			t.Fatalf("Parse accepted a topology NewRing refuses: %v\n%s", err, data)
		}
		if ring.Cluster() != topo.Cluster {
			t.Fatalf("ring of cluster %q for topology %q", ring.Cluster(), topo.Cluster)
		}
		for _, n := range topo.Nodes() {
			for _, s := range topo.ShardsOnNode(n.ID) {
				for _, v := range s.Voters {
					if _, ok := topo.NodeByID(v); !ok {
						t.Fatalf("shard %s has voter %q, not a node", s.ID, v)
					}
				}
			}
		}
	})
}
