package report

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

func pct(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

func msStr(x float64) string {
	switch {
	case x == 0:
		return "-"
	case x >= 1000:
		return fmt.Sprintf("%.2fs", x/1000)
	}
	return fmt.Sprintf("%.0fms", x)
}

// WriteText writes the human-readable summary of r.
func WriteText(w io.Writer, r *Report) error {
	b := &strings.Builder{}
	s := r.Setup
	fmt.Fprintf(b, "regionsim: %d regions x %d nodes (%s survival, %d shards/region, %d replicas), routers: %v\n",
		len(s.Regions), s.NodesPerRegion, s.Survival, s.ShardsPerRegion, s.Replicas, s.Routers)
	var links []string
	for _, l := range s.Links {
		links = append(links, fmt.Sprintf("%s<->%s %.0fms", l.A, l.B, l.LatencyMs))
	}
	fmt.Fprintf(b, "WAN one-way: %s (jitter +/-%.0fms, loss %.1f%%); lease %dms, clock-skew margin %.1fs; %d clients/region at %.0f payments/s/region\n\n",
		strings.Join(links, ", "), s.JitterMs, 100*s.Loss, s.LeaseMs, s.ClockSkewMarginS, s.WorkersPerRegion, s.RatePerRegion)
	for _, sc := range r.Scenarios {
		writeScenario(b, sc)
	}
	writeSummary(b, r)
	_, err := io.WriteString(w, b.String())
	return err
}

func writeScenario(b *strings.Builder, sc Scenario) {
	fmt.Fprintf(b, "== %s (%s): %s\n", sc.Name, sc.FailureMode, verdict(sc.Passed))
	if sc.Error != "" {
		fmt.Fprintf(b, "   ERROR: %s\n", sc.Error)
	}
	fmt.Fprintf(b, "   load %.1fs, drain %.1fs\n", sc.LoadS, sc.DrainS)
	for _, f := range sc.Faults {
		fmt.Fprintf(b, "   fault %5.1fs-%5.1fs  %s", f.StartS, f.EndS, f.Name)
		if f.Detail != "" {
			fmt.Fprintf(b, ": %s", f.Detail)
		}
		if f.Error != "" {
			fmt.Fprintf(b, " (error: %s)", f.Error)
		}
		b.WriteString("\n")
	}
	b.WriteString("   checks (idem, ledger guard on):\n")
	for _, c := range sc.Checks {
		fmt.Fprintf(b, "     %s\n", c)
		for i, f := range c.Findings {
			if i == 3 {
				fmt.Fprintf(b, "       ... %d more (see the JSON report)\n", c.Violations-3)
				break
			}
			fmt.Fprintf(b, "       key %s: %s\n", f.Key, f.Detail)
		}
	}
	b.WriteString("   idem availability and latency per phase and client region:\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "     phase\tregion\tattempts\tok\tp50\tp90\tp99\tmax")
	for _, p := range sc.Phases {
		fmt.Fprintf(tw, "     %s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", p.Phase, p.Region, p.Attempts, pct(p.Availability), msStr(p.P50Ms), msStr(p.P90Ms), msStr(p.P99Ms), msStr(p.MaxMs))
	}
	tw.Flush()
	writeSystems(b, sc.Systems, "     ")
	b.WriteString("\n")
}

func writeSystems(b *strings.Builder, systems []System, indent string) {
	if len(systems) == 0 {
		return
	}
	b.WriteString(strings.TrimSuffix(indent, "  ") + "what each system let through (same workload, same faults):\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, indent+"system\tpayments\tcompleted\tdouble-charged keys\texactly-once violations\tchanged replays\tlost completions\tlinearizability\tavailability\tp99")
	for _, s := range systems {
		lin := "n/a"
		if s.Linearizability >= 0 {
			lin = fmt.Sprint(s.Linearizability)
		}
		fmt.Fprintf(tw, "%s%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", indent, s.Name, s.Payments, s.Completed, s.DoubleCharged,
			s.ExactlyOnceViolations, s.ChangedReplays, s.LostCompletions, lin, pct(s.Availability), msStr(s.P99Ms))
	}
	tw.Flush()
	for _, s := range systems {
		if len(s.DoubleChargeCauses) > 0 {
			fmt.Fprintf(b, "%s%s: extra charges written by %s\n", indent, s.Name, causeList(s.DoubleChargeCauses))
		}
		if s.Resumed > 0 {
			fmt.Fprintf(b, "%s%s: %d attempts resumed from an earlier attempt's checkpoint (recorded its charge, did not charge again)\n",
				indent, s.Name, s.Resumed)
		}
	}
}

// causeList spells a cause count map, largest first.
func causeList(m map[string]int) string {
	type kv struct {
		k string
		v int
	}
	var list []kv
	for k, v := range m {
		list = append(list, kv{k, v})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].v > list[j].v || list[i].v == list[j].v && list[i].k < list[j].k })
	var parts []string
	for _, e := range list {
		parts = append(parts, fmt.Sprintf("%d %s", e.v, e.k))
	}
	return strings.Join(parts, ", ") + " instances"
}

// Totals sums the comparison over every scenario, by system name.
func Totals(r *Report) []System {
	var order []string
	sums := map[string]*System{}
	for _, sc := range r.Scenarios {
		for _, s := range sc.Systems {
			t, ok := sums[s.Name]
			if !ok {
				t = &System{Name: s.Name, Linearizability: s.Linearizability}
				sums[s.Name] = t
				order = append(order, s.Name)
			}
			weight := float64(t.Payments)
			t.Availability = (t.Availability*weight + s.Availability*float64(s.Payments)) / max(weight+float64(s.Payments), 1)
			t.Payments += s.Payments
			t.Completed += s.Completed
			t.Abandoned += s.Abandoned
			t.DoubleCharged += s.DoubleCharged
			t.ExactlyOnceViolations += s.ExactlyOnceViolations
			t.ChangedReplays += s.ChangedReplays
			t.LostCompletions += s.LostCompletions
			t.FencedWrites += s.FencedWrites
			t.Resumed += s.Resumed
			if s.Linearizability >= 0 {
				t.Linearizability = max(t.Linearizability, 0) + s.Linearizability
			}
			t.P99Ms = max(t.P99Ms, s.P99Ms)
			for k, v := range s.DoubleChargeCauses {
				if t.DoubleChargeCauses == nil {
					t.DoubleChargeCauses = map[string]int{}
				}
				t.DoubleChargeCauses[k] += v
			}
		}
	}
	out := make([]System, 0, len(order))
	for _, n := range order {
		out = append(out, *sums[n])
	}
	return out
}

// Headline is the comparison in one sentence.
func Headline(totals []System) string {
	var parts []string
	for _, s := range totals {
		bad := s.DoubleCharged + s.LostCompletions + s.ChangedReplays + max(s.Linearizability, 0)
		if bad == 0 {
			parts = append(parts, fmt.Sprintf("%s: %d payments, nothing let through", s.Name, s.Payments))
			continue
		}
		var what []string
		if s.DoubleCharged > 0 {
			what = append(what, fmt.Sprintf("%d double-charged keys", s.DoubleCharged))
		}
		if s.LostCompletions > 0 {
			what = append(what, fmt.Sprintf("%d lost or overwritten completions", s.LostCompletions))
		}
		if s.ChangedReplays > 0 {
			what = append(what, fmt.Sprintf("%d changed replays", s.ChangedReplays))
		}
		if s.Linearizability > 0 {
			what = append(what, fmt.Sprintf("%d non-linearizable keys", s.Linearizability))
		}
		parts = append(parts, fmt.Sprintf("%s: %s in %d payments", s.Name, strings.Join(what, ", "), s.Payments))
	}
	return strings.Join(parts, "; ") + "."
}

func writeSummary(b *strings.Builder, r *Report) {
	b.WriteString("== summary\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for _, sc := range r.Scenarios {
		failed := 0
		for _, c := range sc.Checks {
			if !c.Passed() {
				failed++
			}
		}
		fmt.Fprintf(tw, "   %s\t%s\t%d/%d checks passed\n", sc.Name, verdict(sc.Passed), len(sc.Checks)-failed, len(sc.Checks))
	}
	tw.Flush()
	writeSystems(b, Totals(r), "     ")
	fmt.Fprintf(b, "   %s\n", Headline(Totals(r)))
	fmt.Fprintf(b, "\nverdict: %s (seed %d, %.0fs)\n", verdict(r.Passed), r.Seed, r.ElapsedS)
	if !r.Passed {
		fmt.Fprintf(b, "replay: %s\n", r.Command)
	}
	if r.WorkDir != "" {
		fmt.Fprintf(b, "logs and data: %s\n", r.WorkDir)
	}
}
