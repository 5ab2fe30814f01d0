package main

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
)

// A node forwards replays larger than gRPC's default 4 MiB message limit
// when --max-response-bytes allows them (its forwarder sizes messages from it).
func TestNodeForwardsLargeReplay(t *testing.T) {
	topo, err := launch.Topology(launch.Spec{Regions: []string{"r1"}, NodesPerRegion: 3, ShardsPerRegion: 1, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"), "--max-response-bytes", "6000000")
	if err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	var apis []*cluster.API
	for _, n := range topo.Nodes() {
		apis = append(apis, cluster.NewAPI(n.HTTPAddr))
	}
	body := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("x", 5000000)))
	// A 5 MB entry replicated three times can outlast a request's deadline
	// on a loaded machine; the contract's answer is 503, retried with the
	// same owner token, which is what a client does. Each step has its own
	// bound: a slow completion must not eat the replays' time. The
	// completion's is the longest: in the CI suite (nodes built with -race,
	// two heavy packages beside this one) its 5 MB entry was still being
	// retried after 45 s while the nodes' groups were re-electing; the
	// test is about the size limits, not about how fast a loaded box
	// replicates 15 MB.
	tctx := t.Context()
	only := apis[:1]
	check(t, 200)(retrying(tctx, only, 0, 45*time.Second, func(a *cluster.API) (cluster.Reply, error) {
		return a.Reserve(tctx, "ns", "big", map[string]any{"owner_token": "owner-token-000001"})
	}))
	check(t, 200)(retrying(tctx, only, 0, 3*time.Minute, func(a *cluster.API) (cluster.Reply, error) {
		return a.Complete(tctx, "ns", "big", map[string]any{"owner_token": "owner-token-000001", "response": map[string]any{"status": 200, "body": body}})
	}))
	for i, a := range apis {
		r, err := retrying(tctx, []*cluster.API{a}, 0, 45*time.Second, func(a *cluster.API) (cluster.Reply, error) {
			return a.Reserve(tctx, "ns", "big", map[string]any{})
		})
		if err != nil || r.Status != 200 || r.Str("outcome") != "COMPLETED" {
			t.Errorf("replay via node %d: %d %s %v", i, r.Status, r.ErrCode(), err)
		}
	}
}
