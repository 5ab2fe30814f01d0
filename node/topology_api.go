package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/security/auth"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/topology"
)

// TopologyDocument is the JSON of GET /v1/topology (and of the Topology
// service's answers).
type TopologyDocument struct {
	ActiveVersion int                `json:"active_version"`
	TargetVersion int                `json:"target_version,omitempty"`
	Topology      *topology.Topology `json:"topology"`
	Target        *topology.Topology `json:"target,omitempty"`
	Progress      *TopologyProgress  `json:"progress,omitempty"`
}

// TopologyProgress is what a running change has done and has left, and
// which removed nodes may be stopped.
type TopologyProgress struct {
	Change      *topology.Change `json:"change,omitempty"`
	ShardsDone  int              `json:"shards_done"`
	ShardsTotal int              `json:"shards_total"`
	// Left lists, per shard not done, the leader's members and the target
	// voters.
	Left          []ShardProgress `json:"left,omitempty"`
	Dead          []string        `json:"dead,omitempty"`
	MayStop       []string        `json:"may_stop,omitempty"`
	StartedAt     time.Time       `json:"started_at,omitzero"`
	LastStepAt    time.Time       `json:"last_step_at,omitzero"`
	Stalled       bool            `json:"stalled"`
	LeaderUnknown []string        `json:"leader_unknown,omitempty"`
	// PartitionsTotal is how many ring partitions the change moves to
	// another shard; PartitionsMoved how many it has moved.
	PartitionsTotal int `json:"partitions_total"`
	PartitionsMoved int `json:"partitions_moved"`
	// Waiting says why the change cannot move its keys yet, when the node
	// answering can tell: the cluster version is below what moving keys
	// between shards needs, and which nodes hold it back; or why the meta
	// leader's last step did not go through (two shards' clocks further
	// apart than a move accepts, a leader it cannot reach).
	Waiting string `json:"waiting,omitempty"`
}

// ShardProgress is one shard a change has not finished.
type ShardProgress struct {
	Shard    string   `json:"shard"`
	Voters   []string `json:"voters"`
	Learners []string `json:"learners,omitempty"`
	Want     []string `json:"want"`
}

// topologyDocument builds the document from the meta state, asking the
// shards' leaders for their members while a change runs.
func (n *Node) topologyDocument(ctx context.Context) (*TopologyDocument, error) {
	mv, _ := n.meta.read()
	if mv.active == nil {
		return nil, &server.Error{Code: contract.CodeUnavailable, Message: "this node has not learnt the cluster's topology yet (its meta replica is catching up)", RetryAfter: time.Second}
	}
	doc := &TopologyDocument{ActiveVersion: mv.active.EffectiveVersion(), Topology: mv.active}
	if mv.target == nil {
		if len(mv.left) > 0 {
			doc.Progress = &TopologyProgress{MayStop: mv.left}
		}
		return doc, nil
	}
	doc.TargetVersion, doc.Target = mv.target.EffectiveVersion(), mv.target
	p := &TopologyProgress{Dead: mv.dead, StartedAt: time.Unix(0, mv.changeStarted).UTC(), LastStepAt: time.Unix(0, mv.lastProgress).UTC()}
	p.Stalled = time.Since(p.LastStepAt) > stallAfter
	p.Change, _ = topology.Plan(mv.active, mv.target)
	holding := map[string]bool{}
	for _, s := range mv.target.Shards() {
		p.ShardsTotal++
		ls, err := n.leaderState(ctx, s.ID, mv.voters(s.ID), mv.dead, nil)
		if err != nil {
			p.LeaderUnknown = append(p.LeaderUnknown, s.ID)
			continue
		}
		sp := ShardProgress{Shard: s.ID, Want: s.Voters}
		for _, m := range ls.members {
			holding[m.ID] = true
			if m.Voter {
				sp.Voters = append(sp.Voters, m.ID)
			} else {
				sp.Learners = append(sp.Learners, m.ID)
			}
		}
		if len(sp.Learners) == 0 && sameSet(sp.Voters, s.Voters) {
			p.ShardsDone++
			continue
		}
		p.Left = append(p.Left, sp)
	}
	if from, to, err := n.rings.rings(mv); err == nil {
		for _, m := range from.Moves(to) {
			p.PartitionsTotal += len(m.Partitions)
		}
	}
	p.PartitionsMoved = len(mv.moved)
	if p.PartitionsMoved < p.PartitionsTotal {
		if short := n.versionShortfall(mv, VersionFencedHandoff, "moving keys between shards"); short != "" {
			p.Waiting = "cluster version " + short
		} else if w := n.moveWait.Load(); w != nil && n.metaGroup.IsLeader() {
			p.Waiting = *w // the driver's last word: what its step waits for (clocks apart, a leader unknown)
		}
	}
	for _, s := range mv.active.Shards() {
		if _, kept := mv.target.ShardByID(s.ID); !kept {
			for _, v := range s.Voters { // a removed shard serves until its partitions moved out
				holding[v] = true
			}
		}
	}
	for _, nd := range mv.active.Nodes() {
		if _, stays := mv.target.NodeByID(nd.ID); stays {
			continue
		}
		if slices.Contains(mv.dead, nd.ID) || !holding[nd.ID] && len(p.LeaderUnknown) == 0 {
			p.MayStop = append(p.MayStop, nd.ID)
		}
	}
	doc.Progress = p
	return doc, nil
}

