package wire

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
)

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
	code, msg, retry := idemv1.StatusToError(st)
	if code == contract.CodeUnavailable {
		if msg == "" {
			msg = "the store did not decide in time"
		}
		return &backend.UnavailableError{RetryAfter: retry, Reason: msg}
	}
	return &backend.Error{Code: code, Message: msg, RetryAfter: retry}
}

// pairs is a two-way conversion table: each row pairs a value of one type
// with its counterpart of the other. A conversion looks it up, so that the
// two directions cannot disagree.
type pairs[A, B comparable] []struct {
	a A
	b B
}

// to is the counterpart of a, or none when no row holds a.
func (p pairs[A, B]) to(a A, none B) B {
	for _, row := range p {
		if row.a == a {
			return row.b
		}
	}
	return none
}

// from is the counterpart of b, or none when no row holds b.
func (p pairs[A, B]) from(b B, none A) A {
	for _, row := range p {
		if row.b == b {
			return row.a
		}
	}
	return none
}

// outcomes pairs each reserve outcome of the state machine with the
// contract's (api/idem/v1 pairs the contract's with the wire's).
var outcomes = pairs[fsm.Outcome, contract.Outcome]{
	{fsm.OutcomeAcquired, contract.OutcomeAcquired},
	{fsm.OutcomeReclaimed, contract.OutcomeReclaimed},
	{fsm.OutcomeInProgress, contract.OutcomeInProgress},
	{fsm.OutcomeCompleted, contract.OutcomeCompleted},
	{fsm.OutcomeFingerprintMismatch, contract.OutcomeFingerprintMismatch},
	{fsm.OutcomeExpired, contract.OutcomeExpired},
}

// states pairs each record state with its wire form.
var states = pairs[fsm.State, idemv1.State]{
	{fsm.StateInProgress, idemv1.State_STATE_IN_PROGRESS},
	{fsm.StateCompleted, idemv1.State_STATE_COMPLETED},
	{fsm.StateExpired, idemv1.State_STATE_EXPIRED},
}

// FSMOutcomeToContract is the public outcome of a state-machine reserve
// outcome; OutcomeUnknown for the outcomes that are not a reserve's (OK,
// NOT_OWNER, INVALID).
func FSMOutcomeToContract(o fsm.Outcome) contract.Outcome {
	return outcomes.to(o, contract.OutcomeUnknown)
}

// FSMOutcomeFromContract is the state-machine outcome of a public reserve
// outcome; fsm.OutcomeInvalid for OutcomeUnknown.
func FSMOutcomeFromContract(o contract.Outcome) fsm.Outcome {
	return outcomes.from(o, fsm.OutcomeInvalid)
}

// StateToProto is the wire state of a record state.
func StateToProto(s fsm.State) idemv1.State {
	return states.to(s, idemv1.State_STATE_UNSPECIFIED)
}

// StateFromProto is the record state of a wire state (0 for unspecified).
func StateFromProto(s idemv1.State) fsm.State {
	return states.from(s, 0)
}

// ResponseToProto is the wire form of a stored response; nil for nil.
func ResponseToProto(r *fsm.Response) *idemv1.StoredResponse {
	if r == nil {
		return nil
	}
	return &idemv1.StoredResponse{Status: r.Status, Headers: r.Headers, Body: r.Body}
}

// ResponseFromProto is the stored response of its wire form; nil for nil.
func ResponseFromProto(r *idemv1.StoredResponse) *fsm.Response {
	if r == nil {
		return nil
	}
	return &fsm.Response{Status: r.GetStatus(), Headers: r.GetHeaders(), Body: r.GetBody()}
}

// ReserveToProto is the ReserveResponse of a reserve's result: the fields of
// its outcome only (docs/api.md). RetryAfter is rounded down to milliseconds,
// so that the hint never points past the moment the key could be reclaimed.
// The caller sets OwnerToken when res carries none (see server).
func ReserveToProto(res fsm.Result) *idemv1.ReserveResponse {
	out := &idemv1.ReserveResponse{Outcome: idemv1.OutcomeToProto(FSMOutcomeToContract(res.Outcome))}
	switch res.Outcome {
	case fsm.OutcomeAcquired, fsm.OutcomeReclaimed:
		out.OwnerToken = res.OwnerToken
		out.FencingToken = res.FencingToken
		out.LeaseExpiresAt = idemv1.TimeToProto(res.LeaseExpiresAt)
		if res.Outcome == fsm.OutcomeReclaimed {
			out.PreviousFencingToken = res.PreviousFencingToken
			out.Checkpoint = CheckpointToProto(res.Checkpoint)
		}
	case fsm.OutcomeExpired:
		out.FencingToken = res.FencingToken
		out.CompletedAt = idemv1.TimeToProto(res.CompletedAt)
		out.ExpiredAt = idemv1.TimeToProto(res.ExpiredAt)
	case fsm.OutcomeInProgress:
		out.RetryAfterMs = max(res.RetryAfter/int64(time.Millisecond), 0)
		out.LeaseExpiresAt = idemv1.TimeToProto(res.LeaseExpiresAt)
	case fsm.OutcomeCompleted:
		out.FencingToken = res.FencingToken
		out.Response = ResponseToProto(res.Response)
		if out.Response == nil {
			out.Response = &idemv1.StoredResponse{}
		}
		out.CompletedAt = idemv1.TimeToProto(res.CompletedAt)
		out.ExpiresAt = idemv1.TimeToProto(res.ExpiresAt)
	}
	return out
}

