package server

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// Every function runs at once, however many are running: a Batch's
// operations block on Raft, and one waiting for a busy worker would wait
// for another operation's commit.
func TestOpWorkersNeverQueue(t *testing.T) {
	p := newOpWorkers()
	const n = 64
	var started, release sync.WaitGroup
	started.Add(n)
	release.Add(1)
	var done sync.WaitGroup
	done.Add(n)
	for range n {
		p.run(func() {
			defer done.Done()
			started.Done()
			release.Wait()
		})
	}
	waitOrFail(t, &started, "all 64 functions to start while none has returned")
	release.Done()
	waitOrFail(t, &done, "all 64 functions to return")
}

// Idle workers take later work, and exit once idle for p.idle.
func TestOpWorkersReuseAndExit(t *testing.T) {
	p := &opWorkers{work: make(chan func()), idle: 300 * time.Millisecond}
	base := runtime.NumGoroutine()
	var wg sync.WaitGroup
	wg.Add(1)
	p.run(wg.Done) // no worker is idle yet: this starts one
	wg.Wait()
	// A worker that finished goes back to waiting for work: each send
	// below is taken by the one worker, however slowly it gets there (a
	// send that no worker takes within 10 s fails the test).
	const runs = 100
	for range runs {
		wg.Add(1)
		select {
		case p.work <- wg.Done:
		case <-time.After(10 * time.Second):
			t.Fatalf("no idle worker took work within 10s after %d workers started", p.started.Load())
		}
		wg.Wait()
	}
	if n := p.started.Load(); n != 1 {
		t.Errorf("%d workers started for %d runs one after another; want the first reused", n, runs+1)
	}
	// run hands work to an idle worker instead of starting one. Whether the
	// worker is back at its receive when run sends is up to the scheduler,
	// so this only needs one run within 10 s that starts nobody.
	reused := false
	for deadline := time.Now().Add(10 * time.Second); !reused && time.Now().Before(deadline); {
		before := p.started.Load()
		wg.Add(1)
		p.run(wg.Done)
		wg.Wait()
		reused = p.started.Load() == before
		time.Sleep(time.Millisecond)
	}
	if !reused {
		t.Errorf("run started a new worker every time for 10s (%d started); want an idle one reused", p.started.Load())
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if g := runtime.NumGoroutine() - base; g > 0 {
		t.Errorf("%d workers still running long after their idle time", g)
	}
}

func waitOrFail(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}
