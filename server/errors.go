package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
)

// Errors of package server.
var (
	// ErrUnavailable is backend.ErrUnavailable: the store could not decide
	// in time. Clients see 503 UNAVAILABLE (gRPC Unavailable) with a
	// Retry-After hint.
	ErrUnavailable = backend.ErrUnavailable
	// ErrInvalidConfig: a Config failed Validate; the joined errors say which
	// fields and why.
	ErrInvalidConfig = errors.New("server: invalid config")
)

// UnavailableError is backend.UnavailableError: an ErrUnavailable with a
// reason and a retry hint.
type UnavailableError = backend.UnavailableError

// Code is an error code of the public API (docs/api.md, "Errors"); defined in
// package contract.
type Code = contract.Code

// The codes of the public API (see contract).
const (
	CodeInvalidArgument    = contract.CodeInvalidArgument
	CodeUnauthenticated    = contract.CodeUnauthenticated
	CodePermissionDenied   = contract.CodePermissionDenied
	CodeNotFound           = contract.CodeNotFound
	CodeMethodNotAllowed   = contract.CodeMethodNotAllowed
	CodeNotOwner           = contract.CodeNotOwner
	CodeFailedPrecondition = contract.CodeFailedPrecondition
	CodePayloadTooLarge    = contract.CodePayloadTooLarge
	CodeResourceExhausted  = contract.CodeResourceExhausted
	CodeInternal           = contract.CodeInternal
	CodeUnavailable        = contract.CodeUnavailable
)

// ErrorDomain is the google.rpc.ErrorInfo domain of idem's gRPC errors. Every
// gRPC error the server returns carries an ErrorInfo whose reason is the Code,
// so that a router forwarding over gRPC gives its client the same code.
const ErrorDomain = contract.ErrorDomain

// defaultRetryAfter is the Retry-After of an UNAVAILABLE that names none.
const defaultRetryAfter = time.Second

// Error is an API error: the code and message a client sees. A Backend may
// return one (or wrap one) to choose the code itself, e.g. RESOURCE_EXHAUSTED
// for a rate limit. It implements GRPCStatus, so gRPC handlers return it as is.
type Error struct {
	Code    Code
	Message string
	// RetryAfter, when set, is sent as the Retry-After header (whole seconds,
	// rounded up) and as a google.rpc.RetryInfo detail.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return "server: " + string(e.Code) + ": " + e.Message }

// GRPCStatus is the gRPC status of e, with an ErrorInfo (reason = Code) and,
// when RetryAfter is set, a RetryInfo detail.
func (e *Error) GRPCStatus() *status.Status {
	return idemv1.ErrorToStatus(e.Code, e.Message, e.RetryAfter)
}

// retryAfterSeconds is the Retry-After header value for d: whole seconds,
// rounded up, at least 1.
func retryAfterSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

func errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// internalMessage is what a client sees for a failure it cannot act on; the
// cause goes to the log, never to the client.
const internalMessage = "internal error: the store failed to process the request; " +
	"a reserve, complete or release may or may not have been applied, so retry with the same owner token, " +
	"and report it to the operator if it persists"

// fromBackend turns an error of Backend.Apply/Get, one of the closed set of
// package backend, into the API error a client sees. internal reports an
// error whose cause should be logged: anything outside the set, and a
// backend.Error with code INTERNAL.
func fromBackend(err error) (apiErr *Error, internal bool) {
	var be *backend.Error
	if errors.As(err, &be) && be.Code.Known() {
		if be.Code == CodeInternal {
			return &Error{Code: CodeInternal, Message: internalMessage}, true
		}
		e := &Error{Code: be.Code, Message: be.Message, RetryAfter: be.RetryAfter}
		if e.Code == CodeUnavailable && e.RetryAfter <= 0 {
			e.RetryAfter = defaultRetryAfter
		}
		if e.Message == "" {
			e.Message = strings.ToLower(strings.ReplaceAll(string(e.Code), "_", " "))
		}
		return e, false
	}
	var nle *backend.NotLeaderError
	if errors.As(err, &nle) {
		msg := "no leader of shard " + nle.Shard + " could be reached"
		if nle.Leader != "" {
			msg = "this node does not lead shard " + nle.Shard + " (" + nle.Leader + " does)"
		}
		return &Error{Code: CodeUnavailable, Message: msg + unavailableAdvice, RetryAfter: defaultRetryAfter}, false
	}
	var ue *UnavailableError
	if errors.As(err, &ue) {
		retry := ue.RetryAfter
		if retry <= 0 {
			retry = defaultRetryAfter
		}
		msg := "the store could not decide in time"
		if ue.Reason != "" {
			msg += " (" + ue.Reason + ")"
		}
		return &Error{Code: CodeUnavailable, Message: msg + unavailableAdvice, RetryAfter: retry}, false
	}
	if errors.Is(err, ErrUnavailable) {
		return &Error{Code: CodeUnavailable, Message: "the store could not decide in time" + unavailableAdvice, RetryAfter: defaultRetryAfter}, false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Code: CodeUnavailable, Message: "the store did not decide before the request deadline" + unavailableAdvice, RetryAfter: defaultRetryAfter}, false
	}
	if errors.Is(err, context.Canceled) {
		return &Error{Code: CodeUnavailable, Message: "the request was cancelled before the store decided" + unavailableAdvice, RetryAfter: defaultRetryAfter}, false
	}
	return &Error{Code: CodeInternal, Message: internalMessage}, true
}

const unavailableAdvice = "; it may or may not have applied a reserve, complete or release: retry with the same owner token after Retry-After"
