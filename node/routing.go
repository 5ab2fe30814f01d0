package node

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
)

// routing answers the Idempotency service's Routing RPC: this node's ring,
// every node's gRPC address as the topology file gives it, and the leader
// of each shard it hosts as its Raft group knows it, so that a client can
// send each call to its shard's leader instead of paying a forwarding hop.
func (n *Node) routing(context.Context) (*idemv1.RoutingResponse, error) {
	// Start fills n.shards before the gRPC server exists, so it is read
	// without a lock.
	if p := n.ringErr.Load(); p != nil {
		// A peer runs another ring: telling clients this one's would be
		// telling them a ring the cluster does not agree on.
		return nil, status.Errorf(codes.Unavailable, "node: ring in doubt: %v", *p)
	}
	leaders := make(map[string]string, len(n.shardMap()))
	for id, s := range n.shardMap() {
		if leader, _ := s.group.Leader(); leader != "" {
			leaders[id] = leader
		}
	}
	v := n.view()
	return idemv1.RoutingToProto(v.ring, n.ownAddrs(v.nodes()), n.cfg.NodeID, leaders), nil
}

// httpAddrOf is the JSON API address of node id as the topology gives it
// (this process's own file first, as routing's addresses), "" for a node
// it does not know: the JSON API's leader hint (server.LeaderHeader).
func (n *Node) httpAddrOf(id string) string {
	if nd, ok := n.cfg.Topology.NodeByID(id); ok {
		return nd.HTTPAddr
	}
	if nd, ok := n.view().node(id); ok {
		return nd.HTTPAddr
	}
	return ""
}
