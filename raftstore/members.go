package raftstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
)

// Member is one server of a group's latest configuration.
type Member struct {
	ID    string
	Addr  string
	Voter bool // false: a non-voting replica catching up (a learner)
}

// Members returns the group's latest configuration (committed or not) as
// this replica knows it.
func (g *Group) Members() ([]Member, error) {
	if g.closed.Load() {
		return nil, shardErr(g.id, "%w", ErrShutdown)
	}
	cf := g.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return nil, g.translateRead(err)
	}
	var out []Member
	for _, s := range cf.Configuration().Servers {
		out = append(out, Member{ID: string(s.ID), Addr: string(s.Address), Voter: s.Suffrage == raft.Voter})
	}
	return out, nil
}

// member returns the server id of the latest configuration, on the leader.
func (g *Group) leaderMember(id string) (raft.Server, bool, error) {
	if g.closed.Load() {
		return raft.Server{}, false, shardErr(g.id, "%w", ErrShutdown)
	}
	if g.raft.State() != raft.Leader {
		return raft.Server{}, false, g.notLeader()
	}
	cf := g.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return raft.Server{}, false, g.translateRead(err)
	}
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == id {
			return s, true, nil
		}
	}
	return raft.Server{}, false, nil
}

// changeMembers runs one configuration change on the leader and waits for it
// to commit.
func (g *Group) changeMembers(ctx context.Context, what string, f func(time.Duration) raft.IndexFuture) error {
	ctx, cancel := g.opContext(ctx)
	defer cancel()
	if err := g.waitFuture(ctx, f(remaining(ctx))); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			return g.notLeader()
		}
		return shardErr(g.id, "%s: %w", what, err)
	}
	return nil
}

// AddLearner adds node id, reached at addr, as a non-voting member: the
// leader sends it a snapshot and the log, it votes nowhere until Promote.
// A node that already is a member (voter or not) is left as it is, so a
// repeated call is safe. Leader only (*NotLeaderError elsewhere).
func (g *Group) AddLearner(ctx context.Context, id, addr string) error {
	if err := checkDialable(addr); err != nil {
		return shardErr(g.id, "add learner %q: address: %w", id, err)
	}
	_, present, err := g.leaderMember(id)
	if err != nil || present {
		return err
	}
	if _, known := g.host.book.get(id); !known {
		g.host.SetPeer(id, addr) // this node's own view wins when it has one
	}
	if err := g.changeMembers(ctx, fmt.Sprintf("add learner %q", id), func(d time.Duration) raft.IndexFuture {
		return g.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, d)
	}); err != nil {
		return err
	}
	g.logger.Info("learner added: it catches up from this leader before it votes", "learner", id, "addr", addr)
	return nil
}

// Promote makes member id a voter. The caller checks first that it caught
// up (its applied index, read from the learner itself, near the leader's
// commit index): a voter that lags slows every commit that needs it. A
// voter is left as it is. Leader only.
func (g *Group) Promote(ctx context.Context, id string) error {
	s, present, err := g.leaderMember(id)
	if err != nil {
		return err
	}
	if !present {
		return shardErr(g.id, "promote %q: not a member: add it as a learner first: %w", id, ErrUnknownPeer)
	}
	if s.Suffrage == raft.Voter {
		return nil
	}
	if err := g.changeMembers(ctx, fmt.Sprintf("promote %q", id), func(d time.Duration) raft.IndexFuture {
		return g.raft.AddVoter(s.ID, s.Address, 0, d)
	}); err != nil {
		return err
	}
	g.logger.Info("learner promoted to voter", "voter", id)
	return nil
}

// RemoveMember removes member id (voter or learner) from the group; a
// node that is not a member is ignored. The leader never removes itself:
// hand the leadership over first (TransferLeadership). Leader only.
func (g *Group) RemoveMember(ctx context.Context, id string) error {
	if id == g.host.cfg.NodeID {
		return shardErr(g.id, "remove %q: this node leads the group; transfer the leadership first", id)
	}
	_, present, err := g.leaderMember(id)
	if err != nil || !present {
		return err
	}
	if err := g.changeMembers(ctx, fmt.Sprintf("remove %q", id), func(d time.Duration) raft.IndexFuture {
		return g.raft.RemoveServer(raft.ServerID(id), 0, d)
	}); err != nil {
		return err
	}
	g.logger.Info("member removed", "member", id)
	return nil
}

// RemoveGroup stops hosting group id: its Raft instance stops and the
// group leaves the host, without handing over anything. Its files stay
// where they are; AddGroup with the same id opens them again. For a replica
// its group no longer counts as a member (after a membership change).
func (h *Host) RemoveGroup(id string) error {
	h.mu.Lock()
	g := h.groups[id]
	delete(h.groups, id)
	h.mu.Unlock()
	if g == nil {
		return shardErr(id, "remove group: not hosted here")
	}
	err := g.shutdown()
	h.metrics.forgetGroup(id)
	g.logger.Info("raft group closed: this node no longer holds a seat in it")
	return err
}

// Demote makes voter id a non-voting member (a learner); a learner is left
// as it is. The leader never demotes itself. Leader only.
func (g *Group) Demote(ctx context.Context, id string) error {
	if id == g.host.cfg.NodeID {
		return shardErr(g.id, "demote %q: this node leads the group; transfer the leadership first", id)
	}
	s, present, err := g.leaderMember(id)
	if err != nil {
		return err
	}
	if !present {
		return shardErr(g.id, "demote %q: %w", id, ErrUnknownPeer)
	}
	if s.Suffrage != raft.Voter {
		return nil
	}
	if err := g.changeMembers(ctx, fmt.Sprintf("demote %q", id), func(d time.Duration) raft.IndexFuture {
		return g.raft.DemoteVoter(s.ID, 0, d)
	}); err != nil {
		return err
	}
	g.logger.Info("voter demoted to learner", "member", id)
	return nil
}

// Bootstrap writes the first configuration (voters) into a running group
// that started empty (StartJoin) and still holds no state, which makes it
// elect a leader among them: how a group that a topology change creates
// starts on the one node that is to bootstrap it, when its replica was
// opened before the node learnt of the change. A group that holds state
// already (a leader added it, or it bootstrapped before) is left as it is.
func (g *Group) Bootstrap(voters []Peer) error {
	servers := make([]raft.Server, 0, len(voters))
	for _, p := range voters {
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)})
	}
	err := g.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
	if errors.Is(err, raft.ErrCantBootstrap) {
		return nil
	}
	return err
}
