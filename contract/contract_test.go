package contract

import (
	"strings"
	"testing"
)

func TestCheckName(t *testing.T) {
	for _, tc := range []struct {
		in    string
		fault Fault
		pos   int
	}{
		{"payments", 0, 0},
		{"a", 0, 0},
		{"0a.b_c-d", 0, 0},
		{strings.Repeat("a", 63), 0, 0},
		{"", FaultEmpty, 0},
		{strings.Repeat("a", 64), FaultLength, 0},
		{"Pay", FaultByte, 0},
		{".a", FaultByte, 0},
		{"a/b", FaultByte, 1},
	} {
		v := CheckNamespace(tc.in)
		if tc.fault == 0 {
			if v != nil || !ValidNamespace(tc.in) {
				t.Errorf("CheckNamespace(%q) = %v, want nil", tc.in, v)
			}
			continue
		}
		if v == nil || v.Fault != tc.fault || tc.fault == FaultByte && v.Pos != tc.pos {
			t.Errorf("CheckNamespace(%q) = %+v, want fault %d at %d", tc.in, v, tc.fault, tc.pos)
		}
		if ValidName(tc.in) {
			t.Errorf("ValidName(%q) = true", tc.in)
		}
	}
}

func TestCheckKey(t *testing.T) {
	for _, tc := range []struct {
		in    string
		fault Fault
	}{
		{"k", 0},
		{"!~", 0},
		{strings.Repeat("k", 255), 0},
		{"", FaultEmpty},
		{strings.Repeat("k", 256), FaultLength},
		{"a b", FaultByte},
		{"a\x7f", FaultByte},
	} {
		v := CheckKey(tc.in)
		if got := Fault(0); v != nil {
			got = v.Fault
			if got != tc.fault {
				t.Errorf("CheckKey(%q) = %+v, want fault %d", tc.in, v, tc.fault)
			}
		} else if tc.fault != 0 {
			t.Errorf("CheckKey(%q) = nil, want fault %d", tc.in, tc.fault)
		}
	}
}

func TestOwnerToken(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		tok := NewOwnerToken()
		if v := CheckOwnerToken(tok); v != nil {
			t.Fatalf("NewOwnerToken() = %q breaks the rule: %v", tok, v)
		}
		if seen[tok] {
			t.Fatalf("NewOwnerToken() repeated %q", tok)
		}
		seen[tok] = true
	}
	for _, bad := range []string{"", "short", strings.Repeat("a", 129), strings.Repeat("a", 15) + "!"} {
		if ValidOwnerToken(bad) {
			t.Errorf("ValidOwnerToken(%q) = true", bad)
		}
	}
	if !ValidOwnerToken(strings.Repeat("A_-z9", 4)) {
		t.Error("a 20-char token of the alphabet is refused")
	}
}

func TestGRPCMaxMessageBytes(t *testing.T) {
	if got := GRPCMaxMessageBytes(0); got != 4<<20 {
		t.Errorf("GRPCMaxMessageBytes(0) = %d, want 4 MiB", got)
	}
	if got := GRPCMaxMessageBytes(10 << 20); got != 11<<20 {
		t.Errorf("GRPCMaxMessageBytes(10 MiB) = %d, want 11 MiB", got)
	}
}

func TestOutcomeString(t *testing.T) {
	if OutcomeFingerprintMismatch.String() != "FINGERPRINT_MISMATCH" || Outcome(42).String() != "Outcome(42)" {
		t.Error("Outcome.String")
	}
	if !OutcomeReclaimed.Owned() || OutcomeInProgress.Owned() {
		t.Error("Outcome.Owned")
	}
}
