package idemv1

import (
	"errors"
	"fmt"
	"net"

	"github.com/idem-dev/idem/topology"
)

// ErrRouting is wrapped by RoutingFromProto's errors: the answer cannot be
// used to place keys (the client keeps sending calls round-robin).
var ErrRouting = errors.New("idemv1: unusable routing answer")

// Routing is a decoded RoutingResponse: the answering node's ring, rebuilt
// and checked against its fingerprint, the nodes' gRPC addresses and the
// leaders the node knows.
type Routing struct {
	// NodeID is the answering node.
	NodeID string
	// Ring places keys exactly as the nodes do.
	Ring *topology.Ring
	// Nodes are every node by id, with ID, Region and GRPCAddr set.
	Nodes map[string]topology.Node
	// Leaders maps shard id to the node the answering node believes leads
	// it, for the shards it hosts and knows a leader of.
	Leaders map[string]string
}

// RoutingToProto encodes a node's routing answer: its ring, every node of
// the topology, its own id, and leaders (shard id -> node id; shards absent
// or mapped to "" have no known leader).
func RoutingToProto(ring *topology.Ring, nodes []topology.Node, self string, leaders map[string]string) *RoutingResponse {
	cfg := ring.Config()
	resp := &RoutingResponse{
		Cluster:         ring.Cluster(),
		RingFingerprint: ring.Fingerprint(),
		Ring:            &RingParams{PartitionCount: int32(cfg.PartitionCount), ReplicationFactor: int32(cfg.ReplicationFactor), Load: cfg.Load},
		NodeId:          self,
	}
	for _, s := range ring.Shards() {
		resp.Shards = append(resp.Shards, &RoutingShard{Id: s.ID, HomeRegion: s.HomeRegion, Voters: s.Voters, LeaderId: leaders[s.ID]})
	}
	for _, n := range nodes {
		resp.Nodes = append(resp.Nodes, &RoutingNode{Id: n.ID, Region: n.Region, GrpcAddr: n.GRPCAddr})
	}
	return resp
}

// RoutingFromProto decodes and checks a routing answer: the ring is rebuilt
// with topology.NewRingFromShards and refused when its fingerprint is not
// the one the node sent; every voter must be a listed node with a HOST:PORT
// address. A leader that is not a voter of its shard is dropped.
func RoutingFromProto(resp *RoutingResponse) (Routing, error) {
	if resp.GetRingFingerprint() == "" || resp.GetRing() == nil {
		return Routing{}, fmt.Errorf("%w: no ring fingerprint or parameters", ErrRouting)
	}
	shards := make([]topology.Shard, 0, len(resp.GetShards()))
	for _, s := range resp.GetShards() {
		shards = append(shards, topology.Shard{ID: s.GetId(), HomeRegion: s.GetHomeRegion(), Voters: s.GetVoters()})
	}
	p := resp.GetRing()
	ring, err := topology.NewRingFromShards(resp.GetCluster(), topology.RingConfig{
		PartitionCount: int(p.GetPartitionCount()), ReplicationFactor: int(p.GetReplicationFactor()), Load: p.GetLoad(),
	}, shards, resp.GetRingFingerprint())
	if err != nil {
		return Routing{}, fmt.Errorf("%w: %w", ErrRouting, err)
	}
	out := Routing{NodeID: resp.GetNodeId(), Ring: ring, Nodes: map[string]topology.Node{}, Leaders: map[string]string{}}
	for _, n := range resp.GetNodes() {
		if _, port, err := net.SplitHostPort(n.GetGrpcAddr()); err != nil || port == "" || !topology.ValidName(n.GetId()) {
			return Routing{}, fmt.Errorf("%w: node %q with gRPC address %q", ErrRouting, n.GetId(), n.GetGrpcAddr())
		}
		out.Nodes[n.GetId()] = topology.Node{ID: n.GetId(), Region: n.GetRegion(), GRPCAddr: n.GetGrpcAddr()}
	}
	for _, s := range ring.Shards() {
		for _, v := range s.Voters {
			if _, ok := out.Nodes[v]; !ok {
				return Routing{}, fmt.Errorf("%w: voter %q of shard %s is not among the nodes", ErrRouting, v, s.ID)
			}
		}
	}
	for _, s := range resp.GetShards() {
		if id := s.GetLeaderId(); id != "" {
			if sh, ok := ring.ShardByID(s.GetId()); ok && sh.HasVoter(id) {
				out.Leaders[s.GetId()] = id
			}
		}
	}
	return out, nil
}
