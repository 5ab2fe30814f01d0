package fsm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/idem-dev/idem/internal/testutil"
)

// model is a deliberately plain second implementation of the contract's
// rules, written from docs/api.md without looking at the FSM's structure. The
// fuzz test drives both with the same commands and compares every outcome.
type model struct {
	clock  int64
	keys   map[string]*modelKey
	policy Policy // of namespace "ns", the only one the generator uses
}

type modelKey struct {
	completed     bool
	tombstone     bool  // expired: only fingerprint, fencing and times kept
	expiredAt     int64 // tombstone: when the response's retention ended
	checkpoint    *Checkpoint
	fp, owner     string
	fencing, prev uint64
	leaseEnd      int64
	completedAt   int64
	expiresAt     int64
	status        int32
	body          string
	headers       string // canonical form of the stored headers (a complete retried with others is another response)
}

// headerKey is a map's canonical form for comparing stored responses.
func headerKey(h map[string]string) string {
	keys := slices.Sorted(maps.Keys(h))
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%q=%q;", k, h[k])
	}
	return b.String()
}

func (m *model) apply(index uint64, c *Command) Result {
	if c.Now > m.clock {
		m.clock = c.Now
	}
	now := m.clock
	keep := DefaultTombstone
	if m.policy.TombstoneSet {
		keep = m.policy.Tombstone
	}
	if c.Op == OpSweep {
		n := 0
		for key, k := range m.keys {
			switch {
			case k.completed && !k.tombstone && k.expiresAt <= now:
				// The response expires: a tombstone stays for the policy's time.
				n++
				if keep > 0 && k.expiresAt+keep > now {
					*k = modelKey{completed: true, tombstone: true, fp: k.fp, fencing: k.fencing, completedAt: k.completedAt,
						expiredAt: k.expiresAt, expiresAt: k.expiresAt + keep}
				} else {
					delete(m.keys, key)
				}
			case k.tombstone && k.expiresAt <= now,
				!k.completed && c.AbandonAfter > 0 && k.leaseEnd+c.AbandonAfter <= now:
				delete(m.keys, key)
				n++
			}
		}
		return Result{Outcome: OutcomeOK, Swept: n}
	}
	if c.Op == OpSetPolicy {
		m.policy = *c.Policy
		return Result{Outcome: OutcomeOK, Policy: c.Policy}
	}
	k := m.keys[c.Key]
	if k != nil && k.completed && !k.tombstone && k.expiresAt <= now {
		// Past retention: a tombstone while the policy keeps one, else absent.
		if keep > 0 && k.expiresAt+keep > now {
			k = &modelKey{completed: true, tombstone: true, fp: k.fp, fencing: k.fencing, completedAt: k.completedAt,
				expiredAt: k.expiresAt, expiresAt: k.expiresAt + keep}
		} else {
			k = nil
		}
	}
	if k != nil && k.tombstone && k.expiresAt <= now {
		k = nil // the tombstone is over: as if absent
	}
	lease, retention := c.Lease, c.Retention
	var over *Result
	switch c.Op {
	case OpReserve, OpHeartbeat:
		lease, over = modelLimit(c.Lease, c.LeaseIsDefault, m.policy.DefaultLease, m.policy.MaxLease, "max_lease_ms", 1e6)
	case OpComplete:
		retention, over = modelLimit(c.Retention, c.RetentionIsDefault, m.policy.DefaultRetention, m.policy.MaxRetention, "max_retention_s", 1e9)
	}
	if over != nil {
		return *over
	}
	if k != nil && k.tombstone && c.Op != OpReserve && c.Op != OpDelete {
		if c.Op == OpForceRelease {
			return Result{Outcome: OutcomeFailedPrecondition}
		}
		return Result{Outcome: OutcomeNotOwner}
	}
	switch c.Op {
	case OpReserve:
		if k != nil && k.fp != c.Fingerprint {
			return Result{Outcome: OutcomeFingerprintMismatch}
		}
		if k != nil && k.tombstone {
			if !c.IfExpiredAcquire {
				return Result{Outcome: OutcomeExpired, FencingToken: k.fencing, CompletedAt: k.completedAt, ExpiredAt: k.expiredAt}
			}
			nk := &modelKey{fp: c.Fingerprint, owner: c.OwnerToken, fencing: index, leaseEnd: now + lease}
			m.keys[c.Key] = nk
			return Result{Outcome: OutcomeAcquired, FencingToken: index, LeaseExpiresAt: nk.leaseEnd}
		}
		if k != nil && k.completed {
			return Result{Outcome: OutcomeCompleted, FencingToken: k.fencing, CompletedAt: k.completedAt, ExpiresAt: k.expiresAt}
		}
		if k != nil && k.owner == c.OwnerToken {
			k.leaseEnd = now + lease
			out := OutcomeAcquired
			var cp *Checkpoint
			if k.prev != 0 {
				out = OutcomeReclaimed
				if k.checkpoint != nil && k.checkpoint.FencingToken != k.fencing {
					cp = k.checkpoint
				}
			}
			return Result{Outcome: out, FencingToken: k.fencing, PreviousFencingToken: k.prev, LeaseExpiresAt: k.leaseEnd, Checkpoint: cp}
		}
		// An owner-less (force-released) key is free at once; any other
		// only after its lease plus the skew margin.
		if k != nil && k.owner != "" && now < k.leaseEnd+c.SkewMargin {
			return Result{Outcome: OutcomeInProgress, LeaseExpiresAt: k.leaseEnd}
		}
		var prev uint64
		var cp *Checkpoint
		if k != nil {
			prev, cp = k.fencing, k.checkpoint // the last checkpoint goes to the reclaiming attempt
		}
		nk := &modelKey{fp: c.Fingerprint, owner: c.OwnerToken, fencing: index, prev: prev, leaseEnd: now + lease, checkpoint: cp}
		m.keys[c.Key] = nk
		out := OutcomeAcquired
		if prev != 0 {
			out = OutcomeReclaimed
		}
		return Result{Outcome: out, FencingToken: index, PreviousFencingToken: prev, LeaseExpiresAt: nk.leaseEnd, Checkpoint: cp}
	case OpCheckpoint:
		if k == nil || k.completed || k.owner != c.OwnerToken {
			return Result{Outcome: OutcomeNotOwner}
		}
		k.checkpoint = &Checkpoint{Name: c.Checkpoint.Name, Data: c.Checkpoint.Data, FencingToken: k.fencing, At: now}
		return Result{Outcome: OutcomeOK, FencingToken: k.fencing, Checkpoint: k.checkpoint}
	case OpHeartbeat:
		if k == nil || k.completed || k.owner != c.OwnerToken {
			return Result{Outcome: OutcomeNotOwner}
		}
		k.leaseEnd = now + lease
		return Result{Outcome: OutcomeOK, FencingToken: k.fencing, LeaseExpiresAt: k.leaseEnd}
	case OpComplete:
		if k == nil || k.owner != c.OwnerToken {
			return Result{Outcome: OutcomeNotOwner}
		}
		if k.completed {
			if k.status != c.Response.Status || k.body != string(c.Response.Body) || k.headers != headerKey(c.Response.Headers) {
				return Result{Outcome: OutcomeNotOwner}
			}
			return Result{Outcome: OutcomeOK, FencingToken: k.fencing, CompletedAt: k.completedAt, ExpiresAt: k.expiresAt}
		}
		k.completed, k.completedAt, k.expiresAt, k.checkpoint = true, now, now+retention, nil
		k.status, k.body, k.headers = c.Response.Status, string(c.Response.Body), headerKey(c.Response.Headers)
		return Result{Outcome: OutcomeOK, FencingToken: k.fencing, CompletedAt: k.completedAt, ExpiresAt: k.expiresAt}
	case OpRelease:
		if k == nil || k.completed || k.owner != c.OwnerToken {
			return Result{Outcome: OutcomeNotOwner}
		}
		delete(m.keys, c.Key)
		return Result{Outcome: OutcomeOK}
	case OpForceRelease:
		if k == nil {
			return Result{Outcome: OutcomeNotFound}
		}
		if k.completed {
			return Result{Outcome: OutcomeFailedPrecondition}
		}
		if k.owner != "" {
			k.owner, k.leaseEnd = "", min(k.leaseEnd, now)
		}
		return Result{Outcome: OutcomeOK, PreviousFencingToken: k.fencing}
	case OpDelete:
		if k == nil {
			return Result{Outcome: OutcomeNotFound}
		}
		delete(m.keys, c.Key)
		return Result{Outcome: OutcomeOK, PreviousFencingToken: k.fencing}
	}
	return Result{Outcome: OutcomeInvalid}
}

