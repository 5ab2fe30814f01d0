package regionsim

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/topology"
)

// lostAnswerTopology stores the first SetTarget but answers it with an
// error (the answer lost on a loaded cluster), refuses every later one, as
// a node does while that change runs and once it is active, and makes the
// target active a few reads after it was stored.
type lostAnswerTopology struct {
	idemv1.UnimplementedTopologyServer
	mu                    sync.Mutex
	active, target, reads int
}

func (f *lostAnswerTopology) SetTarget(_ context.Context, req *idemv1.SetTargetRequest) (*idemv1.TopologyDocument, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.target != 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "version %d is already the target or active", f.target)
	}
	f.target = 2
	return nil, status.Error(codes.DeadlineExceeded, "the answer was lost")
}

func (f *lostAnswerTopology) Get(context.Context, *idemv1.GetTopologyRequest) (*idemv1.TopologyDocument, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.target != 0 {
		if f.reads++; f.reads >= 3 {
			f.active = f.target
		}
	}
	return &idemv1.TopologyDocument{Json: fmt.Appendf(nil, `{"active_version":%d,"target_version":%d}`, max(f.active, 1), f.target)}, nil
}

// A SetTarget whose answer is an error although the target was stored
// must not hide the change: applyTopology reads the topology after it and
// follows the stored target to its activation. (It kept sending SetTarget,
// refused from then on, and reported the version never active.)
func TestApplyTopologyFollowsATargetStoredDespiteAnError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	fake := &lostAnswerTopology{}
	idemv1.RegisterTopologyServer(srv, fake)
	go srv.Serve(ln)
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	// applyTopology asks the running nodes: one, a process that waits.
	proc := &launch.Process{Name: "n1", Bin: "sleep", Args: []string{"60"}, Log: filepath.Join(t.TempDir(), "n1.log")}
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	defer proc.Kill()
	c := &simCluster{
		nodes:   map[string]*simNode{"n1": {id: "n1", proc: proc}},
		nodeIDs: []string{"n1"},
		admin:   map[string]*grpc.ClientConn{"n1": conn},
	}
	next := &topology.Topology{Version: 2}
	if _, err := c.applyTopology(t.Context(), next, nil, 10*time.Second); err != nil {
		t.Fatalf("applyTopology with the SetTarget answer lost: %v", err)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if fake.active != 2 {
		t.Fatalf("applyTopology returned with version %d active, want 2", fake.active)
	}
}

// The change's report reads the batches moved from the nodes' logs, in the
// line the node writes (with the handoff attempt) and the one it wrote
// before attempts were fenced: a line it cannot read would report no batch
// moved and inject no fault mid-move.
func TestMovedLineReadsTheNodesLog(t *testing.T) {
	for _, line := range []string{
		`time=2026-12-08T01:47:00.962Z level=INFO msg="topology change: partitions moved" node=eu-west-2 region=eu-west from=ap-south-0 to=eu-west-2 partitions=70 attempt=25 records=4 bytes=1036 paused=673.232ms`,
		`time=2026-12-05T21:00:00.000Z level=INFO msg="topology change: partitions moved" node=eu-west-2 region=eu-west from=ap-south-0 to=eu-west-2 partitions=70 records=4 bytes=1036 paused=673.232ms`,
	} {
		g := movedLine.FindStringSubmatch(line)
		if g == nil || g[1] != "70" || g[2] != "4" || g[3] != "1036" || g[4] != "673.232ms" {
			t.Errorf("movedLine read %q from %s", g, line)
		}
	}
}
