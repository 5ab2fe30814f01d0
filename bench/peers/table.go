package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// row is one (system, clients) line of the table: the rounds' cells summed up.
type row struct {
	System      string
	Clients     int
	Rounds      int
	Rate        float64 // median cycles/s over rounds
	P50Lo, P50H time.Duration
	P99Lo, P99H time.Duration
	CPUPerCycle time.Duration // median over rounds of server CPU per cycle; 0: unknown
	ClientCPU   time.Duration // median over rounds of the clients' CPU per cycle; 0: unknown
	Failed      int
	FirstErr    string
}

// rows groups cells by (system, clients), in the order of systems and
// concurrency given.
func rows(cells []cell, systems []string, concurrency []int) []row {
	var out []row
	for _, sys := range systems {
		for _, c := range concurrency {
			var rates, cpus, clientCPUs []float64
			r := row{System: sys, Clients: c}
			for _, x := range cells {
				if x.System != sys || x.Clients != c {
					continue
				}
				if r.Rounds == 0 || x.P50 < r.P50Lo {
					r.P50Lo = x.P50
				}
				if r.Rounds == 0 || x.P99 < r.P99Lo {
					r.P99Lo = x.P99
				}
				r.P50H, r.P99H = max(r.P50H, x.P50), max(r.P99H, x.P99)
				r.Rounds++
				rates = append(rates, x.rate())
				if x.CPU > 0 && x.Cycles > 0 {
					cpus = append(cpus, float64(x.CPU)/float64(x.Cycles))
				}
				if x.ClientCPU > 0 && x.Cycles > 0 {
					clientCPUs = append(clientCPUs, float64(x.ClientCPU)/float64(x.Cycles))
				}
				r.Failed += x.Failed
				if r.FirstErr == "" {
					r.FirstErr = x.FirstErr
				}
			}
			if r.Rounds == 0 {
				continue
			}
			r.Rate = median(rates)
			if len(cpus) > 0 {
				r.CPUPerCycle = time.Duration(median(cpus))
			}
			if len(clientCPUs) > 0 {
				r.ClientCPU = time.Duration(median(clientCPUs))
			}
			out = append(out, r)
		}
	}
	return out
}

// median of xs (the mean of the middle two for an even count); xs is sorted.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// ratio is rate(idem row) / rate(peer row) at the same client count; ok is
// false when either is missing or the peer measured nothing.
func ratio(rs []row, idem, peer string, clients int) (float64, bool) {
	var a, b *row
	for i := range rs {
		if rs[i].Clients != clients {
			continue
		}
		switch rs[i].System {
		case idem:
			a = &rs[i]
		case peer:
			b = &rs[i]
		}
	}
	if a == nil || b == nil || b.Rate == 0 {
		return 0, false
	}
	return a.Rate / b.Rate, true
}

// fmtMs prints a duration in milliseconds with precision that suits it.
func fmtMs(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms >= 100:
		return fmt.Sprintf("%.0f", ms)
	case ms >= 10:
		return fmt.Sprintf("%.1f", ms)
	default:
		return fmt.Sprintf("%.2f", ms)
	}
}

func fmtRange(lo, hi time.Duration) string {
	if fmtMs(lo) == fmtMs(hi) {
		return fmtMs(lo)
	}
	return fmtMs(lo) + "-" + fmtMs(hi)
}

