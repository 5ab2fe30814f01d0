package fsm

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

const testPartitions = 64

// encodedApplier applies commands through the log encoding, as replicas do.
type encodedApplier struct {
	*applier
}

func newEncoded(t *testing.T) *encodedApplier { return &encodedApplier{newApplier(t)} }

func (a *encodedApplier) do(cmd *Command) Result {
	a.index += 2
	return a.f.ApplyEntry(a.index, EncodeCommand(cmd))
}

func (a *encodedApplier) must(cmd *Command, outcome Outcome) Result {
	a.t.Helper()
	r := a.do(cmd)
	if r.Outcome != outcome {
		a.t.Fatalf("%s %s by %s: outcome %s, want %s (result %+v)", cmd.Op, cmd.Key, cmd.OwnerToken, r.Outcome, outcome, r)
	}
	return r
}

func handoffCmd(op Op, now int64, h Handoff) *Command {
	h.Count = testPartitions
	return &Command{Op: op, Now: now, Handoff: &h}
}

// adoptAll gives a group the table of one that serves every partition.
func adoptAll(a *encodedApplier) {
	all := make([]uint32, testPartitions)
	for p := range all {
		all[p] = uint32(p)
	}
	a.must(handoffCmd(OpAdopt, t0, Handoff{Partitions: all}), OutcomeOK)
}

// keysIn returns n keys of namespace "ns" whose partitions are in (in) or
// out of (!in) parts.
func keysIn(parts []uint32, in bool, n int, prefix string) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		k := fmt.Sprintf("%s-%d", prefix, i)
		if slices.Contains(parts, PartitionOf("ns", k, testPartitions)) == in {
			out = append(out, k)
		}
	}
	return out
}

// move runs a whole handoff of parts from src to dst at epoch (freeze,
// export, import in batches of batch records, open) and returns the floor.
func move(t *testing.T, src, dst *encodedApplier, srcID, dstID string, parts []uint32, epoch uint64, now int64, batch int) uint64 {
	t.Helper()
	fr := src.must(handoffCmd(OpFreeze, now, Handoff{Partitions: parts, Epoch: epoch, Peer: dstID}), OutcomeOK)
	var recs []KeyedRecord
	if err := src.f.ExportPartitions(testPartitions, parts, func(kr KeyedRecord) bool { recs = append(recs, kr); return true }); err != nil {
		t.Fatal(err)
	}
	first := true
	for len(recs) > 0 || first {
		n := min(batch, len(recs))
		records := recs[:n]
		if first { // the source's policies travel with the first import
			records = append(src.f.PolicyRecords(), records...)
		}
		dst.must(handoffCmd(OpImport, now, Handoff{Partitions: parts, Epoch: epoch, Peer: srcID, Floor: fr.FencingToken, Reset: first, Records: records}), OutcomeOK)
		recs, first = recs[n:], false
	}
	dst.must(handoffCmd(OpOpen, now, Handoff{Partitions: parts, Epoch: epoch, Peer: srcID}), OutcomeOK)
	return fr.FencingToken
}

