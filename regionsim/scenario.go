package regionsim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/idem-dev/idem/regionsim/wan"
)

// mix is what the workload does in one phase: how requests are sent and how
// the API-server instances handling them misbehave. Probabilities are per
// new payment (Burst, Redeliver, Get), per retry (CrossRetry) or per attempt
// (the instance behaviours).
type mix struct {
	Burst             float64 // a payment is a burst of identical concurrent requests
	CrossRetry        float64 // a retry goes through another region's router
	CrashAfterReserve float64 // the instance dies after reserving (SIGKILL of a worker holding a lease)
	CrashAfterCharge  float64 // ... after charging, before completing
	Stall             float64 // the instance pauses past its lease before charging (a GC pause)
	Slow              float64 // the instance heartbeats, then its charge takes most of the lease
	Decline           float64 // the provider declines transiently; the instance releases the key
	Redeliver         float64 // the queue redelivers the processed event to another consumer
	Get               float64 // the client reads the key back after success
	AttemptTimeout    time.Duration
}

// baseMix is the background workload every phase of every scenario has.
func baseMix(cfg Config) mix {
	return mix{CrossRetry: 0.3, Slow: 0.03, Decline: 0.03, Get: 0.15, AttemptTimeout: cfg.AttemptTimeout}
}

// Fault is one fault of a scenario's schedule.
type Fault struct {
	// Name says what the fault does, e.g. "SIGKILL the busiest leader".
	Name string
	// At is when it starts, from the scenario's start; For how long it
	// lasts (its window in the report).
	At, For time.Duration
	// Detail is filled in when it starts: which node, which region.
	Detail string

	start func(ctx context.Context, e *faultEnv) (string, error)
	stop  func(ctx context.Context, e *faultEnv) error
	mix   func(m *mix) // the workload while the fault is active
}

// faultEnv is what faults act on.
type faultEnv struct {
	c   *simCluster
	rng *rand.Rand
	// nodes a fault's start stopped or cut off, for its stop to restore
	nodes []string
}

// Scenario is one failure mode regionsim demonstrates.
type Scenario struct {
	// Name is what --scenario takes.
	Name string
	// FailureMode is the failure mode it targets, in a few words.
	FailureMode string
	// Description says what it does (docs/regionsim.md and the report).
	Description string
	// plan builds the fault schedule for a scenario that generates load for
	// d, drawing every choice from rng.
	plan func(cfg Config, d time.Duration, rng *rand.Rand) []*Fault
}

