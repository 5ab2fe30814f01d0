package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/idem-dev/idem/internal/launch"
)

// Router is an idemrouter process of a Cluster and the loopback addresses it
// serves on (routers are not in the topology, so the addresses live here).
type Router struct {
	*launch.Process
	Region   string
	HTTPAddr string
	GRPCAddr string
	c        *Cluster
}

// NewRouter lays out (but does not start) an idemrouter process named name
// for region, on free loopback ports, with extraArgs; it is added to
// c.Routers, so StopAll stops it.
func (c *Cluster) NewRouter(idemrouter, name, region string, extraArgs ...string) (*Router, error) {
	if _, ok := c.Topology.RegionByName(region); !ok {
		return nil, fmt.Errorf("cluster: region %q is not in the topology", region)
	}
	if _, dup := c.Routers[name]; dup {
		return nil, fmt.Errorf("cluster: a router named %q exists", name)
	}
	ports, err := launch.FreePorts(2)
	if err != nil {
		return nil, err
	}
	r := &Router{
		Region:   region,
		HTTPAddr: "127.0.0.1:" + strconv.Itoa(ports[0]),
		GRPCAddr: "127.0.0.1:" + strconv.Itoa(ports[1]),
		c:        c,
	}
	args := append([]string{"--config", c.TopologyPath, "--region", region,
		"--http-addr", r.HTTPAddr, "--grpc-addr", r.GRPCAddr, "--log-level", "debug"}, extraArgs...)
	if c.CADir != "" {
		certsDir := c.RouterCertsDir
		if c.RouterNodeCerts {
			certsDir = c.NodeCertsDir
		}
		dir, err := certsDir(name)
		if err != nil {
			return nil, err
		}
		args = append(args, c.secureArgs(dir)...)
	}
	r.Process = &launch.Process{Name: name, Bin: idemrouter, Args: args, Log: filepath.Join(c.Dir, name+".log")}
	c.Routers[name] = r.Process
	return r, nil
}

// WaitReady polls the router's /readyz until it answers 200 or ctx ends.
func (r *Router) WaitReady(ctx context.Context) error {
	if err := r.c.probeProcess(ctx, r.Process, r.HTTPAddr); err != nil {
		return fmt.Errorf("router %s: %w", r.Name, err)
	}
	return nil
}

// API returns a JSON API client for the router.
func (r *Router) API() *API { return NewAPI(r.HTTPAddr) }

// NodesIn returns the ids of region's nodes, in topology order.
func (c *Cluster) NodesIn(region string) []string {
	var ids []string
	for _, n := range c.Topology.Nodes() {
		if n.Region == region {
			ids = append(ids, n.ID)
		}
	}
	return ids
}

// KillRegion SIGKILLs every node of region (a region lost at once).
func (c *Cluster) KillRegion(region string) {
	for _, id := range c.NodesIn(region) {
		c.Nodes[id].Kill()
	}
}

// StartRegion starts every node of region that is not running.
func (c *Cluster) StartRegion(region string) error {
	var errs []error
	for _, id := range c.NodesIn(region) {
		if p := c.Nodes[id]; !p.Running() {
			errs = append(errs, p.Start())
		}
	}
	return errors.Join(errs...)
}