// Every promise of a key that changes shard holds across the handoff:
// completed keys replay the same response and token, in-progress keys stay
// with their owner (who can heartbeat, checkpoint and complete at the
// destination), tombstones stay, the source answers MOVED from the freeze
// on, and every token the destination issues is above every token the
// source issued.
func TestHandoffKeepsEveryPromise(t *testing.T) {
	src, dst := newEncoded(t), newEncoded(t)
	dst.must(handoffCmd(OpAdopt, t0, Handoff{}), OutcomeOK)
	parts := []uint32{1, 5, 9, 33, 40, 63}
	moving := keysIn(parts, true, 40, "m")
	staying := keysIn(parts, false, 10, "s")

	// The source's history: completed, in progress with a checkpoint,
	// released, and a tombstone (a completed key past retention, swept).
	now := t0
	policy := Policy{MaxLease: 90 * sec, Tombstone: 3600 * sec, TombstoneSet: true}
	src.must(&Command{Op: OpSetPolicy, Namespace: "ns", Now: now, Policy: &policy}, OutcomeOK)
	responses := map[string]Result{}
	for i, k := range moving {
		owner := "owner-" + k
		acq := src.must(reserveCmd(k, owner, "fp-"+k, now), OutcomeAcquired)
		switch i % 4 {
		case 0:
			src.must(completeCmd(k, owner, now, "body-"+k), OutcomeOK)
			responses[k] = src.must(reserveCmd(k, "other", "fp-"+k, now), OutcomeCompleted)
		case 1:
			src.must(&Command{Op: OpCheckpoint, Namespace: "ns", Key: k, Now: now, OwnerToken: owner, Checkpoint: &Checkpoint{Name: "charged", Data: []byte(k)}}, OutcomeOK)
		case 2:
			src.must(releaseCmd(k, owner, now), OutcomeOK)
		case 3:
			c := completeCmd(k, owner, now, "old-"+k)
			c.Retention = sec
			src.must(c, OutcomeOK)
		}
		_ = acq
	}
	for _, k := range staying {
		src.must(reserveCmd(k, "owner-"+k, "fp", now), OutcomeAcquired)
	}
	now += 2 * sec
	src.must(&Command{Op: OpSweep, Now: now, MaxSweep: 1000}, OutcomeOK) // the retention-1s keys become tombstones
	before := src.f.Stats()
	adoptAll(src) // a group that served every key routed to it adopts a table saying so

	// The destination does not serve the partitions before they open.
	dst.must(reserveCmd(moving[0], "early", "fp-"+moving[0], now), OutcomeMoved)

	floor := move(t, src, dst, "r-0", "r-2", parts, 2, now, 7)
	if floor == 0 || floor < src.f.LastToken()-2 {
		t.Fatalf("floor %d, source's last token %d", floor, src.f.LastToken())
	}

	// The source answers MOVED for moved keys, naming the destination, and
	// still serves its other keys.
	for _, k := range moving[:4] {
		r := src.must(reserveCmd(k, "late", "fp-"+k, now), OutcomeMoved)
		if r.MovedTo != "r-2" || r.Epoch != 2 {
			t.Fatalf("moved answer %+v", r)
		}
		if owned, to, _ := src.f.Owns("ns", k); owned || to != "r-2" {
			t.Fatalf("Owns(%s) at the source: %v %q", k, owned, to)
		}
	}
	src.must(heartbeatCmd(staying[0], "owner-"+staying[0], now), OutcomeOK)
	dst.must(reserveCmd(staying[0], "x", "fp", now), OutcomeMoved)

	// The destination keeps every promise, and enforces the source's
	// namespace policy.
	if p, ok := dst.f.Policy("ns"); !ok || p != policy {
		t.Fatalf("policy at the destination: %+v %v", p, ok)
	}
	over := reserveCmd(moving[2], "x", "fp-"+moving[2], now)
	over.Lease = 100 * sec
	dst.must(over, OutcomeLimitExceeded)
	now += sec
	for i, k := range moving {
		owner := "owner-" + k
		switch i % 4 {
		case 0:
			r := dst.must(reserveCmd(k, "other", "fp-"+k, now), OutcomeCompleted)
			if !reflect.DeepEqual(r.Response, responses[k].Response) || r.FencingToken != responses[k].FencingToken || r.CompletedAt != responses[k].CompletedAt {
				t.Fatalf("replay of %s at the destination: %+v, at the source %+v", k, r, responses[k])
			}
		case 1:
			dst.must(reserveCmd(k, "other", "fp-"+k, now), OutcomeInProgress)
			dst.must(heartbeatCmd(k, owner, now), OutcomeOK)
			rec, ok := dst.f.Get("ns", k, now)
			if !ok || rec.Checkpoint == nil || rec.Checkpoint.Name != "charged" || !bytes.Equal(rec.Checkpoint.Data, []byte(k)) {
				t.Fatalf("checkpoint of %s did not travel: %+v", k, rec)
			}
			dst.must(completeCmd(k, owner, now, "done"), OutcomeOK)
		case 2:
			r := dst.must(reserveCmd(k, "new-owner", "fp-"+k, now), OutcomeAcquired)
			if r.FencingToken <= floor {
				t.Fatalf("token %d for %s at the destination, not above the source's floor %d", r.FencingToken, k, floor)
			}
		case 3:
			r := dst.must(reserveCmd(k, "late-retry", "fp-"+k, now), OutcomeExpired)
			if r.FencingToken == 0 || r.FencingToken > floor {
				t.Fatalf("tombstone of %s: %+v", k, r)
			}
			a := dst.must(&Command{Op: OpReserve, Namespace: "ns", Key: k, Now: now, Fingerprint: "fp-" + k, OwnerToken: "again", Lease: lease, IfExpiredAcquire: true}, OutcomeAcquired)
			if a.FencingToken <= floor {
				t.Fatalf("token %d after a tombstone, floor %d", a.FencingToken, floor)
			}
		}
	}
	fresh := keysIn(parts, true, 41, "m")[40]
	if r := dst.must(reserveCmd(fresh, "o", "fp", now), OutcomeAcquired); r.FencingToken <= floor {
		t.Fatalf("fresh key's token %d, floor %d", r.FencingToken, floor)
	}

	// The source drops what it kept, in bounded steps, and still knows
	// where the partitions went.
	dropped := 0
	for {
		r := src.must(handoffCmd(OpDrop, now, Handoff{Partitions: parts, Epoch: 2, Limit: 9}), OutcomeOK)
		dropped += r.Swept
		if r.Swept < 9 {
			break
		}
	}
	after := src.f.Stats()
	kept := len(moving) - len(moving)/4 // released keys left no record
	if dropped != kept || after.Records != before.Records-kept {
		t.Fatalf("dropped %d of %d moved records; records %d -> %d", dropped, kept, before.Records, after.Records)
	}
	src.must(reserveCmd(moving[1], "late", "fp", now), OutcomeMoved)
}

