package httpidem

import (
	"context"
	"errors"
	"time"

	"github.com/idem-dev/idem/contract"
)

// Errors of package httpidem. Store implementations return (or wrap)
// ErrNotOwner, ErrUnavailable, ErrTooLarge and ErrInvalid so that the engine
// can tell the store's decisions apart from its failures.
var (
	// ErrNotOwner: a heartbeat, complete or release by a caller that no
	// longer owns the key (another caller reclaimed it after the lease ran
	// out, or it does not exist).
	ErrNotOwner = errors.New("httpidem: not the owner of the key")
	// ErrUnavailable: the store could not decide in time. For a reserve,
	// complete or release it does not say whether the call was applied; the
	// owner token makes a retry safe.
	ErrUnavailable = errors.New("httpidem: store unavailable")
	// ErrTooLarge: the response to complete with is larger than the store
	// keeps.
	ErrTooLarge = errors.New("httpidem: response too large for the store")
	// ErrInvalid: the store refused a call as malformed (a name, header or
	// number out of its bounds).
	ErrInvalid = errors.New("httpidem: store refused the request as invalid")
	// ErrLeaseLost is the cancellation cause of a handler's context when its
	// lease was lost: a heartbeat answered NOT_OWNER, or heartbeats failed
	// until the lease ran out.
	ErrLeaseLost = errors.New("httpidem: lease lost")
	// ErrInvalidConfig: a Config failed Validate; the joined errors name every
	// problem.
	ErrInvalidConfig = errors.New("httpidem: invalid config")
)

// Ref names one reservation: the key and the owner token it was made with.
type Ref struct {
	Namespace  string
	Key        string
	OwnerToken string
}

// ReserveRequest claims a key for Ref.OwnerToken. A repeat with the same
// owner token while it holds the key is the same reservation, so a Store may
// retry a reserve whose answer was lost.
type ReserveRequest struct {
	Ref
	// Fingerprint identifies the request the key stands for (at most 256
	// chars).
	Fingerprint string
	// Lease is how long the key stays with the owner without a heartbeat.
	Lease time.Duration
	// Wait (0..30 s) is how long the store may wait for a key in progress
	// to stop being in progress before answering (the caller's Prefer:
	// wait, bounded by Config.MaxWait).
	Wait time.Duration
}

// Reservation is the store's answer to a reserve.
type Reservation struct {
	Outcome contract.Outcome
	// FencingToken (ACQUIRED, RECLAIMED, COMPLETED) grows strictly with every
	// acquisition of the key.
	FencingToken uint64
	// PreviousFencingToken (RECLAIMED) names the owner whose lease ran out.
	PreviousFencingToken uint64
	// LeaseExpiresAt (ACQUIRED, RECLAIMED, IN_PROGRESS), by the store's clock.
	LeaseExpiresAt time.Time
	// RetryAfter (IN_PROGRESS) is a hint for when to ask again.
	RetryAfter time.Duration
	// Response (COMPLETED) is the stored response.
	Response *Response
	// CompletedAt (COMPLETED, EXPIRED) and ExpiredAt (EXPIRED: when the
	// stored response's retention ended).
	CompletedAt, ExpiredAt time.Time
	// ExpiresAt (COMPLETED) is when the stored response's retention ends.
	ExpiresAt time.Time
	// Lease (ACQUIRED, RECLAIMED) is the lease the store granted when it is
	// shorter than the one asked for (a namespace policy's max_lease caps
	// it); 0: the one asked for. Heartbeats then ask for it.
	Lease time.Duration
}

// Completion is the store's answer to a complete.
type Completion struct {
	// CompletedAt is when the response was stored, ExpiresAt when its
	// retention ends and the store stops replaying it (by the store's
	// clock).
	CompletedAt, ExpiresAt time.Time
}

// Response is a stored response, replayed verbatim.
type Response struct {
	Status  int
	Headers map[string]string
	Body    []byte
}

// Store is the idempotency store as the engine uses it. Implementations
// retry calls that failed without a decision for as long as ctx allows (every
// call is safe to repeat with the same owner token), and map failures onto
// the package's errors: ErrUnavailable when no decision was reached,
// ErrNotOwner, ErrTooLarge and ErrInvalid for the store's refusals.
type Store interface {
	// Reserve claims the key, or reports who holds it or what it was
	// completed with.
	Reserve(ctx context.Context, req ReserveRequest) (Reservation, error)
	// Heartbeat extends the owner's lease to lease from now.
	Heartbeat(ctx context.Context, ref Ref, lease time.Duration) error
	// Complete stores the owner's final response for retention (0: the
	// namespace's default retention).
	Complete(ctx context.Context, ref Ref, resp Response, retention time.Duration) (Completion, error)
	// Release frees a key its owner did not complete.
	Release(ctx context.Context, ref Ref) error
}

// NewOwnerToken returns a fresh owner token: 128 random bits, base64url
// without padding (22 characters), within the contract's 16-128
// [A-Za-z0-9_-].
func NewOwnerToken() string { return contract.NewOwnerToken() }
