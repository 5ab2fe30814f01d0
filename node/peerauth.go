package node

import (
	"context"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idem-dev/idem/security/auth"
)

// Authorization of the node-to-node control RPCs (the Topology service's
// ShardState, ChangeMember, Handoff and ExportPartitions). A node
// certificate proves which node calls; what it may ask follows from the
// committed topology as this node knows it (its view: the active topology
// and the target of a running change, both committed by the meta group):
//
//   - ShardState answers the nodes of the committed topology;
//   - the steps of a change (ChangeMember, Handoff, ExportPartitions) are
//     taken only for the change's driver, the meta group's leader as this
//     node knows it;
//   - ChangeMember adds or promotes only a node the committed topology
//     seats in that group, at an address the topology names for it.
//
// A refusal because this node's own picture may lag (it knows another
// meta leader, or none yet) is UNAVAILABLE, which the driver retries on
// its next step; a caller that no picture can make right (no node
// certificate, a node outside the topology) is PERMISSION_DENIED. Without
// TLS (an insecure cluster) every caller is root and nothing is checked.

// memberPeer returns nil when the RPC's caller is a node of the committed
// topology, else the status to answer.
func (n *Node) memberPeer(ctx context.Context, rpc string) error {
	id, secure := auth.NodePeerID(ctx)
	if !secure {
		return nil
	}
	if id == "" {
		return status.Errorf(codes.PermissionDenied, "%s answers the cluster's nodes only: present a node certificate", rpc)
	}
	if _, ok := n.view().node(id); !ok {
		return status.Errorf(codes.PermissionDenied, "%s answers the nodes of the committed topology only; node %q is not one of them", rpc, id)
	}
	return nil
}

// driverPeer returns nil when the RPC's caller is the driver of the
// cluster's changes: a node of the committed topology that leads the meta
// group, as this node knows its leader.
func (n *Node) driverPeer(ctx context.Context, rpc string) error {
	if err := n.memberPeer(ctx, rpc); err != nil {
		return err
	}
	id, secure := auth.NodePeerID(ctx)
	if !secure {
		return nil
	}
	leader, _ := n.metaGroup.Leader()
	switch leader {
	case id:
		return nil
	case "":
		return status.Errorf(codes.Unavailable, "%s is taken only for the meta group's leader, and node %s knows no leader of it right now: retry", rpc, n.cfg.NodeID)
	}
	return status.Errorf(codes.Unavailable, "%s is taken only for the meta group's leader, which node %s knows as %q, not %q: retry if the leadership just moved", rpc, n.cfg.NodeID, leader, id)
}

// authorizeChangeMember is ChangeMember's check: the driver asks, for a
// step the committed topology allows.
func (n *Node) authorizeChangeMember(ctx context.Context, shard, op, node, addr string) error {
	if err := n.driverPeer(ctx, "ChangeMember"); err != nil {
		return err
	}
	if _, secure := auth.NodePeerID(ctx); !secure {
		return nil
	}
	return n.memberStepAllowed(moveStep{shard: shard, op: op, node: node, addr: addr})
}

// memberStepAllowed returns nil when step adds or promotes only a node the
// committed topology seats in the step's group (any node of it for the
// meta group, the active or target voters of a shard) at an address the
// topology, or this node's own file, names for it. Removals, demotions
// and leadership transfers name nodes already in the group: the driver
// check is theirs.
func (n *Node) memberStepAllowed(step moveStep) error {
	if step.op != "add_learner" && step.op != "promote" && step.op != "transfer_leader" {
		return nil
	}
	v := n.view()
	nd, ok := v.node(step.node)
	if !ok {
		return status.Errorf(codes.PermissionDenied, "%s: node %q is in no committed topology", step, step.node)
	}
	if step.shard != MetaGroupID {
		info, ok := v.placer.ShardByID(step.shard)
		if !ok || !slices.Contains(v.forwardShard(info).Voters, step.node) {
			return status.Errorf(codes.FailedPrecondition, "%s: the committed topology gives node %q no seat in %s", step, step.node, step.shard)
		}
	}
	if step.op != "add_learner" {
		return nil
	}
	addrs := []string{nd.RaftAddr}
	if own, ok := n.cfg.Topology.NodeByID(step.node); ok {
		addrs = append(addrs, own.RaftAddr)
	}
	if v.target != nil {
		if next, ok := v.target.NodeByID(step.node); ok {
			addrs = append(addrs, next.RaftAddr)
		}
	}
	if !slices.Contains(addrs, step.addr) {
		return status.Errorf(codes.PermissionDenied, "%s: address %q is not the Raft address the topology names for node %q", step, step.addr, step.node)
	}
	return nil
}