// A handoff that would overwrite live state or skip a step is refused,
// and refused commands change nothing.
func TestHandoffRefusesUnsafeSteps(t *testing.T) {
	src, dst := newEncoded(t), newEncoded(t)
	parts := []uint32{3, 4}
	k := keysIn(parts, true, 1, "k")[0]
	src.must(reserveCmd(k, "o", "fp", t0), OutcomeAcquired)
	dst.must(reserveCmd(k, "x", "fp", t0), OutcomeAcquired) // a group without a table owns every key

	// Import into partitions the destination owns: refused, nothing stored.
	dst.must(handoffCmd(OpImport, t0, Handoff{Partitions: parts, Epoch: 1, Peer: "a", Reset: true}), OutcomeFailedPrecondition)
	// Adopting a group that holds records: refused.
	dst.must(handoffCmd(OpAdopt, t0, Handoff{}), OutcomeFailedPrecondition)

	fresh := newEncoded(t)
	fresh.must(handoffCmd(OpAdopt, t0, Handoff{}), OutcomeOK)
	fresh.must(handoffCmd(OpAdopt, t0, Handoff{}), OutcomeOK) // again: a no-op
	// Open before import; import without a reset; freeze what it does not own.
	fresh.must(handoffCmd(OpOpen, t0, Handoff{Partitions: parts, Epoch: 1}), OutcomeFailedPrecondition)
	fresh.must(handoffCmd(OpImport, t0, Handoff{Partitions: parts, Epoch: 1, Peer: "a"}), OutcomeFailedPrecondition)
	fresh.must(handoffCmd(OpFreeze, t0, Handoff{Partitions: parts, Epoch: 1, Peer: "b"}), OutcomeFailedPrecondition)

	// Freeze twice at the same epoch: the second is a no-op. Drop needs a
	// frozen partition.
	src.must(handoffCmd(OpDrop, t0, Handoff{Partitions: parts, Epoch: 1}), OutcomeFailedPrecondition) // no table yet
	src.must(handoffCmd(OpFreeze, t0, Handoff{Partitions: parts, Epoch: 1, Peer: "b"}), OutcomeFailedPrecondition)
	adoptAll(src)
	src.must(handoffCmd(OpFreeze, t0, Handoff{Partitions: parts, Epoch: 1, Peer: "b"}), OutcomeOK)
	src.must(handoffCmd(OpFreeze, t0, Handoff{Partitions: parts, Epoch: 1, Peer: "b"}), OutcomeOK)
	src.must(handoffCmd(OpImport, t0, Handoff{Partitions: parts, Epoch: 1, Peer: "b", Reset: true}), OutcomeFailedPrecondition) // not an older epoch
	other := keysIn(parts, false, 1, "o")[0]
	src.must(handoffCmd(OpDrop, t0, Handoff{Partitions: []uint32{PartitionOf("ns", other, testPartitions)}, Epoch: 1}), OutcomeFailedPrecondition)

	// Malformed handoffs: unsorted, out of range, no epoch, records of
	// another partition, another partition count, handoff fields on a key
	// command, an adopt naming a peer.
	for _, bad := range []*Command{
		handoffCmd(OpFreeze, t0, Handoff{Partitions: []uint32{4, 3}, Epoch: 1, Peer: "b"}),
		handoffCmd(OpFreeze, t0, Handoff{Partitions: []uint32{testPartitions}, Epoch: 1, Peer: "b"}),
		handoffCmd(OpFreeze, t0, Handoff{Partitions: parts, Peer: "b"}),
		handoffCmd(OpImport, t0, Handoff{Partitions: parts, Epoch: 1, Reset: true, Records: []KeyedRecord{{K: RecordKey{"ns", other}, R: &Record{State: StateInProgress}}}}),
		{Op: OpFreeze, Now: t0, Handoff: &Handoff{Count: testPartitions + 1, Partitions: parts, Epoch: 2, Peer: "b"}},
		{Op: OpReserve, Namespace: "ns", Key: "k", Now: t0, OwnerToken: "o", Lease: lease, Handoff: &Handoff{Count: 1}},
		handoffCmd(OpAdopt, t0, Handoff{Peer: "x"}),
	} {
		src.must(bad, OutcomeInvalid)
	}

	// A partition can come back, at a later epoch; the stale records it
	// left are replaced by the returning ones.
	back := newEncoded(t)
	back.must(handoffCmd(OpAdopt, t0, Handoff{}), OutcomeOK)
	floor := move(t, src, back, "a", "b", parts, 1, t0, 10)
	r := back.must(reserveCmd(k, "o", "fp", t0+sec), OutcomeAcquired) // the same owner: its reservation
	if r.FencingToken > floor {
		t.Fatalf("the owner's own reservation changed token: %d (floor %d)", r.FencingToken, floor)
	}
	back.must(completeCmd(k, "o", t0+sec, "first"), OutcomeOK)
	floor2 := move(t, back, src, "b", "a", parts, 3, t0+2*sec, 10)
	rep := src.must(reserveCmd(k, "z", "fp", t0+3*sec), OutcomeCompleted)
	if string(rep.Response.Body) != "first" {
		t.Fatalf("after moving back: %+v", rep)
	}
	if n := src.must(reserveCmd(keysIn(parts, true, 2, "k")[1], "o", "fp", t0+3*sec), OutcomeAcquired).FencingToken; n <= floor2 {
		t.Fatalf("token %d after moving back, floor %d", n, floor2)
	}
}