// modelLimit: a value left to the default takes the policy's default,
// capped by its max; one asked for above the max is refused.
func modelLimit(v int64, isDefault bool, def, maxV int64, name string, unit int64) (int64, *Result) {
	if isDefault {
		if def > 0 {
			v = def
		}
		if maxV > 0 && v > maxV {
			v = maxV
		}
		return v, nil
	}
	if maxV > 0 && v > maxV {
		return 0, &Result{Outcome: OutcomeLimitExceeded, Limit: name, LimitValue: maxV / unit}
	}
	return v, nil
}

// genCommands turns fuzz bytes into a command sequence over a few keys,
// owners and fingerprints, with a clock that mostly advances but sometimes
// jumps back (a proposer with a slow clock).
func genCommands(data []byte) []*Command {
	var cmds []*Command
	now := t0
	for len(data) >= 3 {
		op, arg, dt := data[0], data[1], data[2]
		data = data[3:]
		if dt&0x80 != 0 {
			now -= int64(dt&0x7f) * sec / 4
		} else {
			now += int64(dt) * sec / 2
		}
		key := []string{"a", "b", "c"}[arg%3]
		owner := []string{"owner-1", "owner-2", "owner-3"}[(arg/3)%3]
		fp := []string{"", "x"}[(arg/9)%2]
		var c *Command
		switch op % 13 {
		case 0, 1:
			c = &Command{Op: OpReserve, Fingerprint: fp, OwnerToken: owner, Lease: int64(1+arg%40) * sec, SkewMargin: skew}
		case 2:
			c = &Command{Op: OpHeartbeat, OwnerToken: owner, Lease: int64(1+arg%40) * sec}
		case 3:
			c = &Command{Op: OpComplete, OwnerToken: owner, Retention: int64(1+arg%60) * sec,
				Response: &Response{Status: 200 + int32(arg%2), Body: []byte{'r', arg % 2}, Headers: genHeaders(arg / 2 % 4)}}
		case 4:
			c = &Command{Op: OpRelease, OwnerToken: owner}
		case 5:
			c = &Command{Op: OpSweep, AbandonAfter: int64(arg%4) * 10 * sec}
		case 6:
			c = &Command{Op: OpForceRelease}
		case 7:
			c = &Command{Op: OpDelete}
		case 8:
			c = &Command{Op: OpCheckpoint, OwnerToken: owner, Checkpoint: &Checkpoint{Name: []string{"charge", "record"}[arg%2], Data: []byte{arg}}}
		case 9:
			c = &Command{Op: OpSetPolicy, Policy: genPolicy(arg)}
		case 10:
			c = &Command{Op: OpReserve, Fingerprint: fp, OwnerToken: owner, Lease: 30 * sec, LeaseIsDefault: true, SkewMargin: skew, IfExpiredAcquire: arg&1 == 0}
		case 11:
			c = &Command{Op: OpComplete, OwnerToken: owner, Retention: 40 * sec, RetentionIsDefault: true,
				Response: &Response{Status: 200 + int32(arg%2), Body: []byte{'r', arg % 2}, Headers: genHeaders(arg / 2 % 4)}}
		case 12:
			c = &Command{Op: OpReserve, Fingerprint: fp, OwnerToken: owner, Lease: int64(1+arg%40) * sec, SkewMargin: skew, IfExpiredAcquire: true}
		}
		if c.Op == OpSetPolicy {
			c.Namespace = "ns"
		} else if c.Op != OpSweep {
			c.Namespace, c.Key = "ns", key
		}
		c.Now = now
		cmds = append(cmds, c)
	}
	return cmds
}

