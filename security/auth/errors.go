package auth

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Errors of package auth. A denied request gets an *Error that unwraps to
// one of the first three.
var (
	// ErrUnauthenticated: no credentials, or credentials of no known
	// principal (HTTP 401, gRPC UNAUTHENTICATED).
	ErrUnauthenticated = errors.New("auth: unauthenticated")
	// ErrPermissionDenied: a known principal, but the namespace is not among
	// its namespaces or the verb is above its role (HTTP 403, gRPC
	// PERMISSION_DENIED).
	ErrPermissionDenied = errors.New("auth: permission denied")
	// ErrRateLimited: the principal is over its rate_per_s (HTTP 429 with
	// Retry-After, gRPC RESOURCE_EXHAUSTED with a RetryInfo detail).
	ErrRateLimited = errors.New("auth: rate limited")
	// ErrInvalidFile: the auth file does not parse or breaks a rule; the
	// joined errors say which principal and why.
	ErrInvalidFile = errors.New("auth: invalid auth file")
)

// The error codes of the public contract that auth produces (docs/api.md,
// "Errors"), spelled as the API spells them.
const (
	CodeUnauthenticated   = "UNAUTHENTICATED"
	CodePermissionDenied  = "PERMISSION_DENIED"
	CodeResourceExhausted = "RESOURCE_EXHAUSTED"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail of a gRPC
// error (the same as the server's).
const ErrorDomain = "idem.dev"

// Error is a refused request: the contract's code, a message the caller can
// act on, and for RESOURCE_EXHAUSTED when to retry.
type Error struct {
	Code       string
	Message    string
	RetryAfter time.Duration // > 0 only for RESOURCE_EXHAUSTED
}

func (e *Error) Error() string { return "auth: " + e.Code + ": " + e.Message }

// Unwrap makes errors.Is(err, ErrUnauthenticated) (and the others) hold.
func (e *Error) Unwrap() error {
	switch e.Code {
	case CodeUnauthenticated:
		return ErrUnauthenticated
	case CodePermissionDenied:
		return ErrPermissionDenied
	case CodeResourceExhausted:
		return ErrRateLimited
	}
	return nil
}

// HTTPStatus is 401, 403 or 429.
func (e *Error) HTTPStatus() int {
	switch e.Code {
	case CodeUnauthenticated:
		return http.StatusUnauthorized
	case CodePermissionDenied:
		return http.StatusForbidden
	case CodeResourceExhausted:
		return http.StatusTooManyRequests
	}
	return http.StatusInternalServerError
}

// RetryAfterSeconds is the Retry-After header value: whole seconds, rounded
// up, at least 1.
func (e *Error) RetryAfterSeconds() int64 {
	return max(int64((e.RetryAfter+time.Second-1)/time.Second), 1)
}

// GRPCStatus is the gRPC status of e, with an ErrorInfo (reason = Code) and,
// for RESOURCE_EXHAUSTED, a RetryInfo detail.
func (e *Error) GRPCStatus() *status.Status {
	code := codes.Internal
	switch e.Code {
	case CodeUnauthenticated:
		code = codes.Unauthenticated
	case CodePermissionDenied:
		code = codes.PermissionDenied
	case CodeResourceExhausted:
		code = codes.ResourceExhausted
	}
	st := status.New(code, e.Message)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: e.Code, Domain: ErrorDomain}}
	if e.RetryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(e.RetryAfter)})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		return withDetails
	}
	return st
}

func unauthenticated(format string, args ...any) *Error {
	return &Error{Code: CodeUnauthenticated, Message: fmt.Sprintf(format, args...)}
}

func denied(format string, args ...any) *Error {
	return &Error{Code: CodePermissionDenied, Message: fmt.Sprintf(format, args...)}
}
