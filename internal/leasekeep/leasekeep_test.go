package leasekeep

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"
)

var (
	errNotOwner  = errors.New("not the owner")
	errLeaseLost = errors.New("lease lost")
)

// keep runs Keep over renew until it returns and is the cause it cancelled
// with (nil when it did not).
func keep(t *testing.T, renew func(ctx context.Context) error) error {
	t.Helper()
	ctx, lost := context.WithCancelCause(context.Background())
	defer lost(nil)
	Keep(ctx, lost, Lease{
		Length:       time.Hour,
		Interval:     time.Millisecond,
		End:          time.Now().Add(time.Hour),
		Renew:        renew,
		ErrNotOwner:  errNotOwner,
		ErrLeaseLost: errLeaseLost,
		Taken:        "lease lost: another holder has the key",
		Log:          slog.New(slog.DiscardHandler),
	})
	return context.Cause(ctx)
}

func TestNotOwnerLosesTheLease(t *testing.T) {
	renewals := 0
	cause := keep(t, func(context.Context) error {
		renewals++
		if renewals < 3 {
			return nil
		}
		return errNotOwner
	})
	if !errors.Is(cause, errLeaseLost) || !errors.Is(cause, errNotOwner) || renewals != 3 {
		t.Fatalf("after %d renewals the cause is %v; want the lease lost on the third, for NOT_OWNER", renewals, cause)
	}
}

func TestFailuresUntilTheEndLoseTheLease(t *testing.T) {
	failed := errors.New("unavailable")
	ctx, lost := context.WithCancelCause(context.Background())
	defer lost(nil)
	Keep(ctx, lost, Lease{
		Length:       time.Hour,
		Interval:     time.Millisecond,
		End:          time.Now(), // already over: the first failure is the last
		Renew:        func(context.Context) error { return failed },
		ErrNotOwner:  errNotOwner,
		ErrLeaseLost: errLeaseLost,
		Log:          slog.New(slog.DiscardHandler),
	})
	if cause := context.Cause(ctx); !errors.Is(cause, errLeaseLost) || !errors.Is(cause, failed) {
		t.Fatalf("cause %v; want the lease lost with the renewal's error", cause)
	}
}

func TestEndOfContextStopsQuietly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	lostCalled := false
	Keep(ctx, func(error) { lostCalled = true }, Lease{
		Length:   time.Hour,
		Interval: time.Millisecond,
		End:      time.Now().Add(time.Hour),
		Renew: func(context.Context) error {
			cancel()
			return context.Canceled
		},
		ErrNotOwner:  errNotOwner,
		ErrLeaseLost: errLeaseLost,
		Log:          slog.New(slog.DiscardHandler),
	})
	if lostCalled {
		t.Fatal("Keep reported the lease lost when its context ended")
	}
}
