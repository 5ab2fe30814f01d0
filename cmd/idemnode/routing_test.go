package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/topology"
)

// Tests of the Go client's leader routing against real idemnode processes:
// calls go to their shard's leader, so the nodes (almost) never forward.

// metricOf sums, over the cluster's running nodes, the samples of name whose
// labels contain every one of labels (`endpoint="reserve"`), read from their
// /metrics (over TLS on a secure cluster).
func metricOf(t *testing.T, c *cluster.Cluster, ids []string, name string, labels ...string) float64 {
	t.Helper()
	var sum float64
	for _, id := range ids {
		api, err := c.API(c.HTTPAddr(id), "")
		if err != nil {
			t.Fatal(err)
		}
		r, err := api.Do(t.Context(), "GET", "/metrics", nil)
		if err != nil || r.Status != 200 {
			t.Fatalf("/metrics of %s: %v %v", id, r, err)
		}
	lines:
		for _, line := range strings.Split(string(r.Raw), "\n") {
			if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
				continue
			}
			for _, l := range labels {
				if !strings.Contains(line, l) {
					continue lines
				}
			}
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			sum += v
		}
	}
	return sum
}

// forwards is how many requests the nodes forwarded to another node.
func forwards(t *testing.T, c *cluster.Cluster) float64 {
	return metricOf(t, c, nodeIDs(c), "idem_forward_requests_total")
}

