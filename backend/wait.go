package backend

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
)

// MaxWait is the longest a reserve may wait for an in-flight key (the
// contract's wait_ms bound, 30000).
const MaxWait = contract.MaxWait

// Waiters holds the reserves waiting on this process for keys to stop being
// in progress. The apply loop calls Settled with every applied command; a
// command that may end a key's in-progress state (complete, release,
// force-release, delete) wakes that key's waiters. Waiting costs nothing
// while nothing happens: no polling, one channel per waiter. The zero value
// is ready to use.
type Waiters struct {
	mu      sync.Mutex
	m       map[fsm.RecordKey][]chan struct{}
	waiting atomic.Int64
	woken   atomic.Uint64
}

// WaiterStats are the figures of a Waiters.
type WaiterStats struct {
	// Waiting is how many reserves wait now.
	Waiting int64
	// Woken counts waiters woken by an apply (not by a timer).
	Woken uint64
}

// Stats returns the current figures.
func (w *Waiters) Stats() WaiterStats {
	return WaiterStats{Waiting: w.waiting.Load(), Woken: w.woken.Load()}
}

func (w *Waiters) subscribe(k fsm.RecordKey) chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	if w.m == nil {
		w.m = map[fsm.RecordKey][]chan struct{}{}
	}
	w.m[k] = append(w.m[k], ch)
	w.mu.Unlock()
	return ch
}

func (w *Waiters) unsubscribe(k fsm.RecordKey, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	chans := w.m[k]
	for i, c := range chans {
		if c == ch {
			chans = append(chans[:i], chans[i+1:]...)
			break
		}
	}
	if len(chans) == 0 {
		delete(w.m, k)
	} else {
		w.m[k] = chans
	}
}

// Settled is called with every command applied and its result: a command
// that may have ended the key's in-progress state wakes its waiters. Cheap
// when nobody waits (one map lookup under a mutex).
func (w *Waiters) Settled(cmd *fsm.Command, res fsm.Result) {
	if !settles(cmd, res) {
		return
	}
	k := fsm.RecordKey{Namespace: cmd.Namespace, Key: cmd.Key}
	w.mu.Lock()
	chans := w.m[k]
	delete(w.m, k)
	w.mu.Unlock()
	for _, ch := range chans {
		close(ch)
	}
	w.woken.Add(uint64(len(chans)))
}

func settles(cmd *fsm.Command, res fsm.Result) bool {
	switch cmd.Op {
	case fsm.OpComplete, fsm.OpRelease, fsm.OpForceRelease, fsm.OpDelete:
		return res.Outcome == fsm.OutcomeOK
	}
	return false
}

type chargeKey struct{}

// WithCharge returns ctx carrying charge, which Waiters.Reserve calls
// before each proposal after its first: a waiting reserve that wakes up and
// proposes again is one more request of its caller, charged to the
// caller's rate (the authorizer sets it; the first proposal was charged
// when the request was let in). charge returns nil, or the error (an
// *Error with RESOURCE_EXHAUSTED and a retry hint) that ends the wait.
func WithCharge(ctx context.Context, charge func() error) context.Context {
	return context.WithValue(ctx, chargeKey{}, charge)
}

// chargeOf returns the charge of ctx, or nil.
func chargeOf(ctx context.Context) func() error {
	charge, _ := ctx.Value(chargeKey{}).(func() error)
	return charge
}

// Reserve runs the reserve cmd through propose and, while the answer is
// IN_PROGRESS and cmd.Wait has not passed, waits for the key's in-progress
// state to end (a Settled apply) or for the moment it could be reclaimed
// (its lease end plus skewMargin, by now), then proposes it again. The
// waiter is registered before each proposal, so an apply between the
// answer and the wait is not missed. Each proposal after the first is
// charged first (WithCharge); a refused charge ends the wait with its
// error. It returns the last answer: after cmd.Wait (or when ctx ends) an
// IN_PROGRESS one. A propose error ends the wait; remaining is then the
// wait left, for a caller that forwards.
func (w *Waiters) Reserve(ctx context.Context, cmd *fsm.Command, skewMargin time.Duration, now func() int64,
	propose func(ctx context.Context, cmd *fsm.Command) (fsm.Result, error)) (res fsm.Result, remaining time.Duration, err error) {
	deadline := time.Now().Add(time.Duration(cmd.Wait))
	k := fsm.RecordKey{Namespace: cmd.Namespace, Key: cmd.Key}
	charge := chargeOf(ctx)
	for first := true; ; first = false {
		if !first && charge != nil {
			if err := charge(); err != nil {
				return fsm.Result{}, max(time.Until(deadline), 0), err
			}
		}
		var ch chan struct{}
		if cmd.Wait > 0 {
			ch = w.subscribe(k)
		}
		res, err = propose(ctx, cmd)
		left := time.Until(deadline)
		if err != nil || res.Outcome != fsm.OutcomeInProgress || left <= 0 || ctx.Err() != nil {
			if ch != nil {
				w.unsubscribe(k, ch)
			}
			return res, max(left, 0), err
		}
		untilReclaim := time.Duration(res.LeaseExpiresAt + int64(skewMargin) - now())
		timer := time.NewTimer(min(left, max(untilReclaim, time.Millisecond)))
		w.waiting.Add(1)
		select {
		case <-ch:
		case <-timer.C:
		case <-ctx.Done():
		}
		w.waiting.Add(-1)
		timer.Stop()
		w.unsubscribe(k, ch)
		if ctx.Err() != nil {
			return res, 0, nil
		}
	}
}
