package check

import (
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/regionsim/history"
	"github.com/idem-dev/idem/regionsim/ledger"
)

const (
	ms     = int64(time.Millisecond)
	margin = time.Second
	base   = int64(1_700_000_000) * int64(time.Second) // store clock origin (Unix ns)
)

// h builds histories: times are in ms since the run start; the store's clock
// reads base + the same ms.
type h struct{ ops []history.Op }

func (b *h) add(op history.Op) *h {
	op.ID = len(b.ops)
	if op.Result == history.Unknown {
		op.Return = history.Infinity
	}
	b.ops = append(b.ops, op)
	return b
}

func reserve(client int, owner string, call, ret int64, outcome string, fencing uint64, leaseEnd int64) history.Op {
	return history.Op{Client: client, Key: "k", Kind: history.Reserve, Owner: owner, Fingerprint: "fp", LeaseMs: 2000,
		Call: call * ms, Return: ret * ms, Result: history.OK, Outcome: outcome, Fencing: fencing, LeaseExpires: leaseEnd}
}

// acquireAt returns an ACQUIRED reserve decided at store time t ms.
func acquireAt(client int, owner string, call, ret, t int64, fencing uint64) history.Op {
	return reserve(client, owner, call, ret, history.Acquired, fencing, base+(t+2000)*ms)
}

// reclaimAt returns a RECLAIMED reserve decided at store time t ms.
func reclaimAt(client int, owner string, call, ret, t int64, fencing, prev uint64) history.Op {
	op := reserve(client, owner, call, ret, history.Reclaimed, fencing, base+(t+2000)*ms)
	op.PrevFencing = prev
	return op
}

func complete(client int, owner string, call, ret int64, resp string, result history.Result) history.Op {
	return history.Op{Client: client, Key: "k", Kind: history.Complete, Owner: owner, Response: resp,
		Call: call * ms, Return: ret * ms, Result: result, CompletedAt: base + ret*ms}
}

func replay(client int, owner string, call, ret int64, resp string, fencing uint64, completedAt int64) history.Op {
	op := reserve(client, owner, call, ret, history.Completed, fencing, 0)
	op.Replay, op.CompletedAt = resp, completedAt
	return op
}

func lin(t *testing.T, ops []history.Op) Outcome {
	t.Helper()
	return Linearizability(ops, margin, 5*time.Second, 20*time.Second)
}

func TestLinearizableHistoriesPass(t *testing.T) {
	for name, ops := range map[string][]history.Op{
		"reserve complete replay": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(reserve(1, "ownerB", 4, 12, history.InProgress, 0, base+2005*ms)).
			add(complete(0, "ownerA", 20, 30, "201 ch_1", history.OK)).
			add(replay(1, "ownerB", 40, 50, "201 ch_1", 3, base+30*ms)).ops,
		"concurrent race, one winner": new(h).
			add(acquireAt(1, "ownerB", 0, 30, 20, 7)).
			add(reserve(0, "ownerA", 0, 30, history.InProgress, 0, base+2020*ms)).
			add(reserve(2, "ownerC", 0, 30, history.InProgress, 0, base+2020*ms)).ops,
		"lost reserve answer, retried by the same owner": new(h).
			add(history.Op{Client: 0, Key: "k", Kind: history.Reserve, Owner: "ownerA", Fingerprint: "fp", LeaseMs: 2000, Call: 0, Result: history.Unknown}).
			add(acquireAt(0, "ownerA", 100, 110, 105, 4)).
			add(complete(0, "ownerA", 120, 130, "201 ch_1", history.OK)).ops,
		"reclaim after lease end plus margin": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(reclaimAt(1, "ownerB", 3500, 3510, 3505, 9, 3)).
			add(complete(0, "ownerA", 3600, 3610, "201 ch_1", history.NotOwner)).
			add(complete(1, "ownerB", 3700, 3710, "201 ch_2", history.OK)).ops,
		"lost complete answer, applied": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(complete(0, "ownerA", 20, 0, "201 ch_1", history.Unknown)).
			add(replay(1, "ownerB", 100, 110, "201 ch_1", 3, base+25*ms)).ops,
		"lost complete answer, never applied": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(complete(0, "ownerA", 20, 0, "201 ch_1", history.Unknown)).
			add(reserve(1, "ownerB", 100, 110, history.InProgress, 0, base+2005*ms)).ops,
		"checkpoint by the owner, refused after a reclaim": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(history.Op{Client: 0, Key: "k", Kind: history.Checkpoint, Owner: "ownerA", Call: 20 * ms, Return: 30 * ms, Result: history.OK}).
			add(reclaimAt(1, "ownerB", 3500, 3510, 3505, 9, 3)).
			add(history.Op{Client: 0, Key: "k", Kind: history.Checkpoint, Owner: "ownerA", Call: 3600 * ms, Return: 3610 * ms, Result: history.NotOwner}).
			add(complete(1, "ownerB", 3700, 3710, "201 ch_1", history.OK)).ops,
		"release then acquire with a larger token": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(history.Op{Client: 0, Key: "k", Kind: history.Release, Owner: "ownerA", Call: 20 * ms, Return: 30 * ms, Result: history.OK}).
			add(history.Op{Client: 1, Key: "k", Kind: history.Get, Call: 40 * ms, Return: 50 * ms, Result: history.NotFound}).
			add(acquireAt(1, "ownerB", 60, 70, 65, 8)).ops,
	} {
		t.Run(name, func(t *testing.T) {
			if o := lin(t, ops); !o.Passed() || o.Inconclusive > 0 {
				t.Fatalf("valid history rejected: %s %+v", o, o.Findings)
			}
		})
	}
}

