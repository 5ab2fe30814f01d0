package fsm

import (
	"bytes"
	"errors"
	"testing"
)

const (
	sec   = int64(1e9)
	lease = 30 * sec
	skew  = 1 * sec
	t0    = int64(1_700_000_000) * sec
)

func reserveCmd(key, owner, fp string, now int64) *Command {
	return &Command{Op: OpReserve, Namespace: "ns", Key: key, Now: now, Fingerprint: fp, OwnerToken: owner, Lease: lease, SkewMargin: skew}
}

func completeCmd(key, owner string, now int64, body string) *Command {
	return &Command{Op: OpComplete, Namespace: "ns", Key: key, Now: now, OwnerToken: owner,
		Response: &Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(body)}, Retention: 3600 * sec}
}

func heartbeatCmd(key, owner string, now int64) *Command {
	return &Command{Op: OpHeartbeat, Namespace: "ns", Key: key, Now: now, OwnerToken: owner, Lease: lease}
}

func releaseCmd(key, owner string, now int64) *Command {
	return &Command{Op: OpRelease, Namespace: "ns", Key: key, Now: now, OwnerToken: owner}
}

// applier applies commands at increasing indexes.
type applier struct {
	t     *testing.T
	f     *FSM
	index uint64
}

func newApplier(t *testing.T) *applier { return &applier{t: t, f: New()} }

func (a *applier) apply(cmd *Command) Result {
	a.index += 3 // gaps, as Raft's configuration and no-op entries leave
	return a.f.Apply(a.index, cmd)
}

func (a *applier) want(cmd *Command, outcome Outcome) Result {
	a.t.Helper()
	r := a.apply(cmd)
	if r.Outcome != outcome {
		a.t.Fatalf("%s %s by %s: outcome %s, want %s (result %+v)", cmd.Op, cmd.Key, cmd.OwnerToken, r.Outcome, outcome, r)
	}
	return r
}

func TestReserveTransitions(t *testing.T) {
	a := newApplier(t)
	first := a.want(reserveCmd("k", "owner-a", "fp", t0), OutcomeAcquired)
	if first.FencingToken != a.index || first.OwnerToken != "owner-a" || first.LeaseExpiresAt != t0+lease {
		t.Fatalf("acquired result %+v", first)
	}

	// Another owner while the lease runs: IN_PROGRESS with a bounded hint.
	busy := a.want(reserveCmd("k", "owner-b", "fp", t0+sec), OutcomeInProgress)
	if busy.RetryAfter != MaxRetryAfter || busy.LeaseExpiresAt != t0+lease || busy.OwnerToken != "" {
		t.Fatalf("in-progress result %+v", busy)
	}
	// Another fingerprint: mismatch comes before state.
	a.want(reserveCmd("k", "owner-b", "other", t0+sec), OutcomeFingerprintMismatch)

	// The same owner again (its answer was lost): same reservation, lease renewed.
	again := a.want(reserveCmd("k", "owner-a", "fp", t0+2*sec), OutcomeAcquired)
	if again.FencingToken != first.FencingToken || again.LeaseExpiresAt != t0+2*sec+lease {
		t.Fatalf("repeat %+v, first %+v", again, first)
	}

	// Complete, then every reserve replays.
	done := a.want(completeCmd("k", "owner-a", t0+3*sec, "charged"), OutcomeOK)
	if done.CompletedAt != t0+3*sec || done.ExpiresAt != t0+3*sec+3600*sec {
		t.Fatalf("complete %+v", done)
	}
	replay := a.want(reserveCmd("k", "owner-b", "fp", t0+4*sec), OutcomeCompleted)
	if string(replay.Response.Body) != "charged" || replay.Response.Status != 201 || replay.FencingToken != first.FencingToken ||
		replay.CompletedAt != done.CompletedAt || replay.ExpiresAt != done.ExpiresAt {
		t.Fatalf("replay %+v", replay)
	}
	a.want(reserveCmd("k", "owner-a", "fp", t0+4*sec), OutcomeCompleted)
	a.want(reserveCmd("k", "owner-b", "different", t0+4*sec), OutcomeFingerprintMismatch)

	// Past retention a tombstone answers EXPIRED (the work was done, its
	// response is gone) until the tombstone ends; then the key is free
	// again, with a larger fencing token.
	gone := a.want(reserveCmd("k", "owner-c", "fp", done.ExpiresAt), OutcomeExpired)
	if gone.FencingToken != first.FencingToken || gone.CompletedAt != done.CompletedAt || gone.ExpiredAt != done.ExpiresAt || gone.Response != nil {
		t.Fatalf("expired %+v", gone)
	}
	a.want(reserveCmd("k", "owner-c", "new", done.ExpiresAt), OutcomeFingerprintMismatch)
	fresh := a.want(reserveCmd("k", "owner-c", "new", done.ExpiresAt+DefaultTombstone), OutcomeAcquired)
	if fresh.FencingToken <= first.FencingToken || fresh.PreviousFencingToken != 0 {
		t.Fatalf("after retention %+v", fresh)
	}
}

