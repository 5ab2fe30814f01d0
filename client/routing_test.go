package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemtest"
	"github.com/idem-dev/idem/topology"
)

// region is three idemtest servers standing in for the nodes n1, n2, n3 of
// a one-region topology whose gRPC addresses are theirs (grpcAddr overrides
// a node's address, to make it unreachable).
type region struct {
	topo    *topology.Topology
	ring    *topology.Ring
	servers map[string]*idemtest.Server
}

func newRegion(t *testing.T, grpcAddr map[string]string) *region {
	t.Helper()
	rg := &region{servers: map[string]*idemtest.Server{}}
	topo := &topology.Topology{Cluster: "unit", ShardsPerRegion: 4, Replicas: 3}
	r := topology.Region{Name: "r1"}
	for i := 1; i <= 3; i++ {
		id := "n" + strconv.Itoa(i)
		srv := startServer(t, idemtest.Config{})
		rg.servers[id] = srv
		addr := srv.Addr()
		if a, ok := grpcAddr[id]; ok {
			addr = a
		}
		// Raft and HTTP addresses are never dialled here: privileged
		// ports no listener of the test can hold.
		r.Nodes = append(r.Nodes, topology.Node{ID: id, GRPCAddr: addr,
			RaftAddr: "127.0.0.1:" + strconv.Itoa(2*i), HTTPAddr: "127.0.0.1:" + strconv.Itoa(2*i+1)})
	}
	topo.Regions = []topology.Region{r}
	ring, err := topology.NewRing(topo)
	if err != nil {
		t.Fatal(err)
	}
	rg.topo, rg.ring = topo, ring
	return rg
}

// serveRouting makes every server answer Routing with leaders.
func (rg *region) serveRouting(leaders map[string]string) {
	for id, srv := range rg.servers {
		srv.SetRouting(idemv1.RoutingToProto(rg.ring, rg.topo.Nodes(), id, leaders))
	}
}

func (rg *region) reserves() map[string]int {
	out := map[string]int{}
	for id, srv := range rg.servers {
		out[id] = srv.Calls(idemtest.MethodReserve)
	}
	return out
}

// reserveOn reserves key and returns the server it landed on.
func (rg *region) reserveOn(t *testing.T, c *client.Client, key string) string {
	t.Helper()
	before := rg.reserves()
	if _, err := c.Reserve(t.Context(), client.ReserveRequest{Namespace: ns, Key: key}); err != nil {
		t.Fatal(err)
	}
	landed := ""
	for id, n := range rg.reserves() {
		if d := n - before[id]; d == 1 && landed == "" {
			landed = id
		} else if d != 0 {
			t.Fatalf("reserve of %s reached the servers %v -> %v, want exactly one call", key, before, rg.reserves())
		}
	}
	return landed
}

// keyIn returns a fresh key of shard (by the region's ring).
func (rg *region) keyIn(t *testing.T, shard string, seq *int) string {
	t.Helper()
	for range 100000 {
		*seq++
		k := fmt.Sprintf("k-%d", *seq)
		if rg.ring.Locate(ns, k).ID == shard {
			return k
		}
	}
	t.Fatalf("no key found in shard %s", shard)
	return ""
}

// waitFor polls cond until it holds, failing the test after 10 s with what
// was last seen.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, seen := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: last seen %s", what, seen)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitRouting(t *testing.T, c *client.Client, fingerprint string) {
	t.Helper()
	waitFor(t, "routing learned", func() (bool, string) {
		s := c.Stats()
		return s.RingFingerprint == fingerprint, fmt.Sprintf("%+v", s)
	})
}

