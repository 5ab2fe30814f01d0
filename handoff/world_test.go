package handoff

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/statedb"
	"github.com/idem-dev/idem/topology"
)

// The explorer's world: a source group "s" and a destination group "t",
// each a log with a leader replica (the in-memory FSM, which answers) and a
// follower replica (the disk store) that applies the same log with apply
// batches cut where the schedule says; a meta group whose leadership the
// schedule moves between drivers (a deposed driver keeps its stale view and
// keeps calling the groups); clients that reserve and complete keys; a
// network that loses, delays and duplicates handoff commands; clocks
// offset between the groups and time that advances. The drivers are the
// package's real Driver over this world's Cluster, run as goroutines that
// take turns: every Cluster call is one atomic step, and the schedule
// decides which actor takes the next one.

const (
	sec       = int64(time.Second)
	partCount = 4
	epoch     = 2 // the change's target version (the groups adopted at 1)
	maxGap    = 500 * time.Millisecond
	longLease = 3600 * sec
)

// chooser makes the schedule's choices.
type chooser interface {
	// choose picks one of n options (n >= 1); option 0 is the default
	// (let the running actor go on, deliver the message, do no fault).
	choose(n int) int
}

// scope bounds what a world may do besides running its drivers.
type scope struct {
	drivers   int   // driver actors (one leads the meta group at a time)
	sizes     []int // each driver's batch size (they differ)
	crashes   int   // driver crashes (it restarts with no memory)
	failovers int   // meta leadership moves to another driver
	faults    int   // lost, delayed or duplicated handoff commands
	clients   int   // client operations
	ticks     int   // time advances
	skews     int   // clock-offset changes of the destination
	steps     int   // actions at most
	disk      bool  // a disk follower per group (else memory only)
}

// group is one shard's Raft group.
type group struct {
	id       string
	log      []*fsm.Command
	leader   *fsm.FSM
	follower *statedb.StateMachine
	applied  int   // follower's applied entries
	offset   int64 // this group's clock minus true time
}

func (g *group) now(trueNow int64) int64 { return trueNow + g.offset }

// propose appends cmd to the log and applies it on the leader.
func (g *group) propose(cmd *fsm.Command) fsm.Result {
	g.log = append(g.log, cmd)
	return g.leader.Apply(uint64(len(g.log)), cmd)
}

// metaState is the meta group's state.
type metaState struct {
	moved map[uint32]bool
	batch *Batch
	nonce uint64
	index uint64 // the meta log's last index: attempts are its values
}

func (m metaState) clone() metaState {
	c := m
	c.moved = make(map[uint32]bool, len(m.moved))
	for p := range m.moved {
		c.moved[p] = true
	}
	if m.batch != nil {
		b := *m.batch
		c.batch = &b
	}
	return c
}

// ack is what a client was told about a key.
type ack struct {
	completed  bool
	response   string
	token      uint64
	owner      string
	lease      int64 // owner's lease length (ns)
	grantedAt  int64 // true time of the grant (or last heartbeat)
	goneAfter  bool  // after completion, some answer said it is gone (EXPIRED or a new grant)
	lastToken  uint64
	retention  int64
	completeAt int64
}

type actorState int

const (
	parked actorState = iota
	running
	finished
)

type actor struct {
	id    int
	wake  chan bool // true: go on; false: crash
	state actorState
	drv   *Driver
	stale *metaState // set while deposed: the view it keeps
	gen   int        // restarts
}

type event struct{ a *actor }

type world struct {
	t        testing.TB
	sc       scope
	ch       chooser
	rng      *rand.Rand // values that do not branch the schedule (nonces)
	groups   map[string]*group
	meta     metaState
	leader   int // the driver that leads the meta group
	actors   []*actor
	events   chan event
	pending  []pendingCmd
	trueNow  int64
	keys     map[fsm.RecordKey]*ack
	keyList  []fsm.RecordKey
	used     scope // what was spent of the scope
	steps    int
	trace    []string
	failures []string
	moves    []topology.Move
}

type pendingCmd struct {
	g   string
	cmd *fsm.Command
}

var errCrashed = errors.New("explorer: the driver crashed")
var errNotLeader = errors.New("explorer: not the meta group's leader")
var errLost = errors.New("explorer: the call was lost")

