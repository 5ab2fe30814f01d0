package forward

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"

	"github.com/idem-dev/idem/topology"
)

// ErrRingMismatch: a node of the cluster was created with another cluster
// name or another ring (shards, placement or ring parameters) than this
// process's topology gives. Working with it would send keys to shards that
// do not hold them, so the process refuses.
var ErrRingMismatch = errors.New("forward: topology does not match the cluster's ring")

// RingCheck asks the cluster's nodes which ring they were created with.
type RingCheck struct {
	topology *topology.Topology
	ring     *topology.Ring
	self     string
	dial     func(nodeID string) (*grpc.ClientConn, error)
}

// NewRingCheck checks ring (built from t) against t's nodes other than
// self, dialling them with dial (which may cache connections).
func NewRingCheck(t *topology.Topology, ring *topology.Ring, self string, dial func(nodeID string) (*grpc.ClientConn, error)) *RingCheck {
	return &RingCheck{topology: t, ring: ring, self: self, dial: dial}
}

// Check asks the nodes one at a time, until one answers, for the cluster and
// ring it was created with. It returns (true, nil) when that node agrees,
// (true, an error wrapping ErrRingMismatch) when it does not, and
// (false, nil) when no node answered within ctx.
func (c *RingCheck) Check(ctx context.Context) (answered bool, err error) {
	for _, n := range c.topology.Nodes() {
		if n.ID == c.self {
			continue
		}
		conn, err := c.dial(n.ID)
		if err != nil {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := idemv1.NewAdminClient(conn).Status(actx, &idemv1.StatusRequest{})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return false, nil
			}
			continue
		}
		// Nodes report their key layout (Ring.LayoutFingerprint: the
		// cluster and the ring parameters, which voters and shard-set
		// changes keep); releases before shards could change reported the
		// shard set too (Ring.ShardLayoutFingerprint).
		fp := st.GetRingFingerprint()
		if st.GetCluster() != c.ring.Cluster() || (fp != "" && fp != c.ring.LayoutFingerprint() && fp != c.ring.ShardLayoutFingerprint()) {
			return true, fmt.Errorf("%w: node %s belongs to cluster %q with key layout %s, this topology gives cluster %q with key layout %s; use the topology file the cluster was created with",
				ErrRingMismatch, n.ID, st.GetCluster(), st.GetRingFingerprint(), c.ring.Cluster(), c.ring.LayoutFingerprint())
		}
		return true, nil
	}
	return false, nil
}

// Watch runs Check every interval until a node answers, then calls report
// once with the result (nil when the rings match), and returns. It stops
// when ctx ends.
func (c *RingCheck) Watch(ctx context.Context, interval time.Duration, report func(error)) {
	for {
		if answered, err := c.Check(ctx); answered {
			report(err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// ShardIDs lists the ids of every shard of the ring, in the ring's order:
// the order of a listing's pages.
func ShardIDs(ring *topology.Ring) []string {
	shards := ring.Shards()
	ids := make([]string, len(shards))
	for i, s := range shards {
		ids[i] = s.ID
	}
	return ids
}
