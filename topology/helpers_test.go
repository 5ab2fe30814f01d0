package topology

import (
	"fmt"
	"testing"
)

// genTopology builds a valid-looking topology: regions named as given, each
// with nodesPerRegion nodes "<region>-n<j>" on distinct loopback ports.
func genTopology(regions []string, nodesPerRegion, shardsPerRegion, replicas int, survival Survival) *Topology {
	t := &Topology{Cluster: "test", ShardsPerRegion: shardsPerRegion, Replicas: replicas, Survival: survival}
	port := 10000
	for _, name := range regions {
		r := Region{Name: name}
		for j := range nodesPerRegion {
			r.Nodes = append(r.Nodes, Node{
				ID:       fmt.Sprintf("%s-n%d", name, j),
				RaftAddr: fmt.Sprintf("127.0.0.1:%d", port),
				GRPCAddr: fmt.Sprintf("127.0.0.1:%d", port+1),
				HTTPAddr: fmt.Sprintf("127.0.0.1:%d", port+2),
				Region:   name,
			})
			port += 3
		}
		t.Regions = append(t.Regions, r)
	}
	return t
}

func regionNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("r%d", i)
	}
	return out
}

func mustRing(tb testing.TB, t *Topology) *Ring {
	tb.Helper()
	r, err := NewRing(t)
	if err != nil {
		tb.Fatalf("NewRing: %v", err)
	}
	return r
}
