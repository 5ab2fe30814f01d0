package fsm

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/idem-dev/idem/internal/testutil"
)

func TestPackedCodec(t *testing.T) {
	cmds := [][]byte{EncodeCommand(reserveCmd("a", "owner-a-0123456789", "", t0)), {}, EncodeCommand(releaseCmd("a", "owner-a-0123456789", t0))}
	data := EncodePacked(cmds)
	if !IsPacked(data) || IsPacked(cmds[0]) || IsPacked(nil) {
		t.Fatal("IsPacked misjudges packed and single entries")
	}
	got, err := DecodePacked(data)
	if err != nil || len(got) != 3 || !bytes.Equal(got[0], cmds[0]) || len(got[1]) != 0 || !bytes.Equal(got[2], cmds[2]) {
		t.Fatalf("DecodePacked = %q, %v", got, err)
	}
	for name, bad := range map[string][]byte{
		"single":    cmds[0],
		"no count":  {packedVersion},
		"zero":      {packedVersion, 0},
		"too many":  append([]byte{packedVersion}, 0x81, 0x80, 0x04), // 65537
		"cut short": data[:len(data)-1],
		"trailing":  append(append([]byte{}, data...), 0),
		"long len":  {packedVersion, 1, 50, 1, 2},
	} {
		if _, err := DecodePacked(bad); err == nil {
			t.Errorf("DecodePacked(%s) succeeded", name)
		}
	}
}

// Tokens strictly increase per key (and overall) across single entries
// written before packing existed, packed entries, single entries after
// packed ones, and a snapshot restore in the middle.
func TestPackedFencingTokens(t *testing.T) {
	f := New()
	var issued []uint64 // every fencing token an acquisition returned, in order
	perKey := map[string][]uint64{}
	acquired := func(key string, r Result) {
		t.Helper()
		if r.Outcome != OutcomeAcquired && r.Outcome != OutcomeReclaimed {
			t.Fatalf("reserve of %s: %v", key, r.Outcome)
		}
		issued = append(issued, r.FencingToken)
		perKey[key] = append(perKey[key], r.FencingToken)
	}
	owner := func(key string, n int) string { return fmt.Sprintf("owner-%s-%012d", key, n) }
	now := t0

	// The old log: one command per entry, tokens are indexes.
	index := uint64(0)
	for i := range 5 {
		index++
		r := f.Apply(index, reserveCmd("k", owner("k", i), "", now))
		acquired("k", r)
		if r.FencingToken != index {
			t.Fatalf("single entry %d before any packed one: token %d, want its index", index, r.FencingToken)
		}
		index++
		if r := f.Apply(index, releaseCmd("k", owner("k", i), now)); r.Outcome != OutcomeOK {
			t.Fatalf("release: %v", r.Outcome)
		}
	}
	preUpgrade := issued[len(issued)-1]
	if f.PackedTokens() {
		t.Fatal("PackedTokens before any packed entry")
	}

	// Packed entries: reserve, release, reserve again of the same key in one
	// entry, and other keys beside it.
	for e := range 3 {
		index++
		var cmds [][]byte
		for i := range 2 {
			n := 100*e + i
			cmds = append(cmds, EncodeCommand(reserveCmd("k", owner("k", n), "", now)), EncodeCommand(releaseCmd("k", owner("k", n), now)))
			cmds = append(cmds, EncodeCommand(reserveCmd(fmt.Sprintf("p%d-%d", e, i), owner("p", n), "", now)))
		}
		rs := f.ApplyPackedEntry(index, EncodePacked(cmds))
		if len(rs) != len(cmds) {
			t.Fatalf("packed entry of %d commands gave %d results", len(cmds), len(rs))
		}
		for i, r := range rs {
			switch i % 3 {
			case 0:
				acquired("k", r)
				if want := packedSlotMark | index<<16 | uint64(i); r.FencingToken != want {
					t.Fatalf("command %d of packed entry %d: token %d, want 1<<62|index<<16|position = %d", i, index, r.FencingToken, want)
				}
			case 1:
				if r.Outcome != OutcomeOK {
					t.Fatalf("release in a packed entry: %v", r.Outcome)
				}
			case 2:
				acquired(fmt.Sprintf("p%d-%d", e, i/3), r)
			}
		}
		// A single entry between packed ones: still above them.
		index++
		acquired("k", f.Apply(index, reserveCmd("k", owner("k", 1000+e), "", now)))
		index++
		f.Apply(index, releaseCmd("k", owner("k", 1000+e), now))
	}

	// A snapshot carries the slot, so a restored replica continues above it.
	var buf bytes.Buffer
	if _, err := f.Snapshot().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	g := New()
	if err := g.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	if !f.PackedTokens() || !g.PackedTokens() {
		t.Fatalf("PackedTokens after packed entries %v, after restoring their snapshot %v; want both", f.PackedTokens(), g.PackedTokens())
	}
	index++
	acquired("k", g.Apply(index, reserveCmd("k", owner("k", 5000), "", now)))

	if issued[5] <= preUpgrade {
		t.Errorf("first token after the upgrade %d is not above the last before it %d", issued[5], preUpgrade)
	}
	for i := 1; i < len(issued); i++ {
		if issued[i] <= issued[i-1] {
			t.Fatalf("tokens not strictly increasing at %d: %v", i, issued)
		}
	}
	if len(perKey["k"]) < 15 {
		t.Fatalf("only %d acquisitions of k", len(perKey["k"]))
	}
}

