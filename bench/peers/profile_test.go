package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

var sink [][]byte

// allocateForProfile allocates ~64 MiB in 64 KiB pieces, so the heap
// profile's sampling sees it for sure.
//
//go:noinline
func allocateForProfile() {
	for range 1024 {
		sink = append(sink, make([]byte, 64<<10))
	}
	sink = nil
}

// The allocation profile covers the window even when no collection ends
// in it: what the node allocated shows up in the difference of the two heap
// profiles. With collections off (a node whose heap headroom outlasts the
// window), allocs?seconds=N gave an empty profile.
func TestProfilesCoverAllocationsWithoutACollection(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go tool pprof")
	}
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	dir := t.TempDir()
	cfg := config{ProfileDir: dir, Warmup: time.Second, Duration: time.Second}
	p := startProfiles(context.Background(), cfg, &system{pprof: []string{strings.TrimPrefix(srv.URL, "http://")}}, t.Logf)
	// Wait for the base heap profile, then allocate inside the window.
	base := filepath.Join(dir, "node1-allocs-base.pprof")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if fi, err := os.Stat(base); err == nil && fi.Size() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no base heap profile within 10s")
		}
	}
	time.Sleep(100 * time.Millisecond) // the base is fetched and closed
	before := numGC()
	allocateForProfile()
	if n := numGC(); n != before {
		t.Fatalf("a collection ran in the window (%d -> %d); the test needs none", before, n)
	}
	if err := p.finish(cell{System: "x", Clients: 1}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"node1-cpu.pprof", "node1-allocs.pprof", "cell.txt"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Size() == 0 {
			t.Fatalf("%s: missing or empty (%v)", f, err)
		}
	}
	out, err := exec.Command("go", "tool", "pprof", "-sample_index=alloc_space", "-top",
		"-base", base, filepath.Join(dir, "node1-allocs.pprof")).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "allocateForProfile") {
		t.Fatalf("the window's allocation profile does not show what it allocated:\n%s", out)
	}
}

func numGC() uint32 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.NumGC
}