// TestRoutingFollowsTheNodesRing: with routing learned from one endpoint,
// every call lands on the leader the nodes named for the shard the nodes'
// ring places its key in, including leaders that are no endpoint.
func TestRoutingFollowsTheNodesRing(t *testing.T) {
	rg := newRegion(t, nil)
	leaders := map[string]string{}
	for i, s := range rg.ring.Shards() {
		leaders[s.ID] = "n" + strconv.Itoa(i%3+1)
	}
	rg.serveRouting(leaders)
	c := newClient(t, []string{rg.servers["n1"].Addr()})
	waitRouting(t, c, rg.ring.Fingerprint())
	seq := 0
	// The first call for a leader not yet connected goes to the endpoint
	// (and starts connecting); wait until each shard's leader took a call.
	for _, s := range rg.ring.Shards() {
		waitFor(t, "a call of shard "+s.ID+" at its leader", func() (bool, string) {
			landed := rg.reserveOn(t, c, rg.keyIn(t, s.ID, &seq))
			return landed == leaders[s.ID], "landed on " + landed
		})
	}
	before := c.Stats()
	for i := range 200 {
		k := fmt.Sprintf("placed-%d", i)
		want := leaders[rg.ring.Locate(ns, k).ID]
		if got := rg.reserveOn(t, c, k); got != want {
			t.Fatalf("key %s landed on %s, want %s, the leader of shard %s", k, got, want, rg.ring.Locate(ns, k).ID)
		}
	}
	after := c.Stats()
	if d := after.LeaderAttempts - before.LeaderAttempts; d != 200 || after.EndpointAttempts != before.EndpointAttempts {
		t.Fatalf("stats %+v -> %+v: want 200 more leader attempts and no endpoint attempt", before, after)
	}
}

// TestRoutingFollowsLeaderHints: the leader header of answers moves calls to
// the node it names, and to the next one when the named node names another.
func TestRoutingFollowsLeaderHints(t *testing.T) {
	rg := newRegion(t, nil)
	rg.serveRouting(nil) // no leader known
	for _, srv := range rg.servers {
		srv.SetLeaderHint("n3")
	}
	c := newClient(t, []string{rg.servers["n1"].Addr()})
	waitRouting(t, c, rg.ring.Fingerprint())
	// Leaders are learned per shard: the calls here are all of one shard.
	shard := rg.ring.Shards()[0].ID
	seq := 0
	if got := rg.reserveOn(t, c, rg.keyIn(t, shard, &seq)); got != "n1" {
		t.Fatalf("first call on %s, want the endpoint n1 (no leader known)", got)
	}
	waitFor(t, "calls at n3", func() (bool, string) {
		got := rg.reserveOn(t, c, rg.keyIn(t, shard, &seq))
		return got == "n3", "landed on " + got
	})
	for i := range 20 {
		if got := rg.reserveOn(t, c, rg.keyIn(t, shard, &seq)); got != "n3" {
			t.Fatalf("call %d on %s, want n3", i, got)
		}
	}
	// n3 hands over to n2 and says so; calls of the shard follow.
	rg.servers["n3"].SetLeaderHint("n2")
	rg.servers["n1"].SetLeaderHint("n2")
	if got := rg.reserveOn(t, c, rg.keyIn(t, shard, &seq)); got != "n3" {
		t.Fatalf("call before the hint on %s, want n3", got)
	}
	waitFor(t, "calls of shard "+shard+" at n2", func() (bool, string) {
		got := rg.reserveOn(t, c, rg.keyIn(t, shard, &seq))
		return got == "n2", "landed on " + got
	})
}