// The can-fail tests: each history breaks the contract once, and the
// checker must say so.
func TestLinearizabilityCatchesViolations(t *testing.T) {
	for name, ops := range map[string][]history.Op{
		"two owners at once": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(acquireAt(1, "ownerB", 20, 30, 25, 4)).ops,
		"reclaimed before lease end plus margin": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(reclaimAt(1, "ownerB", 2500, 2510, 2505, 9, 3)).ops,
		"fencing token not increasing": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(history.Op{Client: 0, Key: "k", Kind: history.Release, Owner: "ownerA", Call: 20 * ms, Return: 30 * ms, Result: history.OK}).
			add(acquireAt(1, "ownerB", 60, 70, 65, 3)).ops,
		"stale read after completion": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(complete(0, "ownerA", 20, 30, "201 ch_1", history.OK)).
			add(history.Op{Client: 1, Key: "k", Kind: history.Get, Call: 40 * ms, Return: 50 * ms, Result: history.NotFound}).ops,
		"replay differs from stored response": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(complete(0, "ownerA", 20, 30, "201 ch_1", history.OK)).
			add(replay(1, "ownerB", 40, 50, "201 ch_2", 3, base+30*ms)).ops,
		"completed key acquired again": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(complete(0, "ownerA", 20, 30, "201 ch_1", history.OK)).
			add(acquireAt(1, "ownerB", 40, 50, 45, 9)).ops,
		"stale owner checkpoints after reclaim": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(reclaimAt(1, "ownerB", 3500, 3510, 3505, 9, 3)).
			add(history.Op{Client: 0, Key: "k", Kind: history.Checkpoint, Owner: "ownerA", Call: 3600 * ms, Return: 3610 * ms, Result: history.OK}).ops,
		"checkpoint of a completed key": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(complete(0, "ownerA", 20, 30, "201 ch_1", history.OK)).
			add(history.Op{Client: 0, Key: "k", Kind: history.Checkpoint, Owner: "ownerA", Call: 40 * ms, Return: 50 * ms, Result: history.OK}).ops,
		"stale owner completes after reclaim": new(h).
			add(acquireAt(0, "ownerA", 0, 10, 5, 3)).
			add(reclaimAt(1, "ownerB", 3500, 3510, 3505, 9, 3)).
			add(complete(0, "ownerA", 3600, 3610, "201 ch_1", history.OK)).ops,
	} {
		t.Run(name, func(t *testing.T) {
			o := lin(t, ops)
			if o.Passed() {
				t.Fatalf("non-linearizable history passed: %s", o)
			}
			if o.Findings[0].Key != "k" || !strings.Contains(o.Findings[0].Detail, "no linearization") {
				t.Fatalf("finding %+v", o.Findings[0])
			}
		})
	}
}

func TestDecidedErrorsAreReported(t *testing.T) {
	ops := new(h).add(history.Op{Key: "k", Kind: history.Complete, Owner: "x", Call: 0, Return: ms, Result: history.Failed, Err: "INVALID_ARGUMENT"}).ops
	if o := lin(t, ops); o.Violations != 1 {
		t.Fatalf("%s", o)
	}
}

