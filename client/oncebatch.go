package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// OnceResult is what OnceBatch did for one event: Ran and Err as Once
// returns them.
type OnceResult struct {
	Ran bool
	Err error
}

// OnceBatch is Once for a consumer that receives events in batches (a Kafka
// poll, an SQS receive of ten messages): it returns one result per event of
// eventIDs, in order, each meaning what Once's would, with far fewer round
// trips than one Once per event:
//
//  1. it reserves every event in one ReserveMany;
//  2. it runs fn for the acquired events one after the other, in the order
//     of eventIDs, keeping all their leases alive until they are recorded;
//  3. it records the events fn finished (nil, or a Permanent error) in one
//     CompleteMany, and releases at once each event whose fn failed, so a
//     redelivery runs it again;
//  4. events recorded as done before replay (Ran false, Err nil, or a
//     *PermanentError), and each event another consumer was running when
//     the batch was reserved goes through Once afterwards, concurrently (it
//     waits for that consumer, up to DefaultMaxWait): fn may run for those
//     concurrently, and must be safe for it.
//
// An event listed twice runs at most once: the second copy replays the
// first's result. An error reserving or recording an event is that event's
// Err alone.
func (c *Client) OnceBatch(ctx context.Context, namespace string, eventIDs []string, fn func(ctx context.Context, eventID string, fencingToken uint64) error) []OnceResult {
	if unique, back, dup := dedupeEvents(eventIDs); dup {
		// Each event once, in first-occurrence order; a later copy gets
		// its first copy's result without having run (whatever order the
		// store would have applied two copies sent in one batch in).
		ur := c.OnceBatch(ctx, namespace, unique, fn)
		out := make([]OnceResult, len(eventIDs))
		seen := make([]bool, len(unique))
		for i, j := range back {
			out[i] = ur[j]
			if seen[j] {
				out[i].Ran = false
			}
			seen[j] = true
		}
		return out
	}
	results := make([]OnceResult, len(eventIDs))
	if fn == nil {
		for i, id := range eventIDs {
			results[i].Err = invalid("once %s/%s: fn is nil", namespace, id)
		}
		return results
	}
	reqs := make([]ReserveRequest, len(eventIDs))
	for i, id := range eventIDs {
		reqs[i] = ReserveRequest{Key: id, Lease: DefaultLease}
	}
	sentAt := time.Now()
	reserved := c.ReserveMany(ctx, namespace, reqs)

	// Keep the leases of every acquired event until it is recorded: fn runs
	// for them one after the other, and they are completed together.
	var owned []int
	var waitFor []int
	for i, r := range reserved {
		if r.Err != nil {
			results[i].Err = r.Err
			continue
		}
		switch r.Outcome {
		case OutcomeAcquired, OutcomeReclaimed:
			owned = append(owned, i)
		case OutcomeCompleted:
			results[i].Err = onceReplay(namespace, eventIDs[i], r.Response)
		case OutcomeFingerprintMismatch:
			results[i].Err = fmt.Errorf("%w: %s/%s is in use for another request", ErrFingerprintMismatch, namespace, eventIDs[i])
		case OutcomeInProgress:
			waitFor = append(waitFor, i)
		default:
			results[i].Err = fmt.Errorf("client: once %s/%s: unexpected outcome %v", namespace, eventIDs[i], r.Outcome)
		}
	}

	leases := make(map[int]*heldLease, len(owned))
	for _, i := range owned {
		leases[i] = c.holdLease(ctx, namespace, eventIDs[i], reserved[i].OwnerToken, sentAt)
	}
	finishCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.RequestTimeout)
	defer cancel()
	var done []int
	var completes []CompleteRequest
	for _, i := range owned {
		l := leases[i]
		results[i].Ran = true
		ferr := runOnceFn(l.ctx, fn, eventIDs[i], reserved[i].FencingToken)
		var permanent *PermanentError
		switch {
		case ferr == nil:
			completes = append(completes, CompleteRequest{Key: eventIDs[i], OwnerToken: l.token, Response: Response{Status: onceDone}})
		case errors.As(ferr, &permanent):
			results[i].Err = ferr
			completes = append(completes, CompleteRequest{Key: eventIDs[i], OwnerToken: l.token, Response: Response{Status: onceFailed, Body: []byte(truncateMessage(ferr.Error()))}})
		default:
			l.stop()
			results[i].Err = ferr
			if errors.Is(context.Cause(l.ctx), ErrLeaseLost) {
				results[i].Err = fmt.Errorf("%w: %s/%s: %w", ErrLeaseLost, namespace, eventIDs[i], ferr)
			}
			if err := c.Release(finishCtx, ReleaseRequest{Namespace: namespace, Key: eventIDs[i], OwnerToken: l.token}); err != nil && !errors.Is(err, ErrNotOwner) {
				c.log.Warn("release failed; the event stays reserved until its lease runs out", "namespace", namespace, "key", eventIDs[i], "err", err)
			}
			continue
		}
		done = append(done, i)
	}
	if len(completes) > 0 {
		recorded := c.CompleteMany(finishCtx, namespace, completes)
		for k, i := range done {
			leases[i].stop()
			switch err := recorded[k].Err; {
			case err == nil:
			case errors.Is(err, ErrNotOwner):
				results[i].Err = fmt.Errorf("%w: %s/%s: another owner took the event while fn ran: %w", ErrLeaseLost, namespace, eventIDs[i], err)
			default:
				results[i].Err = errors.Join(fmt.Errorf("client: once %s/%s: fn finished but recording it failed; a redelivery may run fn again once the lease runs out: %w", namespace, eventIDs[i], err), results[i].Err)
			}
		}
	}
	for _, l := range leases {
		l.stop()
	}

	var wg sync.WaitGroup
	for _, i := range waitFor {
		wg.Go(func() {
			ran, err := c.Once(ctx, namespace, eventIDs[i], func(ctx context.Context, token uint64) error {
				return fn(ctx, eventIDs[i], token)
			})
			results[i] = OnceResult{Ran: ran, Err: err}
		})
	}
	wg.Wait()
	return results
}

