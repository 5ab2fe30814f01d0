package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem/httpidem"
)

// engineStore adapts a Client to the store of the HTTP idempotency engine
// (httpidem) that Middleware runs, mapping the client's errors onto
// the engine's. The client already retries undecided calls with the same
// owner token.
type engineStore struct{ c *Client }

func (s engineStore) Reserve(ctx context.Context, req httpidem.ReserveRequest) (httpidem.Reservation, error) {
	res, err := s.c.Reserve(ctx, ReserveRequest{
		Namespace:   req.Namespace,
		Key:         req.Key,
		Fingerprint: req.Fingerprint,
		Lease:       req.Lease,
		OwnerToken:  req.OwnerToken,
		Wait:        req.Wait,
	})
	if err != nil {
		return httpidem.Reservation{}, engineError(err)
	}
	out := httpidem.Reservation{
		FencingToken:         res.FencingToken,
		PreviousFencingToken: res.PreviousFencingToken,
		LeaseExpiresAt:       res.LeaseExpiresAt,
		RetryAfter:           res.RetryAfter,
		CompletedAt:          res.CompletedAt,
		ExpiredAt:            res.ExpiredAt,
		ExpiresAt:            res.ExpiresAt,
	}
	switch res.Outcome {
	case OutcomeAcquired, OutcomeReclaimed, OutcomeInProgress, OutcomeFingerprintMismatch, OutcomeExpired:
		out.Outcome = res.Outcome
	case OutcomeCompleted:
		out.Outcome = res.Outcome
		out.Response = &httpidem.Response{Status: res.Response.Status, Headers: res.Response.Headers, Body: res.Response.Body}
	default:
		return httpidem.Reservation{}, fmt.Errorf("client: reserve %s/%s: unexpected outcome %v", req.Namespace, req.Key, res.Outcome)
	}
	return out, nil
}

func (s engineStore) Heartbeat(ctx context.Context, ref httpidem.Ref, lease time.Duration) error {
	_, err := s.c.Heartbeat(ctx, HeartbeatRequest{Namespace: ref.Namespace, Key: ref.Key, OwnerToken: ref.OwnerToken, Lease: lease})
	return engineError(err)
}

func (s engineStore) Complete(ctx context.Context, ref httpidem.Ref, resp httpidem.Response, retention time.Duration) (httpidem.Completion, error) {
	done, err := s.c.Complete(ctx, CompleteRequest{
		Namespace:  ref.Namespace,
		Key:        ref.Key,
		OwnerToken: ref.OwnerToken,
		Response:   Response{Status: resp.Status, Headers: resp.Headers, Body: resp.Body},
		Retention:  retention,
	})
	if err != nil {
		return httpidem.Completion{}, engineError(err)
	}
	return httpidem.Completion{CompletedAt: done.CompletedAt, ExpiresAt: done.ExpiresAt}, nil
}

func (s engineStore) Release(ctx context.Context, ref httpidem.Ref) error {
	return engineError(s.c.Release(ctx, ReleaseRequest{Namespace: ref.Namespace, Key: ref.Key, OwnerToken: ref.OwnerToken}))
}

// engineError maps the client's errors onto the engine's.
func engineError(err error) error {
	var sentinel error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotOwner):
		sentinel = httpidem.ErrNotOwner
	case errors.Is(err, ErrPayloadTooLarge):
		sentinel = httpidem.ErrTooLarge
	case errors.Is(err, ErrInvalidArgument):
		sentinel = httpidem.ErrInvalid
	case errors.Is(err, ErrUnavailable), errors.Is(err, ErrClosed),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		sentinel = httpidem.ErrUnavailable
	default:
		return err
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}
