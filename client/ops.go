package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Reserve claims a key, or reports who holds it or what it completed with.
// The store's decision is in Reservation.Outcome; an error means no decision
// reached the client.
//
// When req.OwnerToken is empty, Reserve generates one, and every retry of the
// call carries it: a reserve whose answer was lost and that is retried comes
// back as the same reservation (ACQUIRED, same fencing token), never a second
// acquisition. On error the returned Reservation still holds the owner token
// used, so the caller can retry with it.
func (c *Client) Reserve(ctx context.Context, req ReserveRequest) (Reservation, error) {
	pb, err := reserveProto(req)
	if err != nil {
		return Reservation{OwnerToken: pb.GetOwnerToken()}, err
	}
	var resp *idemv1.ReserveResponse
	_, err = c.invokeWaiting(ctx, "reserve "+req.Namespace+"/"+req.Key, req.Namespace, req.Key, req.Wait, func(ctx context.Context, stub idemv1.IdempotencyClient, opts ...grpc.CallOption) (err error) {
		resp, err = stub.Reserve(ctx, pb, opts...)
		return err
	})
	if err != nil {
		return Reservation{OwnerToken: pb.OwnerToken}, err
	}
	return reservationFromProto(req, pb.OwnerToken, resp)
}

// reserveProto validates req and is its request, with the owner token it
// names or a new one. On error it is nil but for the token req named.
func reserveProto(req ReserveRequest) (*idemv1.ReserveRequest, error) {
	var errs []error
	errs = append(errs, validateNames(req.Namespace, req.Key))
	if n := utf8.RuneCountInString(req.Fingerprint); n > MaxFingerprintLen {
		errs = append(errs, invalid("fingerprint is %d chars, more than %d", n, MaxFingerprintLen))
	}
	leaseMs, err := leaseMillis(req.Lease)
	errs = append(errs, err)
	if req.OwnerToken != "" {
		errs = append(errs, validateOwnerToken(req.OwnerToken))
	}
	if req.Wait < 0 || req.Wait > MaxWait || req.Wait%time.Millisecond != 0 {
		errs = append(errs, invalid("wait %v is out of range: use 0..%v in whole milliseconds", req.Wait, MaxWait))
	}
	if err := errors.Join(errs...); err != nil {
		return &idemv1.ReserveRequest{OwnerToken: req.OwnerToken}, err
	}
	token := req.OwnerToken
	if token == "" {
		token = NewOwnerToken()
	}
	pb := &idemv1.ReserveRequest{
		Namespace:   req.Namespace,
		Key:         req.Key,
		Fingerprint: req.Fingerprint,
		LeaseMs:     leaseMs,
		OwnerToken:  token,
		WaitMs:      req.Wait.Milliseconds(),
	}
	if req.IfExpiredAcquire {
		pb.IfExpired = "acquire"
	}
	return pb, nil
}

// reservationFromProto is the store's answer resp to the reserve of req
// with owner token token, checked.
func reservationFromProto(req ReserveRequest, token string, resp *idemv1.ReserveResponse) (Reservation, error) {
	res := Reservation{
		Outcome:              idemv1.OutcomeFromProto(resp.GetOutcome()),
		OwnerToken:           token,
		FencingToken:         resp.GetFencingToken(),
		PreviousFencingToken: resp.GetPreviousFencingToken(),
		LeaseExpiresAt:       timeFromProto(resp.GetLeaseExpiresAt()),
		RetryAfter:           time.Duration(resp.GetRetryAfterMs()) * time.Millisecond,
		Response:             responseFromProto(resp.GetResponse()),
		CompletedAt:          timeFromProto(resp.GetCompletedAt()),
		ExpiresAt:            timeFromProto(resp.GetExpiresAt()),
		ExpiredAt:            timeFromProto(resp.GetExpiredAt()),
		Checkpoint:           checkpointFromProto(resp.GetCheckpoint()),
	}
	switch {
	case res.Outcome == OutcomeUnknown:
		return res, fmt.Errorf("client: reserve %s/%s: the store answered outcome %v, which this client does not know", req.Namespace, req.Key, resp.GetOutcome())
	case res.Outcome.Owned() && resp.GetOwnerToken() != "" && resp.GetOwnerToken() != token:
		// The store must acquire for the token it was given; anything else
		// would let two callers believe they own the key.
		return res, fmt.Errorf("client: reserve %s/%s: the store acquired for another owner token than the one sent", req.Namespace, req.Key)
	case res.Outcome == OutcomeCompleted && res.Response == nil:
		return res, fmt.Errorf("client: reserve %s/%s: the store answered COMPLETED without a response", req.Namespace, req.Key)
	}
	return res, nil
}

