package ledger

import (
	"errors"
	"testing"
)

func TestGuardRefusesStaleTokens(t *testing.T) {
	l := New("g", true)
	if _, err := l.Charge("k", 5, 100, "a"); err != nil {
		t.Fatal(err)
	}
	// A newer owner looks first: that fences the older one out.
	prior, err := l.Lookup("k", 9)
	if err != nil || len(prior) != 1 {
		t.Fatalf("lookup: %v %v", prior, err)
	}
	if _, err := l.Charge("k", 5, 100, "a-late"); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale write: %v, want ErrFenced", err)
	}
	if _, err := l.Lookup("k", 4); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale lookup: %v, want ErrFenced", err)
	}
	if s := l.Stats(); s.Accepted != 1 || s.Rejected != 2 || s.DoubleCharged != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestNoGuardAcceptsEverything(t *testing.T) {
	l := New("u", false)
	l.Lookup("k", 9)
	c1, err1 := l.Charge("k", 9, 100, "b")
	c2, err2 := l.Charge("k", 5, 100, "a-late")
	if err1 != nil || err2 != nil || c1.ID == c2.ID {
		t.Fatalf("unguarded ledger refused or reused ids: %v %v %v %v", c1, c2, err1, err2)
	}
	if got := l.DoubleCharged(); len(got) != 1 || got[0] != "k" {
		t.Fatalf("DoubleCharged = %v", got)
	}
}
