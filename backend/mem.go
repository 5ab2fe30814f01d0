package backend

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idem-dev/idem/fsm"
)

// DefaultMemSkewMargin is Mem's clock-skew margin when MemConfig names none,
// the same as an idemnode's default.
const DefaultMemSkewMargin = time.Second

// MemConfig configures a Mem.
type MemConfig struct {
	// Now is the proposer's clock in Unix nanoseconds. Nil means the wall
	// clock.
	Now func() int64
	// SkewMargin is stamped on every reserve, as a proposer does: how long
	// past a lease's end the key stays with its owner. Zero means
	// DefaultMemSkewMargin; negative means none.
	SkewMargin time.Duration
}

// Mem is a Backend over one fsm.FSM in memory: what a one-node store does,
// without Raft. Like a proposer, it stamps Now and SkewMargin on each
// command and gives it the next log index. Safe for concurrent use.
//
// Fault injection: SetApplyError and SetReady make it fail as a store that
// cannot decide does; Calls counts applied commands per op.
type Mem struct {
	now  func() int64
	skew int64

	mu       sync.Mutex
	fsm      *fsm.FSM
	index    uint64
	last     fsm.Command
	calls    map[fsm.Op]int
	fail     func(*fsm.Command) error
	notReady error

	waiters Waiters
}

// NewMem returns an empty Mem.
func NewMem(cfg MemConfig) *Mem {
	m := &Mem{now: cfg.Now, fsm: fsm.New(), calls: map[fsm.Op]int{}}
	if m.now == nil {
		m.now = func() int64 { return time.Now().UnixNano() }
	}
	switch {
	case cfg.SkewMargin == 0:
		m.skew = int64(DefaultMemSkewMargin)
	case cfg.SkewMargin > 0:
		m.skew = int64(cfg.SkewMargin)
	}
	return m
}

// Apply implements Backend. A command that already carries Now or
// SkewMargin is answered OutcomeInvalid: the server must leave them to the
// proposer.
func (m *Mem) Apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, error) {
	if cmd.Op == fsm.OpReserve && cmd.Wait > 0 {
		res, _, err := m.waiters.Reserve(ctx, cmd, time.Duration(m.skew), m.now, func(ctx context.Context, c *fsm.Command) (fsm.Result, error) {
			once := *c
			once.Wait = 0
			return m.Apply(ctx, &once)
		})
		return res, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls[cmd.Op]++
	if m.fail != nil {
		if err := m.fail(cmd); err != nil {
			return fsm.Result{}, err
		}
	}
	c := *cmd
	if c.Now != 0 || c.SkewMargin != 0 {
		return fsm.Result{Outcome: fsm.OutcomeInvalid}, nil
	}
	return m.applyLocked(c), nil
}

// ApplyStamped applies cmd as the next log entry, stamping Now and a
// reserve's SkewMargin only where they are zero. It lets tests drive the
// state machine directly (a front end of their own, a clock of their own).
func (m *Mem) ApplyStamped(cmd fsm.Command) fsm.Result {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.applyLocked(cmd)
}

func (m *Mem) applyLocked(c fsm.Command) fsm.Result {
	if c.Now == 0 {
		c.Now = m.now()
	}
	if c.Op == fsm.OpReserve && c.SkewMargin == 0 {
		c.SkewMargin = m.skew
	}
	m.index++
	m.last = c
	res := m.fsm.Apply(m.index, &c)
	m.waiters.Settled(&c, res)
	return res
}

// memShard is the one shard id of a Mem's page tokens.
const memShard = "mem"

// List implements Backend over the one state machine, at the Mem's clock.
func (m *Mem) List(ctx context.Context, q ListQuery) (ListPage, error) {
	return ListShards(ctx, []string{memShard}, q, func(_ context.Context, _ string, sq ShardQuery) (fsm.ListPage, error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		now := m.now()
		return m.fsm.List(sq.FSMQuery(now), now)
	})
}

// Waiters returns the Mem's waiting reserves, for tests.
func (m *Mem) Waiters() *Waiters { return &m.waiters }

// Get implements Backend at the Mem's clock.
func (m *Mem) Get(_ context.Context, namespace, key string) (fsm.Record, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.fsm.Get(namespace, key, m.now())
	return rec, ok, nil
}

// Ready implements Backend: nil, or the error SetReady gave.
func (m *Mem) Ready(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.notReady
}

// SetReady makes Ready answer err (nil: ready).
func (m *Mem) SetReady(err error) {
	m.mu.Lock()
	m.notReady = err
	m.mu.Unlock()
}

// SetApplyError makes Apply call fail before applying each command and
// return its non-nil error instead (nil fail: apply everything).
func (m *Mem) SetApplyError(fail func(cmd *fsm.Command) error) {
	m.mu.Lock()
	m.fail = fail
	m.mu.Unlock()
}

// Calls reports how many commands of op reached Apply, failed ones
// included.
func (m *Mem) Calls(op fsm.Op) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[op]
}

// LastCommand is the last command applied, as stamped.
func (m *Mem) LastCommand() fsm.Command {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

// SetPolicy implements Policies: the Mem is one shard.
func (m *Mem) SetPolicy(ctx context.Context, cmd *fsm.Command) (fsm.Policy, error) {
	res, err := m.Apply(ctx, cmd)
	if err != nil {
		return fsm.Policy{}, err
	}
	if res.Outcome != fsm.OutcomeOK || res.Policy == nil {
		return fsm.Policy{}, fmt.Errorf("backend: set-policy answered %s", res.Outcome)
	}
	return *res.Policy, nil
}

// GetPolicy implements Policies.
func (m *Mem) GetPolicy(_ context.Context, namespace string) (fsm.Policy, bool, error) {
	p, ok := m.fsm.Policy(namespace)
	return p, ok, nil
}
