package wire

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
)

// The times are whole microseconds past 2026 so that they survive
// timestamppb exactly.
const t0 = int64(1_780_000_000_000_000_000)

func TestReserveRoundTrip(t *testing.T) {
	resp := &fsm.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(`{"id":1}`)}
	for _, res := range []fsm.Result{
		{Outcome: fsm.OutcomeAcquired, OwnerToken: "tok_0123456789abcdef", FencingToken: 7, LeaseExpiresAt: t0},
		{Outcome: fsm.OutcomeReclaimed, OwnerToken: "tok_0123456789abcdef", FencingToken: 9, PreviousFencingToken: 7, LeaseExpiresAt: t0},
		{Outcome: fsm.OutcomeInProgress, LeaseExpiresAt: t0, RetryAfter: 1500 * 1e6},
		{Outcome: fsm.OutcomeCompleted, FencingToken: 7, Response: resp, CompletedAt: t0, ExpiresAt: t0 + 86_400e9},
		{Outcome: fsm.OutcomeFingerprintMismatch},
	} {
		got := ReserveFromProto(ReserveToProto(res))
		if !reflect.DeepEqual(got, res) {
			t.Errorf("%v: round trip\n got %+v\nwant %+v", res.Outcome, got, res)
		}
	}
	// Fields of other outcomes are not sent.
	p := ReserveToProto(fsm.Result{Outcome: fsm.OutcomeInProgress, OwnerToken: "secret-of-the-holder", FencingToken: 3, LeaseExpiresAt: t0})
	if p.GetOwnerToken() != "" || p.GetFencingToken() != 0 {
		t.Errorf("IN_PROGRESS leaks the holder's token: %v", p)
	}
	if got := ReserveFromProto(&idemv1.ReserveResponse{Outcome: idemv1.Outcome(99)}).Outcome; got != fsm.OutcomeInvalid {
		t.Errorf("unknown wire outcome = %v, want INVALID", got)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, rec := range []fsm.Record{
		{State: fsm.StateInProgress, Fingerprint: "fp", FencingToken: 3, LeaseExpiresAt: t0},
		{State: fsm.StateCompleted, Fingerprint: "fp", FencingToken: 3, CompletedAt: t0, ExpiresAt: t0 + 1e9,
			Response: &fsm.Response{Status: 200, Body: []byte("ok")}},
	} {
		if got := RecordFromProto(RecordToProto(rec)); !reflect.DeepEqual(got, rec) {
			t.Errorf("round trip\n got %+v\nwant %+v", got, rec)
		}
	}
}

func TestOutcomeAndStateRoundTrip(t *testing.T) {
	for o := contract.OutcomeUnknown + 1; o <= contract.OutcomeFingerprintMismatch; o++ {
		if got := FSMOutcomeToContract(FSMOutcomeFromContract(o)); got != o {
			t.Errorf("fsm outcome %v -> %v", o, got)
		}
	}
	for _, o := range []fsm.Outcome{fsm.OutcomeOK, fsm.OutcomeNotOwner, fsm.OutcomeInvalid} {
		if got := FSMOutcomeToContract(o); got != contract.OutcomeUnknown {
			t.Errorf("%v is not a reserve outcome, got %v", o, got)
		}
	}
	for _, s := range []fsm.State{fsm.StateInProgress, fsm.StateCompleted} {
		if got := StateFromProto(StateToProto(s)); got != s {
			t.Errorf("state %v -> %v", s, got)
		}
	}
	if ResponseFromProto(ResponseToProto(nil)) != nil {
		t.Error("nil response round trip")
	}
}

func TestBackendError(t *testing.T) {
	if BackendError(nil) != nil {
		t.Fatal("nil")
	}
	err := BackendError(idemv1.ErrorToStatus(contract.CodeUnavailable, "no leader", 3*time.Second).Err())
	var ue *backend.UnavailableError
	if !errors.As(err, &ue) || ue.RetryAfter != 3*time.Second || ue.Reason != "no leader" {
		t.Fatalf("UNAVAILABLE = %#v", err)
	}
	err = BackendError(idemv1.ErrorToStatus(contract.CodePayloadTooLarge, "too big", 0).Err())
	var be *backend.Error
	if !errors.As(err, &be) || be.Code != contract.CodePayloadTooLarge || be.Message != "too big" {
		t.Fatalf("PAYLOAD_TOO_LARGE = %#v", err)
	}
	if err := BackendError(context.Canceled); err != context.Canceled {
		t.Fatalf("context error changed: %v", err)
	}
}

func TestListShardRoundTrip(t *testing.T) {
	page := fsm.ListPage{Last: "k2", Records: []fsm.ListedRecord{
		{Key: "k1", Record: fsm.Record{State: fsm.StateInProgress, FencingToken: 3, CreatedAt: t0, LeaseExpiresAt: t0 + 1e9}},
		{Key: "k2", Record: fsm.Record{State: fsm.StateCompleted, FencingToken: 7, CreatedAt: t0, CompletedAt: t0 + 2e9, ExpiresAt: t0 + 3e9}},
	}}
	if got := ListShardFromProto(ListShardToProto(page)); !reflect.DeepEqual(got, page) {
		t.Errorf("round trip\n got %+v\nwant %+v", got, page)
	}
	done := fsm.ListPage{Done: true, Records: []fsm.ListedRecord{}}
	if got := ListShardFromProto(ListShardToProto(done)); !reflect.DeepEqual(got, done) {
		t.Errorf("round trip\n got %+v\nwant %+v", got, done)
	}
}