func charge(key, id string, token uint64) ledger.Charge {
	return ledger.Charge{Key: key, ID: id, Token: token, Accepted: true}
}

func TestExactlyOnce(t *testing.T) {
	good := map[string][]ledger.Charge{"a": {charge("a", "ch_1", 3)}, "b": {charge("b", "ch_2", 4)}}
	acked := []Completion{{Key: "a", ChargeID: "ch_1"}, {Key: "b", ChargeID: "ch_2"}}
	if o := ExactlyOnce(good, acked); !o.Passed() || o.Checked != 2 {
		t.Fatalf("clean ledger: %s %+v", o, o.Findings)
	}
	double := map[string][]ledger.Charge{"a": {charge("a", "ch_1", 3), charge("a", "ch_3", 5)}, "b": {charge("b", "ch_2", 4)}}
	o := ExactlyOnce(double, acked)
	if o.Violations != 1 || o.Findings[0].Key != "a" || !strings.Contains(o.Findings[0].Detail, "charged 2 times") {
		t.Fatalf("double charge not reported: %s %+v", o, o.Findings)
	}
	missing := map[string][]ledger.Charge{"a": {charge("a", "ch_1", 3)}}
	if o := ExactlyOnce(missing, acked); o.Violations != 1 || o.Findings[0].Key != "b" {
		t.Fatalf("completed key without a charge not reported: %s %+v", o, o.Findings)
	}
	wrong := map[string][]ledger.Charge{"a": {charge("a", "ch_9", 3)}, "b": {charge("b", "ch_2", 4)}}
	if o := ExactlyOnce(wrong, acked); o.Violations != 1 || o.Findings[0].Key != "a" {
		t.Fatalf("completion naming another charge not reported: %s %+v", o, o.Findings)
	}
}

func TestReplays(t *testing.T) {
	same := []Delivery{{Key: "a", Response: "201 ch_1", At: 1}, {Key: "a", Response: "201 ch_1", Replayed: true, At: 2}}
	if o := Replays(same, nil); !o.Passed() {
		t.Fatalf("identical replay rejected: %+v", o.Findings)
	}
	changed := append(same, Delivery{Key: "a", Response: "201 ch_7", Replayed: true, At: 3})
	if o := Replays(changed, nil); o.Violations != 1 || o.Findings[0].Key != "a" {
		t.Fatalf("changed replay not reported: %s %+v", o, o.Findings)
	}
	// A replay the store answered that differs from what the owner stored.
	ops := []history.Op{
		complete(0, "ownerA", 0, 10, "201 ch_1", history.OK),
		replay(1, "ownerB", 20, 30, "201 ch_2", 3, base),
	}
	if o := Replays(nil, ops); o.Violations != 1 {
		t.Fatalf("store replay differing from the stored response not reported: %s", o)
	}
}

func TestNoLoss(t *testing.T) {
	acked := []Completion{{Key: "a", Response: "201 ch_1"}, {Key: "b", Response: "201 ch_2"}}
	final := map[string]FinalRead{"a": {Found: true, Response: "201 ch_1"}, "b": {Found: true, Response: "201 ch_2"}}
	if o := NoLoss(acked, final); !o.Passed() || o.Checked != 2 {
		t.Fatalf("%s", o)
	}
	lost := map[string]FinalRead{"a": {Found: true, Response: "201 ch_1"}, "b": {Found: false}}
	if o := NoLoss(acked, lost); o.Violations != 1 || o.Findings[0].Key != "b" {
		t.Fatalf("lost completion not reported: %s %+v", o, o.Findings)
	}
	changed := map[string]FinalRead{"a": {Found: true, Response: "201 ch_9"}, "b": {Found: true, Response: "201 ch_2"}}
	if o := NoLoss(acked, changed); o.Violations != 1 || o.Findings[0].Key != "a" {
		t.Fatalf("changed completion not reported: %s %+v", o, o.Findings)
	}
	unread := map[string]FinalRead{"a": {Err: "timeout"}, "b": {Found: true, Response: "201 ch_2"}}
	if o := NoLoss(acked, unread); !o.Passed() || o.Inconclusive != 1 {
		t.Fatalf("an unanswered final read must be inconclusive, not a loss: %s", o)
	}
}
