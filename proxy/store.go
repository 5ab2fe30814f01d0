package proxy

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/httpidem"
	"github.com/idem-dev/idem/internal/wire"
)

// Store is the idempotency store the proxy reserves, heartbeats, completes
// and releases keys in. BackendStore adapts the backend.Backend of an
// idemrouter or idemnode process; any other implementation must map its
// failures onto httpidem's errors (see httpidem.Store).
type Store = httpidem.Store

// The types of Store's methods.
type (
	// Ref names a reservation: namespace, key and owner token.
	Ref = httpidem.Ref
	// ReserveRequest is a reserve: Ref, fingerprint and lease.
	ReserveRequest = httpidem.ReserveRequest
	// Reservation is the store's answer to a reserve.
	Reservation = httpidem.Reservation
	// Response is a stored response.
	Response = httpidem.Response
	// Completion is the store's answer to a complete.
	Completion = httpidem.Completion
	// Outcome is a reserve's outcome.
	Outcome = contract.Outcome
)

// backendAttempts bounds how often BackendStore tries one call that failed
// without a decision; the backend (router forwarding) already tries every
// voter of the shard within its own deadline.
const backendAttempts = 3

// BackendStore adapts a backend.Backend (the router's forwarding backend, or
// a node) to Store. Commands carry the proxy's owner token, lease and
// retention in nanoseconds; the backend stamps the time and the clock-skew
// margin as it does for the public API. A call that fails without a decision
// (UNAVAILABLE, a deadline) is retried, up to three attempts within the
// context's deadline, with the same owner token: a reserve, heartbeat or
// complete is the same call again, and a release whose retry answers
// NOT_OWNER after an undecided attempt counts as done. The response body's
// size is not checked here: the proxy keeps bodies within
// Config.MaxStoredBodyBytes, and stores without the body if the backend
// still refuses it as too large.
func BackendStore(b backend.Backend) Store { return &backendStore{b: b} }

type backendStore struct{ b backend.Backend }

func (s *backendStore) Reserve(ctx context.Context, req ReserveRequest) (Reservation, error) {
	cmd := &fsm.Command{
		Op:          fsm.OpReserve,
		Namespace:   req.Namespace,
		Key:         req.Key,
		Fingerprint: req.Fingerprint,
		OwnerToken:  req.OwnerToken,
		Lease:       int64(req.Lease),
		Wait:        int64(req.Wait),
	}
	res, _, err := s.apply(ctx, cmd)
	granted := maxLease(res, err)
	if granted > 0 {
		// The namespace's policy caps leases below the proxy's: reserve
		// with its max (the caller asked for no lease of its own), and
		// heartbeat with it.
		cmd.Lease = int64(granted)
		res, _, err = s.apply(ctx, cmd)
	}
	if err != nil {
		return Reservation{}, err
	}
	out := Reservation{
		FencingToken:         res.FencingToken,
		PreviousFencingToken: res.PreviousFencingToken,
		LeaseExpiresAt:       unixNanos(res.LeaseExpiresAt),
		RetryAfter:           time.Duration(res.RetryAfter),
		CompletedAt:          unixNanos(res.CompletedAt),
		ExpiredAt:            unixNanos(res.ExpiredAt),
		ExpiresAt:            unixNanos(res.ExpiresAt),
		Lease:                granted,
	}
	out.Outcome = wire.FSMOutcomeToContract(res.Outcome)
	switch out.Outcome {
	case contract.OutcomeUnknown:
		return Reservation{}, fmt.Errorf("proxy: store: reserve %s/%s answered %v", req.Namespace, req.Key, res.Outcome)
	case contract.OutcomeCompleted:
		if res.Response != nil {
			out.Response = &Response{Status: int(res.Response.Status), Headers: res.Response.Headers, Body: res.Response.Body}
		}
	}
	if out.Outcome.Owned() &&
		res.OwnerToken != "" && res.OwnerToken != req.OwnerToken {
		// Anything else would let two callers believe they own the key.
		return Reservation{}, fmt.Errorf("proxy: store: reserve %s/%s acquired for another owner token than the one sent", req.Namespace, req.Key)
	}
	return out, nil
}

// maxLeaseRE finds the limit in the INVALID_ARGUMENT a node answers a
// reserve that asked for more than its namespace's max_lease_ms
// (server.limitExceeded), forwarded as text.
var maxLeaseRE = regexp.MustCompile(`exceeds the max_lease_ms (\d+) of namespace`)

