package datadir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestIdentityRefusesForeignDataDir(t *testing.T) {
	dir := t.TempDir()
	mine := Identity{Cluster: "demo", NodeID: "us-east-1", RingFingerprint: "ring-a"}
	if _, existed, err := Check(dir, mine); err != nil || existed {
		t.Fatal(existed, err)
	}
	if _, existed, err := Check(dir, mine); err != nil || !existed {
		t.Fatalf("same Identity refused: %v %v", existed, err)
	}
	for _, tc := range []struct {
		name string
		id   Identity
		want string
	}{
		{"other cluster", Identity{Cluster: "prod", NodeID: "us-east-1", RingFingerprint: "ring-a"}, `cluster "demo"`},
		{"other node", Identity{Cluster: "demo", NodeID: "us-east-2", RingFingerprint: "ring-a"}, `node "us-east-1"`},
		{"changed ring", Identity{Cluster: "demo", NodeID: "us-east-1", RingFingerprint: "ring-b"}, "key layout ring-a"},
	} {
		_, _, err := Check(dir, tc.id)
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: got %v", tc.name, err)
		}
	}
	// What an older release pinned for the same layout is upgraded once.
	if have, _, err := Check(dir, Identity{Cluster: "demo", NodeID: "us-east-1", RingFingerprint: "layout-a"}, "ring-a"); err != nil || have.RingFingerprint != "layout-a" {
		t.Fatalf("former ring: %+v, %v", have, err)
	}
	if _, _, err := Check(dir, mine); !errors.Is(err, ErrMismatch) {
		t.Fatalf("after the upgrade the former value still matches: %v", err)
	}
	// A non-empty directory that idem did not create is refused too.
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "something"), []byte("x"), 0o644)
	if _, _, err := Check(other, mine); !errors.Is(err, ErrMismatch) {
		t.Fatalf("foreign dir: %v", err)
	}
}
