package fsm

import "fmt"

// State is the state of a stored record.
type State uint8

const (
	// StateInProgress: an owner holds the key under a lease.
	StateInProgress State = 1
	// StateCompleted: the owner stored its final response; replay it.
	StateCompleted State = 2
	// StateExpired: a tombstone. The COMPLETED record's retention ended; its
	// fingerprint, fencing token and times are kept (no response) until
	// ExpiresAt, so a late retry learns EXPIRED instead of running again.
	StateExpired State = 3
	// StatePolicy: not a key's record but a namespace policy, stored under
	// PolicyNamespace with the namespace as its key (Record.Policy).
	StatePolicy State = 4
	// StatePartitions: not a key's record but the group's partition table
	// (PartitionsNamespace, PartitionsKey), encoded in Response.Body.
	StatePartitions State = 5
)

func (s State) String() string {
	switch s {
	case StateInProgress:
		return "IN_PROGRESS"
	case StateCompleted:
		return "COMPLETED"
	case StateExpired:
		return "EXPIRED"
	case StatePolicy:
		return "POLICY"
	case StatePartitions:
		return "PARTITIONS"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Op is the kind of a command.
type Op uint8

const (
	OpReserve   Op = 1
	OpHeartbeat Op = 2
	OpComplete  Op = 3
	OpRelease   Op = 4
	// OpSweep drops records past retention (and abandoned reservations past
	// the horizon). Namespace and Key are ignored.
	OpSweep Op = 5
	// OpForceRelease (operator action) takes an IN_PROGRESS key away from
	// its owner: the owner gets NOT_OWNER from then on, and the next reserve
	// gets RECLAIMED at once. OwnerToken is ignored.
	OpForceRelease Op = 6
	// OpDelete (operator action) removes a record, whatever its state; the
	// next reserve gets ACQUIRED. OwnerToken is ignored.
	OpDelete Op = 7
	// OpSetPolicy stores Command.Policy as the policy of Namespace (Key is
	// empty). The node applies it to every shard group, so that each
	// shard's state machine reads the same policy.
	OpSetPolicy Op = 8
	// OpCheckpoint stores Command.Checkpoint on the key's IN_PROGRESS
	// record while OwnerToken owns it.
	OpCheckpoint Op = 9
	// Partition handoff (handoff.go; Command.Handoff, Namespace and Key
	// empty). OpFreeze stops the group admitting work for partitions that
	// move away; OpImport stores their records in the destination; OpOpen
	// makes the destination serve them; OpDrop deletes what the source kept;
	// OpAdopt makes a group created by a topology change own nothing until
	// partitions are imported into it.
	OpFreeze Op = 10
	OpImport Op = 11
	OpOpen   Op = 12
	OpDrop   Op = 13
	OpAdopt  Op = 14
)

func (o Op) String() string {
	switch o {
	case OpReserve:
		return "reserve"
	case OpHeartbeat:
		return "heartbeat"
	case OpComplete:
		return "complete"
	case OpRelease:
		return "release"
	case OpSweep:
		return "sweep"
	case OpForceRelease:
		return "force-release"
	case OpDelete:
		return "delete"
	case OpSetPolicy:
		return "set-policy"
	case OpCheckpoint:
		return "checkpoint"
	case OpFreeze:
		return "freeze"
	case OpImport:
		return "import"
	case OpOpen:
		return "open"
	case OpDrop:
		return "drop"
	case OpAdopt:
		return "adopt"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Outcome is what a command did. Outcomes are values, not errors: the store
// decided, and the caller learns what it decided.
type Outcome uint8

const (
	// OutcomeAcquired: the caller owns the key (fresh, released before, past
	// retention, or a repeat by the same owner).
	OutcomeAcquired Outcome = 1
	// OutcomeReclaimed: acquired after an earlier owner's lease (plus the
	// clock-skew margin) ran out; Result.PreviousFencingToken is set.
	OutcomeReclaimed Outcome = 2
	// OutcomeInProgress: another owner holds the key.
	OutcomeInProgress Outcome = 3
	// OutcomeCompleted: the key was completed; Result.Response is the replay.
	OutcomeCompleted Outcome = 4
	// OutcomeFingerprintMismatch: the key exists with another fingerprint.
	OutcomeFingerprintMismatch Outcome = 5
	// OutcomeNotOwner: heartbeat, complete or release by somebody who does not
	// own the key (or of a key that does not exist, or is completed).
	OutcomeNotOwner Outcome = 6
	// OutcomeOK: heartbeat, complete, release or sweep succeeded.
	OutcomeOK Outcome = 7
	// OutcomeInvalid: the command was malformed (a proposer bug, never user
	// input: the API validates first). Nothing changed.
	OutcomeInvalid Outcome = 8
	// OutcomeNotFound: force-release or delete of a key that has no live
	// record.
	OutcomeNotFound Outcome = 9
	// OutcomeFailedPrecondition: force-release of a COMPLETED key (only an
	// IN_PROGRESS key can be force-released).
	OutcomeFailedPrecondition Outcome = 10
	// OutcomeExpired: the key's response is past retention and its
	// tombstone remains (Result.FencingToken, CompletedAt, ExpiredAt).
	OutcomeExpired Outcome = 11
	// OutcomeLimitExceeded: the request asked for more than its namespace's
	// policy allows (Result.Limit names the limit, Result.LimitValue its
	// value). Nothing changed.
	OutcomeLimitExceeded Outcome = 12
	// OutcomeMoved: the key's partition is not served by this group (it
	// moved to Result.MovedTo at Result.Epoch, or is still being imported
	// here, MovedTo empty). Nothing changed; the caller retries at the
	// key's current shard.
	OutcomeMoved Outcome = 13
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
	case OutcomeNotOwner:
		return "NOT_OWNER"
	case OutcomeOK:
		return "OK"
	case OutcomeInvalid:
		return "INVALID"
	case OutcomeNotFound:
		return "NOT_FOUND"
	case OutcomeFailedPrecondition:
		return "FAILED_PRECONDITION"
	case OutcomeExpired:
		return "EXPIRED"
	case OutcomeLimitExceeded:
		return "LIMIT_EXCEEDED"
	case OutcomeMoved:
		return "MOVED"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Response is the response an owner completed a key with, replayed verbatim.
type Response struct {
	Status  int32
	Headers map[string]string
	Body    []byte
}

// Command is one replicated operation. Every input that influences the
// outcome travels in the command, stamped by the proposer, so that every
// replica applying the same log reaches the same state.
type Command struct {
	Op        Op
	Namespace string
	Key       string

	// Now is the proposer's wall clock (Unix nanoseconds). The FSM uses
	// max(Now, highest Now applied so far), so its clock never runs backwards.
	// When ClockQuorum is set, the command's time is QuorumTime of its clock
	// readings instead, and Now is only informative.
	Now int64
	// ClockReadings are the clocks of the group's voters as the proposer
	// read them when stamping (its own and its estimate of each peer's,
	// Unix nanoseconds); ClockQuorum is how many of them must agree within
	// ClockBound nanoseconds (a majority of the voters). See QuorumTime.
	ClockReadings []int64
	ClockQuorum   int
	ClockBound    int64

	// Fingerprint (reserve) is compared as an exact string.
	Fingerprint string
	// OwnerToken identifies the caller (reserve, heartbeat, complete, release).
	// A reserve must carry one: the proposer generates it when the client did not.
	OwnerToken string
	// Lease (reserve, heartbeat) is the lease length in nanoseconds.
	Lease int64
	// SkewMargin (reserve) is how long past a lease's end the key stays with
	// its owner before it can be reclaimed, in nanoseconds.
	SkewMargin int64

	// Response and Retention (complete): the stored response and how long it
	// is kept, in nanoseconds.
	Response  *Response
	Retention int64

	// AbandonAfter (sweep): an IN_PROGRESS record whose lease ended longer
	// than this ago (nanoseconds) and that nobody reclaimed is dropped.
	AbandonAfter int64
	// Wait (reserve) is how long the proposer may wait for an IN_PROGRESS
	// key to stop being in progress, in nanoseconds (the contract's
	// wait_ms). It is never encoded: waiting happens around proposals, on
	// the node that leads the shard, not in the log.
	Wait int64
	// Reason (force-release, delete) is the operator's reason, for the
	// logs of the processes the action passes through; never encoded.
	Reason string

	// MaxSweep (sweep) bounds how many completed records one sweep drops, so
	// a mass expiry cannot stall the apply loop; 0 means no bound.
	MaxSweep int

	// LeaseIsDefault (reserve, heartbeat): the caller asked for no lease
	// length; Lease is the built-in default, which the namespace policy's
	// default_lease replaces (and its max_lease caps). Otherwise a Lease
	// above the policy's max_lease is OutcomeLimitExceeded.
	LeaseIsDefault bool
	// RetentionIsDefault (complete): the same for Retention.
	RetentionIsDefault bool
	// IfExpiredAcquire (reserve): a key with a tombstone is ACQUIRED instead
	// of answering EXPIRED.
	IfExpiredAcquire bool
	// Checkpoint (checkpoint): the recovery point to store; its
	// FencingToken and At are set by the FSM.
	Checkpoint *Checkpoint
	// Policy (set-policy): the namespace's new policy.
	Policy *Policy
	// Handoff (freeze, import, open, drop, adopt): the partitions moved.
	Handoff *Handoff
}

// Checkpoint is the last recovery point an attempt stored on its key.
type Checkpoint struct {
	Name string
	Data []byte
	// FencingToken of the attempt that wrote it.
	FencingToken uint64
	// At is when it was stored (Unix nanoseconds).
	At int64
}

// Policy is a namespace's settings, in nanoseconds. A zero field is not set
// (the built-in default applies); TombstoneSet says whether Tombstone is
// set (0 then keeps no tombstone).
type Policy struct {
	DefaultLease, MaxLease         int64
	DefaultRetention, MaxRetention int64
	Tombstone                      int64
	TombstoneSet                   bool
}

// DefaultTombstone is how long a tombstone outlives its response when the
// namespace's policy does not say (the contract's tombstone_s default).
const DefaultTombstone int64 = 7 * 24 * 3600 * 1e9

// TombstoneFor is how long p keeps tombstones.
func (p Policy) TombstoneFor() int64 {
	if p.TombstoneSet {
		return p.Tombstone
	}
	return DefaultTombstone
}

// PolicyNamespace holds the policy records (StatePolicy). No valid
// namespace starts with '!', so it never meets a key's record.
const PolicyNamespace = "!policy"

// Record is the stored state of one (namespace, key).
type Record struct {
	State       State
	Fingerprint string
	// OwnerToken of the current (IN_PROGRESS) or completing (COMPLETED) owner.
	// Never returned by reads of the public API, logged or exported. Empty
	// for an IN_PROGRESS record an operator force-released (Released).
	OwnerToken string
	// FencingToken is the Raft log index of the entry that acquired the key.
	FencingToken uint64
	// PreviousFencingToken is set when the key was RECLAIMED from an earlier
	// owner, so a repeated reserve by the same owner answers the same.
	PreviousFencingToken uint64

	// Times are Unix nanoseconds.
	LeaseExpiresAt int64 // IN_PROGRESS
	CreatedAt      int64
	CompletedAt    int64 // COMPLETED
	ExpiresAt      int64 // COMPLETED: end of retention; EXPIRED: end of the tombstone
	// ExpiredAt (EXPIRED) is when the response's retention ended.
	ExpiredAt int64
	Response  *Response
	// Checkpoint (IN_PROGRESS) is the last recovery point of an attempt on
	// the key: the current owner's, or the one it reclaimed the key from.
	Checkpoint *Checkpoint
	// Policy (StatePolicy) is a namespace's policy.
	Policy *Policy
}

// Result is the outcome of applying one command.
type Result struct {
	Outcome Outcome

	// ACQUIRED / RECLAIMED.
	OwnerToken           string
	PreviousFencingToken uint64
	// ACQUIRED / RECLAIMED / COMPLETED.
	FencingToken uint64
	// ACQUIRED / RECLAIMED / IN_PROGRESS / heartbeat OK (Unix nanoseconds).
	LeaseExpiresAt int64
	// IN_PROGRESS: a hint for when to ask again, never past the moment the
	// key could be reclaimed (nanoseconds).
	RetryAfter int64
	// COMPLETED / complete OK (Unix nanoseconds).
	CompletedAt int64
	ExpiresAt   int64
	Response    *Response

	// OK of force-release / delete: the fencing token of the owner the key
	// was taken from (force-release) or of the deleted record (delete) is
	// in PreviousFencingToken, and its state in State.
	State State

	// Sweep: how many records were dropped or turned into tombstones.
	Swept int

	// EXPIRED: when the response's retention ended (Unix nanoseconds).
	ExpiredAt int64
	// RECLAIMED: the last checkpoint of an earlier attempt (nil: none);
	// checkpoint OK: the stored one.
	Checkpoint *Checkpoint
	// LIMIT_EXCEEDED: the policy limit the request exceeded
	// ("max_lease_ms", "max_retention_s") and its value in the limit's unit.
	Limit      string
	LimitValue int64
	// set-policy OK: the policy stored.
	Policy *Policy
	// MOVED (and a refused handoff): the shard the key's partition went to
	// ("" while it is being imported here) and the epoch it moved at.
	MovedTo string
	Epoch   uint64
	// Freeze OK: the group's clock (Unix nanoseconds), which the
	// destination's must not go below (Handoff.Clock).
	Clock int64
}