// Random mixes of single and packed entries, reserves, releases and
// reclaims on a few keys: every new acquisition's token exceeds every token
// issued before it, and two replicas applying the same log agree.
func TestPackedTokensRandom(t *testing.T) {
	rng := testutil.Rand(testutil.Seed(t), 1)
	a, b := New(), New()
	var last uint64
	held := map[string]uint64{} // the token of each key's current acquisition
	index := uint64(0)
	now := t0
	type cmd struct {
		key  string
		data []byte
	}
	randCmd := func() cmd {
		key := fmt.Sprintf("k%d", rng.IntN(4))
		o := fmt.Sprintf("owner-%016d", rng.IntN(3))
		if rng.IntN(2) == 0 {
			return cmd{key, EncodeCommand(reserveCmd(key, o, "", now))}
		}
		return cmd{key, EncodeCommand(releaseCmd(key, o, now))}
	}
	check := func(c cmd, ra, rb Result) {
		t.Helper()
		if fmt.Sprint(ra) != fmt.Sprint(rb) {
			t.Fatalf("replicas disagree on %s: %+v vs %+v", c.key, ra, rb)
		}
		if ra.Outcome != OutcomeAcquired && ra.Outcome != OutcomeReclaimed {
			return
		}
		if ra.FencingToken == held[c.key] {
			return // the same owner asking again gets its reservation back
		}
		if ra.FencingToken <= last {
			t.Fatalf("new acquisition of %s at index %d got token %d, not above %d", c.key, index, ra.FencingToken, last)
		}
		last, held[c.key] = ra.FencingToken, ra.FencingToken
	}
	for range 3000 {
		index += 1 + uint64(rng.IntN(3)) // raft's no-ops and barriers skip indexes
		now += int64(rng.IntN(20)) * sec
		if rng.IntN(3) == 0 {
			cmds := make([]cmd, 1+rng.IntN(8))
			raw := make([][]byte, len(cmds))
			for i := range cmds {
				cmds[i] = randCmd()
				raw[i] = cmds[i].data
			}
			data := EncodePacked(raw)
			ras, rbs := a.ApplyPackedEntry(index, data), b.ApplyPackedEntry(index, data)
			for i := range ras {
				check(cmds[i], ras[i], rbs[i])
			}
			continue
		}
		c := randCmd()
		check(c, a.ApplyEntry(index, c.data), b.ApplyEntry(index, c.data))
	}
	if last < packedSlotMark {
		t.Errorf("no token from a packed entry was issued (last %d)", last)
	}
}

func TestPackedCorruptEntryStillAdvances(t *testing.T) {
	f := New()
	rs := f.ApplyPackedEntry(1, []byte{packedVersion, 9})
	if len(rs) != 1 || rs[0].Outcome != OutcomeInvalid {
		t.Fatalf("corrupt packed entry: %+v", rs)
	}
	r := f.Apply(2, reserveCmd("a", "owner-a-0123456789", "", t0))
	if r.FencingToken != packedSlotMark|2<<16 {
		t.Fatalf("single entry at index 2 after a packed entry: token %d, want packed-mode slot %d", r.FencingToken, uint64(packedSlotMark|2<<16))
	}
	defer func() {
		if recover() == nil {
			t.Fatal("re-applying index 2 did not panic")
		}
	}()
	f.Apply(2, reserveCmd("b", "owner-b-0123456789", "", t0))
}
