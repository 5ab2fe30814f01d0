package node

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/datadir"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/topology"
)

// oneNode is a one-node cluster whose processes listen on ports the kernel
// picks (the topology's addresses are never dialled with one replica).
func oneNode(t *testing.T) Config {
	t.Helper()
	topo := &topology.Topology{Cluster: "solo", ShardsPerRegion: 2, Replicas: 1, Regions: []topology.Region{{
		Name: "local", Nodes: []topology.Node{{ID: "n1", RaftAddr: "127.0.0.1:1", GRPCAddr: "127.0.0.1:2", HTTPAddr: "127.0.0.1:3"}},
	}}}
	if err := topo.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Topology, cfg.NodeID, cfg.DataDir = topo, "n1", filepath.Join(t.TempDir(), "data")
	cfg.HTTPAddr, cfg.GRPCAddr, cfg.RaftAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Logger = testutil.Logger(t, slog.LevelWarn)
	return cfg
}

// TestNewHasNoSideEffects: New touches neither disk nor network; Start
// opens the data dir and binds; Close releases the listeners.
func TestNewHasNoSideEffects(t *testing.T) {
	cfg := oneNode(t)
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cfg.DataDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("New created the data dir (stat: %v)", err)
	}
	if err := n.Serve(t.Context()); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("Serve before Start: %v, want ErrNotStarted", err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, datadir.IdentityFile)); err != nil {
		t.Fatalf("Start wrote no identity file: %v", err)
	}
	addr := n.HTTPAddr()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("nothing listens on %s after Start: %v", addr, err)
	}
	conn.Close()
	testutil.Eventually(t, 30*time.Second, "the node to be ready", func() (bool, string) {
		err := n.Ready(t.Context())
		return err == nil, "ready: " + errString(err)
	})
	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("%s still accepts connections after Close", addr)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestStartFailureReleasesEverything: a Start that cannot bind its API
// listener closes the Raft groups it opened, so a second node can use the
// data dir.
func TestStartFailureReleasesEverything(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg := oneNode(t)
	cfg.GRPCAddr = busy.Addr().String()
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err == nil {
		t.Fatal("Start on a busy gRPC address succeeded")
	}
	cfg.GRPCAddr = "127.0.0.1:0"
	again, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Start(); err != nil {
		t.Fatalf("Start after a failed Start on the same data dir: %v", err)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// startTogether starts nodes at once, as a new cluster's nodes start: each
// waits for the others to answer before it bootstraps (awaitFirstStart),
// and serves (serve(i), which must call Serve or start it) as soon as its
// Start returns, since the others ask it again then.
func startTogether(ctx context.Context, nodes []*Node, serve func(i int)) error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, nn := range nodes {
		wg.Go(func() {
			if errs[i] = nn.StartContext(ctx); errs[i] == nil {
				serve(i)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
