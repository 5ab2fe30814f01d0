// Package launch builds idem's commands and runs them as processes on
// loopback: a topology generated with free 127.0.0.1 ports (Topology,
// FreePorts, reserved across the test processes of one machine), the
// binaries built from the module (Build, with -race when the caller runs
// under the race detector), a Process that starts, signals, stops and kills
// one of them with its output in a log file (and reports a data race found
// there), and WaitHTTP for a readiness endpoint. regionsim runs its
// simulated regions with it, and internal/cluster builds the process-level
// tests' clusters on it; it imports no testing code, so a binary that links
// it links no test framework.
package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"

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
			return nil, fmt.Errorf("launch: go build ./cmd/%s: %v\n%s", name, err, b)
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
			return "", errors.New("launch: go.mod not found above the working directory")
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
	// SysProcAttr, when set, is given to the started command: e.g. a
	// group id of its own, which firewall rules can match (iptables -m
	// owner --gid-owner) to cut this process's connections alone.
	SysProcAttr *syscall.SysProcAttr

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
		select {
		case <-p.exited:
			// It exited on its own and nobody waited for it: it can
			// start again.
			p.cmd = nil
		default:
			return fmt.Errorf("launch: %s already running", p.Name)
		}
	}
	logf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = p.SysProcAttr
	if len(p.Env) > 0 {
		cmd.Env = append(os.Environ(), p.Env...)
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("launch: start %s: %w", p.Name, err)
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
		return errors.New("launch: " + p.Name + " is not running")
	}
	select {
	case <-exited:
	case <-ctx.Done():
		return fmt.Errorf("launch: %s still running: %w", p.Name, ctx.Err())
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

// WaitUntil runs probe (a readiness check that polls until it succeeds or
// its context ends) and gives up as soon as p exits (a port it could not
// bind, a bad flag) instead of polling a dead address until ctx ends.
func (p *Process) WaitUntil(ctx context.Context, probe func(context.Context) error) error {
	exited := p.exitedCh()
	if exited == nil {
		return fmt.Errorf("launch: %s is not running", p.Name)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-exited:
			p.mu.Lock()
			err := p.err
			p.mu.Unlock()
			cancel(fmt.Errorf("launch: %s exited before it was ready (%v); see %s", p.Name, err, p.Log))
		case <-ctx.Done():
		}
	}()
	err := probe(ctx)
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
		return fmt.Errorf("launch: %s did not exit within %s after %s; killed", p.Name, timeout, sig)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cmd = nil
	return p.err
}

// WaitHTTP polls url until it answers 200 or ctx ends.
func WaitHTTP(ctx context.Context, url string) error {
	return WaitHTTPClient(ctx, http.DefaultClient, url)
}

// WaitHTTPClient is WaitHTTP over client (a TLS client for a secure
// process).
func WaitHTTPClient(ctx context.Context, client *http.Client, url string) error {
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
			return fmt.Errorf("launch: %s not ready: %w (last: %s)", url, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
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
	return fmt.Errorf("launch: %s reported a data race (log %s):\n%s", p.Name, p.Log, report)
}

// LogTail is the last lines of the process's log (a panic's stack, when it
// crashed), or why the log could not be read: a run's work dir may be gone
// by the time someone reads the report.
func (p *Process) LogTail(lines int) string {
	data, err := os.ReadFile(p.Log)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	ls := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	return string(bytes.Join(ls[max(0, len(ls)-lines):], []byte("\n")))
}