// fmtThousands prints n with thousands separators.
func fmtThousands(n float64) string {
	s := fmt.Sprintf("%.0f", n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// fmtMicros prints a CPU time per cycle in µs, "?" when unknown (0).
func fmtMicros(d time.Duration) string {
	if d <= 0 {
		return "?"
	}
	return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
}

// writeTable prints the main table and the ratios as Markdown, so it can be
// pasted into the README as is.
func writeTable(w io.Writer, rs []row, rounds int) {
	fmt.Fprintf(w, "| system | clients | cycles/s (median of %d) | cycle p50 ms | cycle p99 ms | server CPU/cycle | client CPU/cycle | failed |\n", rounds)
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range rs {
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %d |\n", r.System, r.Clients, fmtThousands(r.Rate), fmtRange(r.P50Lo, r.P50H), fmtRange(r.P99Lo, r.P99H),
			fmtMicros(r.CPUPerCycle), fmtMicros(r.ClientCPU), r.Failed)
	}
	var present []string
	seen := map[string]bool{}
	var clients []int
	for _, r := range rs {
		if !seen[r.System] {
			seen[r.System] = true
			present = append(present, r.System)
		}
		if !slices.Contains(clients, r.Clients) {
			clients = append(clients, r.Clients)
		}
	}
	var idems []string
	for _, s := range present {
		if isIdem(s) {
			idems = append(idems, s)
		}
	}
	for _, g := range ratioGroups(seen) {
		writeRatios(w, rs, g, idems, clients)
	}
}

// ratioGroup is one ratio table: every idem row against these peers.
type ratioGroup struct {
	title string
	peers []string
}

// ratioGroups gives the ratio tables for the systems that ran: the
// replicated peers first, then the single-copy ones; a table none of whose
// peers ran is left out.
func ratioGroups(ran map[string]bool) []ratioGroup {
	var out []ratioGroup
	for _, g := range []ratioGroup{{"replicated peers", replicatedPeers}, {"single-copy peers", singleCopyPeers}} {
		var ps []string
		for _, p := range g.peers {
			if ran[p] {
				ps = append(ps, p)
			}
		}
		if len(ps) > 0 {
			out = append(out, ratioGroup{g.title, ps})
		}
	}
	return out
}

// writeRatios prints idem / peer of the median cycles/s for every idem
// row and client count against g's peers.
func writeRatios(w io.Writer, rs []row, g ratioGroup, idems []string, clients []int) {
	if len(idems) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| idem / %s (median cycles/s) | clients |", g.title)
	for _, p := range g.peers {
		fmt.Fprintf(w, " / %s |", p)
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, "| --- | ---: |")
	for range g.peers {
		fmt.Fprint(w, " ---: |")
	}
	fmt.Fprintln(w)
	for _, s := range idems {
		for _, c := range clients {
			fmt.Fprintf(w, "| %s | %d |", s, c)
			for _, p := range g.peers {
				if x, ok := ratio(rs, s, p, c); ok {
					fmt.Fprintf(w, " %.2f |", x)
				} else {
					fmt.Fprint(w, " - |")
				}
			}
			fmt.Fprintln(w)
		}
	}
}

// writeRace prints the race phase and returns whether every system passed.
func writeRace(w io.Writer, rs []raceResult) bool {
	if len(rs) == 0 {
		return true
	}
	all := true
	fmt.Fprintf(w, "| race: system | keys x contenders | keys with exactly one winner | winners per key | losers' completes refused | winners' completes accepted | errors | verdict |\n")
	fmt.Fprintln(w, "| --- | ---: | ---: | --- | ---: | ---: | ---: | --- |")
	for _, r := range rs {
		verdict := "ok"
		if !r.ok() {
			verdict, all = "FAIL", false
		}
		var dist []string
		for _, k := range slices.Sorted(maps.Keys(r.Winners)) {
			dist = append(dist, fmt.Sprintf("%d:%d", k, r.Winners[k]))
		}
		fmt.Fprintf(w, "| %s | %d x %d | %d | %s | %d/%d | %d/%d | %d | %s |\n", r.System, r.Keys, r.Contenders, r.OneWinner, strings.Join(dist, " "), r.LoserRefuse, r.LoserTries, r.WinnerDone, r.Keys, r.Errors, verdict)
	}
	for _, r := range rs {
		if r.FirstErr != "" {
			fmt.Fprintf(w, "race %s: first error: %s\n", r.System, r.FirstErr)
		}
	}
	return all
}

// writeAB prints, for every idem system run with --idemnode-b, binary b
// against binary a: per round the ratio of the twins' cycles/s and of their
// server CPU per cycle (the twins of one round ran minutes apart at most,
// so the ratio cancels most of the box's drift), as the median and the
// range over rounds. It prints nothing without twins.
func writeAB(w io.Writer, cells []cell, systems []string, concurrency []int) {
	type key struct {
		sys            string
		clients, round int
	}
	byKey := map[key]cell{}
	for _, c := range cells {
		byKey[key{c.System, c.Clients, c.Round}] = c
	}
	header := false
	for _, b := range systems {
		a, twin := twinOf(b)
		if twin == "" {
			continue
		}
		for _, clients := range concurrency {
			var rates, cpus []float64
			for round := 0; ; round++ {
				ca, okA := byKey[key{a, clients, round}]
				cb, okB := byKey[key{b, clients, round}]
				if !okA || !okB {
					break
				}
				if ca.rate() > 0 {
					rates = append(rates, cb.rate()/ca.rate())
				}
				if ca.CPU > 0 && cb.CPU > 0 && ca.Cycles > 0 && cb.Cycles > 0 {
					cpus = append(cpus, (float64(cb.CPU)/float64(cb.Cycles))/(float64(ca.CPU)/float64(ca.Cycles)))
				}
			}
			if len(rates) == 0 {
				continue
			}
			if !header {
				fmt.Fprintln(w)
				fmt.Fprintln(w, "| b / a (per round: median, range) | clients | rounds | cycles/s | server CPU/cycle |")
				fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: |")
				header = true
			}
			fmt.Fprintf(w, "| %s / %s | %d | %d | %s | %s |\n", b, a, clients, len(rates), fmtRatios(rates), fmtRatios(cpus))
		}
	}
}

// fmtRatios prints the median of xs and their range, "?" for none.
func fmtRatios(xs []float64) string {
	if len(xs) == 0 {
		return "?"
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return fmt.Sprintf("%.2f (%.2f-%.2f)", median(s), s[0], s[len(s)-1])
}
