package testutil

import (
	"strings"
	"testing"
)

func TestNeedsCommandSkipsLocallyAndFailsUnderCI(t *testing.T) {
	const missing = "idem-no-such-program"
	t.Setenv("CI", "")
	f := &fakeTB{}
	NeedsCommand(f, missing, "apt-get install it")
	if f.failed != "" || !strings.Contains(f.skipped, missing) || !strings.Contains(f.skipped, "apt-get install it") {
		t.Fatalf("without CI: failed %q, skipped %q; want a skip naming the program and how to install it", f.failed, f.skipped)
	}
	t.Setenv("CI", "true")
	f = &fakeTB{}
	NeedsCommand(f, missing, "apt-get install it")
	if f.skipped != "" || !strings.Contains(f.failed, missing) || !strings.Contains(f.failed, ".ci/run installs it") {
		t.Fatalf("under CI=true: failed %q, skipped %q; want a failure naming the program", f.failed, f.skipped)
	}
	f = &fakeTB{}
	NeedsCommand(f, "sh", "")
	if f.failed != "" || f.skipped != "" {
		t.Fatalf("with the program on PATH: failed %q, skipped %q; want neither", f.failed, f.skipped)
	}
}
