package durable

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMkdirAllAndSyncDir(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "a", "b", "c")
	if err := MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		t.Fatalf("not created: %v", err)
	}
	if err := MkdirAll(dir, 0o750); err != nil {
		t.Fatalf("existing dir: %v", err)
	}
	if err := SyncDir(filepath.Join(base, "missing")); err == nil {
		t.Fatal("SyncDir of a missing dir succeeded")
	}
	f := filepath.Join(base, "file")
	os.WriteFile(f, nil, 0o600)
	if err := MkdirAll(filepath.Join(f, "x"), 0o750); err == nil {
		t.Fatal("MkdirAll under a file succeeded")
	}
}
