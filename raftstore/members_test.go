package raftstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// A fourth node joins a three-voter group as a learner, catches up, is
// promoted, and an old voter leaves: the group keeps every write, the
// learner never counts for a quorum before its promotion, and the removed
// node's group can be closed while the others go on.
func TestLearnerJoinsPromotesAndVoterLeaves(t *testing.T) {
	t.Parallel()
	shard := "s1"
	c := newTestCluster(t, 3, []string{shard}, nil)
	want := map[string]string{}
	put := func(from, to int) {
		for i := from; i < to; i++ {
			k, v := fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)
			c.put(shard, k, v)
			want[k] = v
		}
	}
	put(0, 50)

	// The joiner starts empty and waits: it has no configuration, so it
	// neither campaigns nor counts.
	joiner := &testNode{id: "node3", dir: t.TempDir(), addr: "127.0.0.1:0"}
	c.openHost(joiner)
	t.Cleanup(func() {
		if joiner.up {
			joiner.host.Close()
		}
	})
	joiner.addr = joiner.host.Addr()
	sm := newKV()
	if _, err := joiner.host.AddGroup(GroupConfig{ID: shard, Voters: []Peer{{ID: joiner.id, Addr: joiner.addr}}, Start: StartJoin}, sm); err != nil {
		t.Fatal(err)
	}
	joiner.sms[shard] = sm

	leader := c.leader(shard)
	lg := c.group(leader, shard)
	ctx := context.Background()
	if err := c.group((leader+1)%3, shard).AddLearner(ctx, joiner.id, joiner.addr); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("AddLearner on a follower: %v, want ErrNotLeader", err)
	}
	if err := lg.Promote(ctx, joiner.id); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("Promote before AddLearner: %v, want ErrUnknownPeer", err)
	}
	for range 2 { // repeated: a resumed change runs steps again
		if err := lg.AddLearner(ctx, joiner.id, joiner.addr); err != nil {
			t.Fatalf("AddLearner: %v", err)
		}
	}
	c.nodes = append(c.nodes, joiner) // it follows the leader now
	members, err := lg.Members()
	if err != nil {
		t.Fatal(err)
	}
	voters, learners := 0, 0
	for _, m := range members {
		if m.Voter {
			voters++
		} else if m.ID == joiner.id {
			learners++
		}
	}
	if voters != 3 || learners != 1 {
		t.Fatalf("members after AddLearner: %+v, want 3 voters and the learner", members)
	}
	put(50, 80)
	c.waitReplicated(shard, want, []int{3})
	if joiner.host.groups[shard].IsMember() {
		t.Fatal("a learner reports itself a voting member")
	}
	for range 2 {
		if err := lg.Promote(ctx, joiner.id); err != nil {
			t.Fatalf("Promote: %v", err)
		}
	}

	// An old voter (not the leader) leaves; the leader refuses to remove
	// itself.
	if err := lg.RemoveMember(ctx, c.nodes[leader].id); err == nil {
		t.Fatal("the leader removed itself")
	}
	leaving := (leader + 1) % 3
	for range 2 {
		if err := lg.RemoveMember(ctx, c.nodes[leaving].id); err != nil {
			t.Fatalf("RemoveMember: %v", err)
		}
	}
	if err := c.nodes[leaving].host.RemoveGroup(shard); err != nil {
		t.Fatalf("RemoveGroup: %v", err)
	}
	if _, ok := c.nodes[leaving].host.Group(shard); ok {
		t.Fatal("the removed group is still hosted")
	}
	c.crash(leaving) // the node left the cluster
	put(80, 100)
	stay := []int{leader, (leader + 2) % 3, 3}
	c.waitReplicated(shard, want, stay)

	// The new voter counts: with the leaving node gone and one more old
	// voter crashed, the leader and the new voter still commit.
	other := (leader + 2) % 3
	c.crash(other)
	put(100, 110)
	c.waitReplicated(shard, want, []int{leader, 3})
	if !joiner.host.groups[shard].IsMember() {
		t.Fatal("the promoted node does not report itself a voter")
	}
	// And it can lead.
	if err := c.group(leader, shard).TransferLeadership(joiner.id); err != nil {
		t.Fatalf("TransferLeadership to the new voter: %v", err)
	}
	if got := c.leaderAmong(shard, []int{leader, 3}, 10*time.Second); got != 3 {
		t.Fatalf("leader after the transfer: %s, want %s", c.nodes[got].id, joiner.id)
	}
}
