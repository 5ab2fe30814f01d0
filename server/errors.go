package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/contract"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Errors of package server.
var (
	// ErrUnavailable: the store could not decide in time (no leader
	// reachable, home region lost, deadline passed). A Backend returns it, or
	// an *UnavailableError that unwraps to it; clients see 503 UNAVAILABLE
	// (gRPC Unavailable) with a Retry-After hint.
	ErrUnavailable = errors.New("server: store unavailable")
	// ErrInvalidConfig: a Config failed Validate; the joined errors say which
	// fields and why.
	ErrInvalidConfig = errors.New("server: invalid config")
)

// UnavailableError is an ErrUnavailable with a reason and a retry hint.
type UnavailableError struct {
	// RetryAfter is when the client should try again; 0 means one second.
	RetryAfter time.Duration
	// Reason says why, in words a client may see ("no leader for shard
	// us-east/2", "home region eu-west unreachable").
	Reason string
}

func (e *UnavailableError) Error() string {
	if e.Reason == "" {
		return ErrUnavailable.Error()
	}
	return ErrUnavailable.Error() + ": " + e.Reason
}

// Unwrap makes errors.Is(err, ErrUnavailable) hold.
func (e *UnavailableError) Unwrap() error { return ErrUnavailable }

// Code is an error code of the public API (API-v1.md, "Errors"); defined in
// package contract.
type Code = contract.Code

// The codes of the public API (see contract).
const (
	CodeInvalidArgument   = contract.CodeInvalidArgument
	CodeUnauthenticated   = contract.CodeUnauthenticated
	CodePermissionDenied  = contract.CodePermissionDenied
	CodeNotFound          = contract.CodeNotFound
	CodeMethodNotAllowed  = contract.CodeMethodNotAllowed
	CodeNotOwner          = contract.CodeNotOwner
	CodePayloadTooLarge   = contract.CodePayloadTooLarge
	CodeResourceExhausted = contract.CodeResourceExhausted
	CodeInternal          = contract.CodeInternal
	CodeUnavailable       = contract.CodeUnavailable
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
	st := status.New(idemv1.GRPCCode(e.Code), e.Message)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: string(e.Code), Domain: ErrorDomain}}
	if e.RetryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(e.RetryAfter)})
	}
	withDetails, err := st.WithDetails(details...)
	if err != nil {
		return st // details are a convenience; the code and message suffice
	}
	return withDetails
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

// fromBackend turns an error of Backend.Apply/Get into the API error a client
// sees. internal reports an error whose cause should be logged.
func fromBackend(err error) (apiErr *Error, internal bool) {
	var e *Error
	if errors.As(err, &e) && e.Code.Known() {
		if e.Code == CodeUnavailable && e.RetryAfter <= 0 {
			c := *e
			c.RetryAfter = defaultRetryAfter
			return &c, false
		}
		return e, e.Code == CodeInternal
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
	if st, ok := status.FromError(err); ok {
		return fromStatus(st)
	}
	return &Error{Code: CodeInternal, Message: internalMessage}, true
}

const unavailableAdvice = "; it may or may not have applied a reserve, complete or release: retry with the same owner token after Retry-After"

// fromStatus maps a gRPC status (from a backend that forwarded over gRPC)
// back to the API error. An ErrorInfo of ErrorDomain names the code exactly;
// otherwise the status code decides.
func fromStatus(st *status.Status) (*Error, bool) {
	var code Code
	var retry time.Duration
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == ErrorDomain && Code(d.GetReason()).Known() {
				code = Code(d.GetReason())
			}
		case *errdetails.RetryInfo:
			retry = d.GetRetryDelay().AsDuration()
		}
	}
	msg := st.Message()
	if code == "" {
		switch st.Code() {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			code = CodeUnavailable
			if st.Code() != codes.Unavailable || msg == "" {
				msg = "the store did not decide in time"
			}
			msg += unavailableAdvice
		case codes.InvalidArgument:
			code = CodeInvalidArgument
		case codes.NotFound:
			code = CodeNotFound
		case codes.FailedPrecondition:
			code = CodeNotOwner
		case codes.ResourceExhausted:
			code = CodeResourceExhausted
			lower := strings.ToLower(msg)
			if strings.Contains(lower, "payload too large") || strings.Contains(lower, "larger than max") {
				code = CodePayloadTooLarge
			}
		case codes.Unauthenticated:
			code = CodeUnauthenticated
		case codes.PermissionDenied:
			code = CodePermissionDenied
		default:
			return &Error{Code: CodeInternal, Message: internalMessage}, true
		}
	}
	if code == CodeInternal {
		return &Error{Code: CodeInternal, Message: internalMessage}, true
	}
	if code == CodeUnavailable && retry <= 0 {
		retry = defaultRetryAfter
	}
	if msg == "" {
		msg = strings.ToLower(strings.ReplaceAll(string(code), "_", " "))
	}
	return &Error{Code: code, Message: msg, RetryAfter: retry}, false
}