// Scenarios returns every scenario, in the order "all" runs them.
func Scenarios() []*Scenario {
	return []*Scenario{
		{
			Name:        "race",
			FailureMode: "duplicate concurrent requests",
			Description: "Bursts of 4-8 identical requests (same key, same body) sent at once through the routers of every region, as a double-clicked button or an over-eager retry layer does. Exactly one may charge; all must get the same response.",
			plan: func(cfg Config, d time.Duration, rng *rand.Rand) []*Fault {
				return []*Fault{{Name: "bursts of identical concurrent requests", At: d / 4, For: d / 2,
					mix: func(m *mix) { m.Burst = 0.5 }}}
			},
		},
		{
			Name:        "crash-mid-request",
			FailureMode: "process crash while holding a lease",
			Description: "SIGKILL of storage nodes under load (the one hosting the naive lock server, then the busiest Raft leader), restarted on their data dirs, while API-server instances die after reserving or after charging but before completing. Retries must find the charge, not make a second one.",
			plan: func(cfg Config, d time.Duration, rng *rand.Rand) []*Fault {
				crashes := func(m *mix) { m.CrashAfterReserve, m.CrashAfterCharge = 0.08, 0.08 }
				down := max(d/5, 2*time.Second)
				return []*Fault{
					{Name: "workers die holding leases", At: d / 4, For: d / 2, mix: crashes},
					killNode("SIGKILL the naive lock server's node", d/4, down, func(e *faultEnv) string { return e.c.naiveHostOrFirst() }),
					killNode("SIGKILL the busiest leader", d/2, down, func(e *faultEnv) string {
						id, _ := e.c.busiestLeader(context.Background(), e.c.running())
						return id
					}),
				}
			},
		},
		{
			Name:        "clock-skew",
			FailureMode: "clocks that disagree",
			Description: "Two nodes restarted with their clocks shifted by seconds in opposite directions (beyond the clock-skew margin) and made Raft leaders of their shards; leadership then moves back and forth between them and normal clocks, so a lease stamped under one clock is judged by another and can end early in real time. Slow workers renew their lease and then make a charge that takes most of it, which is safe with honest clocks; bursts race for the same keys. Fencing must keep the ledger clean.",
			plan: func(cfg Config, d time.Duration, rng *rand.Rand) []*Fault {
				skew := time.Duration(2000+rng.IntN(2001)) * time.Millisecond
				if rng.IntN(2) == 0 {
					skew = -skew
				}
				// No worker pauses here: every extra charge a guard-less ledger
				// takes in this scenario is the clocks' doing.
				work := func(m *mix) { m.Slow, m.Burst = 0.4, 0.4 }
				// Long enough for a few hand-overs to the fast clock.
				end := d/4 + max(d/2, min(18*time.Second, 3*d))
				return []*Fault{
					skewNode(fmt.Sprintf("clock %+.1fs on a leader", skew.Seconds()), d/4, end-d/4, skew, work, func(e *faultEnv) string {
						return e.c.naiveHostOrFirst()
					}),
					skewNode(fmt.Sprintf("clock %+.1fs on a leader in another region", -skew.Seconds()), d/4+d/8, end-d/4-d/8, -skew, work, func(e *faultEnv) string {
						others := slices.DeleteFunc(e.c.nodesIn(e.c.regions[len(e.c.regions)-1]), func(id string) bool { return id == e.c.naiveHostOrFirst() })
						if len(others) == 0 {
							return e.c.naiveHostOrFirst()
						}
						return others[e.rng.IntN(len(others))]
					}),
					flipLeaders("leadership moves between skewed and normal clocks", d/4+d/8+time.Second, end-d/4-d/8-2*time.Second),
					// The contract's case: one node hours off, with the
					// --max-clock-offset check on. It must lead nothing and
					// its clock must never reach the state.
					hoursOffNode("clock +3h on a node (max-clock-offset on)", end, max(d/4, 10*time.Second), 3*time.Hour),
				}
			},
		},
		{
			Name:        "cross-region-retry",
			FailureMode: "lost answers and retries elsewhere",
			Description: "Clients time out after 250 ms (shorter than a far region's round trip), so answers are lost after the store applied the request, and retry through another region's router with a new API-server instance; then one WAN direction blackholes answers only (an asymmetric cut) for a while.",
			plan: func(cfg Config, d time.Duration, rng *rand.Rand) []*Fault {
				regions := regionNames(cfg.Regions)
				tight := func(m *mix) { m.AttemptTimeout, m.CrossRetry = 250*time.Millisecond, 0.9 }
				faults := []*Fault{{Name: "client timeouts of 250 ms, retries through other regions", At: d / 4, For: d / 2, mix: tight}}
				if len(regions) > 1 {
					i := rng.IntN(len(regions))
					j := (i + 1 + rng.IntN(len(regions)-1)) % len(regions)
					faults = append(faults, cutLink(fmt.Sprintf("%s->%s blackholed, %s->%s open (asymmetric): %s's calls into %s lose their answers", regions[j], regions[i], regions[i], regions[j], regions[i], regions[j]),
						d/2, max(d/5, 2*time.Second), regions[j], regions[i], wan.Blackhole))
				}
				return faults
			},
		},
		{
			Name:        "region-partition",
			FailureMode: "a region cut off",
			Description: "One region cut off from all others (refusing connections or, the nasty case, silently swallowing traffic), then an asymmetric cut where one region's traffic to another is blackholed while the reverse direction flows. Keys homed in the isolated region stay writable only from inside it; nothing acknowledged may be lost or doubled.",
			plan: func(cfg Config, d time.Duration, rng *rand.Rand) []*Fault {
				regions := regionNames(cfg.Regions)
				if len(regions) < 2 {
					return []*Fault{{Name: "no WAN to partition (one region)", At: d / 4, For: d / 2}}
				}
				mode := wan.Blackhole
				if rng.IntN(2) == 0 {
					mode = wan.Refuse
				}
				victim := regions[rng.IntN(len(regions))]
				i := rng.IntN(len(regions))
				j := (i + 1 + rng.IntN(len(regions)-1)) % len(regions)
				return []*Fault{
					isolateRegion(fmt.Sprintf("%s isolated (%s)", victim, mode), d/4, max(3*d/10, 3*time.Second), victim, mode),
					cutLink(fmt.Sprintf("%s->%s blackholed, %s->%s open (asymmetric)", regions[i], regions[j], regions[j], regions[i]),
						d/4+max(3*d/10, 3*time.Second)+d/20, max(d/6, 2*time.Second), regions[i], regions[j], wan.Blackhole),
				}
			},
		},
		{
			Name:        "stall-past-lease",
			FailureMode: "a process paused past its lease",
			Description: "The busiest Raft leader (other than the node hosting the naive lock server) is frozen with SIGSTOP for longer than its lease and election timeout, then resumed (SIGCONT), while API-server instances pause like a long GC between checking the ledger and charging, past their lease, and then write with their stale fencing token.",
			plan: func(cfg Config, d time.Duration, rng *rand.Rand) []*Fault {
				stallFor := cfg.Lease + cfg.ClockSkewMargin + 2*time.Second
				return []*Fault{
					{Name: "workers pause past their lease (GC)", At: d / 4, For: d / 2, mix: func(m *mix) { m.Stall = 0.12 }},
					// Not the naive lock server's node: a frozen lock server makes the
					// naive system unavailable, which would hide what the worker pauses
					// do to it.
					pauseNode("SIGSTOP the busiest leader", d/3, stallFor, func(e *faultEnv) string {
						id, _ := e.c.busiestLeader(context.Background(), slices.DeleteFunc(e.c.running(), func(id string) bool { return id == e.c.naiveHost }))
						return id
					}),
				}
			},
		},
		{
			Name:        "consumer-redelivery",
			FailureMode: "at-least-once delivery",
			Description: "Payments arrive as queue events; the queue redelivers events that were already processed (to consumers in any region) and events whose consumer died after charging. Consumers deduplicate through idem: every redelivery must replay, never charge.",
			plan: func(cfg Config, d time.Duration, rng *rand.Rand) []*Fault {
				return []*Fault{{Name: "queue redelivers processed events", At: d / 4, For: d / 2,
					mix: func(m *mix) { m.Redeliver, m.CrashAfterCharge = 0.6, 0.05 }}}
			},
		},
		{
			Name:        "reconfigure",
			FailureMode: "the cluster changes shape under load",
			Description: "Four topology versions applied online while payments run. A node joins one region (the new voter joins its shards as a learner, catches up, is promoted); shards_per_region grows by one and then a region of new nodes is added, so ring partitions move between shards (frozen at the source, copied, opened at the destination), and during each move, once the first partitions moved, a node is SIGKILLed (a shard leader, then the meta leader driving the change) and restarted 2 s later while the link between the meta leader's region and another is cut both ways for 3 s; once another batch moved, the meta leader driving the change is partitioned (its region cut from every other for 6 s, refused or blackholed): it loses meta leadership while it still reaches its own region's shards, and its successor resumes the same batch; finally another node of the first region leaves. Every promise must hold across the four changes.",
			plan: func(cfg Config, d time.Duration, rng *rand.Rand) []*Fault {
				regions := regionNames(cfg.Regions)
				// The changes take as long as they take (the load runs on
				// until they are done); the plan only orders them: join,
				// grow, add a region, leave.
				w := max(d/2, 3*time.Second)
				return []*Fault{
					reconfigure(d/4, w, regions[rng.IntN(len(regions))]),
					growShards(d/4+w/4, w/4, cfg.ShardsPerRegion+1),
					addRegion(d/4+w/2+w/8, w/4),
				}
			},
		},
		{
			Name:        "leader-kill",
			FailureMode: "leader crash",
			Description: "SIGKILL of the node leading the most shards, three times in a row, each restarted after a few seconds. Elections must not lose acknowledged completions or hand a key to two owners.",
			plan: func(cfg Config, d time.Duration, rng *rand.Rand) []*Fault {
				down := max(d/10, 2*time.Second)
				var faults []*Fault
				for i, at := range []time.Duration{d / 4, d/4 + d/6, d/4 + d/3} {
					faults = append(faults, killNode(fmt.Sprintf("SIGKILL the busiest leader (%d/3)", i+1), at, down, func(e *faultEnv) string {
						id, _ := e.c.busiestLeader(context.Background(), e.c.running())
						return id
					}))
				}
				return faults
			},
		},
	}
}

