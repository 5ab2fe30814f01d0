package server

import (
	"sync/atomic"
	"time"
)

// opWorkers runs the operations of Batch RPCs on goroutines that outlive
// one operation. A goroutine per operation starts on a small stack and
// grows it (runtime.newstack copies the stack) as the call goes down the
// interceptors, the node and raftstore: ~4% of a node's CPU at 64 clients
// in a profile of the peer benchmark. A worker already has the stack it
// needs. Workers are started on demand, so a Batch never waits for one, and
// one that finds no work for opWorkerIdle exits.
type opWorkers struct {
	work    chan func() // unbuffered: a send succeeds only if a worker is idle
	idle    time.Duration
	started atomic.Int64 // workers started so far
}

// opWorkerIdle is how long an idle worker waits for work before it exits.
const opWorkerIdle = 10 * time.Second

func newOpWorkers() *opWorkers { return &opWorkers{work: make(chan func()), idle: opWorkerIdle} }

// run runs f on an idle worker, or on a new one if none is idle.
func (p *opWorkers) run(f func()) {
	select {
	case p.work <- f:
	default:
		p.started.Add(1)
		go p.worker(f)
	}
}

func (p *opWorkers) worker(f func()) {
	t := time.NewTimer(p.idle)
	defer t.Stop()
	for {
		f()
		t.Reset(p.idle)
		select {
		case f = <-p.work:
		case <-t.C:
			return
		}
	}
}
