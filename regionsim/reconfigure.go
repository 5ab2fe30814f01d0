package regionsim

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"gopkg.in/yaml.v3"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/topology"
)

// reconfigure is the fault-free reconfiguration phase: at its start a new
// node joins region (topology version +1, applied online while the
// workload runs), at its end another node of the region, not the naive
// lock server's host, leaves (version +2) and is stopped once the change
// is done. Nothing is down at any moment; the checkers judge the workload
// across both changes.
func reconfigure(at, d time.Duration, region string) *Fault {
	return &Fault{Name: "a node joins " + region + ", then another leaves (topology changes applied online)", At: at, For: d,
		start: func(ctx context.Context, e *faultEnv) (string, error) {
			id, took, err := e.c.joinNode(ctx, region)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("%s joined in %s", id, took.Round(time.Millisecond)), nil
		},
		stop: func(ctx context.Context, e *faultEnv) error {
			id, took, err := e.c.removeNode(ctx, region)
			if err != nil {
				return err
			}
			e.c.log.Info("node left the cluster", "node", id, "took", took.Round(time.Millisecond))
			return nil
		},
	}
}

// joinNode starts a node with a new id in region, with fresh ports and its
// region's view of the next topology version, and applies that version.
func (c *simCluster) joinNode(ctx context.Context, region string) (string, time.Duration, error) {
	ports, err := launch.FreePorts(3)
	if err != nil {
		return "", 0, err
	}
	next := c.topology().Clone()
	next.Version = next.EffectiveVersion() + 1
	id := ""
	for i := range next.Regions {
		if next.Regions[i].Name != region {
			continue
		}
		for k := len(next.Regions[i].Nodes) + 1; ; k++ {
			id = region + "-" + strconv.Itoa(k)
			if c.node(id) == nil {
				break
			}
		}
		addr := func(p int) string { return "127.0.0.1:" + strconv.Itoa(p) }
		next.Regions[i].Nodes = append(next.Regions[i].Nodes, topology.Node{ID: id, Region: region,
			RaftAddr: addr(ports[0]), GRPCAddr: addr(ports[1]), HTTPAddr: addr(ports[2])})
	}
	if id == "" {
		return "", 0, fmt.Errorf("regionsim: no region %q", region)
	}
	c.nodesMu.Lock()
	c.topo = next
	c.nodesMu.Unlock()
	if err := c.writeViews(); err != nil {
		return "", 0, err
	}
	real, _ := next.NodeByID(id)
	if err := c.startNewNode(real); err != nil {
		return "", 0, err
	}
	took, err := c.applyTopology(ctx, next, nil, membershipWithin)
	return id, took, err
}

// startNewNode starts a node the cluster did not have, with its region's
// view of the current topology (the version about to be applied), and
// adds it to the cluster's nodes.
func (c *simCluster) startNewNode(real topology.Node) error {
	sn := &simNode{id: real.ID, region: real.Region, real: real}
	sn.baseArgs = []string{"--config", c.views[real.Region], "--id", real.ID, "--data-dir", filepath.Join(c.dir, "data", real.ID),
		"--log-level", "info", "--clock-skew-margin", c.cfg.ClockSkewMargin.String()}
	sn.proc = &launch.Process{Name: real.ID, Bin: c.anyNode().proc.Bin, Args: sn.baseArgs, Log: filepath.Join(c.dir, "logs", real.ID+".log"),
		Env: []string{launch.FaultInjectionEnv}}
	if err := sn.proc.Start(); err != nil {
		return err
	}
	c.nodesMu.Lock()
	c.nodes[real.ID] = sn
	c.nodeIDs = append(c.nodeIDs, real.ID)
	c.nodesMu.Unlock()
	return nil
}

