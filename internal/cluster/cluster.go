// Package cluster starts real idem processes (idemnode, idemrouter) on
// loopback from a generated topology, for tests and for regionsim. Every
// process listens on 127.0.0.1 ports picked free at generation time; data
// dirs and logs live under one base directory.
package cluster

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"gopkg.in/yaml.v3"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"

	"github.com/idem-dev/idem/topology"
)

// Build compiles the repo's commands (e.g. "idemnode", "idemrouter") into
// dir and returns their paths by name. It must run inside the module. When
// the calling test binary runs under the race detector (go test -race), the
// commands are built with -race too, so the code that only runs inside the
// processes (node wiring, forwarding, draining) is checked as well.
func Build(dir string, commands ...string) (map[string]string, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	args, env := []string{"build"}, append(os.Environ(), "CGO_ENABLED=0")
	if raceEnabled {
		args, env = append(args, "-race"), append(os.Environ(), "CGO_ENABLED=1")
	}
	out := map[string]string{}
	for _, name := range commands {
		bin := filepath.Join(dir, name)
		cmd := exec.Command("go", append(args, "-o", bin, "./cmd/"+name)...)
		cmd.Dir = root
		cmd.Env = env
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("cluster: go build ./cmd/%s: %v\n%s", name, err, b)
		}
		out[name] = bin
	}
	return out, nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cluster: go.mod not found above the working directory")
		}
		dir = parent
	}
}

// Spec describes a cluster to generate.
type Spec struct {
	Cluster         string   // default "test"
	Regions         []string // default ["r1"]
	NodesPerRegion  int      // default 3
	ShardsPerRegion int      // default 4
	Replicas        int      // default 3
	Survival        string   // default zone
	WANRTTMs        int
}

// Topology generates a topology for spec with free loopback ports.
func Topology(spec Spec) (*topology.Topology, error) {
	if spec.Cluster == "" {
		spec.Cluster = "test"
	}
	if len(spec.Regions) == 0 {
		spec.Regions = []string{"r1"}
	}
	if spec.NodesPerRegion == 0 {
		spec.NodesPerRegion = 3
	}
	if spec.ShardsPerRegion == 0 {
		spec.ShardsPerRegion = 4
	}
	if spec.Replicas == 0 {
		spec.Replicas = 3
	}
	if spec.Survival == "" {
		spec.Survival = "zone"
	}
	ports, err := FreePorts(3 * len(spec.Regions) * spec.NodesPerRegion)
	if err != nil {
		return nil, err
	}
	t := &topology.Topology{
		Cluster: spec.Cluster, ShardsPerRegion: spec.ShardsPerRegion, Replicas: spec.Replicas,
		Survival: topology.Survival(spec.Survival), WANRTTMs: spec.WANRTTMs,
	}
	i := 0
	addr := func() string { i++; return "127.0.0.1:" + strconv.Itoa(ports[i-1]) }
	for _, r := range spec.Regions {
		region := topology.Region{Name: r}
		for j := 1; j <= spec.NodesPerRegion; j++ {
			region.Nodes = append(region.Nodes, topology.Node{ID: r + "-" + strconv.Itoa(j), RaftAddr: addr(), GRPCAddr: addr(), HTTPAddr: addr()})
		}
		t.Regions = append(t.Regions, region)
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

// WriteTopology writes t as YAML to path.
func WriteTopology(t *topology.Topology, path string) error {
	data, err := yaml.Marshal(t)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// Process is one running (or stopped) idem process.
type Process struct {
	Name string
	Args []string
	Bin  string
	Log  string // path of its combined stdout and stderr
	// Env is added to this process's inherited environment (KEY=VALUE),
	// e.g. IDEM_ENABLE_FAULT_INJECTION=1 for the --testing-* flags.
	Env []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
}

// Start starts the process; its output is appended to Log.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("cluster: %s already running", p.Name)
	}
	logf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if len(p.Env) > 0 {
		cmd.Env = append(os.Environ(), p.Env...)
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("cluster: start %s: %w", p.Name, err)
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(exited)
	}(cmd, p.exited)
	return nil
}

// Pid is the process's id (0 before Start).
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the process was started and has not exited.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig; a process that is not running is left alone.
func (p *Process) Signal(sig os.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	return p.cmd.Process.Signal(sig)
}

// Stop sends SIGTERM and waits up to timeout for a clean exit, then kills.
// It returns the process's exit error (nil for exit status 0).
func (p *Process) Stop(timeout time.Duration) error {
	return p.halt(syscall.SIGTERM, timeout)
}

// Wait waits until the process exits by itself or ctx ends, and returns
// its exit error (nil for exit status 0).
func (p *Process) Wait(ctx context.Context) error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return errors.New("cluster: " + p.Name + " is not running")
	}
	select {
	case <-exited:
	case <-ctx.Done():
		return fmt.Errorf("cluster: %s still running: %w", p.Name, ctx.Err())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cmd = nil
	return p.err
}