func TestReclaimAfterLeaseAndMargin(t *testing.T) {
	a := newApplier(t)
	first := a.want(reserveCmd("k", "owner-a", "", t0), OutcomeAcquired)
	// Near the end the hint never points past the moment the key can be reclaimed.
	late := a.want(reserveCmd("k", "owner-b", "", t0+lease+skew-sec/4), OutcomeInProgress)
	if late.RetryAfter != sec/4 {
		t.Fatalf("retry after %d, want %d", late.RetryAfter, sec/4)
	}
	// Lease over but margin not: still IN_PROGRESS.
	a.want(reserveCmd("k", "owner-b", "", t0+lease), OutcomeInProgress)
	a.want(reserveCmd("k", "owner-b", "", t0+lease+skew-1), OutcomeInProgress)
	// The owner may still heartbeat past its lease while nobody reclaimed.
	hb := a.want(heartbeatCmd("k", "owner-a", t0+lease+skew-1), OutcomeOK)
	if hb.LeaseExpiresAt != t0+lease+skew-1+lease {
		t.Fatalf("heartbeat %+v", hb)
	}
	end := hb.LeaseExpiresAt + skew
	a.want(reserveCmd("k", "owner-b", "", end-1), OutcomeInProgress)
	re := a.want(reserveCmd("k", "owner-b", "", end), OutcomeReclaimed)
	if re.PreviousFencingToken != first.FencingToken || re.FencingToken <= first.FencingToken || re.OwnerToken != "owner-b" {
		t.Fatalf("reclaimed %+v", re)
	}
	// The stale owner is fenced out of everything.
	a.want(heartbeatCmd("k", "owner-a", end+1), OutcomeNotOwner)
	a.want(completeCmd("k", "owner-a", end+1, "late"), OutcomeNotOwner)
	a.want(releaseCmd("k", "owner-a", end+1), OutcomeNotOwner)
	// A repeated reserve by the new owner answers RECLAIMED again, same tokens.
	again := a.want(reserveCmd("k", "owner-b", "", end+2), OutcomeReclaimed)
	if again.FencingToken != re.FencingToken || again.PreviousFencingToken != re.PreviousFencingToken {
		t.Fatalf("repeat of reclaim %+v vs %+v", again, re)
	}
	// The stale owner's reserve does not get the key back.
	a.want(reserveCmd("k", "owner-a", "", end+3), OutcomeInProgress)
}

func TestClockNeverRunsBackwards(t *testing.T) {
	a := newApplier(t)
	a.want(reserveCmd("k", "owner-a", "", t0), OutcomeAcquired)
	// A proposer whose clock is an hour fast moves the FSM clock forward...
	a.want(reserveCmd("other", "owner-x", "", t0+3600*sec), OutcomeAcquired)
	// ...and a slow proposer afterwards cannot pull it back: the lease of k
	// has ended by the FSM's clock, so k can be reclaimed.
	re := a.want(reserveCmd("k", "owner-b", "", t0+sec), OutcomeReclaimed)
	if re.LeaseExpiresAt != t0+3600*sec+lease {
		t.Fatalf("lease measured from the slow clock: %+v", re)
	}
	if got := a.f.Stats().Clock; got != t0+3600*sec {
		t.Fatalf("clock %d", got)
	}
}

