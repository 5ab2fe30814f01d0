package idemv1

import (
	"errors"
	"fmt"
	"testing"

	"github.com/idem-dev/idem/topology"
)

func routingTopology(t *testing.T) (*topology.Topology, *topology.Ring) {
	t.Helper()
	topo := &topology.Topology{Cluster: "c1", ShardsPerRegion: 4, Replicas: 3}
	for _, r := range []string{"r1", "r2"} {
		region := topology.Region{Name: r}
		for j := 1; j <= 3; j++ {
			port := 20000 + len(topo.Regions)*100 + j*3
			region.Nodes = append(region.Nodes, topology.Node{ID: fmt.Sprintf("%s-%d", r, j),
				RaftAddr: fmt.Sprintf("127.0.0.1:%d", port), GRPCAddr: fmt.Sprintf("127.0.0.1:%d", port+1), HTTPAddr: fmt.Sprintf("127.0.0.1:%d", port+2)})
		}
		topo.Regions = append(topo.Regions, region)
	}
	ring, err := topology.NewRing(topo)
	if err != nil {
		t.Fatal(err)
	}
	return topo, ring
}

// TestRoutingRoundTrip: what a node encodes, a client decodes into the same
// ring (same placement), the topology's addresses and the hosted shards'
// leaders; a leader that is no voter of its shard is dropped.
func TestRoutingRoundTrip(t *testing.T) {
	topo, ring := routingTopology(t)
	shards := ring.Shards()
	leaders := map[string]string{shards[0].ID: shards[0].Voters[1], shards[1].ID: "", shards[2].ID: "nobody"}
	got, err := RoutingFromProto(RoutingToProto(ring, topo.Nodes(), "r1-1", leaders))
	if err != nil {
		t.Fatal(err)
	}
	if got.NodeID != "r1-1" || got.Ring.Fingerprint() != ring.Fingerprint() {
		t.Fatalf("node %q fingerprint %s, want r1-1 %s", got.NodeID, got.Ring.Fingerprint(), ring.Fingerprint())
	}
	for i := range 2000 {
		k := fmt.Sprintf("key-%d", i)
		if g, w := got.Ring.Locate("ns", k).ID, ring.Locate("ns", k).ID; g != w {
			t.Fatalf("key %s on %s, the node puts it on %s", k, g, w)
		}
	}
	for _, n := range topo.Nodes() {
		if g := got.Nodes[n.ID]; g.GRPCAddr != n.GRPCAddr || g.Region != n.Region {
			t.Errorf("node %s decoded as %+v, want %s in %s", n.ID, g, n.GRPCAddr, n.Region)
		}
	}
	if len(got.Leaders) != 1 || got.Leaders[shards[0].ID] != shards[0].Voters[1] {
		t.Errorf("leaders %v, want only %s -> %s", got.Leaders, shards[0].ID, shards[0].Voters[1])
	}
}

// TestRoutingRefused: a tampered ring, a missing node or a malformed address
// is refused (the client keeps round-robin).
func TestRoutingRefused(t *testing.T) {
	topo, ring := routingTopology(t)
	for name, tamper := range map[string]func(*RoutingResponse){
		"fingerprint":    func(r *RoutingResponse) { r.RingFingerprint = "00" + r.RingFingerprint[2:] },
		"no fingerprint": func(r *RoutingResponse) { r.RingFingerprint = "" },
		"ring params":    func(r *RoutingResponse) { r.Ring.Load = 1.5 },
		"no ring":        func(r *RoutingResponse) { r.Ring = nil },
		"voter order":    func(r *RoutingResponse) { v := r.Shards[0].Voters; v[0], v[1] = v[1], v[0] },
		"missing node":   func(r *RoutingResponse) { r.Nodes = r.Nodes[1:] },
		"bad address":    func(r *RoutingResponse) { r.Nodes[0].GrpcAddr = "no-port" },
	} {
		resp := RoutingToProto(ring, topo.Nodes(), "r1-1", nil)
		resp.Shards[0].Voters = append([]string(nil), resp.Shards[0].Voters...)
		tamper(resp)
		if _, err := RoutingFromProto(resp); !errors.Is(err, ErrRouting) {
			t.Errorf("%s: got %v, want ErrRouting", name, err)
		}
	}
}
