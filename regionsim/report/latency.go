package report

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"strings"
	"time"
)

// Latency is the result of a latency measurement (regionsim.MeasureLatency):
// reserve and complete latency per router region and key home region, on a
// fault-free simulated deployment.
type Latency struct {
	// Command is the command line that repeats the measurement.
	Command string `json:"command"`
	// Started and ElapsedS: when the measurement began and how long it took
	// (cluster start included).
	Started  time.Time `json:"started"`
	ElapsedS float64   `json:"elapsed_s"`
	// Setup describes the simulated deployment (Survival is the mode
	// measured).
	Setup Setup `json:"setup"`
	// Cycles is the number of measured reserve+complete cycles per cell,
	// Warmup the unmeasured ones before them.
	Cycles int `json:"cycles"`
	Warmup int `json:"warmup"`
	// SettleS is how long leaders took to settle on each shard's preferred
	// voter (in its home region) before measuring.
	SettleS float64 `json:"settle_s"`
	// Leaders maps each shard to the node that led it when measuring began.
	Leaders map[string]string `json:"leaders"`
	// Cells has one entry per (router region, key home region).
	Cells []LatencyCell `json:"cells"`
	// LocalHome pools the cells whose key is homed in the router's region,
	// RemoteHome the others.
	LocalHome  LatencyStats `json:"local_home"`
	RemoteHome LatencyStats `json:"remote_home"`
	// Notes are caveats found while measuring (a leader that moved, calls
	// that failed, a time budget that ran out).
	Notes []string `json:"notes,omitempty"`
}

// LatencyCell is the latency of keys homed in HomeRegion reached through
// RouterRegion's router by a client in RouterRegion.
type LatencyCell struct {
	RouterRegion string `json:"router_region"`
	HomeRegion   string `json:"home_region"`
	// WANOneWayMs is the simulated one-way latency between the two regions
	// (0 when they are the same).
	WANOneWayMs float64 `json:"wan_one_way_ms"`
	LatencyStats
}

// LatencyStats summarises measured cycles.
type LatencyStats struct {
	// Cycles counts the measured cycles that succeeded (reserve ACQUIRED,
	// then complete); Errors the ones that failed (left out of the
	// percentiles).
	Cycles int `json:"cycles"`
	Errors int `json:"errors"`
	// Reserve and complete latency percentiles, milliseconds.
	ReserveP50Ms  float64 `json:"reserve_p50_ms"`
	ReserveP99Ms  float64 `json:"reserve_p99_ms"`
	CompleteP50Ms float64 `json:"complete_p50_ms"`
	CompleteP99Ms float64 `json:"complete_p99_ms"`
}

// WriteLatencyJSON writes l as indented JSON.
func WriteLatencyJSON(w io.Writer, l *Latency) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(l)
}

// latencyRows renders l's table rows (cells, then the two pooled rows).
func latencyRows(l *Latency) [][]string {
	row := func(router, home, wan string, s LatencyStats) []string {
		return []string{router, home, wan, fmt.Sprint(s.Cycles), fmt.Sprint(s.Errors),
			fmt.Sprintf("%.1f", s.ReserveP50Ms), fmt.Sprintf("%.1f", s.ReserveP99Ms),
			fmt.Sprintf("%.1f", s.CompleteP50Ms), fmt.Sprintf("%.1f", s.CompleteP99Ms)}
	}
	var rows [][]string
	for _, c := range l.Cells {
		wan := "-"
		if c.RouterRegion != c.HomeRegion {
			wan = fmt.Sprintf("%.0f", c.WANOneWayMs)
		}
		rows = append(rows, row(c.RouterRegion, c.HomeRegion, wan, c.LatencyStats))
	}
	rows = append(rows, row("all", "local home", "-", l.LocalHome), row("all", "remote home", "-", l.RemoteHome))
	return rows
}

var latencyHeader = []string{"router", "key home", "WAN one-way ms", "cycles", "errors",
	"reserve p50 ms", "reserve p99 ms", "complete p50 ms", "complete p99 ms"}

