package forward

import (
	"context"
	"fmt"
	"net"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/security/auth"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/topology"
)

// gatedNode is the real gRPC service over backend.Mem whose RPCs wait at a
// gate, and which records, per Batch RPC, the forwarded principal and hop
// count it carried and the keys of its operations.
type gatedNode struct {
	gate chan struct{}

	mu      sync.Mutex
	waiting int
	unary   int
	batches []gatedBatch
}

type gatedBatch struct {
	principal, hops string
	keys            []string
}

func (g *gatedNode) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	g.mu.Lock()
	g.waiting++
	g.mu.Unlock()
	<-g.gate
	md, _ := metadata.FromIncomingContext(ctx)
	g.mu.Lock()
	g.waiting--
	if b, ok := req.(*idemv1.BatchRequest); ok {
		gb := gatedBatch{principal: strings.Join(md.Get(auth.ForwardedPrincipalMetadata), ","), hops: strings.Join(md.Get(HopsHeader), ",")}
		for _, op := range b.GetOps() {
			gb.keys = append(gb.keys, op.GetReserve().GetKey())
		}
		g.batches = append(g.batches, gb)
	} else if path.Base(info.FullMethod) == "Reserve" {
		g.unary++
	}
	g.mu.Unlock()
	return handler(ctx, req)
}

func (f *Forwarder) queued() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, b := range f.batchers {
		n += b.Queued()
	}
	return n
}

// TestForwardBatches: concurrent forwarded calls to one node share Batch
// RPCs, but only calls forwarded for the same principal (and hop count):
// the node authorizes each operation as the principal its batch names.
func TestForwardBatches(t *testing.T) {
	g := &gatedNode{gate: make(chan struct{})}
	api, err := server.New(server.Config{Backend: backend.NewMem(backend.MemConfig{})})
	if err != nil {
		t.Fatal(err)
	}
	gs := api.NewGRPCServer(grpc.ChainUnaryInterceptor(g.intercept))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	openGate := sync.OnceFunc(func() { close(g.gate) })
	t.Cleanup(func() { openGate(); gs.Stop() })

	topo := &topology.Topology{Cluster: "fwd", Regions: []topology.Region{{Name: "r", Nodes: []topology.Node{{ID: "n-1", GRPCAddr: ln.Addr().String()}}}}}
	f, err := NewForwarder(ForwarderConfig{Topology: topo, Self: "n-0",
		DialOptions: append(DefaultDialOptions(), grpc.WithChainUnaryInterceptor(auth.ForwardUnaryClientInterceptor()))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	shard := topology.Shard{ID: "r-0", HomeRegion: "r", Voters: []string{"n-1"}}

	reserve := func(who, key string, hops int) chan error {
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(auth.WithPrincipal(t.Context(), &auth.Principal{Name: who}), 10*time.Second)
			defer cancel()
			res, err := f.Apply(ctx, shard, &fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: key, OwnerToken: "tok_0123456789abcdef"}, "", hops)
			if err == nil && res.Outcome != fsm.OutcomeAcquired {
				err = fmt.Errorf("%s: outcome %v", key, res.Outcome)
			}
			done <- err
		}()
		return done
	}
	poll := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	var all []chan error
	all = append(all, reserve("carol", "carol-slot-0", 0), reserve("carol", "carol-slot-1", 0))
	poll("two unary RPCs at the gate", func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.waiting == 2 })
	// carol's two unary RPCs fill her batcher's slots; her calls with
	// another hop count, and alice's, have batchers of their own (whose
	// first two calls go unary in turn).
	for i := range 4 {
		all = append(all, reserve("carol", fmt.Sprintf("carol-%d", i), 0), reserve("carol", fmt.Sprintf("carol-hop-%d", i), 1),
			reserve("alice", fmt.Sprintf("alice-%d", i), 0))
	}
	poll("every call at the gate or queued", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.waiting+f.queued() == len(all)
	})
	openGate() // everything goes: the queues as batches
	for _, done := range all {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	batched := 0
	for _, b := range g.batches {
		for _, k := range b.keys {
			owner, _, _ := strings.Cut(k, "-")
			hop := "1"
			if strings.HasPrefix(k, "carol-hop-") {
				hop = "2"
			}
			if owner != b.principal || hop != b.hops {
				t.Fatalf("key %s (hops %s) went in a batch forwarded for %q with hops %q", k, hop, b.principal, b.hops)
			}
			batched++
		}
	}
	if rpcs, calls := f.BatchStats(); rpcs == 0 || int(calls) != batched || len(g.batches) != int(rpcs) {
		t.Fatalf("forwarder: %d Batch RPCs answering %d calls; the node saw %d batches of %d operations", rpcs, calls, len(g.batches), batched)
	}
	if batched+g.unary != len(all) {
		t.Fatalf("%d batched and %d unary reserves, want %d in all", batched, g.unary, len(all))
	}
}
