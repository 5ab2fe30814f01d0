package report

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
)

var palette = []string{"#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2", "#65a30d", "#dc2626"}

var faultFill = []string{"#fca5a5", "#fcd34d", "#c4b5fd", "#93c5fd"}

type chartSeries struct {
	Name   string
	Color  string
	Dashed bool
	X, Y   []float64
}

// niceStep returns a round tick step for a range.
func niceStep(span float64, ticks int) float64 {
	if span <= 0 {
		return 1
	}
	raw := span / float64(ticks)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if raw <= m*mag {
			return m * mag
		}
	}
	return 10 * mag
}

// lineChart renders an SVG line chart with the fault windows shaded.
func lineChart(title, unit string, xMax float64, series []chartSeries, faults []Fault) template.HTML {
	const w, h, left, right, top, bottom = 560.0, 200.0, 48.0, 12.0, 28.0, 20.0
	pw, ph := w-left-right, h-top-bottom
	yMax := 0.0
	for _, s := range series {
		for _, y := range s.Y {
			yMax = max(yMax, y)
		}
	}
	step := niceStep(yMax, 4)
	yMax = math.Max(step, math.Ceil(yMax/step)*step)
	xMax = math.Max(xMax, 1)
	x := func(v float64) float64 { return left + pw*v/xMax }
	y := func(v float64) float64 { return top + ph - ph*v/yMax }
	b := &strings.Builder{}
	fmt.Fprintf(b, `<svg viewBox="0 0 %.0f %.0f" class="chart" role="img" aria-label="%s">`, w, h, template.HTMLEscapeString(title))
	fmt.Fprintf(b, `<text x="%.0f" y="16" class="ctitle">%s (%s)</text>`, left, template.HTMLEscapeString(title), template.HTMLEscapeString(unit))
	for i, f := range faults {
		x0, x1 := x(math.Min(f.StartS, xMax)), x(math.Min(f.EndS, xMax))
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" opacity="0.35"><title>%s</title></rect>`,
			x0, top, math.Max(x1-x0, 1.5), ph, faultFill[i%len(faultFill)], template.HTMLEscapeString(f.Name+": "+f.Detail))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" class="flabel">F%d</text>`, x0+2, top+10+float64(i%3)*10, i+1)
	}
	for v := 0.0; v <= yMax+step/2; v += step {
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" class="grid"/>`, left, left+pw, y(v), y(v))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" class="tick" text-anchor="end">%s</text>`, left-4, y(v)+4, trimFloat(v))
	}
	xs := niceStep(xMax, 8)
	for v := 0.0; v <= xMax+xs/100; v += xs {
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" class="tick" text-anchor="middle">%ss</text>`, x(v), top+ph+14, trimFloat(v))
	}
	for _, s := range series {
		if len(s.X) == 0 {
			continue
		}
		var pts []string
		for i := range s.X {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.X[i]), y(s.Y[i])))
		}
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="4 3"`
		}
		fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.6"%s><title>%s</title></polyline>`,
			strings.Join(pts, " "), s.Color, dash, template.HTMLEscapeString(s.Name))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.1f", v)
	return strings.TrimSuffix(s, ".0")
}

type htmlScenario struct {
	Scenario
	Throughput, Latency template.HTML
	CheckRows           []htmlCheck
}

type htmlCheck struct {
	Name, Verdict, Class string
	Checked, Violations  int
	Inconclusive         int
	Examples             []string
}

type htmlPage struct {
	R         *Report
	Headline  string
	Verdict   string
	Class     string
	Scenarios []htmlScenario
	Totals    []System
	Regions   []regionColor
}

type regionColor struct{ Name, Color string }