// removeNode applies the next version without one of region's nodes (the
// first that is not the naive lock server's host), then stops it.
func (c *simCluster) removeNode(ctx context.Context, region string) (string, time.Duration, error) {
	victims := slices.DeleteFunc(c.nodesIn(region), func(id string) bool { return id == c.naiveHost })
	if len(victims) == 0 {
		return "", 0, fmt.Errorf("regionsim: no node of %s may leave", region)
	}
	id := victims[0]
	next := c.topology().Clone()
	next.Version = next.EffectiveVersion() + 1
	for i := range next.Regions {
		next.Regions[i].Nodes = slices.DeleteFunc(next.Regions[i].Nodes, func(n topology.Node) bool { return n.ID == id })
	}
	took, err := c.applyTopology(ctx, next, nil, membershipWithin)
	if err != nil {
		return id, took, err
	}
	c.nodesMu.Lock()
	c.topo = next
	c.nodeIDs = slices.DeleteFunc(c.nodeIDs, func(x string) bool { return x == id })
	c.nodesMu.Unlock()
	if err := c.node(id).proc.Stop(15 * time.Second); err != nil {
		c.log.Warn("stopping the node that left", "node", id, "err", err)
	}
	return id, took, nil
}

// How long a topology change may take before the scenario reports it as
// stuck: one that only changes Raft memberships, and one that moves ring
// partitions between shards (one batch per mover step; over the simulated
// WAN a step takes seconds).
const (
	membershipWithin = 90 * time.Second
	partitionsWithin = 8 * time.Minute
)

// applyTopology stores next as the cluster's target through a running node
// and waits, up to within, until it is the active version. After a change
// that did not finish, every later one fails at once: the cluster keeps
// its target until that change completes.
func (c *simCluster) applyTopology(ctx context.Context, next *topology.Topology, dead []string, within time.Duration) (time.Duration, error) {
	c.nodesMu.Lock()
	unfinished := c.unfinished
	c.nodesMu.Unlock()
	if unfinished != 0 {
		return 0, fmt.Errorf("regionsim: version %d not applied: version %d never became active", next.EffectiveVersion(), unfinished)
	}
	raw, err := yaml.Marshal(next)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	stored := false
	var lastErr error // the last node's refusal, for the error below
	for ctx.Err() == nil {
		// Ask the running nodes in turn until one answers: a node that
		// refuses or does not answer (restarting, overloaded) passes the
		// question to the next.
		for _, id := range c.running() {
			conn, err := c.adminConn(id)
			if err != nil {
				lastErr = fmt.Errorf("%s: %w", id, err)
				continue
			}
			client := idemv1.NewTopologyClient(conn)
			if !stored {
				// An error may come after the target was stored (the
				// answer lost or late on a loaded cluster): the topology
				// read below tells.
				sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := client.SetTarget(sctx, &idemv1.SetTargetRequest{Topology: raw, Dead: dead})
				scancel()
				if err != nil {
					lastErr = fmt.Errorf("%s: storing the target: %w", id, err)
				}
				stored = err == nil
			}
			gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := client.Get(gctx, &idemv1.GetTopologyRequest{})
			gcancel()
			if err != nil {
				lastErr = fmt.Errorf("%s: reading the topology: %w", id, err)
				continue
			}
			var doc struct {
				ActiveVersion int `json:"active_version"`
				TargetVersion int `json:"target_version"`
			}
			if err := json.Unmarshal(resp.GetJson(), &doc); err != nil {
				lastErr = fmt.Errorf("%s: reading the topology: %w", id, err)
				continue
			}
			if doc.ActiveVersion >= next.EffectiveVersion() {
				return time.Since(start), nil
			}
			stored = stored || doc.TargetVersion == next.EffectiveVersion()
			if !stored {
				continue // refused here: ask the next node
			}
			break // stored and running: ask again in a moment
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	c.nodesMu.Lock()
	c.unfinished = next.EffectiveVersion()
	c.nodesMu.Unlock()
	err = fmt.Errorf("regionsim: topology version %d not active after %s (stored: %v)", next.EffectiveVersion(), time.Since(start).Round(time.Second), stored)
	if lastErr != nil {
		err = fmt.Errorf("%w; last refusal: %v", err, lastErr)
	}
	return time.Since(start), err
}

// anyNode returns one of the cluster's nodes.
func (c *simCluster) anyNode() *simNode { return c.node(c.ids()[0]) }
