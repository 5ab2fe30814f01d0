package node

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/console"
)

// The operator console (package console) on the node's JSON API port: it
// reads and acts through the API as the listener serves it (with the
// authentication in front), places keys with the node's view, and shows
// the cluster from every node's Admin.Status.

// newConsole builds the console; api is the handler the HTTP listener
// serves, set by Start.
func (n *Node) newConsole(api *http.Handler) (*console.Console, error) {
	cfg := console.DefaultConfig()
	cfg.API = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*api).ServeHTTP(w, r) })
	cfg.Registry = n.cfg.Registry
	cfg.Logger = n.log
	cfg.Process = "idemnode " + n.cfg.NodeID
	cfg.Locate = n.locateKey
	cfg.Cluster = n.clusterView
	return console.New(cfg)
}

// locateKey places a key as this node's view does (while a change moves
// keys, the blend of the two rings) and names the shard's leader when this
// node hosts it.
func (n *Node) locateKey(namespace, key string) (console.Location, bool) {
	v := n.view()
	info := v.placer.Locate(namespace, key)
	loc := console.Location{Shard: info.ID, HomeRegion: info.HomeRegion, Partition: int(v.placer.Partition(namespace, key))}
	if s := n.shard(info.ID); s != nil {
		loc.Leader, _ = s.group.Leader()
	}
	return loc, true
}

// clusterView asks every node of the view for its Admin.Status (with the
// caller's principal, forwarded: each node authorizes it) and this node's
// clock readings for the offsets.
func (n *Node) clusterView(ctx context.Context) (*console.ClusterView, error) {
	v := n.view()
	cv := &console.ClusterView{Cluster: n.cfg.Topology.Cluster, Self: n.cfg.NodeID}
	nodes := v.nodes()
	statuses := make([]*idemv1.StatusResponse, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, nd := range nodes {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			if nd.ID == n.cfg.NodeID {
				statuses[i], errs[i] = (&admin{n: n}).Status(sctx, &idemv1.StatusRequest{})
				return
			}
			conn, err := n.fwd.Conn(nd.ID)
			if err != nil {
				errs[i] = err
				return
			}
			statuses[i], errs[i] = idemv1.NewAdminClient(conn).Status(sctx, &idemv1.StatusRequest{})
		})
	}
	wg.Wait()
	clocks := n.clocks.fresh()
	regions := map[string]int{}
	shards := map[string]*console.ShardView{}
	applied := map[string]map[string]uint64{} // shard -> node -> applied index
	for i, nd := range nodes {
		nv := console.NodeView{ID: nd.ID}
		if errs[i] != nil {
			nv.Err = errs[i].Error()
		} else {
			st := statuses[i]
			nv.Ready, nv.Release = st.GetReady(), st.GetVersion()
			nv.AdvertisedVersion, nv.ClusterVersion = int(st.GetAdvertisedVersion()), int(st.GetClusterVersion())
			for _, s := range st.GetShards() {
				if applied[s.GetShard()] == nil {
					applied[s.GetShard()] = map[string]uint64{}
				}
				applied[s.GetShard()][nd.ID] = s.GetAppliedIndex()
				if s.GetRaftState() != "Leader" {
					if _, ok := shards[s.GetShard()]; !ok {
						shards[s.GetShard()] = &console.ShardView{ID: s.GetShard(), HomeRegion: s.GetHomeRegion(), Voters: s.GetVoters()}
					}
					continue
				}
				shards[s.GetShard()] = &console.ShardView{ID: s.GetShard(), HomeRegion: s.GetHomeRegion(), Leader: nd.ID,
					Voters: s.GetVoters(), Commit: s.GetCommitIndex(), Applied: s.GetAppliedIndex(),
					ApplyLag: s.GetCommitIndex() - min(s.GetCommitIndex(), s.GetAppliedIndex()), Records: s.GetRecords(), Bytes: s.GetRecordBytes()}
			}
		}
		if nd.ID == n.cfg.NodeID {
			if off, ok := n.clocks.offset(); ok {
				nv.ClockOffset = fmt.Sprintf("%v against the quorum", off.Round(time.Microsecond))
			}
			nv.Unsafe = n.cfg.UnsafeSettings
		} else if r, ok := clocks[nd.ID]; ok {
			nv.ClockOffset = fmt.Sprintf("%v (rtt %v)", r.offset.Round(time.Microsecond), r.rtt.Round(time.Microsecond))
		}
		ri, ok := regions[nd.Region]
		if !ok {
			ri = len(cv.Regions)
			regions[nd.Region] = ri
			cv.Regions = append(cv.Regions, console.RegionView{Name: nd.Region})
		}
		cv.Regions[ri].Nodes = append(cv.Regions[ri].Nodes, nv)
	}
	for id, s := range shards {
		if s.Leader != "" {
			s.FollowerLag = map[string]uint64{}
			for node, a := range applied[id] {
				if node != s.Leader {
					s.FollowerLag[node] = s.Commit - min(s.Commit, a)
				}
			}
		}
		for _, l := range v.targetVoters[id] {
			if !slices.Contains(s.Voters, l) {
				s.Learners = append(s.Learners, l)
			}
		}
		cv.Shards = append(cv.Shards, *s)
	}
	return cv, nil
}