func sameSet(a, b []string) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(x string) bool { return !slices.Contains(b, x) })
}

// setTarget stores next (a topology file's bytes) as the cluster's target,
// on the meta group's leader (forwarded there when this node does not lead
// it).
func (n *Node) setTarget(ctx context.Context, raw []byte, dead []string) error {
	if len(raw) > maxTargetBytes {
		return &server.Error{Code: contract.CodeInvalidArgument, Message: fmt.Sprintf("the topology document is %d bytes, over the limit of %d", len(raw), maxTargetBytes)}
	}
	next, err := topology.Parse(raw)
	if err != nil {
		return &server.Error{Code: contract.CodeInvalidArgument, Message: err.Error()}
	}
	if !n.metaGroup.IsLeader() {
		id, _ := n.metaGroup.Leader()
		if id == "" {
			return &server.Error{Code: contract.CodeUnavailable, Message: "the meta group has no leader right now", RetryAfter: time.Second}
		}
		conn, err := n.fwd.Conn(id)
		if err != nil {
			return &server.Error{Code: contract.CodeUnavailable, Message: err.Error(), RetryAfter: time.Second}
		}
		_, err = idemv1.NewTopologyClient(conn).SetTarget(ctx, &idemv1.SetTargetRequest{Topology: raw, Dead: dead})
		return fromStatus(err)
	}
	if err := n.checkTargetBeforeProposing(next, dead); err != nil {
		return err
	}
	canon, err := json.Marshal(next)
	if err != nil {
		return err
	}
	err = n.proposeMeta(ctx, metaCommand{Op: "target", Topology: canon, Dead: dead, At: time.Now().UnixNano()})
	var running *changeRunningError
	var plan *topology.PlanError
	switch {
	case errors.As(err, &running):
		return &server.Error{Code: contract.CodeFailedPrecondition, Message: err.Error()}
	case errors.As(err, &plan):
		return &server.Error{Code: contract.CodeInvalidArgument, Message: err.Error()}
	case err != nil:
		var se *server.Error
		if errors.As(err, &se) {
			return se
		}
		if mv, _ := n.meta.read(); mv.active == nil || isRefusal(err) {
			return &server.Error{Code: contract.CodeInvalidArgument, Message: err.Error()}
		}
		return &server.Error{Code: contract.CodeUnavailable, Message: err.Error(), RetryAfter: time.Second}
	}
	n.log.Info("topology change stored: the nodes drive it to the end", "target_version", next.EffectiveVersion(), "dead", dead,
		"principal", principalName(ctx))
	return nil
}

// isRefusal tells the meta state machine's refusals (the command was
// applied and refused) from errors of the proposal.
func isRefusal(err error) bool {
	var ve *topology.ValidationError
	return errors.As(err, &ve) || errors.Is(err, topology.ErrInvalidTopology)
}

func principalName(ctx context.Context) string {
	if p, ok := auth.PrincipalFrom(ctx); ok && p != nil {
		return p.Name
	}
	return ""
}

// fromStatus turns a forwarded call's gRPC status back into a server.Error.
func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, _ := status.FromError(err)
	code := contract.CodeUnavailable
	switch st.Code() {
	case codes.InvalidArgument:
		code = contract.CodeInvalidArgument
	case codes.FailedPrecondition:
		code = contract.CodeFailedPrecondition
	case codes.PermissionDenied:
		code = contract.CodePermissionDenied
	}
	return &server.Error{Code: code, Message: st.Message(), RetryAfter: time.Second}
}

func toStatus(err error) error {
	var se *server.Error
	if errors.As(err, &se) {
		return se.GRPCStatus().Err()
	}
	return status.Error(codes.Unavailable, err.Error())
}

// topologyService is the Topology gRPC service of a node.
type topologyService struct {
	idemv1.UnimplementedTopologyServer
	n *Node
}