// Heartbeat extends the owner's lease and returns its new end (by the store's
// clock). It works while the caller still owns the key, even after its lease
// ran out if nobody reclaimed it; otherwise it returns ErrNotOwner.
func (c *Client) Heartbeat(ctx context.Context, req HeartbeatRequest) (time.Time, error) {
	leaseMs, err := leaseMillis(req.Lease)
	if err := errors.Join(validateNames(req.Namespace, req.Key), validateOwnerToken(req.OwnerToken), err); err != nil {
		return time.Time{}, err
	}
	pb := &idemv1.HeartbeatRequest{Namespace: req.Namespace, Key: req.Key, OwnerToken: req.OwnerToken, LeaseMs: leaseMs}
	var resp *idemv1.HeartbeatResponse
	_, err = c.invoke(ctx, "heartbeat "+req.Namespace+"/"+req.Key, req.Namespace, req.Key, func(ctx context.Context, stub idemv1.IdempotencyClient, opts ...grpc.CallOption) (err error) {
		resp, err = stub.Heartbeat(ctx, pb, opts...)
		return err
	})
	if err != nil {
		return time.Time{}, err
	}
	return timeFromProto(resp.GetLeaseExpiresAt()), nil
}

// Complete stores the owner's final response; later reserves of the key get
// OutcomeCompleted with it until the retention ends. An owner whose lease ran
// out but whom nobody replaced may still complete. Repeating a complete that
// succeeded (same owner token, same response) answers the same times, so it is
// retried safely. ErrNotOwner means somebody else owns the key now (or it was
// completed with another response); ErrPayloadTooLarge that the body exceeds
// the store's limit.
func (c *Client) Complete(ctx context.Context, req CompleteRequest) (Completion, error) {
	pb, err := completeProto(req)
	if err != nil {
		return Completion{}, err
	}
	var resp *idemv1.CompleteResponse
	_, err = c.invokeWaiting(ctx, "complete "+req.Namespace+"/"+req.Key, req.Namespace, req.Key, payloadAllowance(proto.Size(pb)), func(ctx context.Context, stub idemv1.IdempotencyClient, opts ...grpc.CallOption) (err error) {
		resp, err = stub.Complete(ctx, pb, opts...)
		return err
	})
	if err != nil {
		return Completion{}, err
	}
	return Completion{CompletedAt: timeFromProto(resp.GetCompletedAt()), ExpiresAt: timeFromProto(resp.GetExpiresAt())}, nil
}

// completeProto validates req and is its request.
func completeProto(req CompleteRequest) (*idemv1.CompleteRequest, error) {
	retentionS, err := retentionSeconds(req.Retention)
	if err := errors.Join(validateNames(req.Namespace, req.Key), validateOwnerToken(req.OwnerToken), validateResponse(req.Response), err); err != nil {
		return nil, err
	}
	return &idemv1.CompleteRequest{
		Namespace:  req.Namespace,
		Key:        req.Key,
		OwnerToken: req.OwnerToken,
		Response:   responseToProto(req.Response),
		RetentionS: retentionS,
	}, nil
}

