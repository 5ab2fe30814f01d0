package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/internal/leasekeep"
)

// Defaults of Do's options.
const (
	// DefaultLease is the lease Do reserves with; fn's lease is renewed every
	// third of it while fn runs.
	DefaultLease = 30 * time.Second
	// DefaultMaxWait is how long Do waits for another owner of the key to
	// finish before it returns ErrInProgress.
	DefaultMaxWait = 10 * time.Second
	// MaxWait is the longest one reserve may wait in the store for another
	// owner (the contract's wait_ms bound); Do waits longer in several
	// reserves.
	MaxWait = contract.MaxWait

	// While waiting for another owner, Do polls first after minPoll, doubling
	// up to maxPoll, and never later than the store's RetryAfter hint.
	minPoll = 20 * time.Millisecond
	maxPoll = time.Second
)

// Lease is what fn learns about its hold on the key.
type Lease struct {
	// FencingToken grows strictly with every acquisition of the key. Hand it to
	// the systems fn writes to, so they can refuse a write from an owner that
	// was replaced after its lease ran out.
	FencingToken uint64
	// Reclaimed reports that an earlier owner's lease ran out before it
	// completed: that attempt may have done part of the work.
	Reclaimed bool
	// PreviousFencingToken is the fencing token of that earlier owner
	// (when Reclaimed).
	PreviousFencingToken uint64
	// OwnerToken is the token Do reserved with.
	OwnerToken string
	// ExpiresAt is the lease's end when fn started (by the store's clock); Do
	// keeps extending it while fn runs.
	ExpiresAt time.Time
	// Resume (when Reclaimed) is the last checkpoint an earlier attempt
	// stored with Lease.Checkpoint: the step it reached. nil when none did.
	Resume *Checkpoint

	c              *Client
	namespace, key string
}

// Checkpoint stores a recovery point of this attempt (name: the step just
// completed, 1-64 chars of [A-Za-z0-9_.-]; data: at most 64 KiB of what a
// later attempt needs to resume). If this attempt dies, the one that
// reclaims the key gets it as Lease.Resume. ErrNotOwner when the lease was
// lost.
func (l Lease) Checkpoint(ctx context.Context, name string, data []byte) error {
	if l.c == nil {
		return invalid("checkpoint: this Lease does not come from Do")
	}
	_, err := l.c.Checkpoint(ctx, CheckpointRequest{Namespace: l.namespace, Key: l.key, OwnerToken: l.OwnerToken, Name: name, Data: data})
	return err
}

// Result is the response of a key that Do completed or replayed.
type Result struct {
	// Response is what fn returned, or the stored response when Replayed.
	Response Response
	// Replayed reports that the key was completed before (by this or another
	// process) and fn did not run.
	Replayed bool
	// FencingToken of the owner that completed the key.
	FencingToken uint64
	// CompletedAt and ExpiresAt: when the key was completed and when the
	// store forgets it.
	CompletedAt time.Time
	ExpiresAt   time.Time
}

// DoOption adjusts one Do call.
type DoOption func(*doOptions)

type doOptions struct {
	fingerprint    string
	lease          time.Duration
	retention      time.Duration
	maxWait        time.Duration
	acquireExpired bool
}

// WithAcquireExpired makes Do run fn for a key whose response expired (a
// tombstone: the work was done long ago) instead of returning ErrExpired.
func WithAcquireExpired() DoOption {
	return func(o *doOptions) { o.acquireExpired = true }
}

// WithFingerprint sets the fingerprint of the request the key stands for
// (0-256 chars, typically a hash of method, path and body). A key in use with
// another fingerprint makes Do return ErrFingerprintMismatch.
func WithFingerprint(fingerprint string) DoOption {
	return func(o *doOptions) { o.fingerprint = fingerprint }
}

// WithLease sets the lease (100ms..10m, whole milliseconds; default
// DefaultLease). Do renews it every third while fn runs; if fn's process
// dies, another caller can take the key over this long (plus the store's
// clock-skew margin) after the last renewal.
func WithLease(lease time.Duration) DoOption {
	return func(o *doOptions) { o.lease = lease }
}

// WithRetention sets how long the completed response is kept (1s..30 days,
// whole seconds; zero means the store's default, 24 h).
func WithRetention(retention time.Duration) DoOption {
	return func(o *doOptions) { o.retention = retention }
}

// WithMaxWait sets how long Do waits while another owner holds the key
// before it returns ErrInProgress (default DefaultMaxWait; zero returns
// ErrInProgress at once). The context's deadline bounds the wait too.
func WithMaxWait(maxWait time.Duration) DoOption {
	return func(o *doOptions) { o.maxWait = maxWait }
}