func (t *topologyService) Get(ctx context.Context, _ *idemv1.GetTopologyRequest) (*idemv1.TopologyDocument, error) {
	raw, err := t.n.topologyJSON(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return &idemv1.TopologyDocument{Json: raw}, nil
}

// forwardedMD marks a topology read forwarded to the meta group's leader:
// the receiver answers it from its own state when a node of the cluster
// sent it.
const forwardedMD = "idem-topology-forwarded"

// topologyJSON is the topology document, read on the meta group's leader
// (forwarded there): a node that left the meta group, or lags behind it,
// never answers with the state it last saw.
func (n *Node) topologyJSON(ctx context.Context) ([]byte, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	// Only a node of the cluster forwards a read here: from anyone else
	// the mark is ignored, so a client cannot get a lagging replica's
	// picture (nor make a non-leader answer from its own state).
	forwarded := len(md.Get(forwardedMD)) > 0 && n.memberPeer(ctx, "Topology.Get") == nil
	if !n.metaGroup.IsLeader() && !forwarded {
		id, _ := n.metaGroup.Leader()
		if id == "" || id == n.cfg.NodeID {
			return nil, &server.Error{Code: contract.CodeUnavailable, Message: "the meta group has no leader this node can reach", RetryAfter: time.Second}
		}
		conn, err := n.fwd.Conn(id)
		if err != nil {
			return nil, &server.Error{Code: contract.CodeUnavailable, Message: err.Error(), RetryAfter: time.Second}
		}
		fctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, forwardedMD, "1"), 5*time.Second)
		defer cancel()
		resp, err := idemv1.NewTopologyClient(conn).Get(fctx, &idemv1.GetTopologyRequest{})
		if err != nil {
			return nil, fromStatus(err)
		}
		return resp.GetJson(), nil
	}
	doc, err := n.topologyDocument(ctx)
	if err != nil {
		return nil, err
	}
	return json.Marshal(doc)
}

func (t *topologyService) SetTarget(ctx context.Context, req *idemv1.SetTargetRequest) (*idemv1.TopologyDocument, error) {
	if err := t.n.setTarget(ctx, req.GetTopology(), req.GetDead()); err != nil {
		return nil, toStatus(err)
	}
	return t.Get(ctx, nil)
}

func (t *topologyService) ShardState(ctx context.Context, req *idemv1.ShardStateRequest) (*idemv1.ShardStateResponse, error) {
	if err := t.n.memberPeer(ctx, "ShardState"); err != nil {
		return nil, err
	}
	if len(req.GetPartitions()) > fsm.MaxHandoffPartitions {
		return nil, status.Errorf(codes.InvalidArgument, "ShardState lists at most %d partitions", fsm.MaxHandoffPartitions)
	}
	st := t.n.localShardState(req.GetShard(), req.GetPartitions())
	resp := &idemv1.ShardStateResponse{Hosted: st.hosted, Leader: st.leader, AppliedIndex: st.applied, CommitIndex: st.commit,
		PartitionCount: st.partitionCount, Clock: st.clock}
	for _, pi := range st.partitions {
		resp.Partitions = append(resp.Partitions, &idemv1.PartitionState{Partition: pi.Partition, State: pi.State, Epoch: pi.Epoch, Peer: pi.Peer,
			Attempt: pi.Attempt, DigestRecords: pi.Digest.Records, DigestSum: pi.Digest.Sum})
	}
	if t.n.advertisedVersion() >= VersionPartitionHandoff {
		resp.Features = []string{featurePartitionHandoff} // for a mover of a release before the cluster version
	}
	if st.hosted {
		if id := req.GetShard(); id == MetaGroupID {
			resp.LeaderId, _ = t.n.metaGroup.Leader()
		} else if s := t.n.shard(id); s != nil {
			resp.LeaderId, _ = s.group.Leader()
		}
	}
	for _, m := range st.members {
		resp.Members = append(resp.Members, &idemv1.ShardMember{Id: m.ID, Addr: m.Addr, Voter: m.Voter})
	}
	return resp, nil
}

func (t *topologyService) ChangeMember(ctx context.Context, req *idemv1.ChangeMemberRequest) (*idemv1.ChangeMemberResponse, error) {
	if err := t.n.authorizeChangeMember(ctx, req.GetShard(), req.GetOp(), req.GetNode(), req.GetAddr()); err != nil {
		return nil, err
	}
	step := moveStep{shard: req.GetShard(), op: req.GetOp(), node: req.GetNode(), addr: req.GetAddr()}
	if err := t.n.changeMember(ctx, step); err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	t.n.log.Info("membership step taken for the change's driver", "step", step.String())
	return &idemv1.ChangeMemberResponse{}, nil
}

