package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// latency summarises one series of latencies.
type latency struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// report is what a run prints.
type report struct {
	Config       benchConfig       `json:"config"`
	Stopped      string            `json:"stopped_by"` // duration, cycles or interrupted
	Elapsed      float64           `json:"elapsed_s"`
	CyclesOK     int               `json:"cycles_ok"`
	CyclesFailed int               `json:"cycles_failed"`
	CyclesPerSec float64           `json:"cycles_per_s"`
	Cycle        latency           `json:"cycle"`
	Reserve      latency           `json:"reserve"`
	Complete     latency           `json:"complete"`
	Errors       map[string]int    `json:"errors"`
	FirstErrors  map[string]string `json:"first_errors,omitempty"`
}

func newReport(cfg benchConfig, stats []*workerStats, elapsed time.Duration, stopped string) *report {
	r := &report{
		Config:      cfg,
		Stopped:     stopped,
		Elapsed:     elapsed.Seconds(),
		Errors:      make(map[string]int),
		FirstErrors: make(map[string]string),
	}
	var cycle, reserve, complete []time.Duration
	for _, w := range stats {
		cycle = append(cycle, w.cycle...)
		reserve = append(reserve, w.reserve...)
		complete = append(complete, w.complete...)
		r.CyclesFailed += w.failed
		for k, n := range w.errors {
			r.Errors[k] += n
			if _, ok := r.FirstErrors[k]; !ok {
				r.FirstErrors[k] = w.firstError[k]
			}
		}
	}
	r.CyclesOK = len(cycle)
	if elapsed > 0 {
		r.CyclesPerSec = float64(r.CyclesOK) / elapsed.Seconds()
	}
	r.Cycle, r.Reserve, r.Complete = summarise(cycle), summarise(reserve), summarise(complete)
	return r
}

// summarise sorts ds in place and reads nearest-rank percentiles off it.
func summarise(ds []time.Duration) latency {
	if len(ds) == 0 {
		return latency{}
	}
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	rank := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(ds)))) - 1
		return ms(ds[min(max(i, 0), len(ds)-1)])
	}
	return latency{
		Count: len(ds),
		Mean:  ms(sum / time.Duration(len(ds))),
		P50:   rank(0.50),
		P90:   rank(0.90),
		P99:   rank(0.99),
		Max:   ms(ds[len(ds)-1]),
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (r *report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func (r *report) writeText(w io.Writer) error {
	c := r.Config
	var b strings.Builder
	limit := fmt.Sprintf("duration=%v", c.Duration)
	if c.Cycles > 0 {
		limit = fmt.Sprintf("cycles=%d duration=%v", c.Cycles, c.Duration)
	}
	fmt.Fprintf(&b, "config: target=%s addr=%s namespace=%s concurrency=%d %s warmup=%v body-bytes=%d lease=%v request-timeout=%v max-attempts=%d\n",
		c.Target, strings.Join(c.Addrs, ","), c.Namespace, c.Concurrency, limit, c.Warmup, c.BodyBytes, c.Lease, c.RequestTimeout, c.MaxAttempts)
	fmt.Fprintf(&b, "cycles: %d ok, %d failed in %.3fs (stopped by %s): %.1f cycles/s\n",
		r.CyclesOK, r.CyclesFailed, r.Elapsed, r.Stopped, r.CyclesPerSec)
	fmt.Fprintf(&b, "%-10s %10s %10s %10s %10s %10s %10s\n", "latency", "count", "mean", "p50", "p90", "p99", "max")
	for _, row := range []struct {
		name string
		l    latency
	}{{"cycle", r.Cycle}, {"reserve", r.Reserve}, {"complete", r.Complete}} {
		fmt.Fprintf(&b, "%-10s %10d %8.3fms %8.3fms %8.3fms %8.3fms %8.3fms\n", row.name, row.l.Count, row.l.Mean, row.l.P50, row.l.P90, row.l.P99, row.l.Max)
	}
	if len(r.Errors) == 0 {
		b.WriteString("errors: 0\n")
	} else {
		fmt.Fprintf(&b, "errors: %d\n", r.CyclesFailed)
		for _, k := range slices.Sorted(maps.Keys(r.Errors)) {
			fmt.Fprintf(&b, "  %-32s %8d  first: %s\n", k, r.Errors[k], r.FirstErrors[k])
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
