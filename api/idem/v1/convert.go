package idemv1

import (
	"context"
	"errors"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
)

// This file is the one place where the proto messages meet the Go types of
// the state machine (fsm) and the contract. Each conversion comes in a
// To/From pair, and convert_test.go checks that every pair round-trips.

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

// BackendError turns the error of a gRPC call to an idem node into the
// closed set of package backend, for a Backend that forwards: UNAVAILABLE
// (and a deadline or cancellation) becomes a *backend.UnavailableError with
// the node's message as reason, any other status a *backend.Error with its
// code. Context errors and errors already in the set pass through; nil
// stays nil.
func BackendError(err error) error {
	if err == nil || errors.Is(err, backend.ErrUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var be *backend.Error
	if errors.As(err, &be) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	code, msg, retry := StatusToError(st)
	if code == contract.CodeUnavailable {
		if msg == "" {
			msg = "the store did not decide in time"
		}
		return &backend.UnavailableError{RetryAfter: retry, Reason: msg}
	}
	return &backend.Error{Code: code, Message: msg, RetryAfter: retry}
}

// outcomes pairs each reserve outcome in its three forms: the state
// machine's, the contract's and the wire's. The conversions below look it up,
// so that no two can disagree.
var outcomes = [...]struct {
	fsm  fsm.Outcome
	pub  contract.Outcome
	wire Outcome
}{
	{fsm.OutcomeAcquired, contract.OutcomeAcquired, Outcome_ACQUIRED},
	{fsm.OutcomeReclaimed, contract.OutcomeReclaimed, Outcome_RECLAIMED},
	{fsm.OutcomeInProgress, contract.OutcomeInProgress, Outcome_IN_PROGRESS},
	{fsm.OutcomeCompleted, contract.OutcomeCompleted, Outcome_COMPLETED},
	{fsm.OutcomeFingerprintMismatch, contract.OutcomeFingerprintMismatch, Outcome_FINGERPRINT_MISMATCH},
	{fsm.OutcomeExpired, contract.OutcomeExpired, Outcome_EXPIRED},
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

// FSMOutcomeToContract is the public outcome of a state-machine reserve
// outcome; OutcomeUnknown for the outcomes that are not a reserve's (OK,
// NOT_OWNER, INVALID).
func FSMOutcomeToContract(o fsm.Outcome) contract.Outcome {
	for _, row := range outcomes {
		if row.fsm == o {
			return row.pub
		}
	}
	return contract.OutcomeUnknown
}

// FSMOutcomeFromContract is the state-machine outcome of a public reserve
// outcome; fsm.OutcomeInvalid for OutcomeUnknown.
func FSMOutcomeFromContract(o contract.Outcome) fsm.Outcome {
	for _, row := range outcomes {
		if row.pub == o {
			return row.fsm
		}
	}
	return fsm.OutcomeInvalid
}

// StateToProto is the wire state of a record state.
func StateToProto(s fsm.State) State {
	switch s {
	case fsm.StateInProgress:
		return State_STATE_IN_PROGRESS
	case fsm.StateCompleted:
		return State_STATE_COMPLETED
	case fsm.StateExpired:
		return State_STATE_EXPIRED
	}
	return State_STATE_UNSPECIFIED
}

// StateFromProto is the record state of a wire state (0 for unspecified).
func StateFromProto(s State) fsm.State {
	switch s {
	case State_STATE_IN_PROGRESS:
		return fsm.StateInProgress
	case State_STATE_COMPLETED:
		return fsm.StateCompleted
	case State_STATE_EXPIRED:
		return fsm.StateExpired
	}
	return 0
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

// ResponseToProto is the wire form of a stored response; nil for nil.
func ResponseToProto(r *fsm.Response) *StoredResponse {
	if r == nil {
		return nil
	}
	return &StoredResponse{Status: r.Status, Headers: r.Headers, Body: r.Body}
}

// ResponseFromProto is the stored response of its wire form; nil for nil.
func ResponseFromProto(r *StoredResponse) *fsm.Response {
	if r == nil {
		return nil
	}
	return &fsm.Response{Status: r.GetStatus(), Headers: r.GetHeaders(), Body: r.GetBody()}
}

// ReserveToProto is the ReserveResponse of a reserve's result: the fields of
// its outcome only (docs/API-v1.md). RetryAfter is rounded down to milliseconds,
// so that the hint never points past the moment the key could be reclaimed.
// The caller sets OwnerToken when res carries none (see server).
func ReserveToProto(res fsm.Result) *ReserveResponse {
	out := &ReserveResponse{Outcome: OutcomeToProto(FSMOutcomeToContract(res.Outcome))}
	switch res.Outcome {
	case fsm.OutcomeAcquired, fsm.OutcomeReclaimed:
		out.OwnerToken = res.OwnerToken
		out.FencingToken = res.FencingToken
		out.LeaseExpiresAt = TimeToProto(res.LeaseExpiresAt)
		if res.Outcome == fsm.OutcomeReclaimed {
			out.PreviousFencingToken = res.PreviousFencingToken
			out.Checkpoint = CheckpointToProto(res.Checkpoint)
		}
	case fsm.OutcomeExpired:
		out.FencingToken = res.FencingToken
		out.CompletedAt = TimeToProto(res.CompletedAt)
		out.ExpiredAt = TimeToProto(res.ExpiredAt)
	case fsm.OutcomeInProgress:
		out.RetryAfterMs = max(res.RetryAfter/int64(time.Millisecond), 0)
		out.LeaseExpiresAt = TimeToProto(res.LeaseExpiresAt)
	case fsm.OutcomeCompleted:
		out.FencingToken = res.FencingToken
		out.Response = ResponseToProto(res.Response)
		if out.Response == nil {
			out.Response = &StoredResponse{}
		}
		out.CompletedAt = TimeToProto(res.CompletedAt)
		out.ExpiresAt = TimeToProto(res.ExpiresAt)
	}
	return out
}

// ReserveFromProto is the reserve result of a ReserveResponse; an unknown
// wire outcome becomes fsm.OutcomeInvalid.
func ReserveFromProto(p *ReserveResponse) fsm.Result {
	return fsm.Result{
		Outcome:              FSMOutcomeFromContract(OutcomeFromProto(p.GetOutcome())),
		OwnerToken:           p.GetOwnerToken(),
		FencingToken:         p.GetFencingToken(),
		PreviousFencingToken: p.GetPreviousFencingToken(),
		LeaseExpiresAt:       TimeFromProto(p.GetLeaseExpiresAt()),
		RetryAfter:           p.GetRetryAfterMs() * int64(time.Millisecond),
		CompletedAt:          TimeFromProto(p.GetCompletedAt()),
		ExpiresAt:            TimeFromProto(p.GetExpiresAt()),
		Response:             ResponseFromProto(p.GetResponse()),
		ExpiredAt:            TimeFromProto(p.GetExpiredAt()),
		Checkpoint:           CheckpointFromProto(p.GetCheckpoint()),
	}
}

// CheckpointToProto is the wire form of a checkpoint; nil for nil.
func CheckpointToProto(c *fsm.Checkpoint) *KeyCheckpoint {
	if c == nil {
		return nil
	}
	return &KeyCheckpoint{Name: c.Name, Data: c.Data, FencingToken: c.FencingToken, CheckpointedAt: TimeToProto(c.At)}
}

// CheckpointFromProto is the checkpoint of its wire form; nil for nil.
func CheckpointFromProto(p *KeyCheckpoint) *fsm.Checkpoint {
	if p == nil {
		return nil
	}
	return &fsm.Checkpoint{Name: p.GetName(), Data: p.GetData(), FencingToken: p.GetFencingToken(), At: TimeFromProto(p.GetCheckpointedAt())}
}

// PolicyRequestToProto is the wire form of a policy to set: only the
// fields p sets, in the API's units.
func PolicyRequestToProto(p fsm.Policy) *NamespacePolicy {
	out := &NamespacePolicy{}
	set := func(v, unit int64) *int64 {
		if v == 0 {
			return nil
		}
		u := v / unit
		return &u
	}
	ms, s := int64(time.Millisecond), int64(time.Second)
	out.DefaultLeaseMs, out.MaxLeaseMs = set(p.DefaultLease, ms), set(p.MaxLease, ms)
	out.DefaultRetentionS, out.MaxRetentionS = set(p.DefaultRetention, s), set(p.MaxRetention, s)
	if p.TombstoneSet {
		t := p.Tombstone / s
		out.TombstoneS = &t
	}
	return out
}

// PolicyFromProto is the policy of a policy in force (every field set) as
// an fsm.Policy: every field set.
func PolicyFromProto(p *NamespacePolicy) fsm.Policy {
	ms, s := int64(time.Millisecond), int64(time.Second)
	return fsm.Policy{
		DefaultLease: p.GetDefaultLeaseMs() * ms, MaxLease: p.GetMaxLeaseMs() * ms,
		DefaultRetention: p.GetDefaultRetentionS() * s, MaxRetention: p.GetMaxRetentionS() * s,
		Tombstone: p.GetTombstoneS() * s, TombstoneSet: p.TombstoneS != nil,
	}
}

// PolicyToProto is the wire form of a policy in force: every field set, in
// the API's units, the built-in defaults filled in (contract.EffectivePolicy).
func PolicyToProto(p fsm.Policy) *NamespacePolicy {
	e := contract.EffectivePolicyOf(p.DefaultLease, p.MaxLease, p.DefaultRetention, p.MaxRetention, p.Tombstone, p.TombstoneSet)
	return &NamespacePolicy{
		DefaultLeaseMs:    &e.DefaultLeaseMs,
		MaxLeaseMs:        &e.MaxLeaseMs,
		DefaultRetentionS: &e.DefaultRetentionS,
		MaxRetentionS:     &e.MaxRetentionS,
		TombstoneS:        &e.TombstoneS,
	}
}

// RecordToProto is the GetResponse of a found record: the fields of its
// state only.
func RecordToProto(rec fsm.Record) *GetResponse {
	out := &GetResponse{Fingerprint: rec.Fingerprint, FencingToken: rec.FencingToken}
	if rec.State == fsm.StateExpired {
		out.State = State_STATE_EXPIRED
		out.CompletedAt = TimeToProto(rec.CompletedAt)
		out.ExpiredAt = TimeToProto(rec.ExpiredAt)
		return out
	}
	if rec.State == fsm.StateCompleted {
		out.State = State_STATE_COMPLETED
		out.CompletedAt = TimeToProto(rec.CompletedAt)
		out.ExpiresAt = TimeToProto(rec.ExpiresAt)
		out.Response = ResponseToProto(rec.Response)
		if out.Response == nil {
			out.Response = &StoredResponse{}
		}
	} else {
		out.State = State_STATE_IN_PROGRESS
		out.LeaseExpiresAt = TimeToProto(rec.LeaseExpiresAt)
		out.Checkpoint = CheckpointToProto(rec.Checkpoint)
	}
	return out
}

// RecordFromProto is the record of a GetResponse.
func RecordFromProto(p *GetResponse) fsm.Record {
	return fsm.Record{
		State:          StateFromProto(p.GetState()),
		Fingerprint:    p.GetFingerprint(),
		FencingToken:   p.GetFencingToken(),
		LeaseExpiresAt: TimeFromProto(p.GetLeaseExpiresAt()),
		CompletedAt:    TimeFromProto(p.GetCompletedAt()),
		ExpiresAt:      TimeFromProto(p.GetExpiresAt()),
		Response:       ResponseFromProto(p.GetResponse()),
		ExpiredAt:      TimeFromProto(p.GetExpiredAt()),
		Checkpoint:     CheckpointFromProto(p.GetCheckpoint()),
	}
}

// KeyToProto is the KeyInfo of a listed record.
func KeyToProto(r fsm.ListedRecord) *KeyInfo {
	out := &KeyInfo{Key: r.Key, State: StateToProto(r.Record.State), FencingToken: r.Record.FencingToken,
		CreatedAt: TimeToProto(r.Record.CreatedAt)}
	if r.Record.State == fsm.StateCompleted {
		out.CompletedAt = TimeToProto(r.Record.CompletedAt)
		out.ExpiresAt = TimeToProto(r.Record.ExpiresAt)
	} else {
		out.LeaseExpiresAt = TimeToProto(r.Record.LeaseExpiresAt)
	}
	return out
}

// KeyFromProto is the listed record of a KeyInfo.
func KeyFromProto(p *KeyInfo) fsm.ListedRecord {
	return fsm.ListedRecord{Key: p.GetKey(), Record: fsm.Record{
		State:          StateFromProto(p.GetState()),
		FencingToken:   p.GetFencingToken(),
		CreatedAt:      TimeFromProto(p.GetCreatedAt()),
		LeaseExpiresAt: TimeFromProto(p.GetLeaseExpiresAt()),
		CompletedAt:    TimeFromProto(p.GetCompletedAt()),
		ExpiresAt:      TimeFromProto(p.GetExpiresAt()),
	}}
}

// KeysToProto converts listed records.
func KeysToProto(rs []fsm.ListedRecord) []*KeyInfo {
	out := make([]*KeyInfo, len(rs))
	for i, r := range rs {
		out[i] = KeyToProto(r)
	}
	return out
}

// KeysFromProto converts KeyInfos.
func KeysFromProto(ps []*KeyInfo) []fsm.ListedRecord {
	out := make([]fsm.ListedRecord, len(ps))
	for i, p := range ps {
		out[i] = KeyFromProto(p)
	}
	return out
}

// ListShardToProto is the wire form of one shard's page.
func ListShardToProto(p fsm.ListPage) *ListShardResponse {
	return &ListShardResponse{Keys: KeysToProto(p.Records), Last: p.Last, Done: p.Done}
}

// ListShardFromProto is the shard page of a ListShardResponse.
func ListShardFromProto(p *ListShardResponse) fsm.ListPage {
	return fsm.ListPage{Records: KeysFromProto(p.GetKeys()), Last: p.GetLast(), Done: p.GetDone()}
}
