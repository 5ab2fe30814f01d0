package httpidem

import (
	"context"
	"sync/atomic"
	"time"
)

// Lease is what a handler learns about the reservation it runs under.
type Lease struct {
	Namespace string
	Key       string
	// FencingToken grows strictly with every acquisition of the key; it is
	// also sent as the Idempotency-Fencing-Token request header.
	FencingToken uint64
	// Reclaimed reports that an earlier attempt's lease ran out before it
	// finished: it may have done part of the work.
	Reclaimed bool
	// PreviousFencingToken is that earlier attempt's token (when Reclaimed).
	PreviousFencingToken uint64
	// ExpiresAt is the lease's end when the handler started, by the store's
	// clock; it is renewed while the handler runs.
	ExpiresAt time.Time
	// OwnerToken is the reservation's owner token. Only code that keeps the
	// lease itself sets or needs it (the engine leaves it empty: the
	// handler must not complete or release the key behind its back).
	OwnerToken string
}

type runKey struct{}

// runState travels in the handler's context.
type runState struct {
	lease        Lease
	forceRelease atomic.Bool
}

// WithLease returns ctx carrying l, for LeaseFromContext.
func WithLease(ctx context.Context, l Lease) context.Context {
	return context.WithValue(ctx, runKey{}, &runState{lease: l})
}

// LeaseFromContext returns the lease a handler runs under, or false outside a
// keyed request.
func LeaseFromContext(ctx context.Context) (Lease, bool) {
	st, ok := ctx.Value(runKey{}).(*runState)
	if !ok {
		return Lease{}, false
	}
	return st.lease, true
}

// ForceRelease makes the engine release the key after the handler of ctx's
// request returns, whatever its status: the response is an error of the
// path to the work (the proxy's 502 and 504), not the work's answer. Outside
// a keyed request it does nothing.
func ForceRelease(ctx context.Context) {
	if st, ok := ctx.Value(runKey{}).(*runState); ok {
		st.forceRelease.Store(true)
	}
}