// PermanentError marks a failure of fn as final; see Permanent.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks fn's error as final: instead of releasing the key, Do
// completes it with the Response fn returned alongside the error (for
// example a 422 for a request that will never succeed), so every later Do
// with the key replays that response instead of running again. Permanent(nil)
// is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// Do runs fn at most once to completion for (namespace, key), across every
// process and retry that uses the key:
//
//   - Do reserves the key. If it was completed before, Do returns the stored
//     response with Result.Replayed set, and fn does not run.
//   - If another owner holds it, Do waits for that owner to finish (see
//     WithMaxWait), then replays its response, or returns ErrInProgress.
//   - If the key is in use with another fingerprint, Do returns
//     ErrFingerprintMismatch.
//   - Otherwise Do owns the key and runs fn, renewing the lease every third
//     of it. fn's context is cancelled, with cause ErrLeaseLost
//     (context.Cause), if the lease is lost: a renewal answers NOT_OWNER, or
//     renewals fail until the lease runs out.
//
// When fn returns without error, Do completes the key with fn's Response, so
// later calls replay it. When fn returns an error, Do releases the key, so the
// next call runs fn again, and returns fn's error (wrapped with ErrLeaseLost
// if the lease was lost); the default is thus "retry on any error". An error
// marked Permanent instead completes the key with fn's Response, and Do
// returns that Result together with fn's error.
//
// Completing or releasing happens even when ctx ends while fn runs, within
// Config.RequestTimeout. If completing answers NOT_OWNER (the lease was lost
// and somebody else took the key), Do returns ErrLeaseLost: fn's effects may
// be repeated by the new owner, which sees Lease.Reclaimed. If completing
// fails without a decision (ErrUnavailable), the key is left reserved, so the
// next owner reclaims it once the lease ends and learns that an earlier
// attempt ran. If fn panics, Do releases the key and lets the panic go on.
func (c *Client) Do(ctx context.Context, namespace, key string, fn func(ctx context.Context, l Lease) (Response, error), opts ...DoOption) (Result, error) {
	o := doOptions{lease: DefaultLease, maxWait: DefaultMaxWait}
	for _, opt := range opts {
		opt(&o)
	}
	if o.lease == 0 {
		o.lease = DefaultLease
	}
	var errs []error
	if fn == nil {
		errs = append(errs, invalid("do %s/%s: fn is nil", namespace, key))
	}
	if o.maxWait < 0 {
		errs = append(errs, invalid("do %s/%s: max wait %v is negative", namespace, key, o.maxWait))
	}
	_, err := retentionSeconds(o.retention)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return Result{}, err
	}

	// One owner token for the whole call: a retried or repeated reserve is
	// the same reservation.
	token := NewOwnerToken()
	waitUntil := time.Now().Add(o.maxWait)
	poll := minPoll
	// The first reserve answers at once; while another owner holds the key,
	// each next reserve waits in the store (up to MaxWait, and what is left
	// of maxWait), which wakes it when the owner completes or releases.
	var storeWait time.Duration
	for {
		sentAt := time.Now()
		res, err := c.Reserve(ctx, ReserveRequest{
			Namespace:   namespace,
			Key:         key,
			Fingerprint: o.fingerprint,
			Lease:       o.lease,
			OwnerToken:  token,
			Wait:        storeWait,

			IfExpiredAcquire: o.acquireExpired,
		})
		if err != nil {
			return Result{}, err
		}
		switch res.Outcome {
		case OutcomeCompleted:
			return Result{
				Response:     *res.Response,
				Replayed:     true,
				FencingToken: res.FencingToken,
				CompletedAt:  res.CompletedAt,
				ExpiresAt:    res.ExpiresAt,
			}, nil
		case OutcomeFingerprintMismatch:
			return Result{}, fmt.Errorf("%w: %s/%s is in use for another request", ErrFingerprintMismatch, namespace, key)
		case OutcomeExpired:
			return Result{FencingToken: res.FencingToken, CompletedAt: res.CompletedAt, ExpiresAt: res.ExpiredAt},
				fmt.Errorf("%w: %s/%s was completed at %v; its response expired at %v", ErrExpired, namespace, key, res.CompletedAt, res.ExpiredAt)
		case OutcomeAcquired, OutcomeReclaimed:
			return c.runOwned(ctx, namespace, key, res, sentAt, fn, o)
		case OutcomeInProgress:
			remaining := time.Until(waitUntil)
			if remaining < time.Millisecond {
				return Result{}, fmt.Errorf("%w: %s/%s is held by another owner whose lease ends at %v; waited %v", ErrInProgress, namespace, key, res.LeaseExpiresAt, o.maxWait)
			}
			asked := storeWait
			storeWait = min(remaining.Truncate(time.Millisecond), MaxWait)
			if asked == 0 || time.Since(sentAt) >= asked/2 {
				continue // the store waited (or was not asked to): ask it to wait again
			}
			// The store answered well before the wait it was asked for, still
			// IN_PROGRESS (an owner that renewed its lease at the moment it
			// could have been reclaimed, or a store without waiting): pause as
			// a poller would, so that this never turns into a tight loop.
			wait := min(poll, remaining)
			if res.RetryAfter > 0 {
				wait = min(wait, res.RetryAfter)
			}
			poll = min(2*poll, maxPoll)
			// Jitter, so that waiters woken together do not poll together.
			wait = wait/2 + rand.N(wait/2+1)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return Result{}, fmt.Errorf("client: do %s/%s: waiting for another owner: %w", namespace, key, context.Cause(ctx))
			case <-t.C:
			}
		default:
			return Result{}, fmt.Errorf("client: do %s/%s: unexpected outcome %v", namespace, key, res.Outcome)
		}
	}
}