// TestRoutingFallsBack: endpoints that do not serve routing (routers) or
// answer a ring that does not match its fingerprint, and a leader whose
// address cannot be reached, leave every call round-robin on the endpoints,
// and all succeed.
func TestRoutingFallsBack(t *testing.T) {
	t.Run("unimplemented", func(t *testing.T) {
		rg := newRegion(t, nil)
		c := newClient(t, []string{rg.servers["n1"].Addr(), rg.servers["n2"].Addr()})
		waitFor(t, "routing asked", func() (bool, string) {
			n := rg.servers["n1"].Calls(idemtest.MethodRouting) + rg.servers["n2"].Calls(idemtest.MethodRouting)
			return n > 0, fmt.Sprint(n, " routing calls")
		})
		for i := range 20 {
			if got := rg.reserveOn(t, c, fmt.Sprintf("rr-%d", i)); got == "n3" {
				t.Fatalf("call %d on n3, which is no endpoint", i)
			}
		}
		if s := c.Stats(); s.RingFingerprint != "" || s.LeaderAttempts != 0 || s.EndpointAttempts != 20 {
			t.Fatalf("stats %+v: want no ring, 20 endpoint attempts", s)
		}
	})
	t.Run("fingerprint mismatch", func(t *testing.T) {
		rg := newRegion(t, nil)
		resp := idemv1.RoutingToProto(rg.ring, rg.topo.Nodes(), "n1", map[string]string{rg.ring.Shards()[0].ID: "n3"})
		resp.RingFingerprint = strings.Repeat("0", len(resp.RingFingerprint))
		rg.servers["n1"].SetRouting(resp)
		c := newClient(t, []string{rg.servers["n1"].Addr()}, func(cfg *client.Config) { cfg.RoutingRefresh = 20 * time.Millisecond })
		waitFor(t, "routing asked twice", func() (bool, string) {
			n := rg.servers["n1"].Calls(idemtest.MethodRouting)
			return n >= 2, fmt.Sprint(n, " routing calls")
		})
		for i := range 20 {
			if got := rg.reserveOn(t, c, fmt.Sprintf("mm-%d", i)); got != "n1" {
				t.Fatalf("call %d on %s, want the endpoint n1", i, got)
			}
		}
		if s := c.Stats(); s.RingFingerprint != "" || s.LeaderAttempts != 0 {
			t.Fatalf("stats %+v: a refused ring is not used", s)
		}
	})
	t.Run("leader unreachable", func(t *testing.T) {
		rg := newRegion(t, map[string]string{"n2": deadAddr(t)})
		leaders := map[string]string{}
		for _, s := range rg.ring.Shards() {
			leaders[s.ID] = "n2"
		}
		rg.serveRouting(leaders)
		c := newClient(t, []string{rg.servers["n1"].Addr()})
		waitRouting(t, c, rg.ring.Fingerprint())
		for i := range 30 {
			if got := rg.reserveOn(t, c, fmt.Sprintf("un-%d", i)); got != "n1" {
				t.Fatalf("call %d on %s, want the endpoint n1", i, got)
			}
		}
		if s := c.Stats(); s.LeaderAttempts != 0 || s.EndpointAttempts != 30 {
			t.Fatalf("stats %+v: want every attempt on the endpoint", s)
		}
	})
	t.Run("leader fails", func(t *testing.T) {
		rg := newRegion(t, nil)
		shard := rg.ring.Shards()[0].ID
		rg.serveRouting(map[string]string{shard: "n2"})
		c := newClient(t, []string{rg.servers["n1"].Addr()})
		waitRouting(t, c, rg.ring.Fingerprint())
		seq := 0
		waitFor(t, "a call at n2", func() (bool, string) {
			got := rg.reserveOn(t, c, rg.keyIn(t, shard, &seq))
			return got == "n2", "landed on " + got
		})
		known := c.Stats().KnownLeaders
		rg.servers["n2"].FailNext(idemtest.MethodReserve, 1, codes.Unavailable)
		before := rg.reserves()
		key := rg.keyIn(t, shard, &seq)
		res, err := c.Reserve(t.Context(), client.ReserveRequest{Namespace: ns, Key: key})
		if err != nil || res.Outcome != client.OutcomeAcquired {
			t.Fatalf("reserve after the leader failed: %+v, %v", res, err)
		}
		after := rg.reserves()
		if after["n2"]-before["n2"] != 1 || after["n1"]-before["n1"] != 1 {
			t.Fatalf("reserves %v -> %v: want one failed attempt at n2, the retry at the endpoint n1", before, after)
		}
		if s := c.Stats(); s.KnownLeaders != known-1 {
			t.Fatalf("stats %+v: the failed leader should be forgotten (knew %d)", s, known)
		}
	})
}

