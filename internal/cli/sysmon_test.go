package cli

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

func TestSysmonEnv(t *testing.T) {
	for _, tc := range []struct {
		name      string
		environ   []string
		wantEnv   []string // nil: unchanged
		wantExec  bool
		wantAwake bool
		reason    string // a part of the reason
	}{
		{"no GODEBUG", []string{"HOME=/root"}, []string{"HOME=/root", "GODEBUG=" + SysmonSetting}, true, false, ""},
		{"empty GODEBUG", []string{"GODEBUG=", "A=1"}, []string{"GODEBUG=" + SysmonSetting, "A=1"}, true, false, ""},
		{"other settings kept", []string{"GODEBUG=gctrace=1,madvdontneed=1"}, []string{"GODEBUG=gctrace=1,madvdontneed=1," + SysmonSetting}, true, false, ""},
		{"only the first GODEBUG counts, as for the runtime", []string{"GODEBUG=gctrace=1", "GODEBUG=schedtrace=0"}, []string{"GODEBUG=gctrace=1," + SysmonSetting, "GODEBUG=schedtrace=0"}, true, false, ""},
		{"after the re-exec", []string{"GODEBUG=gctrace=1," + SysmonSetting}, nil, false, true, "GODEBUG has " + SysmonSetting},
		{"the operator's opt-out", []string{"GODEBUG=schedtrace=0"}, nil, false, false, "GODEBUG sets schedtrace=0"},
		{"the operator's own trace", []string{"GODEBUG=schedtrace=1000"}, nil, false, true, "a SCHED line every 1000 ms"},
		{"the last setting of a key wins", []string{"GODEBUG=schedtrace=1000,schedtrace=0"}, nil, false, false, "schedtrace=0"},
		{"a value the runtime ignores", []string{"GODEBUG=schedtrace=often"}, nil, false, false, "schedtrace=often"},
		{"too large for the runtime's int32", []string{"GODEBUG=schedtrace=2147483648"}, nil, false, false, "schedtrace=2147483648"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.environ)
			env, reexec, state := sysmonEnv(in)
			if !slices.Equal(in, tc.environ) {
				t.Errorf("the input was changed: %q", in)
			}
			want := tc.wantEnv
			if want == nil {
				want = tc.environ
			}
			if !slices.Equal(env, want) || reexec != tc.wantExec || state.Awake != tc.wantAwake || !strings.Contains(state.Reason, tc.reason) {
				t.Errorf("sysmonEnv(%q) = %q, %v, %+v; want %q, %v, awake %v, reason with %q", tc.environ, env, reexec, state, want, tc.wantExec, tc.wantAwake, tc.reason)
			}
		})
	}
}

func TestSysmonStateLog(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	SysmonState{}.Log(logger) // run in-process (tests): nothing to say
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
