package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/topology"
)

// topologyDoc mirrors GET /v1/topology.
type topologyDoc struct {
	ActiveVersion int             `json:"active_version"`
	TargetVersion int             `json:"target_version,omitempty"`
	Topology      json.RawMessage `json:"topology"`
	Target        json.RawMessage `json:"target,omitempty"`
	Progress      *struct {
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
	} `json:"progress,omitempty"`
}

// topologyNodes are the gRPC addresses idemctl asks: --addr, else the
// nodes of --config, else those of the file given.
func topologyNodes(e *env, file *topology.Topology) []string {
	if e.o.addr != "" {
		return []string{e.o.addr}
	}
	t := e.topo
	if t == nil {
		t = file
	}
	if t == nil {
		return nil
	}
	var out []string
	for _, n := range t.Nodes() {
		out = append(out, n.GRPCAddr)
	}
	return out
}

// callTopology runs call against the first node that answers.
func callTopology(ctx context.Context, e *env, addrs []string, timeout time.Duration, call func(context.Context, idemv1.TopologyClient) error) error {
	if len(addrs) == 0 {
		return errors.New("no node to ask: give --config (the cluster's topology file) or --addr")
	}
	err := firstAnswer(ctx, e, addrs, timeout, func(ctx context.Context, conn *grpc.ClientConn) error {
		return call(ctx, idemv1.NewTopologyClient(conn))
	})
	if err != nil && status.Code(err) != codes.Unknown {
		return apiError("topology", err)
	}
	return err
}

// fetchTopology reads the topology document (retried while no node
// answers: untilAnswered).
func fetchTopology(ctx context.Context, e *env, addrs []string) (*topologyDoc, error) {
	var doc topologyDoc
	err := untilAnswered(ctx, func() error {
		return callTopology(ctx, e, addrs, e.g.timeout, func(ctx context.Context, c idemv1.TopologyClient) error {
			resp, err := c.Get(ctx, &idemv1.GetTopologyRequest{})
			if err != nil {
				return err
			}
			return json.Unmarshal(resp.GetJson(), &doc)
		})
	})
	return &doc, err
}

