package main

import (
	"context"
	"crypto/tls"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/client"
)

// benchConfig is what one run does; it is printed with the figures.
type benchConfig struct {
	Target         string        `json:"target"`
	Addrs          []string      `json:"addrs"`
	Namespace      string        `json:"namespace"`
	Concurrency    int           `json:"concurrency"`
	Duration       time.Duration `json:"duration_ns"`
	Cycles         int           `json:"cycles"`
	BodyBytes      int           `json:"body_bytes"`
	Warmup         time.Duration `json:"warmup_ns"`
	Lease          time.Duration `json:"lease_ns"`
	RequestTimeout time.Duration `json:"request_timeout_ns"`
	MaxAttempts    int           `json:"max_attempts"`
	// TLS is set with --certs-dir (a secure cluster); Secure reports it.
	TLS    *tls.Config `json:"-"`
	Secure bool        `json:"tls"`
	JSON   bool        `json:"-"`
}

// defaultBenchConfig is a run's configuration before flags: the flags'
// defaults.
func defaultBenchConfig() benchConfig {
	return benchConfig{
		Target:         "json",
		Namespace:      "bench",
		Concurrency:    16,
		Duration:       10 * time.Second,
		BodyBytes:      512,
		RequestTimeout: 10 * time.Second,
		MaxAttempts:    1,
	}
}

// target is one API under load. Both methods are called concurrently.
type target interface {
	// reserve reserves key and returns the owner token to complete it with.
	reserve(ctx context.Context, key string) (ownerToken string, err error)
	complete(ctx context.Context, key, ownerToken string) error
	Close() error
}

// stepError is a failed step, classified for the error counts.
type stepError struct {
	kind string // short and stable: "unavailable", "not_owner", "http_502", ...
	err  error
}

func (e *stepError) Error() string { return e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

// workerStats is one worker's record; nothing is shared while running.
type workerStats struct {
	cycle, reserve, complete []time.Duration
	failed                   int
	errors                   map[string]int
	firstError               map[string]string
}

func (w *workerStats) fail(step string, err error) {
	w.failed++
	kind := "other"
	if se, ok := err.(*stepError); ok {
		kind = se.kind
	}
	k := step + ":" + kind
	if w.errors[k] == 0 {
		w.firstError[k] = err.Error()
	}
	w.errors[k]++
}

// Phases of a run; workers read the phase at the start of each cycle.
const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseStop
)

// runBench runs the load and returns the figures. It stops by itself: at the
// end of the duration, after the cycles, or when ctx ends. A cycle under way
// at the end of the duration finishes and counts, so no request is cut short
// into a spurious error.
func runBench(ctx context.Context, cfg benchConfig, tgt target) *report {
	var phase atomic.Int32
	var remaining atomic.Int64 // measured cycles still to start, when --cycles
	remaining.Store(int64(cfg.Cycles))

	start := time.Now()
	if cfg.Warmup == 0 {
		phase.Store(phaseMeasure)
	}

	perWorker := preallocate(cfg)
	stats := make([]*workerStats, cfg.Concurrency)
	var wg sync.WaitGroup
	for i := range stats {
		w := &workerStats{
			cycle:      make([]time.Duration, 0, perWorker),
			reserve:    make([]time.Duration, 0, perWorker),
			complete:   make([]time.Duration, 0, perWorker),
			errors:     make(map[string]int),
			firstError: make(map[string]string),
		}
		stats[i] = w
		wg.Go(func() { worker(ctx, cfg, tgt, w, &phase, &remaining) })
	}

	allDone := make(chan struct{})
	go func() { wg.Wait(); close(allDone) }()

	stopped := "duration"
	wait := func(d time.Duration) bool { // false: the run ended first
		var timeout <-chan time.Time // nil: wait for the workers only
		if d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-timeout:
			return true
		case <-allDone:
			if done(ctx) { // the workers saw the context end first
				stopped = "interrupted"
			}
			return false
		case <-ctx.Done():
			stopped = "interrupted"
			phase.Store(phaseStop)
			<-allDone
			return false
		}
	}
	if cfg.Warmup > 0 && !wait(cfg.Warmup) {
		// Interrupted during warmup: nothing was measured.
		return newReport(cfg, stats, 0, stopped)
	}
	if cfg.Warmup > 0 {
		start = time.Now()
		phase.Store(phaseMeasure)
	}
	if wait(cfg.Duration) {
		phase.Store(phaseStop)
		<-allDone
	} else if stopped != "interrupted" {
		stopped = "cycles"
	}
	return newReport(cfg, stats, time.Since(start), stopped)
}

// preallocate sizes each worker's latency slices for the whole run, so the
// hot loop does not grow them (they still grow if the guess is low).
func preallocate(cfg benchConfig) int {
	if cfg.Cycles > 0 {
		return cfg.Cycles/cfg.Concurrency + 1
	}
	// Assume up to 20k cycles/s in all, and cap what one worker reserves.
	return min(int(cfg.Duration.Seconds()*20000)/cfg.Concurrency+1, 1<<20)
}

func worker(ctx context.Context, cfg benchConfig, tgt target, w *workerStats, phase *atomic.Int32, remaining *atomic.Int64) {
	for !done(ctx) {
		measured := false
		switch phase.Load() {
		case phaseStop:
			return
		case phaseMeasure:
			if cfg.Cycles > 0 && remaining.Add(-1) < 0 {
				return
			}
			measured = true
		}
		key := client.NewKey()
		t0 := time.Now()
		owner, err := tgt.reserve(ctx, key)
		t1 := time.Now()
		if err != nil {
			if measured && !done(ctx) {
				w.fail("reserve", err)
			}
			continue
		}
		err = tgt.complete(ctx, key, owner)
		t2 := time.Now()
		if !measured || done(ctx) {
			continue
		}
		if err != nil {
			w.fail("complete", err)
			continue
		}
		w.cycle = append(w.cycle, t2.Sub(t0))
		w.reserve = append(w.reserve, t1.Sub(t0))
		w.complete = append(w.complete, t2.Sub(t1))
	}
}

// done reports whether ctx ended. A passed deadline counts even before the
// context's timer fires: requests fail on it a moment earlier, and those
// failures are the run ending, not errors of the store.
func done(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}
