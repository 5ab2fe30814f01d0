package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestMeasureHost measures this machine with small bounds: every figure
// must come out positive (a broken measurement reads 0), and the wake-up
// round trip (four system calls and two wake-ups) at least one call's worth.
func TestMeasureHost(t *testing.T) {
	dir := t.TempDir()
	h, err := measureHost(dir, hostLimits{syscalls: 1000, wakes: 200, syncs: 20, pages: 256, each: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]time.Duration{"Syscall": h.Syscall, "WakeWall": h.WakeWall, "SyncWall": h.SyncWall, "Fault": h.Fault} {
		if d <= 0 {
			t.Errorf("%s = %v, want > 0 (%+v)", name, d, h)
		}
	}
	if h.WakeWall < h.Syscall { // four system calls and two wake-ups
		t.Errorf("a wake-up round trip (%v) took less than a system call (%v)", h.WakeWall, h.Syscall)
	}
	// The synced file is gone again.
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Errorf("dir after measuring: %v, %v", entries, err)
	}
}

func TestMeasureHostReportsAnUnwritableDir(t *testing.T) {
	_, err := measureHost("/nonexistent/hostcost", hostLimits{syscalls: 10, wakes: 10, syncs: 10, pages: 1, each: time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/hostcost") {
		t.Fatalf("measureHost in a missing dir = %v, want an error naming it", err)
	}
	if got := hostLine("/nonexistent/hostcost"); !strings.HasPrefix(got, "not measured: synced appends in /nonexistent/hostcost") {
		t.Errorf("hostLine = %q", got)
	}
}

func TestHostCostsString(t *testing.T) {
	h := hostCosts{Syscall: 1040 * time.Nanosecond, WakeWall: 31 * time.Microsecond, WakeCPU: 25 * time.Microsecond,
		SyncWall: 550 * time.Microsecond, SyncCPU: 118 * time.Microsecond, Fault: 12300 * time.Nanosecond}
	want := "system call 1.04 µs; thread wake-up round trip 31 µs (25 µs CPU); 700-byte append + fdatasync 550 µs (118 µs CPU); first touch of a page 12 µs"
	if got := h.String(); got != want {
		t.Errorf("String() =\n%s\nwant\n%s", got, want)
	}
}
