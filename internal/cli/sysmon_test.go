package cli

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

// sysmonState reads GODEBUG as the runtime does and never asks for a
// change: the servers no longer re-execute themselves.
func TestSysmonState(t *testing.T) {
	for _, tc := range []struct {
		name      string
		environ   []string
		wantAwake bool
		reason    string // the reason; "" for Go's default (nothing logged)
	}{
		{"no GODEBUG: Go's default", []string{"HOME=/root"}, false, ""},
		{"empty GODEBUG", []string{"GODEBUG=", "A=1"}, false, ""},
		{"other settings only", []string{"GODEBUG=gctrace=1,madvdontneed=1"}, false, ""},
		{"only the first GODEBUG counts, as for the runtime", []string{"GODEBUG=gctrace=1", "GODEBUG=" + SysmonSetting}, false, ""},
		{"the operator's opt-in", []string{"GODEBUG=gctrace=1," + SysmonSetting}, true, "GODEBUG has " + SysmonSetting},
		{"schedtrace=0 is Go's default, said", []string{"GODEBUG=schedtrace=0"}, false, "GODEBUG sets schedtrace=0"},
		{"the operator's own trace", []string{"GODEBUG=schedtrace=1000"}, true, "GODEBUG sets schedtrace=1000 (a SCHED line every 1000 ms)"},
		{"the last setting of a key wins", []string{"GODEBUG=schedtrace=1000,schedtrace=0"}, false, "GODEBUG sets schedtrace=0"},
		{"a value the runtime ignores", []string{"GODEBUG=schedtrace=often"}, false, "GODEBUG sets schedtrace=often"},
		{"too large for the runtime's int32", []string{"GODEBUG=schedtrace=2147483648"}, false, "GODEBUG sets schedtrace=2147483648"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.environ)
			state := sysmonState(in)
			if !slices.Equal(in, tc.environ) {
				t.Errorf("the input was changed: %q", in)
			}
			if state.Awake != tc.wantAwake || state.Reason != tc.reason {
				t.Errorf("sysmonState(%q) = %+v; want awake %v, reason %q", tc.environ, state, tc.wantAwake, tc.reason)
			}
		})
	}
}

func TestSysmonStateLog(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	SysmonState{}.Log(logger) // Go's default: nothing to say
	if buf.Len() != 0 {
		t.Fatalf("zero state logged %q", buf.String())
	}
	SysmonState{Awake: true, Reason: "GODEBUG has " + SysmonSetting}.Log(logger)
	SysmonState{Reason: "GODEBUG sets schedtrace=0"}.Log(logger)
	out := buf.String()
	for _, want := range []string{"system monitor kept out of its deep sleep", `reason="GODEBUG has schedtrace=2147483647"`, "system monitor left as Go runs it", `reason="GODEBUG sets schedtrace=0"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}
