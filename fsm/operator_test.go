package fsm

import (
	"fmt"
	"testing"
)

func forceReleaseCmd(key string, now int64) *Command {
	return &Command{Op: OpForceRelease, Namespace: "ns", Key: key, Now: now}
}

func deleteCmd(key string, now int64) *Command {
	return &Command{Op: OpDelete, Namespace: "ns", Key: key, Now: now}
}

func TestForceRelease(t *testing.T) {
	a := newApplier(t)
	a.want(forceReleaseCmd("k", t0), OutcomeNotFound)
	first := a.want(reserveCmd("k", "owner-a", "fp", t0), OutcomeAcquired)

	fr := a.want(forceReleaseCmd("k", t0+sec), OutcomeOK)
	if fr.PreviousFencingToken != first.FencingToken {
		t.Fatalf("force-release %+v: previous token, want %d", fr, first.FencingToken)
	}
	// A retried action answers the same.
	if again := a.want(forceReleaseCmd("k", t0+sec), OutcomeOK); again.PreviousFencingToken != first.FencingToken {
		t.Fatalf("repeated force-release %+v", again)
	}
	// The old owner lost the key, long before its lease would have ended.
	a.want(heartbeatCmd("k", "owner-a", t0+2*sec), OutcomeNotOwner)
	a.want(completeCmd("k", "owner-a", t0+2*sec, "late"), OutcomeNotOwner)
	a.want(releaseCmd("k", "owner-a", t0+2*sec), OutcomeNotOwner)
	if rec, ok := a.f.Get("ns", "k", t0+2*sec); !ok || rec.State != StateInProgress || rec.LeaseExpiresAt != t0+sec {
		t.Fatalf("force-released record %+v %v: want IN_PROGRESS, lease ended at the force-release", rec, ok)
	}
	// Even the old owner's own reserve retry is a new reservation now.
	re := a.want(reserveCmd("k", "owner-b", "fp", t0+2*sec), OutcomeReclaimed)
	if re.PreviousFencingToken != first.FencingToken || re.FencingToken <= first.FencingToken {
		t.Fatalf("reclaim %+v after token %d", re, first.FencingToken)
	}
	a.want(reserveCmd("k", "owner-c", "fp", t0+3*sec), OutcomeInProgress)

	a.want(completeCmd("k", "owner-b", t0+4*sec, "done"), OutcomeOK)
	if r := a.want(forceReleaseCmd("k", t0+5*sec), OutcomeFailedPrecondition); r.State != StateCompleted {
		t.Fatalf("force-release of a completed key %+v", r)
	}
	a.want(reserveCmd("k", "owner-c", "fp", t0+5*sec), OutcomeCompleted)
}

func TestDelete(t *testing.T) {
	a := newApplier(t)
	a.want(deleteCmd("k", t0), OutcomeNotFound)
	first := a.want(reserveCmd("k", "owner-a", "fp", t0), OutcomeAcquired)
	a.want(completeCmd("k", "owner-a", t0+sec, "done"), OutcomeOK)
	if d := a.want(deleteCmd("k", t0+2*sec), OutcomeOK); d.PreviousFencingToken != first.FencingToken || d.State != StateCompleted {
		t.Fatalf("delete %+v", d)
	}
	if _, ok := a.f.Get("ns", "k", t0+2*sec); ok {
		t.Fatal("deleted record still readable")
	}
	a.want(deleteCmd("k", t0+2*sec), OutcomeNotFound)
	// A fresh acquisition, with a token above every one issued for the key.
	next := a.want(reserveCmd("k", "owner-b", "other-fp", t0+3*sec), OutcomeAcquired)
	if next.FencingToken <= first.FencingToken || next.PreviousFencingToken != 0 {
		t.Fatalf("reserve after delete %+v, first token %d", next, first.FencingToken)
	}
	// Deleting an IN_PROGRESS key takes it from its owner too.
	a.want(deleteCmd("k", t0+4*sec), OutcomeOK)
	a.want(completeCmd("k", "owner-b", t0+4*sec, "late"), OutcomeNotOwner)
	if r := a.want(reserveCmd("k", "owner-c", "fp", t0+5*sec), OutcomeAcquired); r.FencingToken <= next.FencingToken {
		t.Fatalf("token %d after %d", r.FencingToken, next.FencingToken)
	}
}