// untilAnswered runs call again, once a second for up to 30 s, while no
// node answers it: the meta group may be electing a leader (its last one
// just died).
func untilAnswered(ctx context.Context, call func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := call()
		if !errors.Is(err, errNoNodeAnswered) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func loadNext(path string) (*topology.Topology, []byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	t, err := topology.Parse(raw)
	if err != nil {
		return nil, nil, err
	}
	return t, raw, nil
}

func runTopology(ctx context.Context, e *env, args []string) error {
	sub := args[0]
	switch sub {
	case "plan", "apply":
		if len(args) != 2 {
			return fmt.Errorf("topology %s needs FILE, the new topology file", sub)
		}
	case "status":
		if len(args) != 1 {
			return errors.New("topology status takes no FILE")
		}
	default:
		return fmt.Errorf("unknown topology command %q: plan FILE, apply FILE or status", sub)
	}
	var next *topology.Topology
	var raw []byte
	if len(args) == 2 {
		var err error
		if next, raw, err = loadNext(args[1]); err != nil {
			return err
		}
	}
	addrs := topologyNodes(e, next)
	doc, err := fetchTopology(ctx, e, addrs)
	if err != nil {
		return err
	}
	switch sub {
	case "plan":
		return printPlan(e, doc, next)
	case "status":
		return printTopologyStatus(e, doc)
	}
	if active, err := activeOf(doc); err == nil && topology.SameShape(active, next) {
		fmt.Fprintf(e.stdout, "done: version %d is active already\n", doc.ActiveVersion)
		return nil
	}
	if running, err := topology.Parse(doc.Target); err == nil && topology.SameShape(running, next) {
		fmt.Fprintf(e.stdout, "the change to version %d is running already: following it\n", next.EffectiveVersion())
	} else {
		if err := printPlan(e, doc, next); err != nil {
			return err
		}
		err = untilAnswered(ctx, func() error {
			return callTopology(ctx, e, addrs, 3*e.g.timeout, func(ctx context.Context, c idemv1.TopologyClient) error {
				_, err := c.SetTarget(ctx, &idemv1.SetTargetRequest{Topology: raw, Dead: e.o.dead})
				return err
			})
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "target version %d stored: the nodes drive the change\n", next.EffectiveVersion())
	}
	if e.o.noWait {
		return nil
	}
	last := ""
	for {
		doc, err := fetchTopology(ctx, e, addrs)
		if err == nil {
			if doc.ActiveVersion >= next.EffectiveVersion() {
				fmt.Fprintf(e.stdout, "done: version %d is active\n", doc.ActiveVersion)
				if doc.Progress != nil && len(doc.Progress.MayStop) > 0 {
					fmt.Fprintf(e.stdout, "these nodes left the cluster and may be stopped: %s\n", strings.Join(doc.Progress.MayStop, ", "))
				}
				return nil
			}
			if p := doc.Progress; p != nil {
				line := fmt.Sprintf("version %d -> %d: %d/%d shards done", doc.ActiveVersion, doc.TargetVersion, p.ShardsDone, p.ShardsTotal)
				if p.PartitionsTotal > 0 {
					line += fmt.Sprintf(", %d/%d partitions moved", p.PartitionsMoved, p.PartitionsTotal)
				}
				if p.Waiting != "" {
					line += " (waiting: " + p.Waiting + ")"
				}
				if p.Stalled {
					line += " (STALLED: no step for 10 minutes; see the nodes' logs)"
				}
				if line != last {
					fmt.Fprintln(e.stdout, line)
					last = line
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: the change goes on without idemctl; run apply again to follow it, or topology status", ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func activeOf(doc *topologyDoc) (*topology.Topology, error) {
	return topology.Parse(doc.Topology)
}

func printPlan(e *env, doc *topologyDoc, next *topology.Topology) error {
	active, err := activeOf(doc)
	if err != nil {
		return err
	}
	change, err := topology.Plan(active, next)
	if err != nil {
		var pe *topology.PlanError
		if errors.As(err, &pe) {
			return fmt.Errorf("the change cannot be applied:\n  %s", strings.Join(pe.Reasons, "\n  "))
		}
		return err
	}
	if e.g.json {
		return writeJSON(e.stdout, change)
	}
	fmt.Fprintf(e.stdout, "version %d -> %d\n", change.From, change.To)
	if len(change.Joining) > 0 {
		fmt.Fprintf(e.stdout, "joining: %s\n", strings.Join(change.Joining, ", "))
	}
	if len(change.Leaving) > 0 {
		fmt.Fprintf(e.stdout, "leaving: %s\n", strings.Join(change.Leaving, ", "))
	}
	if len(change.ShardsCreated) > 0 {
		fmt.Fprintf(e.stdout, "shards created: %s\n", strings.Join(change.ShardsCreated, ", "))
	}
	if len(change.ShardsRemoved) > 0 {
		fmt.Fprintf(e.stdout, "shards removed: %s\n", strings.Join(change.ShardsRemoved, ", "))
	}
	for _, s := range change.Shards {
		fmt.Fprintf(e.stdout, "  shard %-16s add %-24s remove %-24s -> voters %s\n", s.ID, dash(strings.Join(s.Add, ",")), dash(strings.Join(s.Remove, ",")), strings.Join(s.Voters, ","))
	}
	fmt.Fprintf(e.stdout, "seats moved: %d (lower bound for any balanced placement: %d)\n", change.SeatsMoved, change.MinSeatsMoved)
	fmt.Fprintf(e.stdout, "keys changing home shard: %.1f%%; changing home region: %.1f%%\n", 100*change.KeysMovedShare, 100*change.RegionMovedShare)
	fmt.Fprintf(e.stdout, "meta group voters: %s\n", strings.Join(change.MetaVoters, ", "))
	return nil
}

func printTopologyStatus(e *env, doc *topologyDoc) error {
	if e.g.json {
		return writeJSON(e.stdout, doc)
	}
	fmt.Fprintf(e.stdout, "active version: %d\n", doc.ActiveVersion)
	p := doc.Progress
	if doc.TargetVersion == 0 {
		fmt.Fprintln(e.stdout, "no change running")
		if p != nil && len(p.MayStop) > 0 {
			fmt.Fprintf(e.stdout, "left the cluster in the last change, may be stopped: %s\n", strings.Join(p.MayStop, ", "))
		}
		return nil
	}
	fmt.Fprintf(e.stdout, "target version: %d (started %s, last step %s)\n", doc.TargetVersion, p.StartedAt.Format(time.RFC3339), p.LastStepAt.Format(time.RFC3339))
	fmt.Fprintf(e.stdout, "shards done: %d/%d\n", p.ShardsDone, p.ShardsTotal)
	if p.PartitionsTotal > 0 {
		fmt.Fprintf(e.stdout, "partitions moved to their new shard: %d/%d\n", p.PartitionsMoved, p.PartitionsTotal)
	}
	for _, s := range p.Left {
		fmt.Fprintf(e.stdout, "  shard %-16s voters %-30s learners %-20s want %s\n", s.Shard, strings.Join(s.Voters, ","), dash(strings.Join(s.Learners, ",")), strings.Join(s.Want, ","))
	}
	if len(p.LeaderUnknown) > 0 {
		fmt.Fprintf(e.stdout, "no leader reached for: %s\n", strings.Join(p.LeaderUnknown, ", "))
	}
	if len(p.Dead) > 0 {
		fmt.Fprintf(e.stdout, "dead (removed without hand-over): %s\n", strings.Join(p.Dead, ", "))
	}
	if len(p.MayStop) > 0 {
		fmt.Fprintf(e.stdout, "may be stopped now: %s\n", strings.Join(p.MayStop, ", "))
	}
	if p.Waiting != "" {
		fmt.Fprintf(e.stdout, "waiting: %s\n", p.Waiting)
	}
	if p.Stalled {
		fmt.Fprintln(e.stdout, "STALLED: no step for 10 minutes (see the meta leader's log)")
	}
	return nil
}
