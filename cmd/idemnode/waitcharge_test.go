package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/topology"
)

// A waiting reserve that wakes up and proposes again is charged to its
// caller's rate like the request it is, on the node that runs the wait (the
// shard's leader), whether the caller sent it there or to a node that
// forwarded it. The principal "waiter" may send one request per 100 s
// (rate_per_s 0.01, burst 1): its waiting reserve takes its one token; when
// the key is released, the reserve would propose again, and gets 429.
// Before, the wake-up's proposals were free: each waiter of a key that
// kept being released proposed again without limit, whatever its rate.
func TestWaitingReserveChargesItsWakeUps(t *testing.T) {
	policy := `principals:
  - {name: root, namespaces: ["*"], role: admin}
  - {name: holder, namespaces: [pay], role: writer}
  - {name: waiter, namespaces: [pay], role: writer, rate_per_s: 0.01}
`
	c := startSecureCluster(t, launch.Spec{Cluster: "waitcharge", NodesPerRegion: 3, ShardsPerRegion: 1, Replicas: 3}, policy, "root", "holder", "waiter")
	topo := c.Topology
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	apis := map[string]map[string]*cluster.API{} // node -> principal -> API
	for _, n := range topo.Nodes() {
		apis[n.ID] = map[string]*cluster.API{}
		for _, p := range []string{"root", "holder", "waiter"} {
			a, err := c.API(n.HTTPAddr, p)
			if err != nil {
				t.Fatal(err)
			}
			a.RetryUnavailable = 10 * time.Second
			apis[n.ID][p] = a
		}
	}
	leader := ""
	shard := topology.ShardID(topo.Regions[0].Name, 0) // the one shard of keys (meta is the other group)
	testutil.Until(t, 30*time.Second, "a leader of shard "+shard, func() bool {
		for id, a := range apis {
			if v, err := a["root"].MetricSum(ctx, `idem_raft_leader{shard="`+shard+`"}`); err == nil && v == 1 {
				leader = id
				return true
			}
		}
		return false
	})
	follower := ""
	for id := range apis {
		if id != leader {
			follower = id
			break
		}
	}

	// waitWoken reserves key as waiter through entry while holder holds it,
	// waits until the leader holds the waiting reserve, releases the key and
	// returns the waiter's answer.
	waitWoken := func(entry, key string) cluster.Reply {
		t.Helper()
		owner := "owner-token-waitcharge-" + key
		if r, err := apis[leader]["holder"].Reserve(ctx, "pay", key, map[string]any{"owner_token": owner, "lease_ms": 60000}); err != nil || r.Str("outcome") != "ACQUIRED" {
			t.Fatalf("holder's reserve of %s: %v %v", key, r, err)
		}
		got := make(chan cluster.Reply, 1)
		go func() {
			r, err := apis[entry]["waiter"].Reserve(ctx, "pay", key, map[string]any{"wait_ms": 30000})
			if err != nil {
				r = cluster.Reply{Status: -1, Raw: []byte(err.Error())}
			}
			got <- r
		}()
		testutil.Until(t, 20*time.Second, fmt.Sprintf("the waiting reserve of %s on the leader %s", key, leader), func() bool {
			v, err := apis[leader]["root"].MetricSum(ctx, "idem_keys_waiting_reserves")
			return err == nil && v == 1
		})
		if r, err := apis[leader]["holder"].Release(ctx, "pay", key, map[string]any{"owner_token": owner}); err != nil || r.Status != 200 {
			t.Fatalf("holder's release of %s: %v %v", key, r, err)
		}
		select {
		case r := <-got:
			return r
		case <-ctx.Done():
			t.Fatalf("the waiting reserve of %s did not answer", key)
			return cluster.Reply{}
		}
	}

	// Straight to the leader: the reserve took the leader's one token, the
	// wake-up's proposal finds none.
	if r := waitWoken(leader, "direct"); r.Status != 429 || r.ErrCode() != "RESOURCE_EXHAUSTED" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("woken reserve sent to the leader: %v, want 429 RESOURCE_EXHAUSTED with Retry-After", r)
	}
	// Through a follower, which charged the reserve to its own bucket and
	// forwarded it: the leader charges the wake-up to the leader's bucket,
	// which the first reserve emptied.
	if r := waitWoken(follower, "forwarded"); r.Status != 429 || r.ErrCode() != "RESOURCE_EXHAUSTED" {
		t.Fatalf("woken reserve forwarded by %s: %v, want 429 RESOURCE_EXHAUSTED", follower, r)
	}
	// The refused proposal was never made: the key is free.
	if r, err := apis[leader]["holder"].Reserve(ctx, "pay", "forwarded", nil); err != nil || r.Str("outcome") != "ACQUIRED" {
		t.Fatalf("holder's reserve after the refused wake-up: %v %v", r, err)
	}
}