// maxLease is the namespace's max lease when a reserve was refused for
// asking more (by the state machine here, or by a node the backend
// forwarded to), 0 otherwise.
func maxLease(res fsm.Result, err error) time.Duration {
	if err == nil && res.Outcome == fsm.OutcomeLimitExceeded && res.Limit == "max_lease_ms" && res.LimitValue > 0 {
		return time.Duration(res.LimitValue) * time.Millisecond
	}
	if err != nil && errors.Is(err, httpidem.ErrInvalid) {
		if m := maxLeaseRE.FindStringSubmatch(err.Error()); m != nil {
			if ms, perr := strconv.ParseInt(m[1], 10, 64); perr == nil && ms > 0 {
				return time.Duration(ms) * time.Millisecond
			}
		}
	}
	return 0
}

func (s *backendStore) Heartbeat(ctx context.Context, ref Ref, lease time.Duration) error {
	return s.decided(s.apply(ctx, &fsm.Command{
		Op: fsm.OpHeartbeat, Namespace: ref.Namespace, Key: ref.Key, OwnerToken: ref.OwnerToken, Lease: int64(lease),
	}))
}

func (s *backendStore) Complete(ctx context.Context, ref Ref, resp Response, retention time.Duration) (Completion, error) {
	cmd := &fsm.Command{
		Op: fsm.OpComplete, Namespace: ref.Namespace, Key: ref.Key, OwnerToken: ref.OwnerToken,
		Response:  &fsm.Response{Status: int32(resp.Status), Headers: resp.Headers, Body: resp.Body},
		Retention: int64(retention),
	}
	if retention == 0 { // the namespace's default, as a complete without retention_s
		cmd.Retention, cmd.RetentionIsDefault = int64(contract.DefaultRetention), true
	}
	res, ambiguous, err := s.apply(ctx, cmd)
	if err := s.decided(res, ambiguous, err); err != nil {
		return Completion{}, err
	}
	return Completion{CompletedAt: unixNanos(res.CompletedAt), ExpiresAt: unixNanos(res.ExpiresAt)}, nil
}

func (s *backendStore) Release(ctx context.Context, ref Ref) error {
	res, ambiguous, err := s.apply(ctx, &fsm.Command{
		Op: fsm.OpRelease, Namespace: ref.Namespace, Key: ref.Key, OwnerToken: ref.OwnerToken,
	})
	if err == nil && res.Outcome == fsm.OutcomeNotOwner && ambiguous {
		return nil // an undecided earlier attempt most likely released it; it is not ours either way
	}
	return s.decided(res, ambiguous, err)
}

// decided turns the outcome of a heartbeat, complete or release into an
// error.
func (s *backendStore) decided(res fsm.Result, _ bool, err error) error {
	switch {
	case err != nil:
		return err
	case res.Outcome == fsm.OutcomeOK:
		return nil
	case res.Outcome == fsm.OutcomeNotOwner:
		return httpidem.ErrNotOwner
	case res.Outcome == fsm.OutcomeInvalid:
		return fmt.Errorf("%w: the state machine refused the command", httpidem.ErrInvalid)
	}
	return fmt.Errorf("proxy: store: unexpected outcome %v", res.Outcome)
}

// apply runs cmd, retrying failures without a decision. ambiguous reports
// that an earlier attempt failed that way (and may have been applied).
func (s *backendStore) apply(ctx context.Context, cmd *fsm.Command) (res fsm.Result, ambiguous bool, err error) {
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		c := *cmd // the backend may stamp its copy
		res, err = s.b.Apply(ctx, &c)
		if err == nil {
			return res, ambiguous, nil
		}
		err = backendError(cmd.Op, err)
		if !errors.Is(err, httpidem.ErrUnavailable) || attempt >= backendAttempts || ctx.Err() != nil {
			return res, ambiguous, err
		}
		ambiguous = true
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return res, ambiguous, err
		case <-t.C:
		}
		wait *= 2
	}
}

// backendError maps a Backend failure, one of package backend's closed set,
// onto httpidem's errors.
func backendError(op fsm.Op, err error) error {
	wrap := func(sentinel error) error { return fmt.Errorf("%w: %s: %w", sentinel, op, err) }
	var be *backend.Error
	if errors.As(err, &be) {
		switch be.Code {
		case contract.CodeUnavailable:
			return wrap(httpidem.ErrUnavailable)
		case contract.CodePayloadTooLarge:
			return wrap(httpidem.ErrTooLarge)
		case contract.CodeInvalidArgument:
			return wrap(httpidem.ErrInvalid)
		case contract.CodeNotOwner:
			return wrap(httpidem.ErrNotOwner)
		}
		return fmt.Errorf("proxy: store: %s: %w", op, err)
	}
	if errors.Is(err, backend.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return wrap(httpidem.ErrUnavailable)
	}
	return fmt.Errorf("proxy: store: %s: %w", op, err)
}

func unixNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
