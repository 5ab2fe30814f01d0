package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

func TestTimelineBuckets(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	c := cell{System: sysIdem3GRPC, Clients: 64, Round: 1, Cycles: 5, Elapsed: 350 * time.Millisecond, Timeline: []timedCycle{
		{End: ms(10), Lat: ms(2)}, {End: ms(50), Lat: ms(4)}, {End: ms(99), Lat: ms(6)}, // bucket 0
		// bucket 1 has nothing: a stall
		{End: ms(250), Lat: ms(80)}, {End: ms(260), Lat: ms(40)}, // bucket 2
	}}
	var b bytes.Buffer
	writeTimeline(&b, c, 100*time.Millisecond)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	want := []string{
		"# idem3-grpc, 64 clients, round 2: 5 cycles in 350ms; buckets of 100ms (from the start of the measured window)",
		"# t_s cycles p50_ms p99_ms max_ms",
		"0.0 3 4.00 6.00 6.00",
		"0.1 0 - - -",
		"0.2 2 40.0 80.0 80.0",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("timeline:\n%s\nwant:\n%s", b.String(), strings.Join(want, "\n"))
	}
}

func TestSaveTimelineNamesTheCell(t *testing.T) {
	dir := t.TempDir()
	path, err := saveTimeline(dir, cell{System: sysRedis, Clients: 16, Round: 0, Timeline: []timedCycle{{End: time.Millisecond, Lat: time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(path, "/redis-c16-r1.txt") {
		t.Fatalf("timeline written to %s", path)
	}
	data, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(data), "\n0.0 1 1.00 1.00 1.00\n") {
		t.Fatalf("timeline file: %q, %v", data, err)
	}
}