// ReserveFromProto is the reserve result of a ReserveResponse; an unknown
// wire outcome becomes fsm.OutcomeInvalid.
func ReserveFromProto(p *idemv1.ReserveResponse) fsm.Result {
	return fsm.Result{
		Outcome:              FSMOutcomeFromContract(idemv1.OutcomeFromProto(p.GetOutcome())),
		OwnerToken:           p.GetOwnerToken(),
		FencingToken:         p.GetFencingToken(),
		PreviousFencingToken: p.GetPreviousFencingToken(),
		LeaseExpiresAt:       idemv1.TimeFromProto(p.GetLeaseExpiresAt()),
		RetryAfter:           p.GetRetryAfterMs() * int64(time.Millisecond),
		CompletedAt:          idemv1.TimeFromProto(p.GetCompletedAt()),
		ExpiresAt:            idemv1.TimeFromProto(p.GetExpiresAt()),
		Response:             ResponseFromProto(p.GetResponse()),
		ExpiredAt:            idemv1.TimeFromProto(p.GetExpiredAt()),
		Checkpoint:           CheckpointFromProto(p.GetCheckpoint()),
	}
}

// CheckpointToProto is the wire form of a checkpoint; nil for nil.
func CheckpointToProto(c *fsm.Checkpoint) *idemv1.KeyCheckpoint {
	if c == nil {
		return nil
	}
	return &idemv1.KeyCheckpoint{Name: c.Name, Data: c.Data, FencingToken: c.FencingToken, CheckpointedAt: idemv1.TimeToProto(c.At)}
}

// CheckpointFromProto is the checkpoint of its wire form; nil for nil.
func CheckpointFromProto(p *idemv1.KeyCheckpoint) *fsm.Checkpoint {
	if p == nil {
		return nil
	}
	return &fsm.Checkpoint{Name: p.GetName(), Data: p.GetData(), FencingToken: p.GetFencingToken(), At: idemv1.TimeFromProto(p.GetCheckpointedAt())}
}