// topologyHTTP serves GET and PUT /v1/topology.
func (n *Node) topologyHTTP() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			raw, err := n.topologyJSON(metadata.NewIncomingContext(r.Context(), nil))
			if err != nil {
				writeHTTPError(w, err)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(append(raw, '\n'))
		case http.MethodPut, http.MethodPost:
			var body struct {
				Topology json.RawMessage `json:"topology"`
				Dead     []string        `json:"dead"`
			}
			data, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
			if err == nil {
				// Refused rather than decoded into something else than
				// was sent: a member named twice, bytes not UTF-8.
				if e := server.CheckJSONText(data); e != nil {
					writeHTTPError(w, e)
					return
				}
				err = json.Unmarshal(data, &body)
			}
			if err != nil || len(body.Topology) == 0 {
				writeHTTPError(w, &server.Error{Code: contract.CodeInvalidArgument, Message: `body must be {"topology": {...the topology file as JSON...}, "dead": [...]?}`})
				return
			}
			raw := []byte(body.Topology)
			var text string
			if json.Unmarshal(body.Topology, &text) == nil {
				raw = []byte(text) // the file's YAML as a JSON string
			}
			if err := n.setTarget(r.Context(), raw, body.Dead); err != nil {
				writeHTTPError(w, err)
				return
			}
			raw, err = n.topologyJSON(metadata.NewIncomingContext(r.Context(), nil))
			if err != nil {
				writeHTTPError(w, err)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(append(raw, '\n'))
		default:
			w.Header().Set("Allow", "GET, HEAD, PUT")
			writeHTTPError(w, &server.Error{Code: contract.CodeMethodNotAllowed, Message: r.Method + " /v1/topology is not allowed: use GET or PUT"})
		}
	})
}

func writeHTTPError(w http.ResponseWriter, err error) {
	var se *server.Error
	if !errors.As(err, &se) {
		se = &server.Error{Code: contract.CodeUnavailable, Message: err.Error(), RetryAfter: time.Second}
	}
	server.WriteHTTPError(w, se)
}

// topoMetrics are the topology metrics of the contract.
type topoMetrics struct {
	version    prometheus.Gauge
	inProgress prometheus.Gauge
	stalled    prometheus.Gauge
	keysMoved  prometheus.Counter
	// bytesMoved, partitionsMoved and pause describe the partition
	// handoffs this node drove.
	bytesMoved, partitionsMoved prometheus.Counter
	pause                       prometheus.Histogram
	steps                       *prometheus.CounterVec
	log                         *slog.Logger
}

func newTopoMetrics() *topoMetrics {
	return &topoMetrics{
		version: prometheus.NewGauge(prometheus.GaugeOpts{Name: "idem_topology_version",
			Help: "The cluster's active topology version, as this node knows it."}),
		inProgress: prometheus.NewGauge(prometheus.GaugeOpts{Name: "idem_topology_change_in_progress",
			Help: "1 while a topology change runs (a target is stored), 0 otherwise."}),
		stalled: prometheus.NewGauge(prometheus.GaugeOpts{Name: "idem_topology_change_stalled",
			Help: "1 when a running topology change has taken no step for 10 minutes (alert on it), 0 otherwise."}),
		keysMoved: prometheus.NewCounter(prometheus.CounterOpts{Name: "idem_topology_keys_moved_total",
			Help: "Records moved to another shard by the topology changes this node drove (as the meta group's leader); membership changes move none."}),
		bytesMoved: prometheus.NewCounter(prometheus.CounterOpts{Name: "idem_topology_bytes_moved_total",
			Help: "Bytes of records moved to another shard by the topology changes this node drove."}),
		partitionsMoved: prometheus.NewCounter(prometheus.CounterOpts{Name: "idem_topology_partitions_moved_total",
			Help: "Ring partitions moved to another shard by the topology changes this node drove."}),
		pause: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "idem_topology_handoff_pause_seconds",
			Help:    "How long one batch of moving partitions paused writes (from the source's freeze to the destination's open).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_topology_steps_total",
			Help: "Steps this node took as the driver of a topology change, by step (add_learner, promote, remove, demote, transfer_leader, adopt, handoff, drop)."}, []string{"step"}),
	}
}

func (m *topoMetrics) register(r *prometheus.Registry) error {
	for _, c := range []prometheus.Collector{m.version, m.inProgress, m.stalled, m.keysMoved, m.bytesMoved, m.partitionsMoved, m.pause, m.steps} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *topoMetrics) observe(v *view, mv metaView) {
	m.version.Set(float64(v.version()))
	if mv.target == nil {
		m.inProgress.Set(0)
		m.stalled.Set(0)
		return
	}
	m.inProgress.Set(1)
	if time.Since(time.Unix(0, mv.lastProgress)) > stallAfter {
		m.stalled.Set(1)
	} else {
		m.stalled.Set(0)
	}
}
