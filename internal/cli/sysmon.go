package cli

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
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
// (docs/lab/2026-12-02-vm-kernel-costs.md).
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
// environment the process starts with. The servers used to re-execute
// themselves to add it; they no longer do: the gain was measured on one
// shape on one VM, and a server that re-executes itself to run with a
// debugging knob changes what a crash prints for every operator. An
// operator who measured a gain on their own hosts sets it themselves
// (SysmonSetting, in GODEBUG), and the servers say at start that it is on.

// SysmonSetting is the GODEBUG setting that keeps sysmon out of its deep
// sleep: the opt-in documented in the servers' --help and docs/operations.md.
const SysmonSetting = "schedtrace=2147483647"

// SysmonUsage is the paragraph of the servers' --help about it.
const SysmonUsage = `GODEBUG=schedtrace=2147483647 in the environment keeps Go's system monitor
from waking every 20 µs after each idle spell, which measured less CPU per
request on some shapes and hosts (docs/operations.md, "Go's system monitor"); off by
default. With it, a crash also prints the scheduler's state.
`

// sysmon is what ReadSysmon found at start.
var sysmon SysmonState

// ReadSysmon records whether the environment keeps Go's system monitor out
// of its deep sleep, for LogSysmon once main has a logger.
func ReadSysmon() { sysmon = sysmonState(os.Environ()) }

// LogSysmon logs what ReadSysmon found, once main has a logger: one INFO
// line when GODEBUG sets schedtrace, nothing otherwise.
func LogSysmon(logger *slog.Logger) { sysmon.Log(logger) }

// SysmonState says whether the process runs with sysmon kept out of its
// deep sleep, and why.
type SysmonState struct {
	Awake  bool
	Reason string
}

// Log writes s to logger: one INFO line, none for Go's default.
func (s SysmonState) Log(logger *slog.Logger) {
	if s.Reason == "" {
		return
	}
	if s.Awake {
		logger.Info("go runtime: system monitor kept out of its deep sleep (see docs/operations.md, \"Go's system monitor\")", "reason", s.Reason)
	} else {
		logger.Info("go runtime: system monitor left as Go runs it", "reason", s.Reason)
	}
}

// sysmonState is what GODEBUG in environ says of schedtrace: nothing
// (Go's default) when it does not set it.
func sysmonState(environ []string) SysmonState {
	for _, kv := range environ {
		value, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			continue
		}
		// The runtime reads the first GODEBUG of the environment, and
		// within it the last setting of a key.
		v, set := lastSetting(value, "schedtrace")
		if !set {
			return SysmonState{}
		}
		n, err := strconv.ParseInt(v, 10, 32)
		switch {
		case err == nil && n == 2147483647:
			return SysmonState{Awake: true, Reason: "GODEBUG has " + SysmonSetting}
		case err == nil && n > 0:
			return SysmonState{Awake: true, Reason: "GODEBUG sets schedtrace=" + v + " (a SCHED line every " + v + " ms)"}
		default:
			return SysmonState{Reason: "GODEBUG sets schedtrace=" + v}
		}
	}
	return SysmonState{}
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
