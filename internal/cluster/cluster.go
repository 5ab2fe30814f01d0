// Package cluster is the process-level tests' harness: a Cluster of real
// idemnode processes (and idemrouter routers, Router) from one generated
// topology, started, probed, stopped and killed by node or region; secure
// clusters with their CA and client certificates (Secure); a JSON API
// client (API) and a key filler (Filler); the TestMain body that builds the
// commands (RunTests) and hands their paths to process-level tests
// (Binaries), table tests of a command's Run (TestRun) and the topology
// files they use (TopologyFiles). Every process listens on 127.0.0.1 ports
// picked free at generation time; data dirs and logs live under one base
// directory. The processes themselves are internal/launch's; this package
// imports testing and is linked by tests only.
package cluster

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/topology"
)

// Cluster is a set of idemnode processes (and routers) from one topology.
type Cluster struct {
	Topology     *topology.Topology
	TopologyPath string
	Dir          string
	Nodes        map[string]*launch.Process
	Routers      map[string]*launch.Process
	// CADir and AuthFile are set by Secure: the CA (and client
	// certificates) of a secure cluster, and the auth file of its processes.
	CADir, AuthFile string
	// RouterNodeCerts makes NewRouter give secure routers a node
	// certificate (as in v1.1) instead of a router certificate.
	RouterNodeCerts bool
}

// NewNodes lays out (but does not start) one idemnode process per node of
// t under dir, each with extraArgs.
func NewNodes(t *topology.Topology, dir, idemnode string, extraArgs ...string) (*Cluster, error) {
	c := &Cluster{Topology: t, Dir: dir, TopologyPath: filepath.Join(dir, "topology.yaml"),
		Nodes: map[string]*launch.Process{}, Routers: map[string]*launch.Process{}}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := launch.WriteTopology(t, c.TopologyPath); err != nil {
		return nil, err
	}
	for _, n := range t.Nodes() {
		args := append([]string{"--config", c.TopologyPath, "--id", n.ID, "--data-dir", filepath.Join(dir, "data", n.ID), "--log-level", "debug"}, extraArgs...)
		c.Nodes[n.ID] = &launch.Process{Name: n.ID, Bin: idemnode, Args: args, Log: filepath.Join(dir, n.ID+".log")}
	}
	return c, nil
}

// StartAll starts every node that is not running.
func (c *Cluster) StartAll() error {
	for _, p := range c.Nodes {
		if !p.Running() {
			if err := p.Start(); err != nil {
				return err
			}
		}
	}
	return nil
}

// WaitReady waits until /readyz of every running node answers 200.
func (c *Cluster) WaitReady(ctx context.Context) error {
	for id, p := range c.Nodes {
		if !p.Running() {
			continue
		}
		n, _ := c.Topology.NodeByID(id)
		if err := c.probeProcess(ctx, p, n.HTTPAddr); err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
	}
	return nil
}

// probeProcess is probe for the /readyz of process p, which gives up as
// soon as p exits (a port it could not bind, a bad flag) instead of polling
// a dead address until ctx ends.
func (c *Cluster) probeProcess(ctx context.Context, p *launch.Process, addr string) error {
	return p.WaitUntil(ctx, func(ctx context.Context) error { return c.probe(ctx, addr) })
}

// StopAll stops every process gracefully (SIGTERM) and reports failures,
// including a data race any process reported in its log (also one that was
// killed, and so never exited with the race detector's status).
func (c *Cluster) StopAll() error {
	var errs []error
	for _, p := range c.Routers {
		errs = append(errs, p.Stop(20*time.Second), p.RaceReport())
	}
	for _, p := range c.Nodes {
		errs = append(errs, p.Stop(20*time.Second), p.RaceReport())
	}
	return errors.Join(errs...)
}

// HTTPAddr returns the JSON API address of node id.
func (c *Cluster) HTTPAddr(id string) string {
	n, _ := c.Topology.NodeByID(id)
	return n.HTTPAddr
}

// Binaries maps a command name (idemnode, ...) to the path RunTests built
// it at.
type Binaries map[string]string

// Path returns the path of command name for a process-level test: under
// -short it skips tb (testutil.NeedsProcesses), since nothing was built.
func (b Binaries) Path(tb testing.TB, name string) string {
	tb.Helper()
	testutil.NeedsProcesses(tb)
	p, ok := b[name]
	if !ok {
		tb.Fatalf("%s was not built: name it in the package's RunTests", name)
	}
	return p
}

// RunTests is a TestMain body for packages that start real processes: it
// builds the named commands into a temporary dir, stores their paths in
// *bins, runs the tests, removes the dir and exits with the tests' code.
//
// With -short (the fast inner loop) nothing is built: the package's unit
// tests run, and every test that asks bins for a command (Binaries.Path)
// skips as process-level; the README's full command runs them.
func RunTests(m *testing.M, bins *Binaries, commands ...string) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "idem-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	built, err := launch.Build(dir, commands...)
	if err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*bins = built
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// ShardLeaders asks every running node for its view of the shards it hosts
// (the Admin service) and returns, per shard id, the node that reports
// itself leader.
func (c *Cluster) ShardLeaders(ctx context.Context) (map[string]string, error) {
	leaders := map[string]string{}
	for _, n := range c.Topology.Nodes() {
		if !c.Nodes[n.ID].Running() {
			continue
		}
		conn, err := grpc.NewClient(n.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := idemv1.NewAdminClient(conn).Status(actx, &idemv1.StatusRequest{})
		cancel()
		conn.Close()
		if err != nil {
			return nil, fmt.Errorf("cluster: status of %s: %w", n.ID, err)
		}
		for _, s := range st.Shards {
			if s.RaftState == "Leader" {
				leaders[s.Shard] = n.ID
			}
		}
	}
	return leaders, nil
}
