package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/idem-dev/idem/security/auth"
)

// ClusterView is the cluster as the process serving the console sees it.
type ClusterView struct {
	Cluster string
	// Self is the node serving the console.
	Self    string
	Regions []RegionView
	Shards  []ShardView
	// Problems are what could not be learnt (a node that did not answer).
	Problems []string
}

// RegionView is one region and its nodes.
type RegionView struct {
	Name  string
	Nodes []NodeView
}

// NodeView is one node as its Admin.Status answered (Err when it did not).
type NodeView struct {
	ID                string
	Ready             bool
	Release           string
	AdvertisedVersion int
	ClusterVersion    int
	// ClockOffset is the node's clock minus the serving node's, from the
	// latest clock probe ("" unknown); for the serving node itself, its
	// offset against the median of its peers (the quorum's clock).
	ClockOffset string
	// Unsafe are the settings in force that turn a safety check off
	// (known for the serving node).
	Unsafe []string
	Err    string
}

// ShardView is one shard as its leader reports it.
type ShardView struct {
	ID         string
	HomeRegion string
	Leader     string
	Voters     []string
	// Learners are the voters a running change gives the shard that are
	// not voters yet (joining).
	Learners []string
	Commit   uint64
	Applied  uint64
	// ApplyLag is the commit index less the applied index on the leader.
	ApplyLag uint64
	// FollowerLag is, per follower that answered, how far its applied index
	// trails the leader's commit index.
	FollowerLag map[string]uint64
	Records     uint64
	Bytes       uint64
}

// topologyDoc is the JSON API's GET /v1/topology.
type topologyDoc struct {
	ActiveVersion int               `json:"active_version"`
	TargetVersion int               `json:"target_version"`
	Progress      *topologyProgress `json:"progress"`
}

// topologyProgress is the document's progress of a running change.
type topologyProgress struct {
	ShardsDone  int `json:"shards_done"`
	ShardsTotal int `json:"shards_total"`
	Left        []struct {
		Shard    string   `json:"shard"`
		Voters   []string `json:"voters"`
		Learners []string `json:"learners"`
		Want     []string `json:"want"`
	} `json:"left"`
	Dead            []string  `json:"dead"`
	MayStop         []string  `json:"may_stop"`
	StartedAt       time.Time `json:"started_at"`
	LastStepAt      time.Time `json:"last_step_at"`
	Stalled         bool      `json:"stalled"`
	LeaderUnknown   []string  `json:"leader_unknown"`
	PartitionsTotal int       `json:"partitions_total"`
	PartitionsMoved int       `json:"partitions_moved"`
	Waiting         string    `json:"waiting"`
}

// Progress is the summary of a topology change the cluster page shows and
// its script polls (/ui/cluster/progress.json).
type Progress struct {
	ActiveVersion   int      `json:"active_version"`
	TargetVersion   int      `json:"target_version,omitempty"`
	Running         bool     `json:"running"`
	Percent         int      `json:"percent"`
	ShardsDone      int      `json:"shards_done"`
	ShardsTotal     int      `json:"shards_total"`
	PartitionsMoved int      `json:"partitions_moved"`
	PartitionsTotal int      `json:"partitions_total"`
	Step            string   `json:"step"`
	WaitingFor      string   `json:"waiting_for,omitempty"`
	Remaining       string   `json:"remaining,omitempty"`
	StartedAt       string   `json:"started_at,omitempty"`
	Stalled         bool     `json:"stalled"`
	MayStop         []string `json:"may_stop,omitempty"`
	Error           string   `json:"error,omitempty"`
	Recent          []Change `json:"recent"`
}

// Change is a finished topology change the console saw.
type Change struct {
	From     int    `json:"from"`
	To       int    `json:"to"`
	Started  string `json:"started"`
	Finished string `json:"finished"`
	Took     string `json:"took"`
}

// changeLog remembers the changes this process saw run and finish (while
// someone looked at the cluster page), newest first, at most ten.
type changeLog struct {
	mu      sync.Mutex
	running *Change
	started time.Time
	done    []Change
}

func (l *changeLog) observe(p Progress, now time.Time) []Change {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case p.Running && l.running == nil:
		started, err := time.Parse(time.RFC3339, p.StartedAt)
		if err != nil {
			started = now
		}
		l.running, l.started = &Change{From: p.ActiveVersion, To: p.TargetVersion, Started: p.StartedAt}, started
	case !p.Running && l.running != nil && p.ActiveVersion >= l.running.To:
		ch := *l.running
		ch.Finished = now.UTC().Format(time.RFC3339)
		ch.Took = now.Sub(l.started).Round(time.Second).String()
		l.done = append([]Change{ch}, l.done...)
		if len(l.done) > 10 {
			l.done = l.done[:10]
		}
		l.running = nil
	}
	return append([]Change{}, l.done...)
}

// progress reads GET /v1/topology with the caller's credentials.
func (c *Console) progress(r *http.Request) Progress {
	reply := c.call(r, http.MethodGet, "/v1/topology", nil, nil)
	var p Progress
	if !reply.OK() {
		code, msg := reply.Error()
		if reply.Status == http.StatusNotFound {
			msg = "this process serves no topology (a router): open a node's console"
		}
		p.Error = code + ": " + msg
		p.Recent = []Change{}
		return p
	}
	var doc topologyDoc
	if err := reply.Decode(&doc); err != nil {
		p.Error = "the topology document could not be read: " + err.Error()
		return p
	}
	p = summarize(doc, c.cfg.Now())
	p.Recent = c.changes.observe(p, c.cfg.Now())
	return p
}