// Release frees a key its owner did not complete, so that the next reserve
// acquires it (with a larger fencing token). A completed key cannot be
// released. ErrNotOwner means the caller did not own the key, with one
// exception made for safe retries: when an earlier attempt's answer was lost
// and the retry answers NOT_OWNER, the first attempt most likely freed the key,
// and Release returns nil: either way the caller no longer owns it.
func (c *Client) Release(ctx context.Context, req ReleaseRequest) error {
	if err := errors.Join(validateNames(req.Namespace, req.Key), validateOwnerToken(req.OwnerToken)); err != nil {
		return err
	}
	pb := &idemv1.ReleaseRequest{Namespace: req.Namespace, Key: req.Key, OwnerToken: req.OwnerToken}
	retried, err := c.invoke(ctx, "release "+req.Namespace+"/"+req.Key, req.Namespace, req.Key, func(ctx context.Context, stub idemv1.IdempotencyClient, opts ...grpc.CallOption) error {
		_, err := stub.Release(ctx, pb, opts...)
		return err
	})
	if retried && errors.Is(err, ErrNotOwner) {
		c.log.Debug("release answered NOT_OWNER after a lost answer; the key is not ours either way", "namespace", req.Namespace, "key", req.Key)
		return nil
	}
	return err
}

// Get reads a key's record. It returns ErrNotFound when the key is absent or
// past retention.
func (c *Client) Get(ctx context.Context, namespace, key string) (Record, error) {
	if err := validateNames(namespace, key); err != nil {
		return Record{}, err
	}
	pb := &idemv1.GetRequest{Namespace: namespace, Key: key}
	var resp *idemv1.GetResponse
	_, err := c.invoke(ctx, "get "+namespace+"/"+key, namespace, key, func(ctx context.Context, stub idemv1.IdempotencyClient, opts ...grpc.CallOption) (err error) {
		resp, err = stub.Get(ctx, pb, opts...)
		return err
	})
	if err != nil {
		return Record{}, err
	}
	return Record{
		State:          stateFromProto(resp.GetState()),
		Fingerprint:    resp.GetFingerprint(),
		FencingToken:   resp.GetFencingToken(),
		LeaseExpiresAt: timeFromProto(resp.GetLeaseExpiresAt()),
		CompletedAt:    timeFromProto(resp.GetCompletedAt()),
		ExpiresAt:      timeFromProto(resp.GetExpiresAt()),
		Response:       responseFromProto(resp.GetResponse()),
		ExpiredAt:      timeFromProto(resp.GetExpiredAt()),
		Checkpoint:     checkpointFromProto(resp.GetCheckpoint()),
	}, nil
}

// CheckpointRequest stores a recovery point of the owner's attempt.
type CheckpointRequest struct {
	Namespace  string
	Key        string
	OwnerToken string
	// Name is 1-64 chars of [A-Za-z0-9_.-] (the step reached, "charged").
	Name string
	// Data is at most 64 KiB (what the next attempt needs to resume).
	Data []byte
}

// Checkpoint stores a recovery point while the caller owns the key; a
// reserve that RECLAIMS the key later gets it in Reservation.Checkpoint, so
// the retry resumes from the last completed step. It returns when the store
// recorded it (by the store's clock); ErrNotOwner when the caller no longer
// owns the key. A complete or release drops the checkpoint.
func (c *Client) Checkpoint(ctx context.Context, req CheckpointRequest) (time.Time, error) {
	errs := []error{validateNames(req.Namespace, req.Key), validateOwnerToken(req.OwnerToken)}
	if n := len(req.Name); n == 0 || n > 64 || strings.IndexFunc(req.Name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-')
	}) >= 0 {
		errs = append(errs, invalid("checkpoint name %q: use 1-64 chars of A-Z, a-z, 0-9, '_', '.', '-'", req.Name))
	}
	if len(req.Data) > 64<<10 {
		errs = append(errs, invalid("checkpoint data is %d bytes, more than 64 KiB", len(req.Data)))
	}
	if err := errors.Join(errs...); err != nil {
		return time.Time{}, err
	}
	pb := &idemv1.CheckpointRequest{Namespace: req.Namespace, Key: req.Key, OwnerToken: req.OwnerToken, Name: req.Name, Data: req.Data}
	var resp *idemv1.CheckpointResponse
	_, err := c.invokeWaiting(ctx, "checkpoint "+req.Namespace+"/"+req.Key, req.Namespace, req.Key, payloadAllowance(proto.Size(pb)), func(ctx context.Context, stub idemv1.IdempotencyClient, opts ...grpc.CallOption) (err error) {
		resp, err = stub.Checkpoint(ctx, pb, opts...)
		return err
	})
	if err != nil {
		return time.Time{}, err
	}
	return timeFromProto(resp.GetCheckpointedAt()), nil
}