// WriteLatencyText writes l as a text table with its setup and notes.
func WriteLatencyText(w io.Writer, l *Latency) error {
	var b strings.Builder
	s := l.Setup
	fmt.Fprintf(&b, "Latency per survival mode: survival %s, %d regions x %d nodes, %d shards per region, %d replicas\n",
		s.Survival, len(s.Regions), s.NodesPerRegion, s.ShardsPerRegion, s.Replicas)
	var links []string
	for _, k := range s.Links {
		links = append(links, fmt.Sprintf("%s-%s %.0fms", k.A, k.B, k.LatencyMs))
	}
	fmt.Fprintf(&b, "WAN one-way: %s (jitter +/-%.0fms, loss %.1f%%); no faults\n", strings.Join(links, ", "), s.JitterMs, 100*s.Loss)
	fmt.Fprintf(&b, "%d measured reserve+complete cycles per cell after %d warm-up, sequential per cell, cells concurrent; leaders settled on the preferred voters (home regions) in %.1fs\n\n",
		l.Cycles, l.Warmup, l.SettleS)
	rows := append([][]string{latencyHeader}, latencyRows(l)...)
	widths := make([]int, len(latencyHeader))
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len(c))
		}
	}
	for i, r := range rows {
		if i == len(rows)-2 {
			b.WriteString(strings.Repeat("-", sum(widths)+2*(len(widths)-1)) + "\n")
		}
		for j, c := range r {
			if j > 0 {
				b.WriteString("  ")
			}
			if j < 2 {
				fmt.Fprintf(&b, "%-*s", widths[j], c)
			} else {
				fmt.Fprintf(&b, "%*s", widths[j], c)
			}
		}
		b.WriteString("\n")
	}
	for _, n := range l.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	fmt.Fprintf(&b, "\ncommand: %s (%.0fs)\n", l.Command, l.ElapsedS)
	_, err := io.WriteString(w, b.String())
	return err
}

func sum(xs []int) int {
	t := 0
	for _, x := range xs {
		t += x
	}
	return t
}

var latencyPage = template.Must(template.New("latency").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>regionsim: latency, {{.L.Setup.Survival}} survival</title>
<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:.3em .6em}td.n{text-align:right}tr.pool td{font-weight:bold;background:#f4f4f4}</style></head>
<body><h1>What {{.L.Setup.Survival}} survival costs</h1>
<p>{{len .L.Setup.Regions}} regions x {{.L.Setup.NodesPerRegion}} nodes, {{.L.Setup.ShardsPerRegion}} shards per region,
{{.L.Setup.Replicas}} replicas; WAN one-way:{{range .L.Setup.Links}} {{.A}}-{{.B}} {{printf "%.0f" .LatencyMs}}&nbsp;ms;{{end}}
jitter &plusmn;{{printf "%.0f" .L.Setup.JitterMs}}&nbsp;ms; no faults. {{.L.Cycles}} measured reserve+complete cycles per cell
after {{.L.Warmup}} warm-up. Leaders settled on the preferred voters (home regions) in {{printf "%.1f" .L.SettleS}}&nbsp;s.</p>
<table><tr>{{range .Header}}<th>{{.}}</th>{{end}}</tr>
{{range $i, $r := .Rows}}<tr{{if ge $i $.PoolFrom}} class="pool"{{end}}>{{range $j, $c := $r}}<td{{if ge $j 2}} class="n"{{end}}>{{$c}}</td>{{end}}</tr>
{{end}}</table>
{{range .L.Notes}}<p>Note: {{.}}</p>{{end}}
<p>Command: <code>{{.L.Command}}</code></p></body></html>
`))

// WriteLatencyHTML writes l as a self-contained HTML page with its table.
func WriteLatencyHTML(w io.Writer, l *Latency) error {
	rows := latencyRows(l)
	return latencyPage.Execute(w, map[string]any{"L": l, "Header": latencyHeader, "Rows": rows, "PoolFrom": len(rows) - 2})
}
