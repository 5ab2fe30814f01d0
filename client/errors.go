package client

import "errors"

// Errors returned by the client. They wrap the gRPC status they came from (when
// there was one), so test them with errors.Is and read the status with
// status.FromError or status.Code.
var (
	// ErrNotOwner: a heartbeat, complete or release by a caller that does not
	// own the key (its lease was reclaimed, it released or completed it, or
	// the key does not exist). The server answered FAILED_PRECONDITION.
	ErrNotOwner = errors.New("client: not the owner of the key")

	// ErrNotFound: Get of a key that is absent or past retention.
	ErrNotFound = errors.New("client: key not found")

	// ErrInvalidArgument: a name, number or token out of range, detected by
	// the client before sending or by the server (INVALID_ARGUMENT).
	ErrInvalidArgument = errors.New("client: invalid argument")

	// ErrPayloadTooLarge: a completed response body over the store's
	// --max-response-bytes (RESOURCE_EXHAUSTED).
	ErrPayloadTooLarge = errors.New("client: payload too large")

	// ErrUnavailable: the store could not decide (UNAVAILABLE or a server-side
	// deadline) on every attempt, and the retries ran out. For a reserve,
	// complete or release it does not say whether the request was applied:
	// retry with the same owner token.
	ErrUnavailable = errors.New("client: store unavailable")

	// ErrInProgress: Do waited its maximum wait while another owner held the
	// key. Try again later.
	ErrInProgress = errors.New("client: key in progress elsewhere")

	// ErrFingerprintMismatch: Do found the key in use (running or completed)
	// with another fingerprint: the key was reused for a different request.
	ErrFingerprintMismatch = errors.New("client: key used with another fingerprint")

	// ErrExpired: Do found the key completed long ago: its response is past
	// retention and only a tombstone is left. The work was done; it is not
	// run again (WithAcquireExpired runs it instead).
	ErrExpired = errors.New("client: key completed and its response expired")

	// ErrLeaseLost: the lease of a Do call ended while fn ran (a heartbeat
	// answered NOT_OWNER, or heartbeats failed until the lease ran out), or
	// completing after fn answered NOT_OWNER. fn's context is cancelled with
	// this cause; fn's work may have to be undone or fenced with the fencing
	// token.
	ErrLeaseLost = errors.New("client: lease lost")

	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("client: closed")
)
