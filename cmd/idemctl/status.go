package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/topology"
)

// Health of a node as status reports it.
const (
	healthReady       = "ready"
	healthNotReady    = "not ready"
	healthUnreachable = "unreachable"
)

// nodeView is one node's answer to Admin.Status (or why there is none).
type nodeView struct {
	ID       string `json:"id"`
	Region   string `json:"region"`
	GRPCAddr string `json:"grpc_addr"`
	// Health is "ready", "not ready" or "unreachable".
	Health  string `json:"health"`
	Error   string `json:"error,omitempty"`
	Version string `json:"version,omitempty"`
	// ClusterVersion is the cluster version as the node's replica of the
	// meta group holds it; AdvertisedVersion the one the node advertises
	// (its release's, or 1 with --raft-pack-commands=off).
	ClusterVersion    uint32 `json:"cluster_version,omitempty"`
	AdvertisedVersion uint32 `json:"advertised_version,omitempty"`
	// Shards and Leads count the shards the node hosts and leads.
	Shards int `json:"shards"`
	Leads  int `json:"leads"`

	status *idemv1.StatusResponse
}

// replicaView is one voter's view of its shard.
type replicaView struct {
	Node         string `json:"node"`
	Reachable    bool   `json:"reachable"`
	RaftState    string `json:"raft_state,omitempty"`
	LeaderID     string `json:"leader_id,omitempty"`
	Term         uint64 `json:"term"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	LastIndex    uint64 `json:"last_index"`
	Records      uint64 `json:"records"`
	RecordBytes  uint64 `json:"record_bytes"`
	// Packing: this replica packs commands into Raft entries when it leads
	// (idemnode --raft-pack-commands).
	Packing bool `json:"packing"`
}

// shardView is a shard with its leader as its voters report it.
type shardView struct {
	ID         string   `json:"id"`
	HomeRegion string   `json:"home_region"`
	Voters     []string `json:"voters"`
	// Leader is the voter that reports itself leader in the highest term,
	// or else the leader the reachable voters name; "" when none is known.
	Leader   string        `json:"leader"`
	Term     uint64        `json:"term"`
	Replicas []replicaView `json:"replicas"`
}

type regionView struct {
	Name  string   `json:"name"`
	Nodes []string `json:"nodes"`
}

// clusterView is what status prints.
type clusterView struct {
	Cluster string `json:"cluster"`
	// ClusterVersion is the highest cluster version a node answered with
	// (it never goes down; a node whose meta replica lags answers lower).
	ClusterVersion uint32       `json:"cluster_version"`
	Regions        []regionView `json:"regions"`
	Nodes          []nodeView   `json:"nodes"`
	Shards         []shardView  `json:"shards"`
}

// dial returns a gRPC connection to addr, secured by --certs-dir or
// --token when given; calls on it fail fast when the address refuses
// connections.
func (e *env) dial(addr string) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if e.tls != nil {
		creds = credentials.NewTLS(e.tls)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if e.g.token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(client.BearerToken(e.g.token)))
	}
	return grpc.NewClient(addr, opts...)
}

// askNodes asks the given nodes for their status concurrently.
func askNodes(ctx context.Context, e *env, nodes []topology.Node) []nodeView {
	views := make([]nodeView, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := nodeView{ID: n.ID, Region: n.Region, GRPCAddr: n.GRPCAddr, Health: healthUnreachable}
			defer func() { views[i] = v }()
			conn, err := e.dial(n.GRPCAddr)
			if err != nil {
				v.Error = err.Error()
				return
			}
			defer conn.Close()
			cctx, cancel := context.WithTimeout(ctx, e.g.timeout)
			defer cancel()
			st, err := idemv1.NewAdminClient(conn).Status(cctx, &idemv1.StatusRequest{})
			if err != nil {
				v.Error = reason(err)
				return
			}
			v.status, v.Version, v.Shards = st, st.GetVersion(), len(st.GetShards())
			v.ClusterVersion, v.AdvertisedVersion = st.GetClusterVersion(), st.GetAdvertisedVersion()
			v.Health = healthNotReady
			if st.GetReady() {
				v.Health = healthReady
			}
			for _, s := range st.GetShards() {
				if s.GetRaftState() == "Leader" {
					v.Leads++
				}
			}
		}()
	}
	wg.Wait()
	return views
}

// shardViews combines the nodes' answers into one view per shard.
func shardViews(shards []topology.Shard, nodes []nodeView) []shardView {
	byNode := map[string]*nodeView{}
	for i := range nodes {
		byNode[nodes[i].ID] = &nodes[i]
	}
	out := make([]shardView, 0, len(shards))
	for _, s := range shards {
		sv := shardView{ID: s.ID, HomeRegion: s.HomeRegion, Voters: s.Voters}
		named := map[string]uint64{} // leader id -> highest term naming it
		for _, voter := range s.Voters {
			rv := replicaView{Node: voter}
			if nv := byNode[voter]; nv != nil && nv.status != nil {
				for _, st := range nv.status.GetShards() {
					if st.GetShard() != s.ID {
						continue
					}
					rv = replicaView{Node: voter, Reachable: true, RaftState: st.GetRaftState(), LeaderID: st.GetLeaderId(),
						Term: st.GetTerm(), CommitIndex: st.GetCommitIndex(), AppliedIndex: st.GetAppliedIndex(),
						LastIndex: st.GetLastIndex(), Records: st.GetRecords(), RecordBytes: st.GetRecordBytes(), Packing: st.GetPacking()}
				}
			}
			if rv.RaftState == "Leader" && rv.Term >= sv.Term {
				sv.Leader, sv.Term = voter, rv.Term
			}
			if rv.LeaderID != "" && rv.Term >= named[rv.LeaderID] {
				named[rv.LeaderID] = rv.Term
			}
			sv.Replicas = append(sv.Replicas, rv)
		}
		if sv.Leader == "" {
			for id, term := range named {
				if term > sv.Term || (term == sv.Term && id < sv.Leader) {
					sv.Leader, sv.Term = id, term
				}
			}
		}
		out = append(out, sv)
	}
	return out
}

func runStatus(ctx context.Context, e *env, _ []string) error {
	topo, err := e.needTopology("status")
	if err != nil {
		return err
	}
	view := clusterView{Cluster: topo.Cluster}
	for _, r := range topo.Regions {
		rv := regionView{Name: r.Name}
		for _, n := range r.Nodes {
			rv.Nodes = append(rv.Nodes, n.ID)
		}
		view.Regions = append(view.Regions, rv)
	}
	view.Nodes = askNodes(ctx, e, topo.Nodes())
	view.Shards = shardViews(topo.Shards(), view.Nodes)
	reachable := 0
	for _, n := range view.Nodes {
		if n.Health != healthUnreachable {
			reachable++
		}
		view.ClusterVersion = max(view.ClusterVersion, n.ClusterVersion)
	}
	if reachable == 0 {
		return fmt.Errorf("no node of cluster %q answered (first: %s at %s: %s)", topo.Cluster, view.Nodes[0].ID, view.Nodes[0].GRPCAddr, view.Nodes[0].Error)
	}
	if e.g.json {
		return writeJSON(e.stdout, view)
	}
	printStatus(e.stdout, view)
	return nil
}

func printStatus(w io.Writer, v clusterView) {
	ready, reachable, led := 0, 0, 0
	for _, n := range v.Nodes {
		if n.Health != healthUnreachable {
			reachable++
		}
		if n.Health == healthReady {
			ready++
		}
	}
	for _, s := range v.Shards {
		if s.Leader != "" {
			led++
		}
	}
	fmt.Fprintf(w, "cluster %s: %d regions, %d nodes (%d reachable, %d ready), %d shards (%d with a leader)\n",
		v.Cluster, len(v.Regions), len(v.Nodes), reachable, ready, len(v.Shards), led)
	fmt.Fprintf(w, "cluster version %d\n\n", v.ClusterVersion)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tNODE\tGRPC\tHEALTH\tVERSION\tADVERTISES\tSHARDS\tLEADS")
	nodes := append([]nodeView(nil), v.Nodes...)
	sort.SliceStable(nodes, func(i, j int) bool { return nodes[i].Region < nodes[j].Region })
	for _, n := range nodes {
		health := n.Health
		if n.Health == healthUnreachable && n.Error != "" {
			health += " (" + shorten(n.Error, 48) + ")"
		}
		if n.Health == healthUnreachable {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t-\t-\t-\t-\n", n.Region, n.ID, n.GRPCAddr, health)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\n", n.Region, n.ID, n.GRPCAddr, health, n.Version, n.AdvertisedVersion, n.Shards, n.Leads)
	}
	tw.Flush()
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tHOME\tLEADER\tREPLICA\tSTATE\tTERM\tCOMMIT\tAPPLIED\tLAST\tRECORDS\tPACKING")
	for _, s := range v.Shards {
		leader := s.Leader
		if leader == "" {
			leader = "NONE"
		}
		for i, r := range s.Replicas {
			shard, home, lead := s.ID, s.HomeRegion, leader
			if i > 0 {
				shard, home, lead = "", "", ""
			}
			if !r.Reachable {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t-\t-\t-\t-\t-\t-\n", shard, home, lead, r.Node, healthUnreachable)
				continue
			}
			packing := "no"
			if r.Packing {
				packing = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", shard, home, lead, r.Node, strings.ToLower(r.RaftState),
				r.Term, r.CommitIndex, r.AppliedIndex, r.LastIndex, r.Records, packing)
		}
	}
	tw.Flush()
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// findLeader asks the voters of shard for their view and returns it, with
// the leader ("" when none is known).
func findLeader(ctx context.Context, e *env, shard topology.Shard) shardView {
	var voters []topology.Node
	for _, id := range shard.Voters {
		if n, ok := e.topo.NodeByID(id); ok {
			voters = append(voters, n)
		}
	}
	return shardViews([]topology.Shard{shard}, askNodes(ctx, e, voters))[0]
}
