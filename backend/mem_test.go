package backend

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem/fsm"
)

func TestMemStampsAndApplies(t *testing.T) {
	now := int64(1_000_000_000)
	m := NewMem(MemConfig{Now: func() int64 { return now }, SkewMargin: 2 * time.Second})
	ctx := context.Background()
	res, err := m.Apply(ctx, &fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: "k", OwnerToken: "tok_0123456789abcdef", Lease: int64(time.Second)})
	if err != nil || res.Outcome != fsm.OutcomeAcquired {
		t.Fatalf("reserve = %v, %v", res.Outcome, err)
	}
	if c := m.LastCommand(); c.Now != now || c.SkewMargin != int64(2*time.Second) {
		t.Fatalf("not stamped as a proposer does: %+v", c)
	}
	res, _ = m.Apply(ctx, &fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: "k", OwnerToken: "another-owner-token0", Lease: int64(time.Second)})
	if res.Outcome != fsm.OutcomeInProgress {
		t.Fatalf("second owner = %v, want IN_PROGRESS", res.Outcome)
	}
	if rec, ok, _ := m.Get(ctx, "ns", "k"); !ok || rec.State != fsm.StateInProgress {
		t.Fatalf("Get = %+v, %v", rec, ok)
	}
	if res, _ := m.Apply(ctx, &fsm.Command{Op: fsm.OpRelease, Namespace: "ns", Key: "k", OwnerToken: "x", Now: 1}); res.Outcome != fsm.OutcomeInvalid {
		t.Fatalf("a command stamped by the caller = %v, want INVALID", res.Outcome)
	}
	if m.Calls(fsm.OpReserve) != 2 {
		t.Fatalf("Calls(reserve) = %d", m.Calls(fsm.OpReserve))
	}
}

func TestMemFaults(t *testing.T) {
	m := NewMem(MemConfig{})
	ctx := context.Background()
	m.SetApplyError(func(*fsm.Command) error { return &UnavailableError{Reason: "test"} })
	if _, err := m.Apply(ctx, &fsm.Command{Op: fsm.OpRelease}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Apply = %v, want ErrUnavailable", err)
	}
	m.SetApplyError(nil)
	if _, err := m.Apply(ctx, &fsm.Command{Op: fsm.OpRelease, Namespace: "ns", Key: "k", OwnerToken: "tok_0123456789abcdef"}); err != nil {
		t.Fatal(err)
	}
	m.SetReady(errors.New("warming up"))
	if m.Ready(ctx) == nil {
		t.Fatal("Ready = nil after SetReady(err)")
	}
}

func TestNotLeaderIsUnavailable(t *testing.T) {
	var err error = &NotLeaderError{Shard: "us-0", Leader: "us-2"}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatal("NotLeaderError does not unwrap to ErrUnavailable")
	}
	var nle *NotLeaderError
	if !errors.As(err, &nle) || nle.Leader != "us-2" {
		t.Fatal("leader hint lost")
	}
}