// genPolicy gives the fuzzed set-policy commands a few policies: none,
// no tombstones, short tombstones, lease and retention limits.
func genPolicy(arg byte) *Policy {
	switch arg % 5 {
	case 1:
		return &Policy{TombstoneSet: true}
	case 2:
		return &Policy{Tombstone: 20 * sec, TombstoneSet: true}
	case 3:
		return &Policy{DefaultLease: 5 * sec, MaxLease: 20 * sec, MaxRetention: 30 * sec}
	case 4:
		return &Policy{DefaultRetention: 10 * sec, MaxRetention: 50 * sec, Tombstone: 60 * sec, TombstoneSet: true}
	}
	return &Policy{}
}

// genHeaders gives the fuzzed completes four header sets, two that differ
// only in a value and one only in the case of a name, so the model checks
// that a retried complete with other headers is another response.
func genHeaders(n byte) map[string]string {
	switch n {
	case 1:
		return map[string]string{"X-Order": "1"}
	case 2:
		return map[string]string{"X-Order": "2"}
	case 3:
		return map[string]string{"x-order": "1"}
	}
	return nil
}

func equalCheckpoints(a, b *Checkpoint) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Name == b.Name && bytes.Equal(a.Data, b.Data) && a.FencingToken == b.FencingToken && a.At == b.At
}

