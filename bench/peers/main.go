package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == dbNodeCmd { // a member of the dragonboat peer
		if err := runDBNode(ctx, os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "peers:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

var errRace = errors.New("the race phase found a key without exactly one winner")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	logf := func(format string, a ...any) {
		fmt.Fprintf(stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}
	if err := ensureInstalled(ctx, cfg, logf); err != nil {
		return err
	}
	dir := cfg.WorkDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "idem-peers-"); err != nil {
			return err
		}
		if !cfg.Keep {
			defer os.RemoveAll(dir)
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// What the kernel work costs on this box right now, before any server
	// runs (and again after the rounds, below): see hostCosts.
	hostBefore := hostLine(dir)
	l := &lab{cfg: cfg, dir: dir, logf: logf, maxConns: max(16, slicesMax(cfg.Concurrency)), body: responseBody(cfg.BodyBytes)}
	defer l.ps.stopAll() // on success, failure and Ctrl-C alike
	l.idemnode = cfg.IdemNode
	if l.idemnode == "" && hasIdem(cfg.Systems) {
		logf("building idemnode")
		if l.idemnode, err = buildIdemNode(ctx, dir); err != nil {
			return err
		}
	}
	systems, err := l.startAll(ctx)
	if err != nil {
		return fmt.Errorf("%w (logs in %s; --keep keeps them)", err, dir)
	}
	defer func() {
		for _, s := range systems {
			s.tgt.close()
		}
	}()

	fmt.Fprintf(stdout, "peers: %d rounds x clients %v x %d systems, %v measured (+%v warmup) per cell, %d-byte responses; %d CPUs, %s/%s, load %s\n",
		cfg.Rounds, cfg.Concurrency, len(systems), cfg.Duration, cfg.Warmup, cfg.BodyBytes, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, loadAvg())
	for _, s := range systems {
		fmt.Fprintf(stdout, "  %-14s %s\n", s.name, s.detail)
	}
	fmt.Fprintln(stdout, "All on 127.0.0.1; clients and servers share this machine's CPUs. server CPU/cycle: user+system time of the system's own processes per cycle; client CPU/cycle: this process's (the clients').")
	fmt.Fprintf(stdout, "Host before the rounds: %s\n", hostBefore)

	var cells []cell
	for round := range cfg.Rounds {
		for _, clients := range cfg.Concurrency {
			// Rotate the order each round, so no system always runs first
			// (or right after the heaviest one).
			for i := range systems {
				s := systems[(i+round)%len(systems)]
				if ctx.Err() != nil {
					return ctx.Err()
				}
				for _, p := range s.procs {
					if err := p.alive(); err != nil {
						return err
					}
				}
				var prof *profiler
				if cfg.ProfileDir != "" && round == 0 && s.name == cfg.ProfileSystem && clients == cfg.ProfileClients {
					prof = startProfiles(ctx, cfg, s, logf)
				}
				c := runCell(ctx, s, clients, cfg.Warmup, cfg.Duration)
				c.Round = round
				if ctx.Err() != nil { // interrupted: the cell measured nothing whole
					return ctx.Err()
				}
				if prof != nil {
					if err := prof.finish(c); err != nil {
						return err
					}
				}
				if cfg.TimelineDir != "" {
					if _, err := saveTimeline(cfg.TimelineDir, c); err != nil {
						return err
					}
				}
				c.Timeline = nil // only the file needs it; a full run would keep millions of them
				logf("round %d  %-14s c=%-4d %8.0f cycles/s  p50 %s ms  p99 %s ms  failed %d %s", round+1, s.name, clients, c.rate(), fmtMs(c.P50), fmtMs(c.P99), c.Failed, c.FirstErr)
				if r := raftPerCycle(c.Raft, c.Cycles); r != "" {
					logf("         %s", r)
				}
				cells = append(cells, c)
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	names := make([]string, len(systems))
	for i, s := range systems {
		names[i] = s.name
	}
	fmt.Fprintf(stdout, "Host after the rounds: %s\n", hostLine(dir))
	fmt.Fprintln(stdout)
	writeTable(stdout, rows(cells, names, cfg.Concurrency), cfg.Rounds)
	writeAB(stdout, cells, names, cfg.Concurrency)
	writeTraceSink(stdout, l.sink)

	writePacking(ctx, stdout, systems)

	var races []raceResult
	if cfg.RaceKeys > 0 {
		for _, s := range systems {
			races = append(races, runRace(ctx, s, cfg.RaceKeys, cfg.RaceContenders))
		}
		fmt.Fprintln(stdout)
		if !writeRace(stdout, races) {
			return errRace
		}
	}
	return nil
}

func hasIdem(systems []string) bool {
	for _, s := range systems {
		if isIdem(s) {
			return true
		}
	}
	return false
}

// hostLine measures hostCosts with the synced appends in dir; a failed
// measurement is reported in the line, not fatal to the run.
func hostLine(dir string) string {
	h, err := measureHost(dir, defaultHostLimits)
	if err != nil {
		return "not measured: " + err.Error()
	}
	return h.String()
}

func slicesMax(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(data))[:3], " ")
}

// profiler fetches CPU and allocation profiles of every idem node of s
// while a cell runs.
type profiler struct {
	dir   string
	wg    sync.WaitGroup
	mu    sync.Mutex
	errs  []error
	secs  int
	nodes []string
}

func startProfiles(ctx context.Context, cfg config, s *system, logf func(string, ...any)) *profiler {
	p := &profiler{dir: cfg.ProfileDir, secs: max(1, int((cfg.Warmup+cfg.Duration)/time.Second)-1), nodes: s.pprof}
	logf("profiling %d idem nodes for %ds", len(s.pprof), p.secs)
	os.MkdirAll(p.dir, 0o755)
	for i, addr := range s.pprof {
		path := func(kind string) string { return filepath.Join(p.dir, fmt.Sprintf("node%d-%s.pprof", i+1, kind)) }
		p.wg.Go(func() {
			p.record(fetchTo(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, p.secs), path("cpu")))
		})
		// Allocations: the heap profile, after a forced collection, at the
		// start and at the end of the window; read the difference with
		// pprof's -base. allocs?seconds=N does not force one, and the
		// runtime publishes allocation samples only when a collection
		// ends: a node whose heap headroom outlasts the window (a region's
		// node at a few thousand cycles/s) gave an empty profile.
		p.wg.Go(func() {
			url := fmt.Sprintf("http://%s/debug/pprof/heap?gc=1", addr)
			if err := fetchTo(ctx, url, path("allocs-base")); err != nil {
				p.record(err)
				return
			}
			select {
			case <-time.After(time.Duration(p.secs) * time.Second):
			case <-ctx.Done():
				p.record(ctx.Err())
				return
			}
			p.record(fetchTo(ctx, url, path("allocs")))
		})
	}
	return p
}

func (p *profiler) record(err error) {
	if err == nil {
		return
	}
	p.mu.Lock()
	p.errs = append(p.errs, err)
	p.mu.Unlock()
}

// finish waits for the profiles and writes what the cell did next to them,
// so per-cycle costs can be read off.
func (p *profiler) finish(c cell) error {
	p.wg.Wait()
	if err := errors.Join(p.errs...); err != nil {
		return fmt.Errorf("profiling: %w", err)
	}
	note := fmt.Sprintf("system %s, clients %d: %d cycles in %.2fs measured (%.0f cycles/s); profiles cover %ds of warmup+measure, i.e. about %.0f cycles\n"+
		"allocations in that window: go tool pprof -sample_index=alloc_space -base nodeN-allocs-base.pprof nodeN-allocs.pprof\n",
		c.System, c.Clients, c.Cycles, c.Elapsed.Seconds(), c.rate(), p.secs, c.rate()*float64(p.secs))
	return os.WriteFile(filepath.Join(p.dir, "cell.txt"), []byte(note), 0o644)
}

func fetchTo(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return fmt.Errorf("%s: %s %s", url, resp.Status, body)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writePacking prints, for each idem cluster running with
// --raft-pack-commands=on, how many commands its proposal buffers packed per
// Raft entry over the whole run (idem_raft_proposal_entry_commands, summed
// over nodes and shards).
func writePacking(ctx context.Context, w io.Writer, systems []*system) {
	seen := map[string]bool{}
	for _, s := range systems {
		if base, _ := twinOf(s.variant); !strings.HasSuffix(base, "pack") || seen[s.variant] {
			continue
		}
		seen[s.variant] = true
		var cmds, entries float64
		for _, addr := range s.http {
			sum, count, err := scrapePacking(ctx, addr)
			if err != nil {
				fmt.Fprintf(w, "%s: /metrics of %s: %v\n", s.variant, addr, err)
				continue
			}
			cmds, entries = cmds+sum, entries+count
		}
		if entries > 0 {
			if len(seen) == 1 {
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "%s: %.0f commands in %.0f Raft entries through the proposal buffer, %.2f per entry\n", s.variant, cmds, entries, cmds/entries)
		}
	}
}

// scrapePacking reads idem_raft_proposal_entry_commands' sum and count,
// over all shards, from a node's /metrics.
func scrapePacking(ctx context.Context, addr string) (sum, count float64, err error) {
	text, err := fetchMetrics(ctx, addr)
	if err != nil {
		return 0, 0, err
	}
	return parsePacking(text)
}

func parsePacking(text string) (sum, count float64, err error) {
	m, err := sumMetrics(text, []string{"idem_raft_proposal_entry_commands_sum", "idem_raft_proposal_entry_commands_count"})
	if err != nil {
		return 0, 0, err
	}
	return m["idem_raft_proposal_entry_commands_sum"], m["idem_raft_proposal_entry_commands_count"], nil
}
