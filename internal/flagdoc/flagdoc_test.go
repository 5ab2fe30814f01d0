package flagdoc

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/idem-dev/idem/internal/launch"

	"github.com/idem-dev/idem/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md from the binaries' --help")

const page = "../../docs/configuration.md"

// TestFlagsDocMatchesBinaries builds every command, renders their --help
// and compares the result with docs/configuration.md byte for byte
// (skipped with -short, like the other tests that build the commands).
func TestFlagsDocMatchesBinaries(t *testing.T) {
	if !*update {
		testutil.NeedsProcesses(t) // builds the commands and runs each --help
	}
	bins, err := launch.Build(t.TempDir(), Commands...)
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	run := func(command string, args ...string) (string, error) {
		cmd := exec.Command(bins[command], args...)
		// A fixed environment: what --help prints must not depend on the
		// caller's GODEBUG, IDEM_* variables or home directory.
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home}
		cmd.Dir = home
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("%s %s: %v: %s", command, strings.Join(args, " "), err, stderr.String())
		}
		if stdout.Len() == 0 { // idembench prints its help on stderr
			return stderr.String(), nil
		}
		return stdout.String(), nil
	}
	got, err := Render(run)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(page, got, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d bytes)", page, len(got))
		return
	}
	want, err := os.ReadFile(page)
	if err != nil {
		t.Fatalf("%v (generate it with: go test ./internal/flagdoc -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the binaries' --help at line %d:\n  file:     %q\n  binaries: %q\nrun: go test ./internal/flagdoc -update",
			filepath.Base(page), diffLine(want, got), lineAt(want, diffLine(want, got)), lineAt(got, diffLine(want, got)))
	}
}

// diffLine is the 1-based number of the first line where a and b differ.
func diffLine(a, b []byte) int {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range max(len(al), len(bl)) {
		if i >= len(al) || i >= len(bl) || al[i] != bl[i] {
			return i + 1
		}
	}
	return 0
}

func lineAt(b []byte, n int) string {
	lines := strings.Split(string(b), "\n")
	if n < 1 || n > len(lines) {
		return "(end of text)"
	}
	return lines[n-1]
}

func TestIdemctlCommands(t *testing.T) {
	help := "idemctl: tool\n\nCommands:\n  status         regions\n  keys list NAMESPACE | delete   keys\n\nFlags:\n  --json\n"
	got, err := IdemctlCommands(help)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"status", "keys"}; !slices.Equal(got, want) {
		t.Fatalf("IdemctlCommands = %q, want %q", got, want)
	}
	if _, err := IdemctlCommands("Flags:\n  --json\n"); err == nil {
		t.Fatal("IdemctlCommands of a help without commands: want an error, got none")
	}
}

// TestRenderFailsOnBadHelp: a command that fails or prints nothing makes
// Render fail rather than write a page with a hole in it.
func TestRenderFailsOnBadHelp(t *testing.T) {
	ok := func(command string, args ...string) (string, error) {
		switch {
		case command == "idemctl" && len(args) == 1:
			return "Commands:\n  status  x\n", nil
		case command == "idemnode" && args[len(args)-1] == "--help":
			return "idemnode help\nTest-only flags: --help-testing lists them.\n", nil
		case command == "idemnode":
			return "Testing:\n  --testing-x\n", nil
		}
		return command + " help\n", nil
	}
	out, err := Render(ok)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"## idemnode\n", "### idemctl status\n", "`idembench --help`:\n\n```text\nidembench help\n```\n",
		"## Testing\n", "### idemnode testing flags\n\n`idemnode --help-testing`:\n\n```text\nTesting:\n  --testing-x\n```\n"} {
		if !bytes.Contains(out, []byte(s)) {
			t.Errorf("page lacks %q:\n%s", s, out)
		}
	}
	empty := func(command string, args ...string) (string, error) {
		if command == "idembench" {
			return " \n", nil
		}
		return ok(command, args...)
	}
	if _, err := Render(empty); err == nil || !strings.Contains(err.Error(), "idembench --help printed nothing") {
		t.Errorf("Render with an empty help: err = %v", err)
	}
	failing := func(command string, args ...string) (string, error) {
		if command == "idemctl" && len(args) == 2 {
			return "", fmt.Errorf("exit status 1")
		}
		return ok(command, args...)
	}
	if _, err := Render(failing); err == nil {
		t.Error("Render with a failing idemctl status --help: want an error, got none")
	}
	if bytes.Contains(out, []byte("### idemrouter testing flags")) {
		t.Error("page has a testing section for a command whose --help names no testing flags")
	}
}