// checkAgainstModel applies cmds to an FSM (snapshotting and restoring into a
// fresh FSM every restoreEvery commands) and to the model, and compares.
func checkAgainstModel(t *testing.T, cmds []*Command, restoreEvery int) {
	t.Helper()
	f := New()
	m := &model{keys: map[string]*modelKey{}}
	lastFencing := map[string]uint64{}
	for i, c := range cmds {
		index := uint64(i+1) * 2
		got := f.ApplyEntry(index, EncodeCommand(c))
		want := m.apply(index, c)
		if got.Outcome != want.Outcome || got.FencingToken != want.FencingToken ||
			got.PreviousFencingToken != want.PreviousFencingToken || got.LeaseExpiresAt != want.LeaseExpiresAt ||
			got.CompletedAt != want.CompletedAt || got.ExpiresAt != want.ExpiresAt || got.Swept != want.Swept ||
			got.ExpiredAt != want.ExpiredAt || got.Limit != want.Limit || got.LimitValue != want.LimitValue ||
			!equalCheckpoints(got.Checkpoint, want.Checkpoint) {
			t.Fatalf("command %d %s %s by %s at %d:\n fsm   %+v\n model %+v", i, c.Op, c.Key, c.OwnerToken, c.Now, got, want)
		}
		if got.Outcome == OutcomeAcquired || got.Outcome == OutcomeReclaimed {
			if prev := lastFencing[c.Key]; got.FencingToken < prev {
				t.Fatalf("command %d: fencing token went from %d to %d", i, prev, got.FencingToken)
			}
			lastFencing[c.Key] = got.FencingToken
		}
		if got.Outcome == OutcomeCompleted && (string(got.Response.Body) != m.keys[c.Key].body || headerKey(got.Response.Headers) != m.keys[c.Key].headers) {
			t.Fatalf("command %d: replayed %q %v, model %q %s", i, got.Response.Body, got.Response.Headers, m.keys[c.Key].body, m.keys[c.Key].headers)
		}
		if restoreEvery > 0 && i%restoreEvery == restoreEvery-1 {
			var buf bytes.Buffer
			if _, err := f.Snapshot().WriteTo(&buf); err != nil {
				t.Fatal(err)
			}
			g := New()
			if err := g.Restore(bytes.NewReader(buf.Bytes())); err != nil {
				t.Fatalf("restore after command %d: %v", i, err)
			}
			f = g
		}
	}
	if got, want := f.Stats().Records, len(m.keys); got != want {
		t.Fatalf("fsm holds %d records, model %d", got, want)
	}
}

func FuzzFSMAgainstModel(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 3, 1, 3, 0, 1, 0, 3, 1})
	f.Add([]byte{0, 0, 0, 0, 3, 90, 0, 3, 1, 2, 0, 1, 4, 0, 1, 5, 1, 120})
	f.Add([]byte{0, 1, 0, 0, 2, 200, 0, 1, 0, 3, 1, 1, 0, 1, 100, 5, 3, 127})
	f.Fuzz(func(t *testing.T, data []byte) {
		checkAgainstModel(t, genCommands(data), 7)
	})
}

// TestRandomAgainstModel runs the fuzz property over seeded random inputs so
// the default test run covers far more than the seed corpus.
func TestRandomAgainstModel(t *testing.T) {
	rng := testutil.Rand(testutil.Seed(t), 1)
	for round := 0; round < 300; round++ {
		data := make([]byte, 3*(50+rng.IntN(400)))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		checkAgainstModel(t, genCommands(data), 1+rng.IntN(50))
	}
}