func TestList(t *testing.T) {
	a := newApplier(t)
	for i := range 10 {
		a.want(reserveCmd(fmt.Sprintf("k%02d", i), "owner-a", "fp", t0+int64(i)*sec), OutcomeAcquired)
	}
	for i := range 5 { // k00..k04 completed
		a.want(completeCmd(fmt.Sprintf("k%02d", i), "owner-a", t0+20*sec, "done"), OutcomeOK)
	}
	a.want(&Command{Op: OpReserve, Namespace: "other", Key: "k00", Now: t0, OwnerToken: "owner-x", Lease: lease}, OutcomeAcquired)
	now := t0 + 30*sec

	// Paging over everything visits each key once, in order.
	var seen []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("paging does not end")
		}
		p := list(t, a.f, ListQuery{Namespace: "ns", After: after, Limit: 3}, now)
		for _, r := range p.Records {
			if r.Record.OwnerToken != "" || r.Record.Response != nil {
				t.Fatalf("listed record carries owner token or response: %+v", r)
			}
			seen = append(seen, r.Key)
		}
		if p.Done {
			break
		}
		after = p.Last
	}
	if fmt.Sprint(seen) != "[k00 k01 k02 k03 k04 k05 k06 k07 k08 k09]" {
		t.Fatalf("paged keys %v", seen)
	}

	// Filters: state and age (created before).
	p := list(t, a.f, ListQuery{Namespace: "ns", State: StateInProgress, CreatedBefore: t0 + 7*sec, Limit: 100}, now)
	if len(p.Records) != 2 || p.Records[0].Key != "k05" || p.Records[1].Key != "k06" || !p.Done {
		t.Fatalf("in-progress older page %+v", p)
	}
	// Bounded work: a page examines at most MaxScan records, matching or not.
	p = list(t, a.f, ListQuery{Namespace: "ns", State: StateInProgress, Limit: 1, MaxScan: 4}, now)
	if len(p.Records) != 0 || p.Done || p.Last != "k03" {
		t.Fatalf("bounded page %+v: want no match, not done, last k03", p)
	}
	// Past retention is not listed.
	if p := list(t, a.f, ListQuery{Namespace: "ns", State: StateCompleted, Limit: 100}, t0+20*sec+3600*sec); len(p.Records) != 0 {
		t.Fatalf("expired records listed: %+v", p)
	}
}

func list(t *testing.T, f *FSM, q ListQuery, now int64) ListPage {
	t.Helper()
	p, err := f.List(q, now)
	if err != nil {
		t.Fatalf("List(%+v): %v", q, err)
	}
	return p
}

func TestOldestInProgress(t *testing.T) {
	a := newApplier(t)
	if _, ok, err := a.f.OldestInProgress(); ok || err != nil {
		t.Fatalf("empty FSM: ok %v err %v", ok, err)
	}
	a.want(reserveCmd("done", "owner-a", "fp", t0-sec), OutcomeAcquired)
	a.want(reserveCmd("old", "owner-a", "fp", t0), OutcomeAcquired)
	a.want(reserveCmd("young", "owner-a", "fp", t0+5*sec), OutcomeAcquired)
	a.want(heartbeatCmd("old", "owner-a", t0+10*sec), OutcomeOK) // its lease now ends last
	a.want(completeCmd("done", "owner-a", t0+10*sec, "x"), OutcomeOK)
	if at, ok, err := a.f.OldestInProgress(); !ok || err != nil || at != t0 {
		t.Fatalf("oldest in progress %d %v %v, want %d", at, ok, err, t0)
	}
}