// summarize turns the topology document into what a person reads: how far
// the change is, its current step, what it waits for and an estimate of
// the time left (from the rate of the work done so far).
func summarize(doc topologyDoc, now time.Time) Progress {
	p := Progress{ActiveVersion: doc.ActiveVersion, TargetVersion: doc.TargetVersion}
	pr := doc.Progress
	if doc.TargetVersion == 0 || pr == nil {
		p.Step = fmt.Sprintf("No change is running: version %d is in force.", doc.ActiveVersion)
		p.Percent = 100
		if pr != nil && len(pr.MayStop) > 0 {
			p.MayStop = pr.MayStop
			p.Step += " Removed nodes that may be stopped: " + strings.Join(pr.MayStop, ", ") + "."
		}
		return p
	}
	p.Running = true
	p.ShardsDone, p.ShardsTotal = pr.ShardsDone, pr.ShardsTotal
	p.PartitionsMoved, p.PartitionsTotal = pr.PartitionsMoved, pr.PartitionsTotal
	p.Stalled, p.MayStop = pr.Stalled, pr.MayStop
	if !pr.StartedAt.IsZero() {
		p.StartedAt = pr.StartedAt.UTC().Format(time.RFC3339)
	}
	p.Percent = percent(pr.ShardsDone, pr.ShardsTotal, pr.PartitionsMoved, pr.PartitionsTotal)
	switch {
	case len(pr.Left) > 0 && pr.PartitionsMoved == 0 && pr.PartitionsTotal > 0:
		l := pr.Left[0]
		p.Step = fmt.Sprintf("Seating voters: shard %s has voters %s, wants %s.", l.Shard, list(l.Voters), list(l.Want))
	case pr.PartitionsMoved < pr.PartitionsTotal:
		p.Step = fmt.Sprintf("Moving partitions: %d of %d moved to their new shards.", pr.PartitionsMoved, pr.PartitionsTotal)
	case len(pr.Left) > 0:
		l := pr.Left[0]
		p.Step = fmt.Sprintf("Changing members: shard %s has voters %s, wants %s.", l.Shard, list(l.Voters), list(l.Want))
	default:
		p.Step = "Activating the new version."
	}
	var waits []string
	if pr.Waiting != "" {
		waits = append(waits, pr.Waiting)
	}
	if len(pr.LeaderUnknown) > 0 {
		waits = append(waits, "a leader of shard "+list(pr.LeaderUnknown))
	}
	for _, l := range pr.Left {
		if len(l.Learners) > 0 {
			waits = append(waits, fmt.Sprintf("learners %s of shard %s to catch up", list(l.Learners), l.Shard))
		}
	}
	if pr.Stalled {
		waits = append(waits, "no step for a while (stalled): check the nodes' logs")
	}
	p.WaitingFor = strings.Join(waits, "; ")
	// The time left, at the rate partitions moved so far (seating voters
	// before the first move is not counted: it has no rate to go by).
	if pr.PartitionsMoved > 0 && pr.PartitionsMoved < pr.PartitionsTotal && !pr.StartedAt.IsZero() {
		elapsed := now.Sub(pr.StartedAt)
		left := time.Duration(float64(elapsed) * float64(pr.PartitionsTotal-pr.PartitionsMoved) / float64(pr.PartitionsMoved))
		p.Remaining = "about " + left.Round(time.Second).String()
	}
	return p
}

// percent weighs a change's work: seating voters a fifth, moving
// partitions the rest (a change that moves none is all seating).
func percent(shardsDone, shardsTotal, moved, partitions int) int {
	seats := 1.0
	if shardsTotal > 0 {
		seats = float64(shardsDone) / float64(shardsTotal)
	}
	if partitions == 0 {
		return int(100 * seats)
	}
	return int(20*seats + 80*float64(moved)/float64(partitions))
}

func list(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

type clusterPage struct {
	View     *ClusterView
	ViewErr  string
	Progress Progress
}

func (c *Console) serveCluster(w http.ResponseWriter, r *http.Request) {
	pg := clusterPage{Progress: c.progress(r)}
	p := principal(r)
	switch {
	case !(p.Role >= auth.RoleAdmin && p.AllowsNamespace("*")):
		pg.ViewErr = "Nodes and shards are shown to role admin on every namespace (as the Admin service's Status): " + p.Name + " is " + p.Role.String() + "."
	case c.cfg.Cluster == nil:
		pg.ViewErr = "This process is a router: nodes and shards are shown by a node's console."
	default:
		v, err := c.cfg.Cluster(r.Context())
		if err != nil {
			pg.ViewErr = err.Error()
			break
		}
		sort.Slice(v.Regions, func(i, j int) bool { return v.Regions[i].Name < v.Regions[j].Name })
		sort.Slice(v.Shards, func(i, j int) bool { return v.Shards[i].ID < v.Shards[j].ID })
		pg.View = v
	}
	c.render(w, r, http.StatusOK, "cluster", pg)
}

func (c *Console) serveProgressJSON(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(c.progress(r))
}
