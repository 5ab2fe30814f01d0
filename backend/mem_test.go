package backend

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/testutil"
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

// A waiting reserve charges each proposal after its first (WithCharge): a
// wake-up with a charge left proposes again; a refused charge ends the wait
// with the refusal, and nothing is proposed.
func TestWaitingReserveChargesItsWakeUps(t *testing.T) {
	now := int64(1_000_000_000)
	m := NewMem(MemConfig{Now: func() int64 { return now }})
	refused := &Error{Code: "RESOURCE_EXHAUSTED", Message: "over the rate"}
	charges := 0
	ctx := WithCharge(t.Context(), func() error {
		charges++
		if charges > 1 {
			return refused
		}
		return nil
	})
	reserve := func(ctx context.Context, owner string, wait time.Duration) (fsm.Result, error) {
		return m.Apply(ctx, &fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: "k", OwnerToken: owner, Lease: int64(time.Hour), Wait: int64(wait)})
	}
	type answer struct {
		res fsm.Result
		err error
	}
	for round, want := range []struct {
		holder, waiter string
		outcome        fsm.Outcome
		err            error
	}{
		{"holder-token-0123456789", "waiter-token-0123456789", fsm.OutcomeAcquired, nil},
		{"waiter-token-0123456789", "second-token-0123456789", fsm.Outcome(0), refused},
	} {
		if round == 0 {
			if res, err := reserve(t.Context(), want.holder, 0); err != nil || res.Outcome != fsm.OutcomeAcquired {
				t.Fatalf("holder: %v %v", res.Outcome, err)
			}
		}
		got := make(chan answer, 1)
		go func() {
			res, err := reserve(ctx, want.waiter, 10*time.Second)
			got <- answer{res, err}
		}()
		testutil.Until(t, 10*time.Second, "the reserve to wait", func() bool { return m.Waiters().Stats().Waiting == 1 })
		if res, err := m.Apply(t.Context(), &fsm.Command{Op: fsm.OpRelease, Namespace: "ns", Key: "k", OwnerToken: want.holder}); err != nil || res.Outcome != fsm.OutcomeOK {
			t.Fatalf("round %d: release: %v %v", round, res.Outcome, err)
		}
		a := <-got
		if a.res.Outcome != want.outcome || !errors.Is(a.err, want.err) {
			t.Fatalf("round %d: woken reserve = %v, %v; want %v, %v", round, a.res.Outcome, a.err, want.outcome, want.err)
		}
		if charges != round+1 {
			t.Fatalf("round %d: %d charges, want %d (one per wake-up)", round, charges, round+1)
		}
	}
	if _, found, _ := m.Get(t.Context(), "ns", "k"); found {
		t.Fatal("the refused wake-up proposed anyway: the key is held")
	}
}