// runOwned runs fn while holding the key, then completes or releases it.
func (c *Client) runOwned(ctx context.Context, namespace, key string, res Reservation, sentAt time.Time, fn func(context.Context, Lease) (Response, error), o doOptions) (Result, error) {
	lease := Lease{
		FencingToken:         res.FencingToken,
		Reclaimed:            res.Outcome == OutcomeReclaimed,
		PreviousFencingToken: res.PreviousFencingToken,
		OwnerToken:           res.OwnerToken,
		ExpiresAt:            res.LeaseExpiresAt,
		Resume:               res.Checkpoint,
		c:                    c,
		namespace:            namespace,
		key:                  key,
	}
	fnCtx, cancelFn := context.WithCancelCause(ctx)
	defer cancelFn(nil)
	hbCtx, stopHeartbeats := context.WithCancel(fnCtx)
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		// The lease counts from the store's apply, which comes after sentAt:
		// measured from sentAt by our clock, it ends early, never late.
		c.keepLease(hbCtx, cancelFn, namespace, key, res.OwnerToken, o.lease, sentAt.Add(o.lease))
	}()
	stop := func() {
		stopHeartbeats()
		<-hbDone
	}

	// The work is done or abandoned by now; record that even if the caller
	// gave up on ctx meanwhile, or the key stays blocked until its lease ends.
	finishCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), c.cfg.RequestTimeout)
	}
	release := func() {
		rctx, cancel := finishCtx()
		defer cancel()
		err := c.Release(rctx, ReleaseRequest{Namespace: namespace, Key: key, OwnerToken: res.OwnerToken})
		if err != nil && !errors.Is(err, ErrNotOwner) {
			c.log.Warn("release failed; the key stays reserved until its lease runs out", "namespace", namespace, "key", key, "err", err)
		}
	}

	returned := false
	defer func() {
		if !returned { // fn panicked
			stop()
			release()
		}
	}()
	resp, fnErr := fn(fnCtx, lease)
	returned = true
	stop()
	lost := errors.Is(context.Cause(fnCtx), ErrLeaseLost)

	var permanent *PermanentError
	if fnErr != nil && !errors.As(fnErr, &permanent) {
		release()
		if lost {
			return Result{}, fmt.Errorf("%w: %s/%s: %w", ErrLeaseLost, namespace, key, fnErr)
		}
		return Result{}, fnErr
	}

	cctx, cancel := finishCtx()
	defer cancel()
	comp, err := c.Complete(cctx, CompleteRequest{
		Namespace:  namespace,
		Key:        key,
		OwnerToken: res.OwnerToken,
		Response:   resp,
		Retention:  o.retention,
	})
	switch {
	case err == nil:
		return Result{
			Response:     resp,
			FencingToken: lease.FencingToken,
			CompletedAt:  comp.CompletedAt,
			ExpiresAt:    comp.ExpiresAt,
		}, fnErr
	case errors.Is(err, ErrNotOwner):
		return Result{}, fmt.Errorf("%w: %s/%s: another owner took the key while fn ran: %w", ErrLeaseLost, namespace, key, err)
	case errors.Is(err, ErrInvalidArgument), errors.Is(err, ErrPayloadTooLarge):
		release()
		return Result{}, errors.Join(fmt.Errorf("client: do %s/%s: fn's response cannot be stored, so the key was released: %w", namespace, key, err), fnErr)
	default:
		return Result{}, errors.Join(fmt.Errorf("client: do %s/%s: fn finished but completing failed; the key stays reserved until its lease runs out, and the next owner reclaims it: %w", namespace, key, err), fnErr)
	}
}

// keepLease renews the lease every third of its length until ctx ends. It
// cancels fn's context with ErrLeaseLost when a renewal answers NOT_OWNER, or
// when renewals keep failing until localEnd, the lease's end by our clock.
func (c *Client) keepLease(ctx context.Context, lost context.CancelCauseFunc, namespace, key, token string, lease time.Duration, localEnd time.Time) {
	leasekeep.Keep(ctx, lost, leasekeep.Lease{
		Length:   lease,
		Interval: lease / 3,
		End:      localEnd,
		Renew: func(ctx context.Context) error {
			_, err := c.Heartbeat(ctx, HeartbeatRequest{Namespace: namespace, Key: key, OwnerToken: token, Lease: lease})
			return err
		},
		ErrNotOwner:  ErrNotOwner,
		ErrLeaseLost: ErrLeaseLost,
		Taken:        "lease lost: another owner holds the key",
		Log:          c.log.With("namespace", namespace, "key", key),
	})
}
