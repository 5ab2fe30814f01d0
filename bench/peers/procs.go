package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one server process the benchmark started. It runs in its own
// process group, dies with the benchmark (Pdeathsig), and its output goes to
// a log file in the work directory.
type proc struct {
	name   string
	cmd    *exec.Cmd
	log    string
	stop   syscall.Signal // the signal for a clean shutdown
	exited chan struct{}
	err    error
}

// procs is every process started, for stopping them all at the end.
type procs struct {
	mu   sync.Mutex
	list []*proc
}

// start launches bin with args. cred, if set, runs it as another user
// (PostgreSQL refuses to run as root).
func (ps *procs) start(name, logPath string, cred *syscall.Credential, stop syscall.Signal, bin string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, stop: stop, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	ps.mu.Lock()
	ps.list = append(ps.list, p)
	ps.mu.Unlock()
	return p, nil
}

// alive returns an error naming the log if p has exited.
func (p *proc) alive() error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s exited (%v); see %s:\n%s", p.name, p.err, p.log, tail(p.log, 15))
	default:
		return nil
	}
}

// halt signals p's process group and waits up to timeout, then kills it.
func (p *proc) halt(timeout time.Duration) {
	pgid := -p.cmd.Process.Pid
	syscall.Kill(pgid, p.stop)
	select {
	case <-p.exited:
	case <-time.After(timeout):
		syscall.Kill(pgid, syscall.SIGKILL)
		<-p.exited
	}
	// Children left in the group (none expected) go too.
	syscall.Kill(pgid, syscall.SIGKILL)
}

// stopAll stops every process, in reverse start order, in parallel groups of
// one: clients are closed before this runs, so each stops quickly.
func (ps *procs) stopAll() {
	ps.mu.Lock()
	list := ps.list
	ps.list = nil
	ps.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range list {
		wg.Go(func() { p.halt(15 * time.Second) })
	}
	wg.Wait()
}

func tail(path string, lines int) string {
	data, _ := os.ReadFile(path)
	ls := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(ls[max(0, len(ls)-lines):], "\n")
}

// freePorts returns n distinct ports on 127.0.0.1 that were free when it
// looked, picked below the kernel's ephemeral range so that outgoing
// connections do not take them before the servers bind them.
func freePorts(n int) ([]int, error) {
	low := 32768
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		fmt.Sscan(string(data), &low)
	}
	const base = 20000
	if low-base < 20*n {
		return nil, fmt.Errorf("ephemeral port range starts at %d, leaving no room below it", low)
	}
	used := map[int]bool{}
	var out []int
	for tries := 0; len(out) < n && tries < 200*n; tries++ {
		p := base + rand.IntN(low-base)
		if used[p] {
			continue
		}
		used[p] = true
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		ln.Close()
		out = append(out, p)
	}
	if len(out) < n {
		return nil, fmt.Errorf("found only %d of %d free ports", len(out), n)
	}
	return out, nil
}

func loopback(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// poll calls check until it succeeds, p exits, or timeout passes.
func poll(ctx context.Context, timeout time.Duration, p *proc, what string, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		last = check(cctx)
		ccancel()
		if last == nil {
			return nil
		}
		if p != nil {
			if err := p.alive(); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v: %w", what, timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// The Debian packages that provide the peers, and a binary each must install.
var packages = []struct{ pkg, bin string }{
	{"redis-server", "redis-server"},
	{"postgresql", "initdb"},
	{"postgresql", "pg_basebackup"},
	{"etcd-server", "etcd"},
	{"etcd-client", "etcdctl"},
}

// postgresBin finds a PostgreSQL server binary: on PATH, or in Debian's
// versioned directory (which is not on PATH).
func postgresBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	if len(matches) == 0 {
		return "", fmt.Errorf("%s not found on PATH nor in /usr/lib/postgresql/*/bin", name)
	}
	return matches[len(matches)-1], nil
}

func lookBin(name string) (string, error) {
	if name == "initdb" || name == "postgres" || name == "pg_basebackup" {
		return postgresBin(name)
	}
	return exec.LookPath(name)
}

// ensureInstalled installs the packages of the wanted peers that are missing.
func ensureInstalled(ctx context.Context, cfg config, logf func(string, ...any)) error {
	want := map[string]bool{}
	for _, s := range cfg.Systems {
		switch s {
		case sysRedis, sysRedisWait:
			want["redis-server"] = true
		case sysPostgres, sysPostgresSyn:
			want["postgresql"] = true
		case sysEtcd:
			want["etcd-server"], want["etcd-client"] = true, true
		}
	}
	var missing []string
	for _, p := range packages {
		if _, err := lookBin(p.bin); want[p.pkg] && err != nil && !slices.Contains(missing, p.pkg) {
			missing = append(missing, p.pkg)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if !cfg.Install {
		return fmt.Errorf("missing %s (install them, or run without --install=false)", strings.Join(missing, ", "))
	}
	logf("installing %s with apt-get", strings.Join(missing, " "))
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	for _, args := range [][]string{{"update", "-qq"}, append([]string{"install", "-y", "-qq"}, missing...)} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// Debian's maintainer scripts may start the packaged services; this
	// benchmark runs its own instances and leaves those alone.
	return nil
}

// repoRoot finds the idem repository above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(data), "module github.com/idem-dev/idem\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("the idem repository (go.mod of github.com/idem-dev/idem) is not above the working directory; run from bench/peers or pass --idemnode")
		}
		dir = parent
	}
}

// buildIdemNode compiles cmd/idemnode into dir.
func buildIdemNode(ctx context.Context, dir string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "idemnode")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/idemnode")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/idemnode: %v\n%s", err, out)
	}
	return bin, nil
}