// PolicyRequestToProto is the wire form of a policy to set: only the
// fields p sets, in the API's units.
func PolicyRequestToProto(p fsm.Policy) *idemv1.NamespacePolicy {
	out := &idemv1.NamespacePolicy{}
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
func PolicyFromProto(p *idemv1.NamespacePolicy) fsm.Policy {
	ms, s := int64(time.Millisecond), int64(time.Second)
	return fsm.Policy{
		DefaultLease: p.GetDefaultLeaseMs() * ms, MaxLease: p.GetMaxLeaseMs() * ms,
		DefaultRetention: p.GetDefaultRetentionS() * s, MaxRetention: p.GetMaxRetentionS() * s,
		Tombstone: p.GetTombstoneS() * s, TombstoneSet: p.TombstoneS != nil,
	}
}

// PolicyToProto is the wire form of a policy in force: every field set, in
// the API's units, the built-in defaults filled in (contract.EffectivePolicy).
func PolicyToProto(p fsm.Policy) *idemv1.NamespacePolicy {
	e := contract.EffectivePolicyOf(p.DefaultLease, p.MaxLease, p.DefaultRetention, p.MaxRetention, p.Tombstone, p.TombstoneSet)
	return &idemv1.NamespacePolicy{
		DefaultLeaseMs:    &e.DefaultLeaseMs,
		MaxLeaseMs:        &e.MaxLeaseMs,
		DefaultRetentionS: &e.DefaultRetentionS,
		MaxRetentionS:     &e.MaxRetentionS,
		TombstoneS:        &e.TombstoneS,
	}
}

// RecordToProto is the GetResponse of a found record: the fields of its
// state only.
func RecordToProto(rec fsm.Record) *idemv1.GetResponse {
	out := &idemv1.GetResponse{Fingerprint: rec.Fingerprint, FencingToken: rec.FencingToken}
	if rec.State == fsm.StateExpired {
		out.State = idemv1.State_STATE_EXPIRED
		out.CompletedAt = idemv1.TimeToProto(rec.CompletedAt)
		out.ExpiredAt = idemv1.TimeToProto(rec.ExpiredAt)
		return out
	}
	if rec.State == fsm.StateCompleted {
		out.State = idemv1.State_STATE_COMPLETED
		out.CompletedAt = idemv1.TimeToProto(rec.CompletedAt)
		out.ExpiresAt = idemv1.TimeToProto(rec.ExpiresAt)
		out.Response = ResponseToProto(rec.Response)
		if out.Response == nil {
			out.Response = &idemv1.StoredResponse{}
		}
	} else {
		out.State = idemv1.State_STATE_IN_PROGRESS
		out.LeaseExpiresAt = idemv1.TimeToProto(rec.LeaseExpiresAt)
		out.Checkpoint = CheckpointToProto(rec.Checkpoint)
	}
	return out
}

// RecordFromProto is the record of a GetResponse.
func RecordFromProto(p *idemv1.GetResponse) fsm.Record {
	return fsm.Record{
		State:          StateFromProto(p.GetState()),
		Fingerprint:    p.GetFingerprint(),
		FencingToken:   p.GetFencingToken(),
		LeaseExpiresAt: idemv1.TimeFromProto(p.GetLeaseExpiresAt()),
		CompletedAt:    idemv1.TimeFromProto(p.GetCompletedAt()),
		ExpiresAt:      idemv1.TimeFromProto(p.GetExpiresAt()),
		Response:       ResponseFromProto(p.GetResponse()),
		ExpiredAt:      idemv1.TimeFromProto(p.GetExpiredAt()),
		Checkpoint:     CheckpointFromProto(p.GetCheckpoint()),
	}
}

// KeyToProto is the KeyInfo of a listed record.
func KeyToProto(r fsm.ListedRecord) *idemv1.KeyInfo {
	out := &idemv1.KeyInfo{Key: r.Key, State: StateToProto(r.Record.State), FencingToken: r.Record.FencingToken,
		CreatedAt: idemv1.TimeToProto(r.Record.CreatedAt)}
	if r.Record.State == fsm.StateCompleted {
		out.CompletedAt = idemv1.TimeToProto(r.Record.CompletedAt)
		out.ExpiresAt = idemv1.TimeToProto(r.Record.ExpiresAt)
	} else {
		out.LeaseExpiresAt = idemv1.TimeToProto(r.Record.LeaseExpiresAt)
	}
	return out
}

// KeyFromProto is the listed record of a KeyInfo.
func KeyFromProto(p *idemv1.KeyInfo) fsm.ListedRecord {
	return fsm.ListedRecord{Key: p.GetKey(), Record: fsm.Record{
		State:          StateFromProto(p.GetState()),
		FencingToken:   p.GetFencingToken(),
		CreatedAt:      idemv1.TimeFromProto(p.GetCreatedAt()),
		LeaseExpiresAt: idemv1.TimeFromProto(p.GetLeaseExpiresAt()),
		CompletedAt:    idemv1.TimeFromProto(p.GetCompletedAt()),
		ExpiresAt:      idemv1.TimeFromProto(p.GetExpiresAt()),
	}}
}

// KeysToProto converts listed records.
func KeysToProto(rs []fsm.ListedRecord) []*idemv1.KeyInfo {
	out := make([]*idemv1.KeyInfo, len(rs))
	for i, r := range rs {
		out[i] = KeyToProto(r)
	}
	return out
}

// KeysFromProto converts KeyInfos.
func KeysFromProto(ps []*idemv1.KeyInfo) []fsm.ListedRecord {
	out := make([]fsm.ListedRecord, len(ps))
	for i, p := range ps {
		out[i] = KeyFromProto(p)
	}
	return out
}

// ListShardToProto is the wire form of one shard's page.
func ListShardToProto(p fsm.ListPage) *idemv1.ListShardResponse {
	return &idemv1.ListShardResponse{Keys: KeysToProto(p.Records), Last: p.Last, Done: p.Done}
}

// ListShardFromProto is the shard page of a ListShardResponse.
func ListShardFromProto(p *idemv1.ListShardResponse) fsm.ListPage {
	return fsm.ListPage{Records: KeysFromProto(p.GetKeys()), Last: p.GetLast(), Done: p.GetDone()}
}
