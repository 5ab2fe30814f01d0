package raftstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"
)

// TestLostStateIsRefusedAndReplaced: a node whose data dir lost its Raft
// state refuses to start the group with StartRequireState (it must not
// bootstrap over it: fencing tokens and its term and vote would go back);
// restarted empty with StartJoin it bootstraps nothing and takes its state
// from the leader; the leader's ReplaceVoter resets its membership, and it
// holds every acknowledged write, including those made while it was out,
// and takes part again (it can lead).
func TestLostStateIsRefusedAndReplaced(t *testing.T) {
	t.Parallel()
	shard := "s1"
	c := newTestCluster(t, 3, []string{shard}, nil)
	want := map[string]string{}
	for i := range 30 {
		k, v := fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)
		c.put(shard, k, v)
		want[k] = v
	}
	leader := c.leader(shard)
	victim := (leader + 1) % 3
	c.waitReplicated(shard, want, []int{victim})
	c.crash(victim)
	dir := c.nodes[victim].dir
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}

	// Lost state is refused.
	c.openHost(c.nodes[victim])
	_, err := c.nodes[victim].host.AddGroup(GroupConfig{ID: shard, Voters: c.voters(), Start: StartRequireState}, newKV())
	if !errors.Is(err, ErrStateMissing) {
		t.Fatalf("AddGroup with StartRequireState on an emptied dir: %v, want ErrStateMissing", err)
	}
	c.nodes[victim].host.Close()
	c.nodes[victim].up = false

	// Writes go on while it is out.
	for i := 30; i < 40; i++ {
		k, v := fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)
		c.put(shard, k, v)
		want[k] = v
	}

	// Restarted empty to join: it bootstraps nothing (no configuration of
	// its own, so it cannot campaign); what it holds comes from the leader.
	c.openHost(c.nodes[victim])
	c.addGroupsWith(c.nodes[victim], StartJoin)
	joined := c.group(victim, shard)

	// Replacement runs on the leader only.
	if err := joined.ReplaceVoter(context.Background(), c.nodes[leader].id); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("ReplaceVoter on a non-leader: %v, want ErrNotLeader", err)
	}
	leader = c.leader(shard)
	if err := c.group(leader, shard).ReplaceVoter(context.Background(), c.nodes[leader].id); err == nil {
		t.Fatal("ReplaceVoter of the leader itself succeeded")
	}
	if err := c.group(leader, shard).ReplaceVoter(context.Background(), "nobody"); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("ReplaceVoter of an unknown node: %v, want ErrUnknownPeer", err)
	}
	if err := c.group(leader, shard).ReplaceVoter(context.Background(), c.nodes[victim].id); err != nil {
		t.Fatalf("ReplaceVoter: %v", err)
	}
	c.waitReplicated(shard, want, []int{0, 1, 2})

	// It is a full voter again: it can take the leadership.
	deadline := time.Now().Add(15 * time.Second)
	for !joined.IsLeader() {
		l := c.leader(shard)
		if err := c.group(l, shard).TransferLeadership(c.nodes[victim].id); err != nil && !errors.Is(err, ErrNotLeader) {
			t.Logf("transfer to the replaced voter: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replaced voter never took the leadership; stats %+v", joined.Stats())
		}
		time.Sleep(50 * time.Millisecond) // between transfer attempts
	}
	c.put(shard, "after", "replace")
	want["after"] = "replace"
	c.waitReplicated(shard, want, []int{0, 1, 2})
}