// The partition table and the token base survive a snapshot and restore,
// and the destination's tokens stay above a packed-mode source's.
func TestHandoffSurvivesSnapshotAndPackedTokens(t *testing.T) {
	src, dst := newEncoded(t), newEncoded(t)
	parts := []uint32{7}
	keys := keysIn(parts, true, 3, "p")
	// The source packs commands: its tokens are in packed mode (2^62 and up).
	src.index += 10
	src.f.ApplyPackedEntry(src.index, EncodePacked([][]byte{EncodeCommand(reserveCmd(keys[0], "o", "fp", t0)), EncodeCommand(reserveCmd(keys[1], "o", "fp", t0))}))
	adoptAll(src)
	dst.must(handoffCmd(OpAdopt, t0, Handoff{}), OutcomeOK)
	dst.must(reserveCmd(keysIn(parts, true, 1, "zz")[0], "o", "fp", t0), OutcomeMoved)
	floor := move(t, src, dst, "a", "b", parts, 4, t0, 1)
	if floor&packedSlotMark == 0 {
		t.Fatalf("floor %d is not a packed-mode token", floor)
	}

	var snap bytes.Buffer
	s := dst.f.Snapshot()
	_, err := s.WriteTo(&snap)
	s.Release()
	if err != nil {
		t.Fatal(err)
	}
	restored := New()
	if err := restored.Restore(&snap); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*FSM{dst.f, restored} {
		if owned, _, _ := f.Owns("ns", keys[2]); !owned {
			t.Fatalf("partition %d not owned after the import (restored: %v)", parts[0], f == restored)
		}
		if owned, _, _ := f.Owns("ns", keysIn(parts, false, 1, "q")[0]); owned {
			t.Fatal("an adopted group owns a partition it was never given")
		}
		if f.LastToken() < floor {
			t.Fatalf("last token %d below the floor %d", f.LastToken(), floor)
		}
		n, list := f.Partitions()
		if n != testPartitions || len(list) != 1 || list[0].State != "owned" || list[0].Epoch != 4 {
			t.Fatalf("partition table %d %+v", n, list)
		}
	}
	again := &encodedApplier{&applier{t: t, f: restored, index: dst.index}}
	r := again.must(reserveCmd(keys[2], "o", "fp", t0+sec), OutcomeAcquired)
	if r.FencingToken <= floor || int64(r.FencingToken) < 0 {
		t.Fatalf("token %d after restore, floor %d", r.FencingToken, floor)
	}
	r0 := again.must(reserveCmd(keys[0], "o", "fp", t0+sec), OutcomeAcquired)
	if r0.FencingToken > floor {
		t.Fatalf("the moved reservation's token changed: %d", r0.FencingToken)
	}
}