// WriteHTML writes a self-contained HTML page (no scripts, no external
// resources) for r.
func WriteHTML(w io.Writer, r *Report) error {
	page := htmlPage{R: r, Verdict: verdict(r.Passed), Class: strings.ToLower(verdict(r.Passed)), Totals: Totals(r)}
	color := map[string]string{}
	for i, reg := range r.Setup.Regions {
		color[reg] = palette[i%len(palette)]
		page.Regions = append(page.Regions, regionColor{reg, color[reg]})
	}
	page.Headline = Headline(page.Totals)
	for _, sc := range r.Scenarios {
		hs := htmlScenario{Scenario: sc}
		xMax := 0.0
		var thr, lat []chartSeries
		for _, s := range sc.Timeline {
			ok := chartSeries{Name: s.Region + " ok/s", Color: color[s.Region]}
			bad := chartSeries{Name: s.Region + " failed/s", Color: color[s.Region], Dashed: true}
			p99 := chartSeries{Name: s.Region + " p99", Color: color[s.Region]}
			for _, p := range s.Points {
				xMax = math.Max(xMax, p.T+1)
				ok.X, ok.Y = append(ok.X, p.T), append(ok.Y, float64(p.OK))
				bad.X, bad.Y = append(bad.X, p.T), append(bad.Y, float64(p.Failed))
				if p.OK > 0 {
					p99.X, p99.Y = append(p99.X, p.T), append(p99.Y, p.P99Ms)
				}
			}
			thr = append(thr, ok, bad)
			lat = append(lat, p99)
		}
		hs.Throughput = lineChart("idem throughput per client region: ok (solid), failed (dashed)", "attempts/s", xMax, thr, sc.Faults)
		hs.Latency = lineChart("idem p99 latency of successful attempts, per client region", "ms", xMax, lat, sc.Faults)
		for _, c := range sc.Checks {
			hc := htmlCheck{Name: c.Check, Verdict: verdict(c.Passed()), Class: strings.ToLower(verdict(c.Passed())),
				Checked: c.Checked, Violations: c.Violations, Inconclusive: c.Inconclusive}
			for i, f := range c.Findings {
				if i == 5 {
					break
				}
				hc.Examples = append(hc.Examples, "key "+f.Key+": "+f.Detail)
			}
			hs.CheckRows = append(hs.CheckRows, hc)
		}
		page.Scenarios = append(page.Scenarios, hs)
	}
	return pageTemplate.Execute(w, page)
}

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"pct":    pct,
	"causes": causeList,
	"ms":     msStr,
	"add1":   func(i int) int { return i + 1 },
	"lin": func(n int) string {
		if n < 0 {
			return "n/a"
		}
		return fmt.Sprint(n)
	},
	"bad": func(n int) string {
		if n > 0 {
			return "badnum"
		}
		return ""
	},
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>regionsim report: {{.Verdict}}</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1f2937;background:#f8fafc}
main{max-width:1180px;margin:0 auto;padding:20px 24px 60px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:0} h3{font-size:14px;margin:14px 0 6px;color:#374151}
.sub{color:#6b7280;margin:0 0 14px}
.pass{color:#16a34a;font-weight:600}.fail{color:#dc2626;font-weight:600}
.badge{display:inline-block;padding:2px 10px;border-radius:999px;font-weight:600;font-size:13px}
.badge.pass{background:#16a34a;color:#fff}.badge.fail{background:#dc2626;color:#fff}
.legend{font-size:12px;color:#4b5563;margin:2px 0 8px}.legend span{display:inline-block;margin-right:14px}
.swatch{display:inline-block;width:18px;height:0;border-top:3px solid;vertical-align:middle;margin-right:4px}
.headline{font-size:15px;margin:8px 0 12px}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:16px 18px;margin:16px 0;box-shadow:0 1px 2px rgba(0,0,0,.04)}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #f1f5f9;vertical-align:top}
th{color:#6b7280;font-weight:600;background:#f8fafc}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.badnum{color:#dc2626;font-weight:700}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:10px}
svg.chart{width:100%;height:auto;background:#fff}
.ctitle{font-size:11px;font-weight:600;fill:#374151}.tick{font-size:10px;fill:#6b7280}.flabel{font-size:9px;font-weight:700;fill:#7f1d1d}
.grid{stroke:#eef2f7}
.desc{color:#4b5563;margin:6px 0 8px}
.ex{color:#7f1d1d;font-size:12px;font-family:ui-monospace,monospace;word-break:break-all}
.scen-head{display:flex;gap:10px;align-items:center}
.muted{color:#6b7280}
code{font-family:ui-monospace,monospace;font-size:12px;background:#f1f5f9;padding:1px 4px;border-radius:4px}
nav a{margin-right:10px;color:#2563eb;text-decoration:none}
</style></head><body><main>
<h1>regionsim <span class="badge {{.Class}}">{{.Verdict}}</span></h1>
<p class="sub">{{len .R.Setup.Regions}} regions &times; {{.R.Setup.NodesPerRegion}} nodes, {{.R.Setup.Survival}} survival, {{.R.Setup.ShardsPerRegion}} shards per region, {{.R.Setup.Replicas}} replicas;
WAN {{range $i, $l := .R.Setup.Links}}{{if $i}}, {{end}}{{$l.A}}&harr;{{$l.B}} {{$l.LatencyMs}} ms{{end}} one way (&plusmn;{{.R.Setup.JitterMs}} ms, loss {{pct .R.Setup.Loss}});
lease {{.R.Setup.LeaseMs}} ms, clock-skew margin {{.R.Setup.ClockSkewMarginS}} s. Seed {{.R.Seed}}, {{printf "%.0f" .R.ElapsedS}} s.<br>
Replay: <code>{{.R.Command}}</code></p>
<nav>{{range .Scenarios}}<a href="#{{.Name}}">{{.Name}}</a>{{end}}</nav>

<div class="card" id="comparison">
<h2>What each approach let through</h2>
<p class="headline">{{.Headline}}</p>
<p class="desc">The same seeded workload and the same faults, at the same time: idem with the ledger's fencing guard on; the same ledger writes replayed against a ledger without the guard (what idem without fencing downstream would have allowed); and a naive <code>SET NX PX</code> lock on one Redis-like server in {{with index .R.Setup.Regions 0}}{{.}}{{end}} (wall-clock TTLs, fsync every second, no fencing tokens).</p>
<table><tr><th>system</th><th class="num">payments</th><th class="num">completed</th><th class="num">double-charged keys</th><th class="num">exactly-once violations</th><th class="num">changed replays</th><th class="num">lost or overwritten completions</th><th class="num">linearizability violations</th><th class="num">availability</th><th class="num">p99</th></tr>
{{range .Totals}}<tr><td>{{.Name}}{{if .DoubleChargeCauses}}<div class="muted">extra charges written by {{causes .DoubleChargeCauses}}</div>{{end}}{{if .Resumed}}<div class="muted">{{.Resumed}} attempts resumed from a checkpoint</div>{{end}}</td><td class="num">{{.Payments}}</td><td class="num">{{.Completed}}</td><td class="num {{bad .DoubleCharged}}">{{.DoubleCharged}}</td><td class="num {{bad .ExactlyOnceViolations}}">{{.ExactlyOnceViolations}}</td><td class="num {{bad .ChangedReplays}}">{{.ChangedReplays}}</td><td class="num {{bad .LostCompletions}}">{{.LostCompletions}}</td><td class="num {{bad .Linearizability}}">{{lin .Linearizability}}</td><td class="num">{{pct .Availability}}</td><td class="num">{{ms .P99Ms}}</td></tr>
{{end}}</table>
<h3>Per scenario</h3>
<table><tr><th>scenario</th><th>verdict (idem)</th>{{range .Totals}}<th class="num">{{.Name}}: double-charged / lost or overwritten / changed replays</th>{{end}}</tr>
{{range .Scenarios}}<tr><td><a href="#{{.Name}}">{{.Name}}</a></td><td class="{{if .Passed}}pass{{else}}fail{{end}}">{{if .Passed}}PASS{{else}}FAIL{{end}}</td>{{range .Systems}}<td class="num"><span class="{{bad .DoubleCharged}}">{{.DoubleCharged}}</span> / <span class="{{bad .LostCompletions}}">{{.LostCompletions}}</span> / <span class="{{bad .ChangedReplays}}">{{.ChangedReplays}}</span></td>{{end}}</tr>
{{end}}</table>
</div>

{{range .Scenarios}}
<div class="card" id="{{.Name}}">
<div class="scen-head"><h2>{{.Name}}</h2><span class="badge {{if .Passed}}pass{{else}}fail{{end}}">{{if .Passed}}PASS{{else}}FAIL{{end}}</span><span class="muted">{{.FailureMode}}</span></div>
<p class="desc">{{.Description}}</p>
{{if .Error}}<p class="fail">Error: {{.Error}}</p>{{end}}
<table><tr><th>#</th><th>fault</th><th>window</th><th>what happened</th></tr>
{{range $i, $f := .Faults}}<tr><td>F{{add1 $i}}</td><td>{{$f.Name}}</td><td>{{printf "%.1f" $f.StartS}}s &ndash; {{printf "%.1f" $f.EndS}}s</td><td>{{$f.Detail}}{{if $f.Error}} <span class="fail">({{$f.Error}})</span>{{end}}</td></tr>{{end}}
</table>
<div class="charts">{{.Throughput}}{{.Latency}}</div>
<div class="legend">{{range $.Regions}}<span><i class="swatch" style="border-color:{{.Color}}"></i>{{.Name}}</span>{{end}}<span><i class="swatch" style="border-color:#9ca3af;border-top-style:dashed"></i>failed attempts</span><span>shaded: fault windows F1, F2, ... (hover for details)</span></div>
<h3>Checks (idem, ledger guard on)</h3>
<table><tr><th>check</th><th>verdict</th><th class="num">checked</th><th class="num">violations</th><th class="num">inconclusive</th></tr>
{{range .CheckRows}}<tr><td>{{.Name}}{{range .Examples}}<div class="ex">{{.}}</div>{{end}}</td><td class="{{.Class}}">{{.Verdict}}</td><td class="num">{{.Checked}}</td><td class="num {{bad .Violations}}">{{.Violations}}</td><td class="num">{{.Inconclusive}}</td></tr>{{end}}
</table>
<h3>Availability and latency of idem, per phase and client region</h3>
<table><tr><th>phase</th><th>region</th><th class="num">attempts</th><th class="num">ok</th><th class="num">p50</th><th class="num">p90</th><th class="num">p99</th><th class="num">max</th></tr>
{{range .Phases}}<tr><td>{{.Phase}}</td><td>{{.Region}}</td><td class="num">{{.Attempts}}</td><td class="num">{{pct .Availability}}</td><td class="num">{{ms .P50Ms}}</td><td class="num">{{ms .P90Ms}}</td><td class="num">{{ms .P99Ms}}</td><td class="num">{{ms .MaxMs}}</td></tr>{{end}}
{{range .FaultWindows}}<tr><td>{{.Phase}}</td><td>{{.Region}}</td><td class="num">{{.Attempts}}</td><td class="num">{{pct .Availability}}</td><td class="num">{{ms .P50Ms}}</td><td class="num">{{ms .P90Ms}}</td><td class="num">{{ms .P99Ms}}</td><td class="num">{{ms .MaxMs}}</td></tr>{{end}}
</table>
<h3>Comparison</h3>
<table><tr><th>system</th><th class="num">payments</th><th class="num">completed</th><th class="num">abandoned</th><th class="num">double-charged keys</th><th class="num">exactly-once violations</th><th class="num">changed replays</th><th class="num">lost or overwritten completions</th><th class="num">fenced writes</th><th class="num">availability</th><th class="num">p99</th></tr>
{{range .Systems}}<tr><td>{{.Name}}{{if .Note}}<div class="muted">{{.Note}}</div>{{end}}{{if .DoubleChargeCauses}}<div class="muted">extra charges written by {{causes .DoubleChargeCauses}}</div>{{end}}{{if .Resumed}}<div class="muted">{{.Resumed}} attempts resumed from a checkpoint</div>{{end}}</td><td class="num">{{.Payments}}</td><td class="num">{{.Completed}}</td><td class="num">{{.Abandoned}}</td><td class="num {{bad .DoubleCharged}}">{{.DoubleCharged}}</td><td class="num {{bad .ExactlyOnceViolations}}">{{.ExactlyOnceViolations}}</td><td class="num {{bad .ChangedReplays}}">{{.ChangedReplays}}</td><td class="num {{bad .LostCompletions}}">{{.LostCompletions}}</td><td class="num">{{.FencedWrites}}</td><td class="num">{{pct .Availability}}</td><td class="num">{{ms .P99Ms}}</td></tr>{{end}}
</table>
</div>
{{end}}
<p class="muted">Generated by <code>go run ./cmd/regionsim</code>. Availability: client attempts answered with a final response within the client's timeout. Latency: successful attempts, end to end through the routers and the simulated WAN.{{if .R.WorkDir}} Logs: <code>{{.R.WorkDir}}</code>{{end}}</p>
</main></body></html>
`))
