package node

import (
	"fmt"
	"maps"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/server"
)

// TestRegionAnswersRouting: every node's Routing answer decodes into its own
// ring (same fingerprint), the topology's gRPC addresses and the shards'
// actual leaders; and a get forwarded by a follower names the leader in its
// idem-leader header, as a client learns it (in JSON, Idem-Leader with the
// leader's JSON address).
func TestRegionAnswersRouting(t *testing.T) {
	r := startRegion(t, 3, nil)
	testutil.Eventually(t, 30*time.Second, "leaders on their preferred voters", r.balanced)
	leaders := r.leaders()
	ring := r.nodes[0].view().ring
	for _, nn := range r.nodes {
		conn, err := grpc.NewClient(nn.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		api := idemv1.NewIdempotencyClient(conn)
		// A follower names a shard's leader once it heard from it: the
		// groups' own views above can be ahead of this node's answer for a
		// moment after the elections.
		var rt idemv1.Routing
		testutil.Eventually(t, 20*time.Second, nn.cfg.NodeID+" naming every leader", func() (bool, string) {
			resp, err := api.Routing(t.Context(), &idemv1.RoutingRequest{})
			if err != nil {
				t.Fatalf("Routing on %s: %v", nn.cfg.NodeID, err)
			}
			if rt, err = idemv1.RoutingFromProto(resp); err != nil {
				t.Fatalf("Routing on %s: %v", nn.cfg.NodeID, err)
			}
			return maps.Equal(rt.Leaders, leaders), fmt.Sprintf("leaders %v, the groups say %v", rt.Leaders, leaders)
		})
		if rt.NodeID != nn.cfg.NodeID || rt.Ring.Fingerprint() != ring.Fingerprint() {
			t.Fatalf("%s answered as %s with ring %s, want ring %s", nn.cfg.NodeID, rt.NodeID, rt.Ring.Fingerprint(), ring.Fingerprint())
		}
		for _, n := range r.topo.Nodes() {
			if rt.Nodes[n.ID].GRPCAddr != n.GRPCAddr {
				t.Errorf("%s: node %s at %q, the topology says %q", nn.cfg.NodeID, n.ID, rt.Nodes[n.ID].GRPCAddr, n.GRPCAddr)
			}
		}
		// A get of a key whose shard this node does not lead is forwarded;
		// the answer names the leader.
		for i := 0; ; i++ {
			key := fmt.Sprintf("absent-%d", i)
			shard := ring.Locate("pay", key).ID
			if leaders[shard] == nn.cfg.NodeID {
				continue
			}
			var header metadata.MD
			_, err := api.Get(t.Context(), &idemv1.GetRequest{Namespace: "pay", Key: key}, grpc.Header(&header))
			if status.Code(err) != codes.NotFound {
				t.Fatalf("get of an absent key on %s: %v, want NOT_FOUND", nn.cfg.NodeID, err)
			}
			if got := header.Get(idemv1.LeaderHeader); len(got) != 1 || got[0] != leaders[shard] {
				t.Fatalf("forwarded get on %s: leader header %v, want %s (shard %s)", nn.cfg.NodeID, got, leaders[shard], shard)
			}
			// The JSON API names the leader by its JSON address.
			leader, _ := r.topo.NodeByID(leaders[shard])
			resp, err := http.Get("http://" + nn.HTTPAddr() + "/v1/namespaces/pay/keys/" + key)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if got := resp.Header.Values(server.LeaderHeader); resp.StatusCode != http.StatusNotFound || len(got) != 1 || got[0] != leader.HTTPAddr {
				t.Fatalf("JSON get on %s: %d with %s %v, want 404 with [%s] (shard %s)", nn.cfg.NodeID, resp.StatusCode, server.LeaderHeader, got, leader.HTTPAddr, shard)
			}
			break
		}
	}
}