// newWorld builds the world of one schedule. db holds the disk followers
// (shard ids unique per world).
func newWorld(t testing.TB, sc scope, ch chooser, seed uint64, db *statedb.DB, id int) *world {
	w := &world{t: t, sc: sc, ch: ch, rng: rand.New(rand.NewPCG(seed, 7)), groups: map[string]*group{}, events: make(chan event),
		keys: map[fsm.RecordKey]*ack{}, trueNow: 1000 * sec}
	w.meta.moved = map[uint32]bool{}
	for _, name := range []string{"s", "t"} {
		g := &group{id: name, leader: fsm.New()}
		if db != nil && sc.disk {
			sm, err := db.Shard(fmt.Sprintf("%s-%d", name, id))
			if err != nil {
				t.Fatal(err)
			}
			g.follower = sm
		}
		w.groups[name] = g
	}
	all := []uint32{0, 1, 2, 3}
	w.propose("s", &fsm.Command{Op: fsm.OpAdopt, Handoff: &fsm.Handoff{Count: partCount, Partitions: all, Epoch: 1}})
	w.propose("t", &fsm.Command{Op: fsm.OpAdopt, Handoff: &fsm.Handoff{Count: partCount, Epoch: 1}})
	w.moves = []topology.Move{{From: "s", To: "t", Partitions: []uint32{1, 2, 3}}}
	// Keys: two per partition; the first of each is completed before the
	// change, the second held by a live owner, a third short-lived one
	// completed with a short retention (it expires while keys move).
	for p := range uint32(partCount) {
		var ks []string
		for i := 0; len(ks) < 3; i++ {
			k := fmt.Sprintf("k%d", i)
			if fsm.PartitionOf("ns", k, partCount) == p && !slices.Contains(w.keyNames(), k) {
				ks = append(ks, k)
			}
		}
		for i, k := range ks {
			rk := fsm.RecordKey{Namespace: "ns", Key: k}
			w.keys[rk] = &ack{}
			w.keyList = append(w.keyList, rk)
			switch i {
			case 0:
				w.reserve(rk, "o1", longLease)
				w.complete(rk, "o1", longLease)
			case 1:
				w.reserve(rk, "o1", 20*sec)
			case 2:
				w.reserve(rk, "o1", longLease)
				w.complete(rk, "o1", 30*sec)
			}
		}
	}
	return w
}

func (w *world) keyNames() []string {
	var out []string
	for k := range w.keys {
		out = append(out, k.Key)
	}
	return out
}

func (w *world) logf(format string, args ...any) {
	w.trace = append(w.trace, fmt.Sprintf("%3d ", w.steps)+fmt.Sprintf(format, args...))
}

func (w *world) fail(format string, args ...any) {
	w.failures = append(w.failures, fmt.Sprintf("step %d: ", w.steps)+fmt.Sprintf(format, args...))
}

// propose proposes cmd to group g at the current time.
func (w *world) propose(g string, cmd *fsm.Command) fsm.Result {
	grp := w.groups[g]
	if cmd.Handoff == nil {
		cmd.Now = grp.now(w.trueNow)
	}
	return grp.propose(cmd)
}

// serving returns the group whose table owns k's partition (nil: none)
// and how many do.
func (w *world) serving(k fsm.RecordKey) (*group, int) {
	var g *group
	n := 0
	for _, name := range []string{"s", "t"} {
		if owned, _, _ := w.groups[name].leader.Owns(k.Namespace, k.Key); owned {
			g = w.groups[name]
			n++
		}
	}
	return g, n
}

// route applies a key command at the group that serves the key, as a
// proposer that follows MOVED would; MOVED everywhere is an unavailable
// key (it is moving).
func (w *world) route(cmd *fsm.Command) (fsm.Result, bool) {
	for _, name := range []string{"s", "t"} {
		c := *cmd
		if r := w.propose(name, &c); r.Outcome != fsm.OutcomeMoved {
			return r, true
		}
	}
	return fsm.Result{}, false
}

