package node

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/datadir"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/topology"
)

// A node started on an empty data dir with a file of a later version (which
// bootstraps nothing) refuses when its peers count it as a meta voter: it
// lost its state, and starting would put a replica without its log and vote
// among voters that count on both. A node its peers do not count (a new
// one) starts, and with no peer answering a node waits instead of guessing.
func TestEmptyDataDirWithLaterFile(t *testing.T) {
	r := startRegion(t, 3, nil)
	later := r.topo.Clone()
	later.Version = 2
	nodeOn := func(topo *topology.Topology, id string) (*Node, string) {
		t.Helper()
		rc := raftstore.DefaultConfig()
		rc.NoFsync = true
		dir := t.TempDir()
		nn, err := New(Config{Topology: topo, NodeID: id, DataDir: dir, Raft: rc, ClockSkewMargin: 200 * time.Millisecond,
			Logger: testutil.Logger(t, slog.LevelWarn).With("node", id)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nn.Close() })
		return nn, dir
	}
	empty := func(dir string) {
		t.Helper()
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Fatalf("the node wrote into its data dir: %v", left)
		}
	}

	// n3 loses its data dir and is started again with the later file.
	r.cancels[2]()
	if err := r.nodes[2].Close(); err != nil {
		t.Fatal(err)
	}
	lost, dir := nodeOn(later, "n3")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := lost.StartContext(ctx)
	if !errors.Is(err, ErrStateLost) || !strings.Contains(err.Error(), "meta group") || !strings.Contains(err.Error(), "idemctl replace-node") {
		t.Fatalf("start of a node whose data dir was lost, with a later file: %v, want ErrStateLost naming the meta group and replace-node", err)
	}
	empty(dir)

	// A node the running ones do not count (a change adds it) joins.
	grown := later.Clone()
	addrs, err := freeAddrs(3)
	if err != nil {
		t.Fatal(err)
	}
	grown.Regions[0].Nodes = append(grown.Regions[0].Nodes, topology.Node{ID: "n4", Region: "local", RaftAddr: addrs[0], GRPCAddr: addrs[1], HTTPAddr: addrs[2]})
	if err := grown.Validate(); err != nil {
		t.Fatal(err)
	}
	fresh, _ := nodeOn(grown, "n4")
	if err := fresh.StartContext(ctx); err != nil {
		t.Fatalf("start of a new node on an empty data dir with a later file: %v", err)
	}
	fresh.Close()

	// Nobody answers: the node waits until it is stopped, and writes nothing.
	for i := range 2 {
		r.cancels[i]()
		r.nodes[i].Close()
	}
	alone, dir := nodeOn(later, "n3")
	short, cancelShort := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancelShort()
	if err := alone.StartContext(short); !errors.Is(err, errStoppedBeforeFirstStart) {
		t.Fatalf("start with no peer answering: %v, want it to wait until stopped", err)
	}
	empty(dir)
}

// A node whose data dir lost everything but its identity file (raft,
// seats, state and the cluster version record deleted) refuses to start
// with one line naming the data dir and idemctl replace-node, whether it is
// a dev node (alone) or one of a region's: it ran before, and starting
// would begin its groups over with no log and no vote.
func TestLostStateButIdentityRefused(t *testing.T) {
	for _, size := range []int{1, 3} {
		t.Run(strconv.Itoa(size)+" nodes", func(t *testing.T) {
			r := startRegion(t, size, nil)
			last := size - 1
			r.cancels[last]()
			if err := r.nodes[last].Close(); err != nil {
				t.Fatal(err)
			}
			dir := r.nodes[last].cfg.DataDir
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if e.Name() != datadir.IdentityFile {
					if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
						t.Fatal(err)
					}
				}
			}
			cfg := r.nodes[last].cfg
			cfg.Registry = nil
			again, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer again.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			err = again.StartContext(ctx)
			if !errors.Is(err, ErrStateLost) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "idemctl replace-node") {
				t.Fatalf("start on a data dir that kept only %s: %v, want ErrStateLost naming %s and idemctl replace-node", datadir.IdentityFile, err, dir)
			}
			if left, _ := os.ReadDir(dir); len(left) != 1 {
				t.Fatalf("the refused start wrote into the data dir: %v", left)
			}
		})
	}
}
