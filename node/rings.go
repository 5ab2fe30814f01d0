package node

import (
	"sync"

	"github.com/idem-dev/idem/topology"
)

// ringCache keeps the rings of the last few topologies this node placed
// keys with. Building a ring costs up to about a second at the largest
// cluster allowed (topology.MaxVirtualNodes), and while a change runs the
// node's view is rebuilt after every batch of moved partitions and the
// mover reads the same active and target topologies at every step: they
// are the same two rings each time.
type ringCache struct {
	mu      sync.Mutex
	entries []ringEntry // most recent last
}

type ringEntry struct {
	t *topology.Topology
	r *topology.Ring
}

// ringCacheSize covers the active and target topologies of a change and
// the node's own file.
const ringCacheSize = 4

// ring returns t's ring, built once per topology shape.
func (c *ringCache) ring(t *topology.Topology) (*topology.Ring, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if topology.SameShape(e.t, t) {
			return e.r, nil
		}
	}
	r, err := topology.NewRing(t)
	if err != nil {
		return nil, err
	}
	c.entries = append(c.entries, ringEntry{t: t, r: r})
	if len(c.entries) > ringCacheSize {
		c.entries = c.entries[1:]
	}
	return r, nil
}

// rings returns the active and target rings of a running change.
func (c *ringCache) rings(mv metaView) (from, to *topology.Ring, err error) {
	if from, err = c.ring(mv.active); err != nil {
		return nil, nil, err
	}
	if to, err = c.ring(mv.target); err != nil {
		return nil, nil, err
	}
	return from, to, nil
}