// Random workloads with a move in the middle: per key, tokens strictly
// increase across both shards, a completed response never changes, and at
// most one owner holds a key at any time.
func TestHandoffRandomized(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			src, dst := newEncoded(t), newEncoded(t)
			adoptAll(src)
			dst.must(handoffCmd(OpAdopt, t0, Handoff{}), OutcomeOK)
			var parts []uint32
			for p := range uint32(testPartitions) {
				if rng.IntN(2) == 0 {
					parts = append(parts, p)
				}
			}
			keys := make([]string, 30)
			for i := range keys {
				keys[i] = fmt.Sprintf("k%d", i)
			}
			lastToken := map[string]uint64{}
			completed := map[string]string{}
			moved := false
			now := t0
			for step := range 600 {
				if step == 300 {
					move(t, src, dst, "s", "d", parts, 1, now, 1+rng.IntN(5))
					moved = true
				}
				now += int64(rng.IntN(4)) * sec
				k := keys[rng.IntN(len(keys))]
				home := src
				if moved && slices.Contains(parts, PartitionOf("ns", k, testPartitions)) {
					home = dst
				}
				owner := fmt.Sprintf("o%d", rng.IntN(3))
				var r Result
				switch rng.IntN(4) {
				case 0, 1:
					r = home.do(reserveCmd(k, owner, "fp", now))
				case 2:
					r = home.do(completeCmd(k, owner, now, fmt.Sprintf("%s-%d", owner, step)))
				case 3:
					r = home.do(releaseCmd(k, owner, now))
				}
				if r.Outcome == OutcomeMoved || r.Outcome == OutcomeInvalid {
					t.Fatalf("step %d: %s at its home shard", step, r.Outcome)
				}
				if r.Outcome == OutcomeAcquired || r.Outcome == OutcomeReclaimed {
					if r.FencingToken < lastToken[k] {
						t.Fatalf("step %d: token %d for %s below %d", step, r.FencingToken, k, lastToken[k])
					}
					lastToken[k] = r.FencingToken
				}
				if r.Outcome == OutcomeCompleted {
					if want, ok := completed[k]; ok && want != string(r.Response.Body) {
						t.Fatalf("step %d: %s replays %q, first %q", step, k, r.Response.Body, want)
					}
					completed[k] = string(r.Response.Body)
				}
				// The other shard never answers for a key it does not serve.
				if moved {
					other := dst
					if home == dst {
						other = src
					}
					if o := other.do(reserveCmd(k, owner, "fp", now)); o.Outcome != OutcomeMoved {
						t.Fatalf("step %d: the non-home shard answered %s for %s", step, o.Outcome, k)
					}
				}
			}
		})
	}
}

