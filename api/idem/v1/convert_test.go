package idemv1

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idem-dev/idem/contract"
)

// The times are whole microseconds past 2026 so that they survive
// timestamppb exactly.
const t0 = int64(1_780_000_000_000_000_000)

func TestOutcomeAndTimeRoundTrip(t *testing.T) {
	for o := contract.OutcomeUnknown; o <= contract.OutcomeFingerprintMismatch; o++ {
		if got := OutcomeFromProto(OutcomeToProto(o)); got != o {
			t.Errorf("outcome %v -> %v", o, got)
		}
	}
	if TimeFromProto(TimeToProto(0)) != 0 || TimeFromProto(TimeToProto(t0)) != t0 {
		t.Error("time round trip")
	}
}

func TestGRPCCode(t *testing.T) {
	for code, want := range map[contract.Code]codes.Code{
		contract.CodeInvalidArgument: codes.InvalidArgument, contract.CodeNotOwner: codes.FailedPrecondition,
		contract.CodePayloadTooLarge: codes.ResourceExhausted, contract.CodeUnavailable: codes.Unavailable,
		contract.CodeInternal: codes.Internal, contract.CodeNotFound: codes.NotFound,
	} {
		if got := GRPCCode(code); got != want {
			t.Errorf("GRPCCode(%s) = %v, want %v", code, got, want)
		}
	}
}

func TestErrorStatusRoundTrip(t *testing.T) {
	for _, code := range []contract.Code{
		contract.CodeInvalidArgument, contract.CodeUnauthenticated, contract.CodePermissionDenied,
		contract.CodeNotFound, contract.CodeMethodNotAllowed, contract.CodeNotOwner, contract.CodePayloadTooLarge,
		contract.CodeResourceExhausted, contract.CodeInternal, contract.CodeUnavailable,
	} {
		for _, retry := range []time.Duration{0, 3 * time.Second} {
			gotCode, gotMsg, gotRetry := StatusToError(ErrorToStatus(code, "why", retry))
			if gotCode != code || gotMsg != "why" || gotRetry != retry {
				t.Errorf("%s/%v: round trip = %s, %q, %v", code, retry, gotCode, gotMsg, gotRetry)
			}
		}
	}
}

// A status without ErrorInfo (from something that is not idem) maps by its
// code, and by message for ResourceExhausted.
func TestStatusWithoutDetails(t *testing.T) {
	for _, tc := range []struct {
		st   *status.Status
		code contract.Code
	}{
		{status.New(codes.Unavailable, "connection refused"), contract.CodeUnavailable},
		{status.New(codes.DeadlineExceeded, "deadline"), contract.CodeUnavailable},
		{status.New(codes.InvalidArgument, "bad key"), contract.CodeInvalidArgument},
		{status.New(codes.NotFound, "nope"), contract.CodeNotFound},
		{status.New(codes.FailedPrecondition, "not owner"), contract.CodeNotOwner},
		{status.New(codes.ResourceExhausted, "Payload too large: body"), contract.CodePayloadTooLarge},
		{status.New(codes.ResourceExhausted, "grpc: received message larger than max (9 vs. 4)"), contract.CodePayloadTooLarge},
		{status.New(codes.ResourceExhausted, "quota"), contract.CodeResourceExhausted},
		{status.New(codes.Unauthenticated, "who"), contract.CodeUnauthenticated},
		{status.New(codes.PermissionDenied, "no"), contract.CodePermissionDenied},
		{status.New(codes.Internal, "stack trace here"), contract.CodeInternal},
		{status.New(codes.Unimplemented, "old node"), contract.CodeInternal},
	} {
		if got, _, _ := StatusToError(tc.st); got != tc.code {
			t.Errorf("%v: %s, want %s", tc.st, got, tc.code)
		}
	}
}