// exitedCh returns a channel closed when the process exits, or nil if it
// was never started (or was reaped by Stop, Kill or Wait).
func (p *Process) exitedCh() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	return p.exited
}

// probeProcess is probe for the /readyz of process p, which gives up as
// soon as p exits (a port it could not bind, a bad flag) instead of polling
// a dead address until ctx ends.
func (c *Cluster) probeProcess(ctx context.Context, p *Process, addr string) error {
	exited := p.exitedCh()
	if exited == nil {
		return fmt.Errorf("cluster: %s is not running", p.Name)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-exited:
			p.mu.Lock()
			err := p.err
			p.mu.Unlock()
			cancel(fmt.Errorf("cluster: %s exited before it was ready (%v); see %s", p.Name, err, p.Log))
		case <-ctx.Done():
		}
	}()
	err := c.probe(ctx, addr)
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, ctx.Err()) {
		return cause
	}
	return err
}

// FaultInjectionEnv is the environment a process needs for the --testing-*
// flags of idemnode.
const FaultInjectionEnv = "IDEM_ENABLE_FAULT_INJECTION=1"

// Kill sends SIGKILL (a crash) and waits for the process to be gone.
func (p *Process) Kill() error {
	p.halt(syscall.SIGKILL, 10*time.Second)
	return nil
}

func (p *Process) halt(sig syscall.Signal, timeout time.Duration) error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	cmd.Process.Signal(syscall.SIGCONT) // a stopped process cannot act on SIGTERM
	cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-exited
		p.mu.Lock()
		p.cmd = nil
		p.mu.Unlock()
		return fmt.Errorf("cluster: %s did not exit within %s after %s; killed", p.Name, timeout, sig)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cmd = nil
	return p.err
}

// WaitHTTP polls url until it answers 200 or ctx ends.
func WaitHTTP(ctx context.Context, url string) error { return waitHTTP(ctx, http.DefaultClient, url) }

func waitHTTP(ctx context.Context, client *http.Client, url string) error {
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: %s not ready: %w (last: %s)", url, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Cluster is a set of idemnode processes (and routers) from one topology.
type Cluster struct {
	Topology     *topology.Topology
	TopologyPath string
	Dir          string
	Nodes        map[string]*Process
	Routers      map[string]*Process
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
		Nodes: map[string]*Process{}, Routers: map[string]*Process{}}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := WriteTopology(t, c.TopologyPath); err != nil {
		return nil, err
	}
	for _, n := range t.Nodes() {
		args := append([]string{"--config", c.TopologyPath, "--id", n.ID, "--data-dir", filepath.Join(dir, "data", n.ID), "--log-level", "debug"}, extraArgs...)
		c.Nodes[n.ID] = &Process{Name: n.ID, Bin: idemnode, Args: args, Log: filepath.Join(dir, n.ID+".log")}
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

// raceMarker starts every report of the race detector.
const raceMarker = "WARNING: DATA RACE"

// RaceReport returns an error quoting the first data race the process
// reported in its log (processes are built with -race when the tests run
// with it), or nil.
func (p *Process) RaceReport() error {
	data, err := os.ReadFile(p.Log)
	if err != nil {
		return nil // never started: nothing to report
	}
	i := bytes.Index(data, []byte(raceMarker))
	if i < 0 {
		return nil
	}
	report := data[i:]
	if len(report) > 4000 {
		report = report[:4000]
	}
	return fmt.Errorf("cluster: %s reported a data race (log %s):\n%s", p.Name, p.Log, report)
}

// HTTPAddr returns the JSON API address of node id.
func (c *Cluster) HTTPAddr(id string) string {
	n, _ := c.Topology.NodeByID(id)
	return n.HTTPAddr
}

// RunTests is a TestMain body for packages that start real processes: it
// builds the named commands into a temporary dir, stores their paths in
// *bins, runs the tests, removes the dir and exits with the tests' code.
//
// With -short (the fast inner loop) the package's tests are process-level:
// nothing is built and none runs; the README's full command runs them.
func RunTests(m *testing.M, bins *map[string]string, commands ...string) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("skipped: process-level tests (they start real processes) do not run with -short")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "idem-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	built, err := Build(dir, commands...)
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
