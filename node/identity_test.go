package node

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestIdentityRefusesForeignDataDir(t *testing.T) {
	dir := t.TempDir()
	mine := identity{Cluster: "demo", NodeID: "us-east-1", RingFingerprint: "ring-a"}
	if err := checkIdentity(dir, mine); err != nil {
		t.Fatal(err)
	}
	if err := checkIdentity(dir, mine); err != nil {
		t.Fatalf("same identity refused: %v", err)
	}
	for _, tc := range []struct {
		name string
		id   identity
		want string
	}{
		{"other cluster", identity{Cluster: "prod", NodeID: "us-east-1", RingFingerprint: "ring-a"}, `cluster "demo"`},
		{"other node", identity{Cluster: "demo", NodeID: "us-east-2", RingFingerprint: "ring-a"}, `node "us-east-1"`},
		{"changed ring", identity{Cluster: "demo", NodeID: "us-east-1", RingFingerprint: "ring-b"}, "ring ring-a"},
	} {
		err := checkIdentity(dir, tc.id)
		if !errors.Is(err, ErrDataDirMismatch) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: got %v", tc.name, err)
		}
	}
	// A non-empty directory that idem did not create is refused too.
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "something"), []byte("x"), 0o644)
	if err := checkIdentity(other, mine); !errors.Is(err, ErrDataDirMismatch) {
		t.Fatalf("foreign dir: %v", err)
	}
}
