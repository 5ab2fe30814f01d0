package node

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/metadata"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/forward"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/server"
)

// Namespace policies are a replicated command applied to every shard group
// of the ring, so that each shard's state machine decides leases,
// retentions and tombstones of its keys from its own state (fsm DESIGN.md).

// SetPolicy implements backend.Policies: cmd is proposed to every shard's
// leader (here, or forwarded) and SetPolicy returns once all applied it.
func (n *Node) SetPolicy(ctx context.Context, cmd *fsm.Command) (fsm.Policy, error) {
	err := backend.SetPolicyShards(ctx, forward.ShardIDs(n.view().placer), func(ctx context.Context, id string) error {
		return n.SetShardPolicy(ctx, id, cmd, 0)
	})
	if err != nil {
		return fsm.Policy{}, err
	}
	return *cmd.Policy, nil
}

// SetShardPolicy applies the set-policy cmd to shard id: proposed here
// when this node leads it, otherwise forwarded to the leader.
func (n *Node) SetShardPolicy(ctx context.Context, id string, cmd *fsm.Command, hops int) error {
	v := n.view()
	info, ok := v.placer.ShardByID(id)
	if !ok {
		return &backend.Error{Code: server.CodeInvalidArgument, Message: fmt.Sprintf("no shard %q in this cluster's ring", id)}
	}
	prefer := ""
	if s := n.shard(id); s != nil {
		res, leader, done, err := n.proposeLocal(ctx, s, info, cmd)
		if done {
			if err == nil && res.Outcome != fsm.OutcomeOK {
				err = &backend.Error{Code: contract.CodeInternal, Message: fmt.Sprintf("shard %s answered %s to a set-policy", id, res.Outcome)}
			}
			return err
		}
		prefer = leader
	}
	return n.fwd.SetShardPolicy(ctx, v.forwardShard(info), cmd, prefer, hops)
}

// GetPolicy implements backend.Policies: the policy as the ring's first
// shard holds it, read on its leader after a read barrier (here, or
// forwarded). Every shard holds the same once a set-policy returned.
func (n *Node) GetPolicy(ctx context.Context, namespace string) (fsm.Policy, bool, error) {
	v := n.view()
	id := forward.ShardIDs(v.ring)[0]
	info, _ := v.ring.ShardByID(id)
	prefer := ""
	if s := n.shard(id); s != nil {
		err := s.group.ReadBarrier(ctx)
		if err == nil {
			p, ok := s.fsm.Policy(namespace)
			return p, ok, nil
		}
		var nle *raftstore.NotLeaderError
		if !errors.As(err, &nle) {
			return fsm.Policy{}, false, unavailable(info, err)
		}
		prefer = nle.LeaderID
	}
	p, err := n.fwd.GetPolicy(ctx, v.forwardShard(info), namespace, prefer, 0)
	return p, err == nil, err
}

// SetShardPolicy answers one shard's part of a SetPolicy, on the shard's
// leader (forwarded there when this node does not lead it).
func (a *admin) SetShardPolicy(ctx context.Context, req *idemv1.SetShardPolicyRequest) (*idemv1.SetShardPolicyResponse, error) {
	cmd, err := a.n.api.PolicyCommandFromProto(req)
	if err != nil {
		return nil, err
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if err := a.n.SetShardPolicy(ctx, req.GetShard(), cmd, idemv1.HopsFromMetadata(md)); err != nil {
		return nil, a.n.api.OperatorError(err, "set_shard_policy")
	}
	return &idemv1.SetShardPolicyResponse{}, nil
}