func TestHeartbeatCompleteRelease(t *testing.T) {
	a := newApplier(t)
	a.want(heartbeatCmd("missing", "owner-a", t0), OutcomeNotOwner)
	a.want(completeCmd("missing", "owner-a", t0, "x"), OutcomeNotOwner)
	a.want(releaseCmd("missing", "owner-a", t0), OutcomeNotOwner)

	first := a.want(reserveCmd("k", "owner-a", "", t0), OutcomeAcquired)
	a.want(heartbeatCmd("k", "owner-b", t0), OutcomeNotOwner)
	a.want(releaseCmd("k", "owner-b", t0), OutcomeNotOwner)
	a.want(completeCmd("k", "owner-b", t0, "x"), OutcomeNotOwner)
	a.want(releaseCmd("k", "owner-a", t0+sec), OutcomeOK)
	a.want(releaseCmd("k", "owner-a", t0+sec), OutcomeNotOwner)

	second := a.want(reserveCmd("k", "owner-b", "", t0+2*sec), OutcomeAcquired)
	if second.FencingToken <= first.FencingToken || second.PreviousFencingToken != 0 {
		t.Fatalf("after release %+v", second)
	}
	done := a.want(completeCmd("k", "owner-b", t0+3*sec, "ok"), OutcomeOK)
	// The same complete again answers the same times (a lost answer retried).
	retry := a.want(completeCmd("k", "owner-b", t0+9*sec, "ok"), OutcomeOK)
	if retry.CompletedAt != done.CompletedAt || retry.ExpiresAt != done.ExpiresAt {
		t.Fatalf("retried complete %+v vs %+v", retry, done)
	}
	// A different response, another owner, heartbeat or release: NOT_OWNER.
	a.want(completeCmd("k", "owner-b", t0+9*sec, "changed"), OutcomeNotOwner)
	a.want(completeCmd("k", "owner-a", t0+9*sec, "ok"), OutcomeNotOwner)
	a.want(heartbeatCmd("k", "owner-b", t0+9*sec), OutcomeNotOwner)
	a.want(releaseCmd("k", "owner-b", t0+9*sec), OutcomeNotOwner)

	rec, ok := a.f.Get("ns", "k", t0+10*sec)
	if !ok || rec.State != StateCompleted || string(rec.Response.Body) != "ok" || rec.FencingToken != second.FencingToken {
		t.Fatalf("get %+v %v", rec, ok)
	}
	if rec, ok := a.f.Get("ns", "k", done.ExpiresAt); !ok || rec.State != StateExpired || rec.Response != nil || rec.ExpiredAt != done.ExpiresAt {
		t.Fatalf("past retention: %+v %v, want the tombstone", rec, ok)
	}
	if _, ok := a.f.Get("ns", "k", done.ExpiresAt+DefaultTombstone); ok {
		t.Fatal("record visible past its tombstone")
	}
}

