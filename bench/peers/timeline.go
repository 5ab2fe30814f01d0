package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// timelineBucket is how finely --timeline-dir slices a cell's window.
const timelineBucket = 100 * time.Millisecond

// writeTimeline prints c's measured window in buckets of width: per bucket
// the cycles that ended in it and their p50, p99 and max latency. A stall
// (a flush, a compaction, a GC, an election) shows as a bucket with few
// cycles and a high p50, which a cell's overall p99 cannot tell from
// latency that is high throughout.
func writeTimeline(w io.Writer, c cell, width time.Duration) {
	fmt.Fprintf(w, "# %s, %d clients, round %d: %d cycles in %v; buckets of %v (from the start of the measured window)\n",
		c.System, c.Clients, c.Round+1, c.Cycles, c.Elapsed.Round(time.Millisecond), width)
	fmt.Fprintln(w, "# t_s cycles p50_ms p99_ms max_ms")
	if len(c.Timeline) == 0 {
		return
	}
	byBucket := map[int][]time.Duration{}
	last := 0
	for _, tc := range c.Timeline {
		b := int(tc.End / width)
		byBucket[b] = append(byBucket[b], tc.Lat)
		last = max(last, b)
	}
	for b := 0; b <= last; b++ {
		lats := byBucket[b]
		if len(lats) == 0 {
			fmt.Fprintf(w, "%.1f 0 - - -\n", (time.Duration(b) * width).Seconds())
			continue
		}
		fmt.Fprintf(w, "%.1f %d %s %s %s\n", (time.Duration(b) * width).Seconds(), len(lats),
			fmtMs(percentile(lats, 0.50)), fmtMs(percentile(lats, 0.99)), fmtMs(slices.Max(lats)))
	}
}

// saveTimeline writes c's timeline to dir/SYSTEM-cCLIENTS-rROUND.txt.
func saveTimeline(dir string, c cell) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-c%d-r%d.txt", c.System, c.Clients, c.Round+1))
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	writeTimeline(f, c, timelineBucket)
	return path, f.Close()
}
