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
	const runs = 100
	for range runs {
		wg.Add(1)
		p.run(wg.Done)
		wg.Wait()
		time.Sleep(5 * time.Millisecond) // the worker that ran it is idle again
	}
	if n := p.started.Load(); n > runs/10 {
		t.Errorf("%d workers started for %d runs one after another; want idle ones reused", n, runs)
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
