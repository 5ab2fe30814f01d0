// Package leasekeep is the heartbeat loop that keeps a reserved key's lease
// while the work it guards runs: the one loop behind client's Do and Once
// and httpidem's engine (the middleware and the proxy). It imports nothing
// of idem, so the public client and httpidem may both use it.
package leasekeep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Lease is one reserved key's lease and how to renew it.
type Lease struct {
	// Length is what one renewal grants, counted from the moment it was sent.
	Length time.Duration
	// Interval is the time between renewals; a failed renewal is retried
	// after a quarter of it, and never past End.
	Interval time.Duration
	// End is the lease's end by our clock; each renewal that succeeds moves
	// it to the renewal's send time plus Length.
	End time.Time
	// Timeout bounds one renewal (and End always does); 0 for End alone.
	Timeout time.Duration
	// Renew sends one renewal.
	Renew func(ctx context.Context) error
	// ErrNotOwner is what Renew's error wraps when another holder has the
	// key, and ErrLeaseLost what the cause Keep cancels with wraps.
	ErrNotOwner, ErrLeaseLost error
	// Taken is the warning logged when a renewal answers ErrNotOwner.
	Taken string
	// Log takes the warnings of failed renewals.
	Log *slog.Logger
}

// Keep renews l every l.Interval until ctx ends. It calls lost with a cause
// that wraps l.ErrLeaseLost, and returns, when a renewal answers
// l.ErrNotOwner or when renewals keep failing until l.End.
func Keep(ctx context.Context, lost context.CancelCauseFunc, l Lease) {
	localEnd := l.End
	t := time.NewTimer(l.Interval)
	defer t.Stop()
	for fired(ctx, t) {
		sentAt := time.Now()
		deadline := localEnd
		if l.Timeout > 0 && sentAt.Add(l.Timeout).Before(deadline) {
			deadline = sentAt.Add(l.Timeout)
		}
		callCtx, cancel := context.WithDeadline(ctx, deadline)
		err := l.Renew(callCtx)
		cancel()
		switch {
		case err == nil:
			localEnd = sentAt.Add(l.Length)
			t.Reset(l.Interval)
		case ctx.Err() != nil:
			return
		case errors.Is(err, l.ErrNotOwner):
			l.Log.Warn(l.Taken, "err", err)
			lost(fmt.Errorf("%w: heartbeat: %w", l.ErrLeaseLost, err))
			return
		case !time.Now().Before(localEnd):
			l.Log.Warn("lease lost: heartbeats failed until the lease ran out", "err", err)
			lost(fmt.Errorf("%w: heartbeats failed until the lease ran out: %w", l.ErrLeaseLost, err))
			return
		default:
			l.Log.Warn("heartbeat failed; retrying", "err", err)
			t.Reset(max(min(l.Interval/4, time.Until(localEnd)), time.Millisecond))
		}
	}
}

// fired waits for t and is false when ctx ends first.
func fired(ctx context.Context, t *time.Timer) bool {
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
