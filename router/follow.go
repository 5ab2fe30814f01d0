package router

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/topology"
)

// followInterval is how often a router asks a node for the cluster's
// topology version: a change's steps reach it within about this long.
const followInterval = 2 * time.Second

// followedVersion is the topology version a router's ring reflects.
type followedVersion struct{ active, target int }

// follow keeps the backend's ring and forwarder on the cluster's topology:
// every followInterval it reads the topology document from a node (the
// Topology service) and, when the active or target version changed, routes
// with the active topology's ring whose shards list the target's voters
// too (a shard's leader may already be one of them) and learns the
// addresses of joining nodes. A node that answers with another key layout
// is ignored (the ring check refuses such a cluster).
func (b *Backend) follow(ctx context.Context) {
	layout := b.Ring().LayoutFingerprint()
	t := time.NewTicker(followInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		doc, ok := b.readTopology(ctx)
		if !ok {
			continue
		}
		active, err := topology.Parse(doc.Topology)
		if err != nil {
			continue
		}
		var target *topology.Topology
		if len(doc.Target) > 0 {
			if target, err = topology.Parse(doc.Target); err != nil {
				continue
			}
		}
		v := followedVersion{active: active.EffectiveVersion()}
		if target != nil {
			v.target = target.EffectiveVersion()
		}
		if cur := b.version.Load(); *cur == v || v.active < cur.active {
			continue
		}
		ring, err := topology.NewRing(active)
		if err != nil || ring.LayoutFingerprint() != layout {
			continue
		}
		nodes := active.Nodes()
		if target != nil {
			voters := map[string][]string{}
			for _, s := range ring.Shards() {
				voters[s.ID] = s.Voters
			}
			for _, s := range target.Shards() {
				for _, id := range s.Voters {
					if !slices.Contains(voters[s.ID], id) {
						voters[s.ID] = append(slices.Clone(voters[s.ID]), id)
					}
				}
			}
			ring = ring.WithVoters(voters)
			nodes = append(nodes, target.Nodes()...)
		}
		for i, nd := range nodes {
			if own, ok := b.cfg.Topology.NodeByID(nd.ID); ok {
				nodes[i] = own // this router's own view of a node wins (a WAN proxy, a NAT)
			}
		}
		b.fwd.AddNodes(nodes)
		b.ringp.Store(ring)
		b.version.Store(&v)
		b.log.Info("following the cluster's topology", "active_version", v.active, "target_version", v.target)
	}
}

// topologyDoc is the part of the nodes' topology document a router reads.
type topologyDoc struct {
	Topology json.RawMessage `json:"topology"`
	Target   json.RawMessage `json:"target"`
}

// readTopology asks the nodes, ready ones first, for the topology document.
func (b *Backend) readTopology(ctx context.Context) (topologyDoc, bool) {
	for _, id := range b.probeOrder() {
		if r := b.nodeReady[id]; r != nil && !r.Load() {
			continue
		}
		conn, err := b.fwd.Conn(id)
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := idemv1.NewTopologyClient(conn).Get(cctx, &idemv1.GetTopologyRequest{})
		cancel()
		if err != nil {
			continue
		}
		var doc topologyDoc
		if json.Unmarshal(resp.GetJson(), &doc) == nil && len(doc.Topology) > 0 {
			return doc, true
		}
	}
	return topologyDoc{}, false
}