// runOnceFn runs fn, turning a panic into the event's error: the other
// events of the batch still get their leases released or recorded.
func runOnceFn(ctx context.Context, fn func(ctx context.Context, eventID string, fencingToken uint64) error, id string, token uint64) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("client: once %s: fn panicked: %v", id, p)
		}
	}()
	return fn(ctx, id, token)
}

// onceReplay is Once's answer to an event recorded before.
func onceReplay(namespace, id string, r *Response) error {
	if r != nil && r.Status == onceFailed {
		return &PermanentError{Err: fmt.Errorf("client: event %s/%s failed permanently before: %s", namespace, id, r.Body)}
	}
	return nil
}

func truncateMessage(msg string) string {
	if len(msg) > onceMaxMessage {
		return msg[:onceMaxMessage]
	}
	return msg
}

// heldLease is a lease kept alive by heartbeats until stop; ctx is
// cancelled with ErrLeaseLost when it is lost.
type heldLease struct {
	ctx   context.Context
	token string
	once  sync.Once
	stopF func()
}

func (l *heldLease) stop() { l.once.Do(l.stopF) }

// holdLease renews the lease of (namespace, key), reserved with token at
// sentAt for DefaultLease, until stop.
func (c *Client) holdLease(ctx context.Context, namespace, key, token string, sentAt time.Time) *heldLease {
	fnCtx, cancelFn := context.WithCancelCause(ctx)
	hbCtx, stopHeartbeats := context.WithCancel(fnCtx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.keepLease(hbCtx, cancelFn, namespace, key, token, DefaultLease, sentAt.Add(DefaultLease))
	}()
	return &heldLease{ctx: fnCtx, token: token, stopF: func() {
		stopHeartbeats()
		<-done
		cancelFn(nil)
	}}
}

// dedupeEvents returns the distinct event ids in first-occurrence order,
// the index into them of every position of ids, and whether any id repeats.
func dedupeEvents(ids []string) (unique []string, back []int, dup bool) {
	first := make(map[string]int, len(ids))
	back = make([]int, len(ids))
	for i, id := range ids {
		j, ok := first[id]
		if !ok {
			j = len(unique)
			first[id] = j
			unique = append(unique, id)
		} else {
			dup = true
		}
		back[i] = j
	}
	return unique, back, dup
}
