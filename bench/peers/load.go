package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idem-dev/idem/client"
)

// cell is one measurement: one system, one client count, one round.
type cell struct {
	System   string
	Clients  int
	Round    int
	Cycles   int
	Failed   int
	Elapsed  time.Duration
	P50, P99 time.Duration
	CPU      time.Duration // server CPU (user+system) of the system's processes during the cell; 0: unknown
	// ClientCPU is this process's own CPU (user+system) during the cell:
	// the clients' cost, which shares the machine with the servers; 0: unknown.
	ClientCPU time.Duration
	FirstErr  string
	Raft      map[string]float64 // idem only: raftCounters' increase during the measured window; nil: unknown
	Timeline  []timedCycle       // every measured cycle: when it ended and how long it took
}

// timedCycle is one measured cycle: when it ended, from the start of the
// measured window, and its latency.
type timedCycle struct{ End, Lat time.Duration }

func (c cell) rate() float64 {
	if c.Elapsed <= 0 {
		return 0
	}
	return float64(c.Cycles) / c.Elapsed.Seconds()
}

// Phases of a cell; workers read it before each cycle.
const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseStop
)

// runCell runs clients workers of reserve+complete cycles on fresh keys for
// warmup, then measures for duration. A cycle under way at the end finishes
// and counts.
func runCell(ctx context.Context, s *system, clients int, warmup, duration time.Duration) cell {
	var phase atomic.Int32
	type worker struct {
		lat    []time.Duration
		ends   []time.Duration // when each measured cycle ended, from the start of the window
		failed int
		first  string
	}
	ws := make([]*worker, clients)
	var start time.Time // set before the measured phase begins; workers read it only then
	var wg sync.WaitGroup
	for i := range ws {
		w := &worker{lat: make([]time.Duration, 0, 1024)}
		ws[i] = w
		wg.Go(func() {
			for ctx.Err() == nil {
				ph := phase.Load()
				if ph == phaseStop {
					return
				}
				key, owner := client.NewKey(), client.NewOwnerToken()
				t0 := time.Now()
				err := cycle(ctx, s.tgt, key, owner)
				d := time.Since(t0)
				if ph != phaseMeasure || ctx.Err() != nil {
					continue
				}
				if err != nil {
					if w.failed == 0 {
						w.first = err.Error()
					}
					w.failed++
					continue
				}
				w.lat = append(w.lat, d)
				w.ends = append(w.ends, time.Since(start))
			}
		})
	}
	sleep(ctx, warmup)
	raft0 := scrapeRaft(ctx, s.http)
	cpu0 := cpuOf(s.procs)
	self0 := selfCPU()
	start = time.Now()
	phase.Store(phaseMeasure)
	sleep(ctx, duration)
	phase.Store(phaseStop)
	wg.Wait()
	elapsed := time.Since(start)
	self1 := selfCPU()
	cpu1 := cpuOf(s.procs)
	raft1 := scrapeRaft(ctx, s.http)

	c := cell{System: s.name, Clients: clients, Elapsed: elapsed, Raft: delta(raft0, raft1)}
	if cpu0 >= 0 && cpu1 >= cpu0 {
		c.CPU = cpu1 - cpu0
	}
	if self0 >= 0 && self1 > self0 {
		c.ClientCPU = self1 - self0
	}
	var all []time.Duration
	for _, w := range ws {
		all = append(all, w.lat...)
		for i, e := range w.ends {
			c.Timeline = append(c.Timeline, timedCycle{End: e, Lat: w.lat[i]})
		}
		c.Failed += w.failed
		if c.FirstErr == "" {
			c.FirstErr = w.first
		}
	}
	c.Cycles = len(all)
	c.P50, c.P99 = percentile(all, 0.50), percentile(all, 0.99)
	return c
}

// cycle is the unit of work: reserve a fresh key, complete it.
func cycle(ctx context.Context, t target, key, owner string) error {
	won, err := t.reserve(ctx, key, owner)
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	if !won {
		return fmt.Errorf("reserve of a fresh key %s was not acquired", key)
	}
	ok, err := t.complete(ctx, key, owner)
	if err != nil {
		return fmt.Errorf("complete: %w", err)
	}
	if !ok {
		return fmt.Errorf("complete of %s by its owner was refused", key)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// percentile sorts ds and returns the nearest-rank q-quantile.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// selfCPU is this process's user+system CPU so far, or -1 if unknown.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuOf sums user+system CPU of the processes of ps and all their
// descendants (PostgreSQL's backends are children of the postmaster), or -1
// if /proc is unreadable.
func cpuOf(ps []*proc) time.Duration {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return -1
	}
	type stat struct {
		ppid int
		cpu  int64 // clock ticks
	}
	all := map[int]stat{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The fields after the command name, which may hold spaces, in "()".
		s := string(data)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		all[pid] = stat{ppid: ppid, cpu: utime + stime}
	}
	ours := map[int]bool{}
	for _, p := range ps {
		ours[p.cmd.Process.Pid] = true
	}
	var total int64
	for pid, st := range all {
		// Walk up to a root of ours (or the top); process trees are shallow.
		for q, depth := pid, 0; q > 1 && depth < 64; q, depth = all[q].ppid, depth+1 {
			if ours[q] {
				total += st.cpu
				break
			}
		}
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(total) * time.Second / ticksPerSecond
}

// raceResult is the race phase of one system.
type raceResult struct {
	System      string
	Keys        int
	Contenders  int
	OneWinner   int // keys with exactly one ACQUIRED
	Winners     map[int]int
	LoserRefuse int // complete attempts by losers that were refused (all of them should be)
	LoserTries  int
	WinnerDone  int // winners whose complete was accepted
	Errors      int
	FirstErr    string
}

func (r raceResult) ok() bool {
	return r.OneWinner == r.Keys && r.LoserRefuse == r.LoserTries && r.WinnerDone == r.Keys && r.Errors == 0
}

// runRace sends contenders concurrent reserves of one fresh key, keys times,
// then has every loser try to complete (each must be refused) and the
// winner complete (it must be accepted).
func runRace(ctx context.Context, s *system, keys, contenders int) raceResult {
	r := raceResult{System: s.name, Keys: keys, Contenders: contenders, Winners: map[int]int{}}
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if r.Errors == 0 {
			r.FirstErr = err.Error()
		}
		r.Errors++
	}
	for range keys {
		if ctx.Err() != nil {
			break
		}
		key := client.NewKey()
		owners := make([]string, contenders)
		won := make([]bool, contenders)
		for i := range owners {
			owners[i] = client.NewOwnerToken()
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range contenders {
			wg.Go(func() {
				<-start
				w, err := s.tgt.reserve(ctx, key, owners[i])
				if err != nil {
					fail(err)
				}
				won[i] = w
			})
		}
		close(start)
		wg.Wait()
		winners := 0
		for _, w := range won {
			if w {
				winners++
			}
		}
		r.Winners[winners]++
		if winners == 1 {
			r.OneWinner++
		}
		for i := range contenders {
			if won[i] {
				continue
			}
			r.LoserTries++
			ok, err := s.tgt.complete(ctx, key, owners[i])
			if err != nil {
				fail(err)
			} else if !ok {
				r.LoserRefuse++
			}
		}
		for i := range contenders {
			if !won[i] {
				continue
			}
			ok, err := s.tgt.complete(ctx, key, owners[i])
			if err != nil {
				fail(err)
			} else if ok {
				r.WinnerDone++
			}
		}
	}
	return r
}