// routingClient is a client of every node of c (TLS and token from adjust)
// that has learned the nodes' routing and every leader.
func routingClient(t *testing.T, c *cluster.Cluster, adjust func(*client.Config)) *client.Client {
	t.Helper()
	var eps []string
	for _, n := range c.Topology.Nodes() {
		eps = append(eps, n.GRPCAddr)
	}
	cfg := client.DefaultConfig(eps...)
	cfg.RequestTimeout = 15 * time.Second
	if adjust != nil {
		adjust(&cfg)
	}
	cl, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	ring, err := topology.NewRing(c.Topology)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := cl.Stats()
		if s.RingFingerprint == ring.Fingerprint() && s.KnownLeaders == len(ring.Shards()) {
			return cl
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client did not learn the routing (ring %s, %d shards): %+v", ring.Fingerprint(), len(ring.Shards()), s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cycles runs one reserve + complete per key, failing the test on any error.
func cycles(t *testing.T, cl *client.Client, namespace string, keys []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for _, k := range keys {
		res, err := cl.Reserve(ctx, client.ReserveRequest{Namespace: namespace, Key: k, Fingerprint: "fp"})
		if err != nil || res.Outcome != client.OutcomeAcquired {
			t.Fatalf("reserve %s: %+v, %v", k, res, err)
		}
		if _, err := cl.Complete(ctx, client.CompleteRequest{Namespace: namespace, Key: k, OwnerToken: res.OwnerToken,
			Response: client.Response{Status: 201, Body: []byte(k)}}); err != nil {
			t.Fatalf("complete %s: %v", k, err)
		}
	}
}

// leaderChanges is how many leader changes the nodes of c have seen, summed
// over nodes and shards.
func leaderChanges(t *testing.T, c *cluster.Cluster) float64 {
	return metricOf(t, c, nodeIDs(c), "idem_raft_leader_changes_total")
}

// checkForwards fails the test when the nodes forwarded more than the calls
// the client sent to an endpoint instead of a leader (each may have hit a
// follower), plus slack, plus the leader changes seen meanwhile (changes
// is after minus before of leaderChanges): an election nobody asked for,
// which a loaded box has, sends the next call of that shard to the old
// leader, which forwards it and names the new one.
func checkForwards(t *testing.T, what string, forwarded float64, before, after client.Stats, slack int, changes float64) {
	t.Helper()
	endpoint := after.EndpointAttempts - before.EndpointAttempts
	leader := after.LeaderAttempts - before.LeaderAttempts
	t.Logf("%s: %d attempts at the leader, %d at an endpoint, %v forwarded by the nodes, %v leader changes seen", what, leader, endpoint, forwarded, changes)
	if forwarded > float64(endpoint)+float64(slack)+changes {
		t.Fatalf("%s: the nodes forwarded %v requests; the client sent only %d to an endpoint (and %d to leaders), with %v leader changes seen: routing did not reach the leaders", what, forwarded, endpoint, leader, changes)
	}
}

func keysOf(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return keys
}

// TestClientRoutesToLeaders: 300 reserve+complete cycles of a routing
// client against a three-node region are (almost) never forwarded; after a
// leader transfer every call still succeeds and the calls of the moved
// shard go to the new leader (the old one forwards at most the first).
func TestClientRoutesToLeaders(t *testing.T) {
	c := startCluster(t, launch.Spec{})
	cl := routingClient(t, c, nil)

	f0, s0, l0 := forwards(t, c), cl.Stats(), leaderChanges(t, c)
	cycles(t, cl, "payments", keysOf("order", 300))
	f1, s1, l1 := forwards(t, c), cl.Stats(), leaderChanges(t, c)
	checkForwards(t, "300 cycles", f1-f0, s0, s1, 5, l1-l0)
	if s1.LeaderAttempts-s0.LeaderAttempts < 500 {
		t.Fatalf("only %d of 600 attempts went to a leader (%+v -> %+v)", s1.LeaderAttempts-s0.LeaderAttempts, s0, s1)
	}

	// Move one shard's leadership and use only that shard's keys.
	ring, err := topology.NewRing(c.Topology)
	if err != nil {
		t.Fatal(err)
	}
	shard := ring.Shards()[0]
	leaders, err := c.ShardLeaders(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	from := leaders[shard.ID]
	to := ""
	for _, v := range shard.Voters {
		if v != from {
			to = v
			break
		}
	}
	if err := transferLeader(t, c, from, shard.ID, to); err != nil {
		t.Fatalf("transfer %s from %s to %s: %v", shard.ID, from, to, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for leaders[shard.ID] != to {
		if time.Now().After(deadline) {
			t.Fatalf("shard %s led by %q, want %s after the transfer", shard.ID, leaders[shard.ID], to)
		}
		time.Sleep(50 * time.Millisecond)
		if leaders, err = c.ShardLeaders(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	var moved []string
	for i := 0; len(moved) < 60; i++ {
		if k := fmt.Sprintf("moved-%d", i); ring.Locate("payments", k).ID == shard.ID {
			moved = append(moved, k)
		}
	}
	grpcCalls := func(id string) float64 {
		return metricOf(t, c, []string{id}, "idem_api_requests_total", `api="grpc"`, `endpoint="reserve"`) +
			metricOf(t, c, []string{id}, "idem_api_requests_total", `api="grpc"`, `endpoint="complete"`)
	}
	f2, s2, old0, l2 := forwards(t, c), cl.Stats(), grpcCalls(from), leaderChanges(t, c)
	cycles(t, cl, "payments", moved)
	f3, s3, old1, l3 := forwards(t, c), cl.Stats(), grpcCalls(from), leaderChanges(t, c)
	// The first call after the transfer goes to the old leader, which
	// forwards it and names the new one.
	checkForwards(t, "after the transfer", f3-f2, s2, s3, 2, l3-l2)
	if got := old1 - old0; got > float64(s3.EndpointAttempts-s2.EndpointAttempts)+2 {
		t.Fatalf("the old leader %s still got %v of the moved shard's %d calls", from, got, 2*len(moved))
	}
}

// TestClientRoutesToLeadersSecure: in secure mode the client reaches the
// leaders over TLS with its own certificate, as it reaches the endpoints,
// and Routing is open to an application principal (a writer of one
// namespace); the node certificates cover the topology's addresses.
func TestClientRoutesToLeadersSecure(t *testing.T) {
	c := startSecureCluster(t, launch.Spec{Cluster: "sec"}, "principals:\n  - name: app\n    namespaces: [app]\n    role: writer\n", "app")
	tlsCfg, err := c.ClientTLS("app")
	if err != nil {
		t.Fatal(err)
	}
	cl := routingClient(t, c, func(cfg *client.Config) { cfg.TLS = tlsCfg })
	f0, s0, l0 := forwards(t, c), cl.Stats(), leaderChanges(t, c)
	cycles(t, cl, "app", keysOf("secure", 100))
	f1, s1, l1 := forwards(t, c), cl.Stats(), leaderChanges(t, c)
	checkForwards(t, "100 secure cycles", f1-f0, s0, s1, 5, l1-l0)
	if s1.LeaderAttempts-s0.LeaderAttempts < 150 {
		t.Fatalf("only %d of 200 attempts went to a leader over TLS (%+v -> %+v)", s1.LeaderAttempts-s0.LeaderAttempts, s0, s1)
	}
}
