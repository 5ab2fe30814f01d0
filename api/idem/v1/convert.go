package idemv1

import (
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idem-dev/idem/contract"
)

// This file converts between the proto messages and the contract's Go
// types: error codes and statuses, reserve outcomes, times. The conversions
// to and from the state machine's types are the serving side's
// (internal/wire), so a program that links this package links no fsm.
// Each conversion comes in a To/From pair, and convert_test.go checks that
// every pair round-trips.

// GRPCCode is the gRPC status code that carries c.
func GRPCCode(c contract.Code) codes.Code {
	switch c {
	case contract.CodeInvalidArgument:
		return codes.InvalidArgument
	case contract.CodeUnauthenticated:
		return codes.Unauthenticated
	case contract.CodePermissionDenied:
		return codes.PermissionDenied
	case contract.CodeNotFound:
		return codes.NotFound
	case contract.CodeMethodNotAllowed:
		return codes.Unimplemented
	case contract.CodeNotOwner, contract.CodeFailedPrecondition:
		return codes.FailedPrecondition
	case contract.CodePayloadTooLarge, contract.CodeResourceExhausted:
		return codes.ResourceExhausted
	case contract.CodeUnavailable:
		return codes.Unavailable
	}
	return codes.Internal
}

// ErrorToStatus is the gRPC status of an API error: GRPCCode(code), the
// message, a google.rpc.ErrorInfo (reason = code, domain =
// contract.ErrorDomain) and, when retryAfter is positive, a RetryInfo.
func ErrorToStatus(code contract.Code, msg string, retryAfter time.Duration) *status.Status {
	st := status.New(GRPCCode(code), msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: string(code), Domain: contract.ErrorDomain}}
	if retryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	}
	withDetails, err := st.WithDetails(details...)
	if err != nil {
		return st // details are a convenience; the code and message suffice
	}
	return withDetails
}

// StatusToError reads an API error back from a gRPC status. An ErrorInfo of
// contract.ErrorDomain names the code exactly; otherwise the status code
// decides (DeadlineExceeded and Canceled are UNAVAILABLE; a
// ResourceExhausted about message size, as grpc-go itself reports it, is
// PAYLOAD_TOO_LARGE), and codes with no public meaning are INTERNAL.
func StatusToError(st *status.Status) (code contract.Code, msg string, retryAfter time.Duration) {
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == contract.ErrorDomain && contract.Code(d.GetReason()).Known() {
				code = contract.Code(d.GetReason())
			}
		case *errdetails.RetryInfo:
			retryAfter = d.GetRetryDelay().AsDuration()
		}
	}
	msg = st.Message()
	if code != "" {
		return code, msg, retryAfter
	}
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		code = contract.CodeUnavailable
	case codes.InvalidArgument:
		code = contract.CodeInvalidArgument
	case codes.NotFound:
		code = contract.CodeNotFound
	case codes.FailedPrecondition:
		code = contract.CodeNotOwner
	case codes.ResourceExhausted:
		code = contract.CodeResourceExhausted
		lower := strings.ToLower(msg)
		if strings.Contains(lower, "payload too large") || strings.Contains(lower, "larger than max") {
			code = contract.CodePayloadTooLarge
		}
	case codes.Unauthenticated:
		code = contract.CodeUnauthenticated
	case codes.PermissionDenied:
		code = contract.CodePermissionDenied
	default:
		code = contract.CodeInternal
	}
	return code, msg, retryAfter
}

// outcomes pairs each reserve outcome in its two forms here: the
// contract's and the wire's (internal/wire pairs the contract's with the
// state machine's). The conversions below look it up, so that no two can
// disagree.
var outcomes = [...]struct {
	pub  contract.Outcome
	wire Outcome
}{
	{contract.OutcomeAcquired, Outcome_ACQUIRED},
	{contract.OutcomeReclaimed, Outcome_RECLAIMED},
	{contract.OutcomeInProgress, Outcome_IN_PROGRESS},
	{contract.OutcomeCompleted, Outcome_COMPLETED},
	{contract.OutcomeFingerprintMismatch, Outcome_FINGERPRINT_MISMATCH},
	{contract.OutcomeExpired, Outcome_EXPIRED},
}

// OutcomeToProto is the wire outcome of a reserve outcome;
// OUTCOME_UNSPECIFIED for every other value.
func OutcomeToProto(o contract.Outcome) Outcome {
	for _, row := range outcomes {
		if row.pub == o {
			return row.wire
		}
	}
	return Outcome_OUTCOME_UNSPECIFIED
}

// OutcomeFromProto is the reserve outcome of a wire outcome; OutcomeUnknown
// for OUTCOME_UNSPECIFIED and values this build does not know.
func OutcomeFromProto(o Outcome) contract.Outcome {
	for _, row := range outcomes {
		if row.wire == o {
			return row.pub
		}
	}
	return contract.OutcomeUnknown
}

// TimeToProto is the timestamp of Unix nanoseconds; nil for 0 (absent).
func TimeToProto(unixNanos int64) *timestamppb.Timestamp {
	if unixNanos == 0 {
		return nil
	}
	return timestamppb.New(time.Unix(0, unixNanos))
}

// TimeFromProto is the Unix nanoseconds of a timestamp; 0 for nil.
func TimeFromProto(ts *timestamppb.Timestamp) int64 {
	if ts == nil {
		return 0
	}
	return ts.AsTime().UnixNano()
}