func TestHandoffCommandsRoundTrip(t *testing.T) {
	rec := &Record{State: StateCompleted, Fingerprint: "fp", OwnerToken: "o", FencingToken: 9, CreatedAt: 1, CompletedAt: 2, ExpiresAt: 3,
		Response: &Response{Status: 200, Body: []byte("b")}}
	for _, cmd := range []*Command{
		handoffCmd(OpFreeze, t0, Handoff{Partitions: []uint32{0, 5, 63}, Epoch: 3, Peer: "us-east-2"}),
		handoffCmd(OpImport, t0, Handoff{Partitions: []uint32{5}, Epoch: 3, Peer: "us-east-0", Floor: 1<<62 | 77, Reset: true,
			Records: []KeyedRecord{{K: RecordKey{"ns", "a"}, R: rec}}}),
		handoffCmd(OpDrop, t0, Handoff{Partitions: []uint32{1}, Epoch: 3, Limit: 500}),
		handoffCmd(OpAdopt, t0, Handoff{Partitions: []uint32{2, 3}}),
	} {
		got, err := DecodeCommand(EncodeCommand(cmd))
		if err != nil {
			t.Fatalf("%s: %v", cmd.Op, err)
		}
		if !reflect.DeepEqual(got, cmd) {
			t.Fatalf("%s round trip:\n got %+v\nwant %+v", cmd.Op, got.Handoff, cmd.Handoff)
		}
	}
}

// Fenced handoff fields survive encoding, and a table with attempts and
// digests survives its record (version 2), while one without is still
// version 1 byte for byte.
func TestFencedHandoffEncoding(t *testing.T) {
	h := &Handoff{Count: 8, Partitions: []uint32{1, 5}, Epoch: 3, Peer: "x", Floor: 9, Reset: true, Attempt: 41, Clock: -7,
		Records: []KeyedRecord{{K: RecordKey{"ns", "k"}, R: &Record{State: StateCompleted, ExpiresAt: 10}}}}
	for _, cmd := range []*Command{{Op: OpImport, Handoff: h}, {Op: OpOpen, Handoff: &Handoff{Count: 8, Partitions: []uint32{1}, Epoch: 3, Attempt: 2, Expect: Digest{Records: 3, Sum: 1<<63 + 5}}}} {
		got, err := DecodeCommand(EncodeCommand(cmd))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.Handoff, cmd.Handoff) {
			t.Fatalf("decoded %+v, want %+v", got.Handoff, cmd.Handoff)
		}
	}
	plain := partTable{count: 4, parts: []partState{{kind: partOwned, epoch: 1}, {}, {kind: partOut, epoch: 2, peer: "t"}, {}}}
	if b := plain.encode(); b[0] != partTableVersion {
		t.Fatalf("a table without attempts is written as version %d", b[0])
	}
	fenced := plain.clone()
	fenced.parts[1] = partState{kind: partIncoming, epoch: 2, peer: "s", attempt: 7, digest: Digest{Records: 2, Sum: 99}}
	got, err := decodePartTable(fenced.encode())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, fenced) {
		t.Fatalf("decoded %+v, want %+v", got, fenced)
	}
}