// ScenarioNames returns the names of every scenario.
func ScenarioNames() []string {
	var out []string
	for _, s := range Scenarios() {
		out = append(out, s.Name)
	}
	return out
}

func killNode(name string, at, down time.Duration, pick func(*faultEnv) string) *Fault {
	return &Fault{Name: name, At: at, For: down,
		start: func(ctx context.Context, e *faultEnv) (string, error) {
			id := pick(e)
			if id == "" {
				return "no running node", nil
			}
			e.nodes = []string{id}
			e.c.kill(id)
			return "killed " + id, nil
		},
		stop: func(ctx context.Context, e *faultEnv) error {
			for _, id := range e.nodes {
				if err := e.c.start(id); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

func pauseNode(name string, at, d time.Duration, pick func(*faultEnv) string) *Fault {
	return &Fault{Name: name, At: at, For: d,
		start: func(ctx context.Context, e *faultEnv) (string, error) {
			id := pick(e)
			if id == "" {
				return "no running node", nil
			}
			e.nodes = []string{id}
			return "stopped " + id, e.c.pause(id)
		},
		stop: func(ctx context.Context, e *faultEnv) error {
			for _, id := range e.nodes {
				if err := e.c.resume(id); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

func skewNode(name string, at, d, skew time.Duration, work func(*mix), pick func(*faultEnv) string) *Fault {
	return &Fault{Name: name, At: at, For: d, mix: work,
		start: func(ctx context.Context, e *faultEnv) (string, error) {
			id := pick(e)
			e.nodes = []string{id}
			if err := e.c.restartWithOffset(id, skew, false); err != nil {
				return "", err
			}
			// Wait for it to rejoin, then make it lead what it hosts.
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := e.c.waitReady(rctx, 30*time.Second); err != nil {
				return fmt.Sprintf("%s restarted with clock %+v, not ready: %v", id, skew, err), nil
			}
			led := e.c.transferLeadership(ctx, id)
			return fmt.Sprintf("%s restarted with clock %+.1fs, leads %d shards", id, skew.Seconds(), led), nil
		},
		stop: func(ctx context.Context, e *faultEnv) error {
			for _, id := range e.nodes {
				if err := e.c.restartWithOffset(id, 0, false); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// hoursOffNode restarts one node with its clock skew ahead and the clock
// check on: the node must report not ready and lead no shard, even when a
// leadership is handed to it (it hands it back); the checkers then show
// that no record expired early.
func hoursOffNode(name string, at, d, skew time.Duration) *Fault {
	return &Fault{Name: name, At: at, For: d,
		start: func(ctx context.Context, e *faultEnv) (string, error) {
			id := e.c.naiveHostOrFirst()
			e.nodes = []string{id}
			if err := e.c.restartWithOffset(id, skew, true); err != nil {
				return "", err
			}
			// Once its Raft port is up, hand it every shard it hosts (a
			// transfer needs it caught up, so try a few times), then see
			// that it gives them all back.
			n := e.c.node(id)
			deadline := time.Now().Add(20 * time.Second)
			for range 3 {
				if !sleepOrStop(ctx, nil, 2*time.Second) {
					break
				}
				e.c.transferLeadership(ctx, id)
			}
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if e.c.leaderCount(ctx, id) == 0 {
					return fmt.Sprintf("%s restarted %s ahead with the check on: it handed back every leadership (log %s)", id, skew, n.proc.Log), nil
				}
				if !sleepOrStop(ctx, nil, 250*time.Millisecond) {
					break
				}
			}
			return "", fmt.Errorf("regionsim: %s, %s ahead, still leads %d shards", id, skew, e.c.leaderCount(ctx, id))
		},
		stop: func(ctx context.Context, e *faultEnv) error {
			for _, id := range e.nodes {
				if err := e.c.restartWithOffset(id, 0, false); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// flipLeaders moves the leadership of the skewed nodes' shards away for
// 3.5 s and back for 1.5 s, over and over, while it is active. Each hand-over
// to a fast clock makes the leases granted meanwhile end at once; each
// hand-over from a slow clock ends early the leases it granted.
func flipLeaders(name string, at, d time.Duration) *Fault {
	var stop chan struct{}
	var done chan struct{}
	return &Fault{Name: name, At: at, For: max(d, time.Second),
		start: func(ctx context.Context, e *faultEnv) (string, error) {
			stop, done = make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				for {
					// Away long enough for real time to catch up with a fast
					// clock's stamps, back long enough for a slow clock to
					// stamp leases that end early once it hands over.
					for id := range e.c.offsets() {
						e.c.transferAway(ctx, id)
					}
					if !sleepOrStop(ctx, stop, 3500*time.Millisecond) {
						return
					}
					for id := range e.c.offsets() {
						e.c.transferLeadership(ctx, id)
					}
					if !sleepOrStop(ctx, stop, 1500*time.Millisecond) {
						return
					}
				}
			}()
			return fmt.Sprintf("between %v and the other voters", mapKeys(e.c.offsets())), nil
		},
		stop: func(ctx context.Context, e *faultEnv) error {
			close(stop)
			<-done
			return nil
		},
	}
}

func sleepOrStop(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
	case <-ctx.Done():
	}
	return false
}

func mapKeys(m map[string]time.Duration) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func cutLink(name string, at, d time.Duration, src, dst string, mode wan.Cut) *Fault {
	return &Fault{Name: name, At: at, For: d,
		start: func(ctx context.Context, e *faultEnv) (string, error) {
			return fmt.Sprintf("%s->%s %s", src, dst, mode), e.c.net.SetCut(src, dst, mode)
		},
		stop: func(ctx context.Context, e *faultEnv) error { return e.c.net.SetCut(src, dst, wan.Up) },
	}
}

func isolateRegion(name string, at, d time.Duration, region string, mode wan.Cut) *Fault {
	return &Fault{Name: name, At: at, For: d,
		start: func(ctx context.Context, e *faultEnv) (string, error) {
			return fmt.Sprintf("%s cut from every region (%s)", region, mode), e.c.net.Isolate(region, mode)
		},
		stop: func(ctx context.Context, e *faultEnv) error { return e.c.net.Isolate(region, wan.Up) },
	}
}

// naiveHostOrFirst returns the node hosting the naive lock server, or the
// first node.
func (c *simCluster) naiveHostOrFirst() string {
	if c.naiveHost != "" {
		return c.naiveHost
	}
	return c.ids()[0]
}

// running returns the ids of running, unpaused nodes.
func (c *simCluster) running() []string {
	var out []string
	for _, id := range c.ids() {
		n := c.node(id)
		n.mu.Lock()
		paused := n.paused
		n.mu.Unlock()
		if !paused && n.proc.Running() {
			out = append(out, id)
		}
	}
	return out
}
