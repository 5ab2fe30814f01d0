package contract

import (
	"fmt"
	"net/http"
)

// Code is an error code of the public API (docs/api.md, "Errors").
type Code string

// The codes of the public API. CodeMethodNotAllowed is the one addition: the
// contract names no code for a wrong HTTP method (server's doc.go says why).
const (
	CodeInvalidArgument  Code = "INVALID_ARGUMENT"
	CodeUnauthenticated  Code = "UNAUTHENTICATED"
	CodePermissionDenied Code = "PERMISSION_DENIED"
	CodeNotFound         Code = "NOT_FOUND"
	CodeMethodNotAllowed Code = "METHOD_NOT_ALLOWED"
	CodeNotOwner         Code = "NOT_OWNER"
	// CodeFailedPrecondition (v1.1): an operator action does not apply to
	// the key's current state (force-release of a COMPLETED key).
	CodeFailedPrecondition Code = "FAILED_PRECONDITION"
	CodePayloadTooLarge    Code = "PAYLOAD_TOO_LARGE"
	CodeResourceExhausted  Code = "RESOURCE_EXHAUSTED"
	CodeInternal           Code = "INTERNAL"
	CodeUnavailable        Code = "UNAVAILABLE"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of idem's gRPC errors: every
// gRPC error the server returns carries an ErrorInfo whose reason is the Code.
const ErrorDomain = "idem.dev"

// HTTPStatus is the HTTP status code that carries c.
func (c Code) HTTPStatus() int {
	switch c {
	case CodeInvalidArgument:
		return http.StatusBadRequest
	case CodeUnauthenticated:
		return http.StatusUnauthorized
	case CodePermissionDenied:
		return http.StatusForbidden
	case CodeNotFound:
		return http.StatusNotFound
	case CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case CodeNotOwner, CodeFailedPrecondition:
		return http.StatusConflict
	case CodePayloadTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeResourceExhausted:
		return http.StatusTooManyRequests
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// Known reports whether c is one of the codes above.
func (c Code) Known() bool {
	switch c {
	case CodeInvalidArgument, CodeUnauthenticated, CodePermissionDenied, CodeNotFound,
		CodeMethodNotAllowed, CodeNotOwner, CodeFailedPrecondition, CodePayloadTooLarge, CodeResourceExhausted,
		CodeInternal, CodeUnavailable:
		return true
	}
	return false
}

// Outcome is the store's decision on a reserve (docs/api.md). The zero value
// is OutcomeUnknown, which the store never decides.
type Outcome int

// The outcomes of a reserve.
const (
	OutcomeUnknown Outcome = iota
	// OutcomeAcquired: the caller now owns the key (fresh, released before,
	// past retention, or a repeat by the same owner token).
	OutcomeAcquired
	// OutcomeReclaimed: acquired after an earlier owner's lease ran out; the
	// earlier attempt may have done part of the work.
	OutcomeReclaimed
	// OutcomeInProgress: another owner holds the key.
	OutcomeInProgress
	// OutcomeCompleted: the key was completed; its response is replayed.
	OutcomeCompleted
	// OutcomeFingerprintMismatch: the key exists with another fingerprint.
	OutcomeFingerprintMismatch
	// OutcomeExpired (v1.2): the key was completed and its response is past
	// retention; only its tombstone is left. The work was done.
	OutcomeExpired
)

func (o Outcome) String() string {
	switch o {
	case OutcomeAcquired:
		return "ACQUIRED"
	case OutcomeReclaimed:
		return "RECLAIMED"
	case OutcomeInProgress:
		return "IN_PROGRESS"
	case OutcomeCompleted:
		return "COMPLETED"
	case OutcomeFingerprintMismatch:
		return "FINGERPRINT_MISMATCH"
	case OutcomeExpired:
		return "EXPIRED"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Owned reports whether the outcome made the caller the key's owner.
func (o Outcome) Owned() bool { return o == OutcomeAcquired || o == OutcomeReclaimed }