// TestRoutingCoolsDownAFailedLeader: a leader whose attempts fail
// undecided while the nodes keep naming it (cut off from this client alone)
// gets no first attempt during the cooldown: it costs one failed attempt,
// not one per call.
func TestRoutingCoolsDownAFailedLeader(t *testing.T) {
	old := client.SetLeaderCooldown(time.Hour)
	t.Cleanup(func() { client.SetLeaderCooldown(old) })
	rg := newRegion(t, nil)
	shard := rg.ring.Shards()[0].ID
	rg.serveRouting(map[string]string{shard: "n2"})
	for _, srv := range rg.servers {
		srv.SetLeaderHint("n2")
	}
	c := newClient(t, []string{rg.servers["n1"].Addr()})
	waitRouting(t, c, rg.ring.Fingerprint())
	seq := 0
	waitFor(t, "a call at n2", func() (bool, string) {
		got := rg.reserveOn(t, c, rg.keyIn(t, shard, &seq))
		return got == "n2", "landed on " + got
	})
	rg.servers["n2"].FailNext(idemtest.MethodReserve, -1, codes.Unavailable)
	before := rg.reserves()
	for i := range 10 {
		res, err := c.Reserve(t.Context(), client.ReserveRequest{Namespace: ns, Key: rg.keyIn(t, shard, &seq)})
		if err != nil || res.Outcome != client.OutcomeAcquired {
			t.Fatalf("reserve %d with the leader failing: %+v, %v", i, res, err)
		}
	}
	after := rg.reserves()
	if after["n2"]-before["n2"] != 1 || after["n1"]-before["n1"] != 10 {
		t.Fatalf("reserves %v -> %v: want one failed attempt at n2, then every call at the endpoint n1 although it names n2", before, after)
	}
}

// TestRoutingCanBeTurnedOff: DisableRouting never asks for routing.
func TestRoutingCanBeTurnedOff(t *testing.T) {
	rg := newRegion(t, nil)
	rg.serveRouting(map[string]string{rg.ring.Shards()[0].ID: "n2"})
	c := newClient(t, []string{rg.servers["n1"].Addr()}, func(cfg *client.Config) { cfg.DisableRouting = true })
	for i := range 10 {
		if got := rg.reserveOn(t, c, fmt.Sprintf("off-%d", i)); got != "n1" {
			t.Fatalf("call %d on %s, want n1", i, got)
		}
	}
	if n := rg.servers["n1"].Calls(idemtest.MethodRouting); n != 0 {
		t.Fatalf("%d routing calls with routing off", n)
	}
	if s := c.Stats(); s.EndpointAttempts != 10 || s.RingFingerprint != "" {
		t.Fatalf("stats %+v", s)
	}
}

// TestRoutingCloseStopsEverything: Close ends the refresher, also one
// waiting on an endpoint that never answers, and the connections to leaders;
// later calls fail with ErrClosed.
func TestRoutingCloseStopsEverything(t *testing.T) {
	rg := newRegion(t, nil)
	rg.serveRouting(map[string]string{rg.ring.Shards()[0].ID: "n2", rg.ring.Shards()[1].ID: "n3"})
	c := newClient(t, []string{rg.servers["n1"].Addr()}, func(cfg *client.Config) { cfg.RoutingRefresh = 10 * time.Millisecond })
	waitRouting(t, c, rg.ring.Fingerprint())
	seq := 0
	for _, shard := range []string{rg.ring.Shards()[0].ID, rg.ring.Shards()[1].ID} {
		waitFor(t, "a call at the leader of "+shard, func() (bool, string) {
			got := rg.reserveOn(t, c, rg.keyIn(t, shard, &seq))
			return got != "n1", "landed on " + got
		})
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	noRoutingGoroutine(t)
	_, err := c.Reserve(context.Background(), client.ReserveRequest{Namespace: ns, Key: "late"})
	if !errors.Is(err, client.ErrClosed) {
		t.Fatalf("reserve after Close: %v, want ErrClosed", err)
	}

	// An endpoint that accepts connections and never answers holds the
	// first Routing call for the whole (hour-long) request timeout: Close
	// cancels it.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = silent.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if conn, err := silent.Accept(); err == nil {
			accepted <- conn
		}
	}()
	stuck := newClient(t, []string{silent.Addr().String()}, func(cfg *client.Config) { cfg.RequestTimeout = time.Hour })
	select {
	case conn := <-accepted:
		t.Cleanup(func() { _ = conn.Close() })
	case <-time.After(time.Minute):
		t.Fatal("the client never connected to the silent endpoint to ask for routing")
	}
	closed := make(chan error, 1)
	go func() { closed <- stuck.Close() }()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close did not return within a minute: the Routing call in flight was not cancelled")
	}
	noRoutingGoroutine(t)
}

// noRoutingGoroutine waits until no goroutine of the client's routing is
// left (one that closed its done channel may still be returning).
func noRoutingGoroutine(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	waitFor(t, "the routing goroutines to end", func() (bool, string) {
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "client.(*leaderRouter)") {
				return false, g
			}
		}
		return true, ""
	})
}