func TestSweep(t *testing.T) {
	a := newApplier(t)
	for i, key := range []string{"a", "b", "c"} {
		a.want(reserveCmd(key, "owner-1", "", t0), OutcomeAcquired)
		c := completeCmd(key, "owner-1", t0, "x")
		c.Retention = int64(i+1) * sec
		a.want(c, OutcomeOK)
	}
	a.want(reserveCmd("abandoned", "owner-1", "", t0), OutcomeAcquired)
	a.want(reserveCmd("live", "owner-1", "", t0+10*sec), OutcomeAcquired)

	r := a.want(&Command{Op: OpSweep, Now: t0 + 2*sec, MaxSweep: 1}, OutcomeOK)
	if r.Swept != 1 {
		t.Fatalf("bounded sweep dropped %d", r.Swept)
	}
	if rec, ok := a.f.store.Get(RecordKey{"ns", "a"}); !ok || rec.State != StateExpired {
		t.Fatal("oldest expired record should become a tombstone first")
	}
	// Abandoned: lease ended at t0+30s; dropped once 60s more have passed.
	r = a.want(&Command{Op: OpSweep, Now: t0 + lease + 59*sec, AbandonAfter: 60 * sec}, OutcomeOK)
	if r.Swept != 2 { // b and c expired
		t.Fatalf("swept %d, want 2", r.Swept)
	}
	r = a.want(&Command{Op: OpSweep, Now: t0 + lease + 60*sec, AbandonAfter: 60 * sec}, OutcomeOK)
	if r.Swept != 1 {
		t.Fatalf("swept %d, want the abandoned reservation", r.Swept)
	}
	st := a.f.Stats()
	if st.Records != 4 || st.InProgress != 1 || st.Tombstones != 3 || st.Completed != 0 {
		t.Fatalf("stats after sweep %+v", st)
	}
	// Tombstones go once their time is over.
	r = a.want(&Command{Op: OpSweep, Now: t0 + 3*sec + DefaultTombstone}, OutcomeOK)
	if r.Swept != 3 || a.f.Stats().Tombstones != 0 {
		t.Fatalf("tombstone sweep %+v, stats %+v", r, a.f.Stats())
	}
	if _, ok := a.f.Get("ns", "live", 0); !ok {
		t.Fatal("live reservation swept")
	}
}

func TestInvalidCommands(t *testing.T) {
	a := newApplier(t)
	for _, cmd := range []*Command{
		{Op: 0, Namespace: "ns", Key: "k", OwnerToken: "o"},
		{Op: OpReserve, Namespace: "ns", Key: "k", Lease: lease},    // no owner token
		{Op: OpReserve, Namespace: "ns", Key: "", OwnerToken: "o"},  // no key
		{Op: OpReserve, Namespace: "ns", Key: "k", OwnerToken: "o"}, // no lease
		{Op: OpComplete, Namespace: "ns", Key: "k", OwnerToken: "o", Retention: sec},
		{Op: OpSweep, MaxSweep: -1},
	} {
		a.want(cmd, OutcomeInvalid)
	}
	if r := a.f.ApplyEntry(a.index+1, []byte{9, 9, 9}); r.Outcome != OutcomeInvalid {
		t.Fatalf("garbage entry: %v", r.Outcome)
	}
	if a.f.Stats().Records != 0 {
		t.Fatal("invalid commands changed state")
	}
}

func TestIndexMustIncrease(t *testing.T) {
	f := New()
	f.Apply(10, reserveCmd("k", "owner-a", "", t0))
	defer func() {
		if recover() == nil {
			t.Fatal("applying an old index did not panic")
		}
	}()
	f.Apply(10, reserveCmd("k2", "owner-a", "", t0))
}

func TestCommandCodecRoundTrip(t *testing.T) {
	for _, cmd := range []*Command{
		reserveCmd("k:1/2", "owner-a", "fp", t0),
		completeCmd("k", "owner", t0, "body"),
		{Op: OpComplete, Namespace: "n", Key: "k", OwnerToken: "o", Response: &Response{Status: 204}, Retention: 1},
		{Op: OpSweep, Now: -5, AbandonAfter: 7, MaxSweep: 1000},
	} {
		got, err := DecodeCommand(EncodeCommand(cmd))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(EncodeCommand(got), EncodeCommand(cmd)) || got.Key != cmd.Key || got.Now != cmd.Now ||
			!sameResponse(got.Response, cmd.Response) {
			t.Fatalf("round trip %+v -> %+v", cmd, got)
		}
	}
	enc := EncodeCommand(completeCmd("k", "owner", t0, "body"))
	for i := 0; i < len(enc); i++ {
		if _, err := DecodeCommand(enc[:i]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated at %d: err %v", i, err)
		}
	}
	if _, err := DecodeCommand(append(enc, 0)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("trailing byte: err %v", err)
	}
}
