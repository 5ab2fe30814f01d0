package launch

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// LogTail gives the log's last lines, all of a shorter log, and says why
// when the log is gone.
func TestLogTail(t *testing.T) {
	dir := t.TempDir()
	p := &Process{Name: "n", Log: filepath.Join(dir, "n.log")}
	if got := p.LogTail(3); !strings.HasPrefix(got, "(log unreadable: ") {
		t.Fatalf("missing log: %q", got)
	}
	if err := os.WriteFile(p.Log, []byte("a\nb\nc\nd\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := p.LogTail(2); got != "c\nd" {
		t.Fatalf("LogTail(2) = %q, want %q", got, "c\nd")
	}
	if got := p.LogTail(10); got != "a\nb\nc\nd" {
		t.Fatalf("LogTail(10) = %q, want the whole log", got)
	}
}