// reserve is a client's reserve, checked against what clients were told.
func (w *world) reserve(k fsm.RecordKey, owner string, lease int64) {
	r, ok := w.route(&fsm.Command{Op: fsm.OpReserve, Namespace: k.Namespace, Key: k.Key, OwnerToken: owner, Fingerprint: "f", Lease: lease})
	if !ok {
		return
	}
	a := w.keys[k]
	switch r.Outcome {
	case fsm.OutcomeAcquired, fsm.OutcomeReclaimed:
		if r.FencingToken <= a.lastToken && a.owner != owner {
			w.fail("%s: granted to %s with token %d, not above the last token %d", k.Key, owner, r.FencingToken, a.lastToken)
		}
		if a.completed && !a.goneAfter && w.trueNow < a.completeAt+a.retention-int64(maxGap) {
			w.fail("%s: completed (token %d) and still retained, but granted again to %s", k.Key, a.token, owner)
		}
		if a.owner != "" && a.owner != owner && !a.completed && w.trueNow < a.grantedAt+a.lease-int64(maxGap) {
			w.fail("%s: held by %s until %d, granted to %s at %d: two owners", k.Key, a.owner, a.grantedAt+a.lease, owner, w.trueNow)
		}
		if a.completed {
			a.goneAfter = true
		}
		a.owner, a.lease, a.grantedAt, a.lastToken = owner, lease, w.trueNow, max(a.lastToken, r.FencingToken)
		if !a.completed {
			a.token = r.FencingToken
		}
	case fsm.OutcomeCompleted:
		if !a.completed {
			w.fail("%s: COMPLETED, but no completion was acknowledged", k.Key)
		} else if a.goneAfter {
			w.fail("%s: COMPLETED again after it was answered gone (expired or granted anew)", k.Key)
		} else if r.FencingToken != a.token || r.Response == nil || string(r.Response.Body) != a.response {
			w.fail("%s: replayed token %d body %v, acknowledged token %d body %q", k.Key, r.FencingToken, r.Response, a.token, a.response)
		}
	case fsm.OutcomeExpired:
		if a.completed {
			a.goneAfter = true
		}
	}
}

// complete is the owner's complete.
func (w *world) complete(k fsm.RecordKey, owner string, retention int64) {
	body := fmt.Sprintf("resp-%s-%d", k.Key, w.steps)
	r, ok := w.route(&fsm.Command{Op: fsm.OpComplete, Namespace: k.Namespace, Key: k.Key, OwnerToken: owner,
		Response: &fsm.Response{Status: 201, Body: []byte(body)}, Retention: retention})
	if !ok || r.Outcome != fsm.OutcomeOK {
		return
	}
	a := w.keys[k]
	if a.completed && !a.goneAfter {
		w.fail("%s: a second completion by %s was accepted", k.Key, owner)
	}
	a.completed, a.goneAfter, a.response, a.retention, a.completeAt, a.token = true, false, body, retention, w.trueNow, a.lastToken
}

// check runs the invariants that hold after every step.
func (w *world) check() {
	for _, k := range w.keyList {
		g, n := w.serving(k)
		if n > 1 {
			w.fail("%s: served by two groups", k.Key)
		}
		a := w.keys[k]
		if g == nil || !a.completed || a.goneAfter || a.retention != longLease {
			continue
		}
		rec, found := g.leader.Get(k.Namespace, k.Key, g.now(w.trueNow))
		if !found || rec.State != fsm.StateCompleted || rec.Response == nil || string(rec.Response.Body) != a.response || rec.FencingToken != a.token {
			w.fail("%s: acknowledged completion (token %d) not served by %s: found %v %+v", k.Key, a.token, g.id, found, rec)
		}
	}
}

// finish brings the followers level with their leaders and compares them,
// and checks that every partition is served by exactly one group.
func (w *world) finish() {
	for _, g := range w.groups {
		if g.follower != nil {
			w.applyFollower(g, len(g.log))
			var a, b bytes.Buffer
			if _, err := g.leader.Snapshot().WriteTo(&a); err != nil {
				w.t.Fatal(err)
			}
			if _, err := g.follower.FSM().Snapshot().WriteTo(&b); err != nil {
				w.t.Fatal(err)
			}
			if !bytes.Equal(a.Bytes(), b.Bytes()) {
				w.fail("group %s: the disk replica's state differs from the memory replica's after the same %d entries", g.id, len(g.log))
			}
		}
	}
	for p := range uint32(partCount) {
		n := 0
		for _, g := range w.groups {
			if _, list := g.leader.Partitions(); slices.ContainsFunc(list, func(pi fsm.PartitionInfo) bool { return pi.Partition == p && pi.State == "owned" }) {
				n++
			}
		}
		if n != 1 && !w.moving(p) {
			w.fail("partition %d is served by %d groups at the end", p, n)
		}
	}
	w.check()
}

// moving reports whether p is in the batch a driver may still finish
// (the schedule ended while it was frozen).
func (w *world) moving(p uint32) bool {
	return w.meta.batch != nil && slices.Contains(w.meta.batch.Partitions, p)
}

// applyFollower applies g's log to its disk follower up to n entries,
// committing where the schedule cuts.
func (w *world) applyFollower(g *group, n int) {
	for g.applied < n {
		g.applied++
		g.follower.FSM().Apply(uint64(g.applied), g.log[g.applied-1])
		if g.applied == n || w.rng.IntN(3) == 0 {
			if err := g.follower.CommitApplied(uint64(g.applied)); err != nil {
				w.t.Fatal(err)
			}
		}
	}
}
