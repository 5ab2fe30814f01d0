package client

import (
	"context"
	"errors"
	"fmt"
)

// How Once stores an event's end.
const (
	onceDone   = 200 // fn returned nil
	onceFailed = 422 // fn returned a Permanent error; the body is its message
	// onceMaxMessage bounds the stored message of a permanent failure.
	onceMaxMessage = 4 << 10
)

// Once runs fn at most once to completion per (namespace, eventID), across
// redeliveries of the event and every consumer that receives it: the
// consumer-side deduplication of at-least-once delivery. It is built on Do
// with the event id as the key.
//
//   - The first delivery runs fn with the fencing token of its attempt (hand
//     it to the systems fn writes to, so a replaced attempt's late writes
//     are refused). When fn returns nil the event is recorded as done, and
//     Once returns ran=true, nil.
//   - A delivery of an event recorded as done returns ran=false, nil: ack
//     it and move on.
//   - A delivery that arrives while another runs fn waits for it (up to
//     DefaultMaxWait, and ctx) and returns its result: ran=false, nil when
//     it succeeded. If it failed, the key was freed, and this delivery runs
//     fn itself. If the wait runs out, Once returns ErrInProgress: leave the
//     event for redelivery.
//   - When fn fails, the event is not recorded: Once returns ran=true and
//     fn's error, and a redelivery runs fn again. A failure marked with
//     Permanent is recorded instead: the redeliveries get ran=false and a
//     *PermanentError with its message, and fn does not run again.
//
// ctx of fn is cancelled with ErrLeaseLost if the lease is lost. If
// recording the event fails after fn succeeded (the store was unreachable),
// Once returns ran=true and the error, and a redelivery may run fn again
// once the lease has run out, with a larger fencing token.
func (c *Client) Once(ctx context.Context, namespace, eventID string, fn func(ctx context.Context, fencingToken uint64) error) (ran bool, err error) {
	if fn == nil {
		return false, invalid("once %s/%s: fn is nil", namespace, eventID)
	}
	res, err := c.Do(ctx, namespace, eventID, func(ctx context.Context, l Lease) (Response, error) {
		ran = true
		ferr := fn(ctx, l.FencingToken)
		var permanent *PermanentError
		switch {
		case ferr == nil:
			return Response{Status: onceDone}, nil
		case errors.As(ferr, &permanent):
			msg := ferr.Error()
			if len(msg) > onceMaxMessage {
				msg = msg[:onceMaxMessage]
			}
			return Response{Status: onceFailed, Body: []byte(msg)}, ferr
		default:
			return Response{}, ferr
		}
	})
	if errors.Is(err, ErrExpired) {
		// Recorded long ago, and the record's retention ended: the event
		// was handled; a redelivery this late does not run it again.
		return false, nil
	}
	if ran || err != nil {
		return ran, err
	}
	if res.Response.Status == onceFailed {
		return false, &PermanentError{Err: fmt.Errorf("client: event %s/%s failed permanently before: %s", namespace, eventID, res.Response.Body)}
	}
	return false, nil
}
