package client

import (
	"fmt"
	"maps"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/contract"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Outcome is what the store decided on a reserve (defined in package
// contract, shared with the HTTP middleware).
type Outcome = contract.Outcome

const (
	// OutcomeUnknown is the zero value; the store never decides it.
	OutcomeUnknown = contract.OutcomeUnknown
	// OutcomeAcquired: the caller now owns the key (fresh, released before,
	// past retention, or a repeat by the same owner token).
	OutcomeAcquired = contract.OutcomeAcquired
	// OutcomeReclaimed: acquired after an earlier owner's lease ran out; the
	// earlier attempt may have done part of the work.
	// Reservation.PreviousFencingToken names it.
	OutcomeReclaimed = contract.OutcomeReclaimed
	// OutcomeInProgress: another owner holds the key;
	// Reservation.RetryAfter says when to ask again.
	OutcomeInProgress = contract.OutcomeInProgress
	// OutcomeCompleted: the key was completed; Reservation.Response is the
	// response to replay.
	OutcomeCompleted = contract.OutcomeCompleted
	// OutcomeFingerprintMismatch: the key exists with another fingerprint.
	OutcomeFingerprintMismatch = contract.OutcomeFingerprintMismatch
	// OutcomeExpired: the key was completed and its response is past
	// retention; only a tombstone is left (Reservation.CompletedAt,
	// ExpiredAt, FencingToken). The work was done: do not run it again
	// (ReserveRequest.IfExpiredAcquire acquires the key instead).
	OutcomeExpired = contract.OutcomeExpired
)

// State is the state of a stored record, as Get reports it.
type State int

const (
	// StateUnknown is the zero value; a stored record never has it.
	StateUnknown State = iota
	// StateInProgress: an owner holds the key under a lease.
	StateInProgress
	// StateCompleted: the owner stored its final response.
	StateCompleted
	// StateExpired: a tombstone; the response is past retention.
	StateExpired
)

func (s State) String() string {
	switch s {
	case StateInProgress:
		return "IN_PROGRESS"
	case StateCompleted:
		return "COMPLETED"
	case StateExpired:
		return "EXPIRED"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Response is the response a key was completed with, replayed verbatim.
type Response struct {
	// Status is an HTTP-style status code, 100..599.
	Status int
	// Headers are stored and replayed exactly as given; join multiple values
	// of one header yourself.
	Headers map[string]string
	// Body is at most the store's --max-response-bytes.
	Body []byte
}

// ReserveRequest claims a key.
type ReserveRequest struct {
	// Namespace matches [a-z0-9][a-z0-9._-]{0,62}.
	Namespace string
	// Key is 1 to 255 bytes of printable ASCII (0x21-0x7E). NewKey makes one.
	Key string
	// Fingerprint (0-256 chars, optional) identifies the request the key
	// stands for; a reserve with another fingerprint gets
	// OutcomeFingerprintMismatch.
	Fingerprint string
	// Lease is how long the key stays with the caller without a heartbeat,
	// 100ms..10m in whole milliseconds. Zero means the store's default (30 s).
	Lease time.Duration
	// OwnerToken identifies the caller: 16-128 chars of [A-Za-z0-9_-]. Empty
	// means Reserve generates one (128 random bits); it is returned in the
	// Reservation. Every retry of the call uses the same token, so a reserve
	// whose answer was lost comes back as the same reservation.
	OwnerToken string
	// Wait (0..30s, whole milliseconds) is how long the store may wait for
	// a key another owner holds to stop being in progress (completed,
	// released, or reclaimable) before it answers; the answer is then
	// decided as usual, or OutcomeInProgress after Wait. The store wakes the
	// waiter when the owner finishes: no polling. Zero answers at once.
	Wait time.Duration
	// IfExpiredAcquire: a key whose response expired (a tombstone) is
	// acquired instead of answering OutcomeExpired.
	IfExpiredAcquire bool
}

// Checkpoint is the last recovery point an attempt stored on its key
// (Lease.Checkpoint, Client.Checkpoint).
type Checkpoint struct {
	Name string
	Data []byte
	// FencingToken of the attempt that wrote it.
	FencingToken uint64
	At           time.Time
}

func checkpointFromProto(c *idemv1.KeyCheckpoint) *Checkpoint {
	if c == nil {
		return nil
	}
	return &Checkpoint{Name: c.GetName(), Data: c.GetData(), FencingToken: c.GetFencingToken(), At: timeFromProto(c.GetCheckpointedAt())}
}

// Reservation is the store's answer to a reserve.
type Reservation struct {
	Outcome Outcome
	// OwnerToken is the token the reserve was made with (set for every
	// outcome, including a generated one); pass it to Heartbeat, Complete and
	// Release.
	OwnerToken string
	// FencingToken (ACQUIRED, RECLAIMED, COMPLETED) grows strictly with every
	// acquisition of the key; pass it to downstream systems so they can refuse
	// writes from an owner that was replaced.
	FencingToken uint64
	// PreviousFencingToken (RECLAIMED) is the fencing token of the owner whose
	// lease ran out.
	PreviousFencingToken uint64
	// LeaseExpiresAt (ACQUIRED, RECLAIMED, IN_PROGRESS) is when the current
	// owner's lease ends, by the store's clock.
	LeaseExpiresAt time.Time
	// RetryAfter (IN_PROGRESS) is a hint for when to reserve again.
	RetryAfter time.Duration
	// Response (COMPLETED) is the stored response.
	Response *Response
	// CompletedAt and ExpiresAt (COMPLETED): when the key was completed and
	// when the record leaves the store.
	CompletedAt time.Time
	ExpiresAt   time.Time
	// ExpiredAt (EXPIRED): when the response's retention ended.
	ExpiredAt time.Time
	// Checkpoint (RECLAIMED): the last checkpoint of an earlier attempt, to
	// resume from; nil when none was stored.
	Checkpoint *Checkpoint
}

// HeartbeatRequest extends the lease of the key's owner.
type HeartbeatRequest struct {
	Namespace  string
	Key        string
	OwnerToken string
	// Lease is the new lease length from now; zero means the store's default.
	Lease time.Duration
}

// CompleteRequest stores the final response of the key's owner.
type CompleteRequest struct {
	Namespace  string
	Key        string
	OwnerToken string
	Response   Response
	// Retention is how long the response is kept, 1s..30 days in whole
	// seconds; zero means the store's default (24 h).
	Retention time.Duration
}

// Completion is the store's answer to a complete.
type Completion struct {
	CompletedAt time.Time
	ExpiresAt   time.Time
}

// ReleaseRequest frees a key its owner did not complete.
type ReleaseRequest struct {
	Namespace  string
	Key        string
	OwnerToken string
}

// Record is a key's stored state as Get reports it (never its owner token).
type Record struct {
	State       State
	Fingerprint string
	// FencingToken of the current (IN_PROGRESS) or completing (COMPLETED)
	// owner.
	FencingToken uint64
	// LeaseExpiresAt (IN_PROGRESS).
	LeaseExpiresAt time.Time
	// CompletedAt, ExpiresAt and Response (COMPLETED).
	CompletedAt time.Time
	ExpiresAt   time.Time
	Response    *Response
	// ExpiredAt (EXPIRED): when the response's retention ended.
	ExpiredAt time.Time
	// Checkpoint (IN_PROGRESS): the last checkpoint stored, if any.
	Checkpoint *Checkpoint
}

func stateFromProto(s idemv1.State) State {
	switch s {
	case idemv1.State_STATE_IN_PROGRESS:
		return StateInProgress
	case idemv1.State_STATE_COMPLETED:
		return StateCompleted
	case idemv1.State_STATE_EXPIRED:
		return StateExpired
	}
	return StateUnknown
}

func responseFromProto(r *idemv1.StoredResponse) *Response {
	if r == nil {
		return nil
	}
	return &Response{Status: int(r.GetStatus()), Headers: maps.Clone(r.GetHeaders()), Body: r.GetBody()}
}

func responseToProto(r Response) *idemv1.StoredResponse {
	return &idemv1.StoredResponse{Status: int32(r.Status), Headers: r.Headers, Body: r.Body}
}

// timeFromProto maps an absent timestamp to the zero time.
func timeFromProto(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}
