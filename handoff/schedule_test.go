package handoff

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
)

// start runs actor a's driver (afresh: a new Driver, no memory) as a
// goroutine and waits until it parks at its first step or finishes.
func (w *world) start(a *actor) {
	a.drv = NewDriver(worldCluster{w, a}, func() uint64 { return w.rng.Uint64() | 1 }, 64)
	a.state = running
	go func() {
		for {
			res, err := a.drv.Step(context.Background())
			if errors.Is(err, errCrashed) || (err == nil && res.Step.Kind == Done) {
				a.state = finished
				w.events <- event{a}
				return
			}
		}
	}()
	<-w.events
}

// resume lets a parked actor take one step (wake false: it crashes there).
func (w *world) resume(a *actor, wake bool) {
	a.state = running
	a.wake <- wake
	<-w.events
}

// option is one action the schedule may take next.
type option struct {
	name string
	do   func()
}

// run plays one schedule: the choices come from w.ch until the scope's
// steps are spent, then the meta leader finishes the change alone (no more
// faults, the clocks agreeing again) and late messages land.
func (w *world) run() {
	w.actors = make([]*actor, w.sc.drivers)
	for i := range w.actors {
		w.actors[i] = &actor{id: i, wake: make(chan bool), state: finished}
	}
	w.start(w.actors[0])
	current := 0
	for ; w.steps < w.sc.steps && len(w.failures) == 0; w.steps++ {
		opts := w.options(&current)
		if len(opts) == 0 {
			break
		}
		opts[w.ch.choose(len(opts))].do()
		w.check()
	}
	// The end: the clocks agree again, no more faults; then run2end.
	w.groups["t"].offset = 0
	w.sc.faults, w.used.faults = 0, 0
	w.run2end()
}

// run2end ends a schedule: deposed drivers stop, late messages land, the
// leader finishes the change alone; then the end checks.
func (w *world) run2end() {
	for _, a := range w.actors {
		if a.state == parked && (a.stale != nil || a.id != w.leader) {
			w.resume(a, false)
		}
	}
	for _, p := range w.pending {
		w.propose(p.g, p.cmd)
	}
	w.pending = nil
	w.check()
	lead := w.actors[w.leader]
	if lead.state == finished && len(w.meta.moved) < 3 {
		w.start(lead)
	}
	for i := 0; lead.state == parked && i < 400 && len(w.failures) == 0; i++ {
		w.resume(lead, true)
		w.check()
	}
	if lead.state != finished {
		w.fail("the meta leader did not finish the change alone")
	}
	w.finish()
}

// options lists the actions enabled now, the default first: let the
// actor that ran last go on.
func (w *world) options(current *int) []option {
	var opts []option
	runnable := func(a *actor) bool { return a.state == parked }
	order := []int{*current}
	for i := range w.actors {
		if i != *current {
			order = append(order, i)
		}
	}
	for _, i := range order {
		a := w.actors[i]
		if runnable(a) {
			opts = append(opts, option{fmt.Sprintf("run d%d", i), func() { *current = i; w.resume(a, true) }})
		}
	}
	if w.used.clients < w.sc.clients {
		opts = append(opts, option{"client", func() { w.used.clients++; w.clientOp() }})
	}
	if w.used.ticks < w.sc.ticks {
		opts = append(opts, option{"tick", func() {
			w.used.ticks++
			w.trueNow += 10 * int64(1e9)
			w.logf("time +10s")
		}})
	}
	if w.used.skews < w.sc.skews {
		opts = append(opts, option{"skew", func() {
			w.used.skews++
			w.groups["t"].offset = []int64{int64(3 * maxGap), -int64(3 * maxGap), int64(maxGap) * 4 / 5, -int64(maxGap) * 4 / 5, 0}[w.rng.IntN(5)]
			w.logf("t's clock offset %v", w.groups["t"].offset)
		}})
	}
	if len(w.pending) > 0 {
		opts = append(opts, option{"deliver", func() {
			p := w.pending[0]
			w.pending = w.pending[1:]
			r := w.propose(p.g, p.cmd)
			w.logf("late %v %v at %s (attempt %d): %v", p.cmd.Op, p.cmd.Handoff.Partitions, p.g, p.cmd.Handoff.Attempt, r.Outcome)
		}})
	}
	for _, a := range w.actors {
		if runnable(a) && w.used.crashes < w.sc.crashes {
			opts = append(opts, option{fmt.Sprintf("crash d%d", a.id), func() {
				w.used.crashes++
				w.logf("d%d crashes", a.id)
				w.resume(a, false)
				if a.id == w.leader && a.stale == nil {
					w.start(a) // it restarts with no memory
				}
			}})
		}
	}
	for _, a := range w.actors {
		if a.id != w.leader && w.used.failovers < w.sc.failovers {
			opts = append(opts, option{fmt.Sprintf("failover to d%d", a.id), func() {
				w.used.failovers++
				old := w.actors[w.leader]
				stale := w.meta.clone()
				old.stale = &stale
				w.leader, a.stale = a.id, nil
				w.logf("d%d leads the meta group; d%d is deposed", a.id, old.id)
				if a.state == finished {
					w.start(a)
				}
			}})
		}
	}
	return opts
}

// clientOp runs one client operation on a key the generator picks: a new
// owner's reserve (a retry of another attempt), the holder's heartbeat-
// free complete, or a probe of a completed key.
func (w *world) clientOp() {
	k := w.keyList[w.rng.IntN(len(w.keyList))]
	a := w.keys[k]
	switch {
	case a.owner != "" && !a.completed && w.rng.IntN(2) == 0:
		w.logf("client: %s completes %s", a.owner, k.Key)
		w.complete(k, a.owner, longLease)
	default:
		owner := fmt.Sprintf("o%d", 2+w.rng.IntN(3))
		w.logf("client: %s reserves %s", owner, k.Key)
		w.reserve(k, owner, 20*int64(1e9))
	}
}

// randomChooser walks one seeded schedule; option 0 (go on) half the time.
type randomChooser struct{ rng *rand.Rand }

func (c randomChooser) choose(n int) int {
	if n == 1 || c.rng.IntN(2) == 0 {
		return 0
	}
	return c.rng.IntN(n)
}

// dfsChooser enumerates schedules depth first: each run replays prefix and
// takes option 0 after it, recording each choice point; next moves to the
// following schedule. A schedule deviates from option 0 at most bound
// times (preemption bounding): every schedule with up to bound deviations
// is explored.
type dfsChooser struct {
	bound  int
	prefix []int
	path   []int // choices made in this run
	width  []int // options at each choice
}

func (c *dfsChooser) deviations(upto int) int {
	n := 0
	for _, v := range c.path[:upto] {
		if v != 0 {
			n++
		}
	}
	return n
}

func (c *dfsChooser) choose(n int) int {
	i := len(c.path)
	v := 0
	if i < len(c.prefix) {
		v = c.prefix[i]
	}
	c.path = append(c.path, v)
	c.width = append(c.width, n)
	return v
}

// next sets up the following schedule; false when every one was run.
func (c *dfsChooser) next() bool {
	for i := len(c.path) - 1; i >= 0; i-- {
		if c.path[i]+1 < c.width[i] && (c.path[i] != 0 || c.deviations(i) < c.bound) {
			c.prefix = append(append([]int(nil), c.path[:i]...), c.path[i]+1)
			c.path, c.width = c.path[:0], c.width[:0]
			return true
		}
	}
	return false
}

func (c *dfsChooser) String() string {
	parts := make([]string, len(c.path))
	for i, v := range c.path {
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, ",")
}