// TestReplicasAreByteIdentical: two FSMs that apply the same log (one of
// them restored from a snapshot part way) produce identical snapshots.
func TestReplicasAreByteIdentical(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	data := make([]byte, 3*5000)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	cmds := genCommands(data)
	// More keys than the generator's three, so snapshots have real content.
	for i, c := range cmds {
		if c.Op != OpSweep {
			c.Key += string(rune('a' + i%17))
		}
	}
	a, b := New(), New()
	for i, c := range cmds {
		entry := EncodeCommand(c)
		a.ApplyEntry(uint64(i+1), entry)
		b.ApplyEntry(uint64(i+1), entry)
		if i == len(cmds)/2 {
			var buf bytes.Buffer
			if _, err := b.Snapshot().WriteTo(&buf); err != nil {
				t.Fatal(err)
			}
			b = New()
			if err := b.Restore(&buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	var sa, sb bytes.Buffer
	if _, err := a.Snapshot().WriteTo(&sa); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Snapshot().WriteTo(&sb); err != nil {
		t.Fatal(err)
	}
	if a.Stats().Records == 0 {
		t.Fatal("test log left no records to compare")
	}
	if !bytes.Equal(sa.Bytes(), sb.Bytes()) {
		t.Fatalf("replica snapshots differ (%d vs %d bytes)", sa.Len(), sb.Len())
	}
	if a.Stats() != b.Stats() {
		t.Fatalf("stats differ: %+v vs %+v", a.Stats(), b.Stats())
	}
}

func TestRestoreRejectsCorruption(t *testing.T) {
	a := newApplier(t)
	a.want(reserveCmd("k", "owner-a", "fp", t0), OutcomeAcquired)
	a.want(completeCmd("k", "owner-a", t0, "body"), OutcomeOK)
	var buf bytes.Buffer
	if _, err := a.f.Snapshot().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	for i := 0; i < len(good); i++ {
		bad := bytes.Clone(good)
		bad[i] ^= 0x41
		g := New()
		if err := g.Restore(bytes.NewReader(bad)); err == nil {
			t.Fatalf("flipping byte %d went unnoticed", i)
		}
		if g.Stats().Records != 0 {
			t.Fatalf("failed restore left state behind")
		}
	}
	if err := New().Restore(bytes.NewReader(good[:len(good)-1])); err == nil {
		t.Fatal("truncated snapshot accepted")
	}
	g := New()
	if err := g.Restore(bytes.NewReader(good)); err != nil {
		t.Fatal(err)
	}
	rec, ok := g.Get("ns", "k", t0)
	if !ok || string(rec.Response.Body) != "body" || rec.OwnerToken != "owner-a" {
		t.Fatalf("restored %+v", rec)
	}
	// The restored FSM keeps refusing old indexes: fencing tokens survive.
	defer func() {
		if recover() == nil {
			t.Fatal("restored FSM accepted an index it had applied")
		}
	}()
	g.Apply(a.index, reserveCmd("x", "o", "", t0))
}

// BenchmarkRetainedRecordMemory reports the heap bytes one completed record
// with a 512-byte response costs (go test -bench RetainedRecord ./fsm).
func BenchmarkRetainedRecordMemory(b *testing.B) {
	const n = 200_000
	body := bytes.Repeat([]byte("x"), 512)
	for b.Loop() {
		var before, after runtimeMem
		before.read()
		f := New()
		var key [16]byte
		for i := 0; i < n; i++ {
			binary.BigEndian.PutUint64(key[:], uint64(i))
			k := "018f3a5c-7b2e-7c41-9d2a-" + string(hexKey(key[2:8]))
			idx := uint64(2*i + 1)
			f.Apply(idx, &Command{Op: OpReserve, Namespace: "payments", Key: k, Now: t0, OwnerToken: "Qm9vdHN0cmFwcGluZ1Rva2Vu", Lease: lease, SkewMargin: skew, Fingerprint: "sha256:0123456789abcdef0123456789abcdef"})
			f.Apply(idx+1, &Command{Op: OpComplete, Namespace: "payments", Key: k, Now: t0, OwnerToken: "Qm9vdHN0cmFwcGluZ1Rva2Vu", Retention: 86400 * sec,
				Response: &Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: body}})
		}
		after.read()
		b.ReportMetric(float64(after.heap-before.heap)/n, "bytes/record")
		b.ReportMetric(float64(f.Stats().Bytes)/n, "accounted-bytes/record")
		keepAlive(f)
	}
}

func hexKey(p []byte) []byte {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(p))
	for _, c := range p {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return out
}
