package server

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/fsm"
)

// routedBackend is a backend.Routed over Mem that records the hops it was
// given and names a fixed leader, or refuses as a follower.
type routedBackend struct {
	*backend.Mem
	follower bool

	mu   sync.Mutex
	hops []int
}

func (b *routedBackend) ApplyRouted(ctx context.Context, cmd *fsm.Command, hops int) (fsm.Result, string, error) {
	b.mu.Lock()
	b.hops = append(b.hops, hops)
	b.mu.Unlock()
	if b.follower {
		return fsm.Result{}, "", &backend.NotLeaderError{Shard: "s-0", Leader: "node-7"}
	}
	res, err := b.Apply(ctx, cmd)
	return res, "node-3", err
}

func (b *routedBackend) GetRouted(ctx context.Context, namespace, key string, hops int) (fsm.Record, bool, string, error) {
	rec, ok, err := b.Get(ctx, namespace, key)
	return rec, ok, "node-3", err
}

// The hop count reaches the backend as data and its leader hint goes back as
// the LeaderHeader, so no process hides them in a context.
func TestRoutedHopsAndLeaderAreData(t *testing.T) {
	b := &routedBackend{Mem: newMemBackend(newFakeClock())}
	h := newHarness(t, b, nil)
	ctx := metadata.AppendToOutgoingContext(t.Context(), idemv1.HopsHeader, "1")
	var header metadata.MD
	if _, err := h.grpc.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "ns", Key: "k"}, grpc.Header(&header)); err != nil {
		t.Fatal(err)
	}
	if got := header.Get(idemv1.LeaderHeader); len(got) != 1 || got[0] != "node-3" {
		t.Fatalf("leader header %v, want [node-3]", got)
	}
	if _, err := h.grpc.Reserve(metadata.AppendToOutgoingContext(t.Context(), idemv1.HopsHeader, "junk"),
		&idemv1.ReserveRequest{Namespace: "ns", Key: "k2"}); err != nil {
		t.Fatal(err)
	}
	h.do("POST", ns+"k3:reserve", "") // JSON: never forwarded
	b.mu.Lock()
	hops := append([]int(nil), b.hops...)
	b.mu.Unlock()
	if len(hops) != 3 || hops[0] != 1 || hops[1] != idemv1.MaxHops || hops[2] != 0 {
		t.Fatalf("hops seen by the backend %v, want [1 %d 0]", hops, idemv1.MaxHops)
	}

	// A follower's NotLeaderError: UNAVAILABLE, and its leader hint on the
	// wire.
	b.follower = true
	header = nil
	_, err := h.grpc.Reserve(t.Context(), &idemv1.ReserveRequest{Namespace: "ns", Key: "k4"}, grpc.Header(&header))
	expectStatus(t, err, idemv1.GRPCCode(CodeUnavailable), CodeUnavailable)
	if got := header.Get(idemv1.LeaderHeader); len(got) != 1 || got[0] != "node-7" {
		t.Fatalf("leader header of a follower %v, want [node-7]", got)
	}
}

// The JSON API names the key's shard's leader by its JSON address in the
// LeaderHeader, on answers and errors alike, once the server can resolve
// node ids (a node's); without LeaderAddr (a router's) there is no header.
func TestJSONLeaderHeader(t *testing.T) {
	addrs := map[string]string{"node-3": "10.0.0.3:8080", "node-7": "10.0.0.7:8080"}
	b := &routedBackend{Mem: newMemBackend(newFakeClock())}
	h := newHarness(t, b, func(c *Config) { c.LeaderAddr = func(id string) string { return addrs[id] } })
	expect := func(r reply, want string) {
		t.Helper()
		if got := r.header.Values(LeaderHeader); want == "" && len(got) != 0 || want != "" && (len(got) != 1 || got[0] != want) {
			t.Fatalf("%s %v (status %d), want %q", LeaderHeader, got, r.status, want)
		}
	}
	r := h.do("POST", ns+"k1:reserve", `{"owner_token":"owner-token-0001"}`)
	if r.status != 200 {
		t.Fatalf("reserve: %d %s", r.status, r)
	}
	expect(r, "10.0.0.3:8080")
	expect(h.do("POST", ns+"k1:complete", `{"owner_token":"owner-token-0001","response":{"status":200}}`), "10.0.0.3:8080")
	expect(h.do("GET", ns+"k1", ""), "10.0.0.3:8080")
	// NOT_OWNER: still the leader's address.
	r = h.do("POST", ns+"k1:release", `{"owner_token":"other-token-0002"}`)
	h.expectError(r, 409, CodeNotOwner)
	expect(r, "10.0.0.3:8080")
	// A follower's NotLeaderError: 503 with the leader it names.
	b.follower = true
	r = h.do("POST", ns+"k2:reserve", `{}`)
	h.expectError(r, 503, CodeUnavailable)
	expect(r, "10.0.0.7:8080")
	// Validation fails before the backend names anyone.
	expect(h.do("POST", ns+"k2:reserve", `{"lease_ms":"x"}`), "")

	// A router's server resolves no addresses: no header.
	plain := newHarness(t, &routedBackend{Mem: newMemBackend(newFakeClock())}, nil)
	expect(plain.do("POST", ns+"k1:reserve", `{}`), "")
	// An unknown node id: no header either.
	b.follower = false
	delete(addrs, "node-3")
	expect(h.do("POST", ns+"k3:reserve", `{}`), "")
}
