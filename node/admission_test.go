package node

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/testutil"
)

// TestAdmissionOnLowDisk: below the free-space reserve a node refuses the
// writes that add data (a reserve of a new key, a complete) with 429
// RESOURCE_EXHAUSTED and a Retry-After, and keeps everything else working:
// reads, a reserve that replays, heartbeats, releases, readiness. When space
// returns, writes resume by themselves.
func TestAdmissionOnLowDisk(t *testing.T) {
	cfg := oneNode(t)
	var free atomic.Uint64
	free.Store(1 << 30)
	cfg.DiskReserveBytes = 64 << 20
	cfg.DiskFree = func(string) (uint64, uint64, error) { return free.Load(), 1 << 34, nil }
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	testutil.Eventually(t, 30*time.Second, "ready", func() (bool, string) {
		err := n.Ready(t.Context())
		return err == nil, errString(err)
	})
	ctx := t.Context()
	apply := func(c fsm.Command) (fsm.Result, error) { return n.Apply(ctx, &c) }
	reserve := func(key, owner string) fsm.Command {
		return fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: key, OwnerToken: owner, Lease: int64(time.Minute)}
	}
	complete := func(key, owner string) fsm.Command {
		return fsm.Command{Op: fsm.OpComplete, Namespace: "ns", Key: key, OwnerToken: owner, Retention: int64(time.Hour), Response: &fsm.Response{Status: 200, Body: []byte("x")}}
	}
	mustOK := func(what string, r fsm.Result, err error, want fsm.Outcome) {
		t.Helper()
		if err != nil || r.Outcome != want {
			t.Fatalf("%s: %v %v, want %v", what, r.Outcome, err, want)
		}
	}
	refused := func(what string, _ fsm.Result, err error) {
		t.Helper()
		var be *backend.Error
		if !errors.As(err, &be) || be.Code != contract.CodeResourceExhausted || be.RetryAfter <= 0 {
			t.Fatalf("%s with the disk below its reserve: %v, want RESOURCE_EXHAUSTED with a Retry-After", what, err)
		}
	}
	r, err := apply(reserve("done", "owner-done-000001"))
	mustOK("reserve", r, err, fsm.OutcomeAcquired)
	r, err = apply(complete("done", "owner-done-000001"))
	mustOK("complete", r, err, fsm.OutcomeOK)
	r, err = apply(reserve("held", "owner-held-000001"))
	mustOK("reserve", r, err, fsm.OutcomeAcquired)

	free.Store(10 << 20)
	probe := 0
	testutil.Eventually(t, 5*time.Second, "the sampler to see the full disk", func() (bool, string) {
		probe++ // a new key each time: the ones admitted before the sample are held
		_, err := apply(reserve(fmt.Sprintf("probe-%d", probe), "owner-probe-00001"))
		return err != nil, errString(err)
	})
	r, err = apply(reserve("new", "owner-new-0000001"))
	refused("reserve of a new key", r, err)
	r, err = apply(complete("held", "owner-held-000001"))
	refused("complete", r, err)
	r, err = apply(reserve("done", "owner-other-00001"))
	mustOK("replay", r, err, fsm.OutcomeCompleted)
	r, err = apply(reserve("held", "owner-other-00001"))
	mustOK("reserve of a held key", r, err, fsm.OutcomeInProgress)
	r, err = apply(fsm.Command{Op: fsm.OpHeartbeat, Namespace: "ns", Key: "held", OwnerToken: "owner-held-000001", Lease: int64(time.Minute)})
	mustOK("heartbeat", r, err, fsm.OutcomeOK)
	if _, ok, err := n.Get(ctx, "ns", "done"); !ok || err != nil {
		t.Fatalf("read with a full disk: %v %v", ok, err)
	}
	if err := n.Ready(ctx); err != nil {
		t.Fatalf("not ready with a full disk: %v", err)
	}
	r, err = apply(fsm.Command{Op: fsm.OpRelease, Namespace: "ns", Key: "held", OwnerToken: "owner-held-000001"})
	mustOK("release", r, err, fsm.OutcomeOK)

	free.Store(1 << 30)
	testutil.Eventually(t, 5*time.Second, "writes to resume", func() (bool, string) {
		r, err := apply(reserve("new", "owner-new-0000001"))
		return err == nil && r.Outcome == fsm.OutcomeAcquired, errString(err)
	})
}
