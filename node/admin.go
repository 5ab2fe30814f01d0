package node

import (
	"context"
	"errors"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/wire"
	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/server"
)

// admin serves idemctl: this node's view of the shards it hosts, the
// operator actions on keys (server.KeysAdmin, over the node's API), and
// ListShard for other nodes' and routers' listings.
type admin struct {
	*server.KeysAdmin
	n *Node
}

// ListShard answers one shard's part of a listing page, on the shard's
// leader (forwarded there when this node does not lead it).
func (a *admin) ListShard(ctx context.Context, req *idemv1.ListShardRequest) (*idemv1.ListShardResponse, error) {
	q, err := server.ShardQueryFromProto(req)
	if err != nil {
		return nil, err
	}
	md, _ := metadata.FromIncomingContext(ctx)
	page, err := a.n.ListShard(ctx, req.GetShard(), q, idemv1.HopsFromMetadata(md))
	if err != nil {
		return nil, a.n.api.OperatorError(err, "list_shard")
	}
	return wire.ListShardToProto(page), nil
}

func (a *admin) Status(ctx context.Context, _ *idemv1.StatusRequest) (*idemv1.StatusResponse, error) {
	n := a.n
	resp := &idemv1.StatusResponse{
		Cluster:           n.cfg.Topology.Cluster,
		NodeId:            n.cfg.NodeID,
		Region:            n.self.Region,
		Ready:             n.Ready(ctx) == nil,
		Version:           n.cfg.Version,
		RingFingerprint:   n.layout, // what a peer or router must share: the key layout
		ClusterVersion:    uint32(n.clusterVersion()),
		AdvertisedVersion: uint32(n.advertisedVersion()),
	}
	for _, s := range n.hosted() {
		id := s.id
		st := s.group.Stats()
		fs := s.fsm.Stats()
		resp.Shards = append(resp.Shards, &idemv1.ShardStatus{
			Shard:        id,
			HomeRegion:   s.info.HomeRegion,
			Voters:       n.voters(id, false),
			RaftState:    st.State,
			LeaderId:     st.LeaderID,
			Term:         st.Term,
			CommitIndex:  st.CommitIndex,
			AppliedIndex: st.AppliedIndex,
			LastIndex:    st.LastLogIndex,
			Records:      uint64(fs.Records),
			RecordBytes:  uint64(fs.Bytes),
			Packing:      st.Packing,
		})
	}
	return resp, nil
}

func (a *admin) shard(id string) (*shard, error) {
	s, ok := a.n.shardMap()[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "node %s does not host shard %q (ask a voter of that shard; idemctl locate shows them)", a.n.cfg.NodeID, id)
	}
	return s, nil
}

func (a *admin) TransferLeader(ctx context.Context, req *idemv1.TransferLeaderRequest) (*idemv1.TransferLeaderResponse, error) {
	s, err := a.shard(req.GetShard())
	if err != nil {
		return nil, err
	}
	if err := s.group.TransferLeadership(req.GetTargetNodeId()); err != nil {
		return nil, adminError(err)
	}
	id, _ := s.group.Leader()
	return &idemv1.TransferLeaderResponse{LeaderId: id}, nil
}

func (a *admin) Snapshot(ctx context.Context, req *idemv1.SnapshotRequest) (*idemv1.SnapshotResponse, error) {
	s, err := a.shard(req.GetShard())
	if err != nil {
		return nil, err
	}
	index, term, err := s.group.Snapshot()
	if err != nil {
		return nil, adminError(err)
	}
	return &idemv1.SnapshotResponse{Index: index, Term: term}, nil
}

// ReplaceVoter rebuilds a voter's membership in a shard this node leads
// (idemctl replace-node): see raftstore.Group.ReplaceVoter.
func (a *admin) ReplaceVoter(ctx context.Context, req *idemv1.ReplaceVoterRequest) (*idemv1.ReplaceVoterResponse, error) {
	if req.GetShard() == MetaGroupID {
		return a.replaceMetaMember(ctx, req.GetNodeId())
	}
	s, err := a.shard(req.GetShard())
	if err != nil {
		return nil, err
	}
	if !slices.Contains(a.n.voters(s.info.ID, true), req.GetNodeId()) {
		return nil, status.Errorf(codes.InvalidArgument, "node %q is not a voter of shard %s in the topology", req.GetNodeId(), s.info.ID)
	}
	if err := s.group.ReplaceVoter(ctx, req.GetNodeId()); err != nil {
		return nil, adminError(err)
	}
	a.n.log.Info("voter replaced on operator request", "shard", s.info.ID, "voter", req.GetNodeId())
	return &idemv1.ReplaceVoterResponse{LeaderId: a.n.cfg.NodeID}, nil
}

// replaceMetaMember replaces node id in the meta group (idemctl
// replace-node), as the voter or learner the active topology makes it; on
// the meta group's leader only (FAILED_PRECONDITION elsewhere, naming it).
func (a *admin) replaceMetaMember(ctx context.Context, id string) (*idemv1.ReplaceVoterResponse, error) {
	v := a.n.view()
	if _, ok := v.node(id); !ok {
		return nil, status.Errorf(codes.InvalidArgument, "node %q is not in the cluster's topology", id)
	}
	voters, _ := v.active.MetaMembers()
	if err := a.n.metaGroup.ReplaceMember(ctx, id, slices.Contains(voters, id)); err != nil {
		return nil, adminError(err)
	}
	a.n.log.Info("meta group member replaced on operator request", "member", id)
	return &idemv1.ReplaceVoterResponse{LeaderId: a.n.cfg.NodeID}, nil
}

// Clock answers a peer's clock probe with this node's clock (the one it
// would stamp commands with, before any correction), whether its disk is
// below its reserve (the peer's admission control reads it) and the
// cluster version it advertises (the meta group's leader reads it).
func (a *admin) Clock(context.Context, *idemv1.ClockRequest) (*idemv1.ClockResponse, error) {
	low := false
	if d := a.n.disk; d != nil {
		low, _ = d.low()
	}
	return &idemv1.ClockResponse{UnixNanos: a.n.localNow(), BelowDiskReserve: low,
		AdvertisedVersion: uint32(a.n.advertisedVersion()), Features: clockFeatures(a.n.advertisedVersion())}, nil
}

func adminError(err error) error {
	switch {
	case errors.Is(err, raftstore.ErrNotLeader):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, raftstore.ErrUnknownPeer):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, raftstore.ErrNothingToSnapshot):
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}
