package cli

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// Go's system monitor (sysmon, a thread of every Go process) sleeps 20 µs
// between its checks while the process is busy, backing off to 10 ms once
// it has found nothing to do 50 times in a row, and it sleeps deeply while
// every P is idle. The first system call after such a deep sleep wakes it
// and resets it to 20 µs, "as a bet" that work resumes (runtime/proc.go,
// sysmon). A node of a Raft group lives on exactly that pattern: a burst of
// work per round, every P idle until the next message, and a system call
// (a read, a write, an fdatasync) to start the next burst. So its sysmon
// spends most of its life in 20 µs sleeps, each a nanosleep, a timer and
// two context switches: on the 2-core VM this project is measured on, 42%
// of the context switches of a one-shard region's nodes at 64 clients, and a
// context switch with its wake-up costs ~10-20 µs of CPU there
// (raftstore/DESIGN.md, "What this VM charges for kernel work").
//
// The period is hardcoded (golang/go#18236, open). The one switch Go has
// that keeps sysmon out of its deep sleep is GODEBUG's schedtrace: with it
// set, sysmon never sleeps deeply, so nothing resets it, and it backs off
// to 10 ms whenever it has no P to retake; it still wakes at 20 µs after
// every P it does retake from a long system call, as before. schedtrace's
// other effects: a line "SCHED ..." on stderr every schedtrace milliseconds
// of the host's monotonic clock (at the largest value Go accepts, 2^31-1 ms
// or 24.8 days, that is one line at start on a host up for longer than
// that, and one more every 24.8 days); and on a fatal error or an
// unrecovered panic, the runtime prints its scheduler's state (Ps, Ms and
// one line per goroutine) before the usual panic message and stacks.
// GODEBUG is read once, before main runs, so the setting has to be in the
// environment the process starts with: KeepSysmonAwake re-executes the
// program (the same binary, arguments and process id) with it added, once.

// SysmonSetting is what KeepSysmonAwake adds to GODEBUG.
const SysmonSetting = "schedtrace=2147483647"

// SysmonUsage is the paragraph of the servers' --help about it.
const SysmonUsage = `At start it runs itself again, once, with GODEBUG=schedtrace=2147483647 added
(same process id), which keeps Go's system monitor from waking every 20 µs
after each idle spell: less CPU per request, most under light load (README,
"Go's system monitor"). GODEBUG=schedtrace=0 keeps Go's behaviour.
`

// sysmon is what KeepSysmonAwake found at start: a fact about the process,
// like its environment (zero when main did not call it, as in tests that
// call a command's run in-process).
var sysmon SysmonState

// LogSysmon logs what KeepSysmonAwake found, once main has a logger.
func LogSysmon(logger *slog.Logger) { sysmon.Log(logger) }

// SysmonState says whether the process runs with sysmon kept out of its
// deep sleep, and why.
type SysmonState struct {
	Awake  bool
	Reason string
}

// Log writes s to logger: one INFO line.
func (s SysmonState) Log(logger *slog.Logger) {
	if s.Reason == "" {
		return
	}
	if s.Awake {
		logger.Info("go runtime: system monitor kept out of its deep sleep (see README, \"Go's system monitor\")", "reason", s.Reason)
	} else {
		logger.Info("go runtime: system monitor left as Go runs it", "reason", s.Reason)
	}
}

// KeepSysmonAwake re-executes the running program with SysmonSetting
// added to GODEBUG, unless GODEBUG already sets schedtrace (any value: an
// operator's choice, schedtrace=0 to keep Go's behaviour), or the program
// runs on another OS than Linux. When it re-executes it does not return;
// otherwise it records what it found, for LogSysmon once main has a
// logger. Call it first thing in main, before any goroutine starts.
func KeepSysmonAwake() {
	sysmon = keepSysmonAwake()
}

func keepSysmonAwake() SysmonState {
	env, reexec, state := sysmonEnv(os.Environ())
	if !reexec {
		return state
	}
	if runtime.GOOS != "linux" {
		return SysmonState{Reason: "not on Linux: left as is"}
	}
	// /proc/self/exe is this very binary even if its file was replaced
	// or removed since it started (an upgrade in place).
	err := syscall.Exec("/proc/self/exe", os.Args, env)
	return SysmonState{Reason: fmt.Sprintf("re-executing with GODEBUG=%s failed: %v", SysmonSetting, err)}
}

// sysmonEnv returns environ with SysmonSetting in GODEBUG and true when the
// program has to re-execute for it, or environ unchanged, false and what
// GODEBUG already says.
func sysmonEnv(environ []string) ([]string, bool, SysmonState) {
	for i, kv := range environ {
		value, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			continue
		}
		// The runtime reads the first GODEBUG of the environment, and
		// within it the last setting of a key.
		if v, set := lastSetting(value, "schedtrace"); set {
			n, err := strconv.ParseInt(v, 10, 32)
			switch {
			case err == nil && n == 2147483647:
				return environ, false, SysmonState{Awake: true, Reason: "GODEBUG has " + SysmonSetting}
			case err == nil && n > 0:
				return environ, false, SysmonState{Awake: true, Reason: "GODEBUG sets schedtrace=" + v + " (a SCHED line every " + v + " ms)"}
			default:
				return environ, false, SysmonState{Reason: "GODEBUG sets schedtrace=" + v}
			}
		}
		out := append([]string(nil), environ...)
		if value == "" {
			out[i] = "GODEBUG=" + SysmonSetting
		} else {
			out[i] = kv + "," + SysmonSetting
		}
		return out, true, SysmonState{}
	}
	return append(append([]string(nil), environ...), "GODEBUG="+SysmonSetting), true, SysmonState{}
}

// lastSetting is the value of key's last setting in a GODEBUG value
// ("k=v,k2=v2").
func lastSetting(godebug, key string) (string, bool) {
	value, found := "", false
	for _, field := range strings.Split(godebug, ",") {
		if k, v, ok := strings.Cut(field, "="); ok && k == key {
			value, found = v, true
		}
	}
	return value, found
}
