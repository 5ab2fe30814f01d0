package regionsim

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/idem-dev/idem/regionsim/check"
	"github.com/idem-dev/idem/regionsim/ledger"
	"github.com/idem-dev/idem/regionsim/report"
)

// phaseOf names the phase of an attempt from its start to its end (ns
// since the scenario started), given the faults' span: before when it
// ended before the first fault began, after when it started once the last
// one ended, during otherwise. An attempt the faults caught midway (it
// started before them and timed out under them) counts as during, so the
// before phase is the healthy cluster's baseline. Without faults (an empty
// span) there is no during.
func phaseOf(start, end int64, during [2]int64) string {
	switch {
	case start >= during[1]:
		return "after"
	case end < during[0] || during[0] == during[1]:
		return "before"
	}
	return "during"
}

// stats computes availability and latency percentiles of attempts,
// leaving out those whose instance misbehaved on purpose.
func stats(phase, region string, atts []attemptRec) report.Phase {
	p := report.Phase{Phase: phase, Region: region}
	var lat []float64
	for _, a := range atts {
		if a.Injected {
			continue
		}
		p.Attempts++
		if a.OK {
			p.OK++
			lat = append(lat, float64(a.End-a.Start)/1e6)
		}
	}
	if p.Attempts > 0 {
		p.Availability = float64(p.OK) / float64(p.Attempts)
	}
	sort.Float64s(lat)
	p.P50Ms, p.P90Ms, p.P99Ms = quantile(lat, .5), quantile(lat, .9), quantile(lat, .99)
	if len(lat) > 0 {
		p.MaxMs = lat[len(lat)-1]
	}
	return p
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted)-1) + 0.5)
	return sorted[min(i, len(sorted)-1)]
}

// fill computes the checks, phases, comparison and timeline of a finished
// scenario.
func (env *runEnv) fill(out *report.Scenario, r *scenarioRun, faults []*Fault, finals map[string]map[string]check.FinalRead) {
	cfg := env.cfg
	ops := r.rec.Ops()
	idemRes := r.result(sysIdem)
	lin := check.Linearizability(ops, cfg.ClockSkewMargin, 10*time.Second, 60*time.Second)
	once := check.ExactlyOnce(r.guard.All(), idemRes.acks)
	replays := check.Replays(idemRes.deliveries, ops)
	noLoss := check.NoLoss(idemRes.acks, finals[sysIdem])
	out.Checks = []check.Outcome{once, replays, lin, noLoss}
	out.Passed = true
	for _, c := range out.Checks {
		out.Passed = out.Passed && c.Passed()
	}
	if d := r.rec.Dropped(); d > 0 {
		env.log.Warn("history full; calls past the limit were not checked", "scenario", r.sc.Name, "dropped", d)
	}
	out.Ops = map[string]int{}
	for _, op := range ops {
		k := op.Kind.String() + " " + op.Result.String()
		if op.Outcome != "" {
			k = op.Kind.String() + " " + op.Outcome
		}
		out.Ops[k]++
	}

	// Phases: before the first fault, during (first start to last end),
	// after.
	loadEnd := int64(r.loadEnd().Sub(r.start))
	during := [2]int64{loadEnd, loadEnd}
	for i, f := range out.Faults {
		s, e := int64(f.StartS*1e9), int64(f.EndS*1e9)
		if i == 0 || s < during[0] {
			during[0] = s
		}
		if i == 0 || e > during[1] {
			during[1] = e
		}
	}
	attempts := r.sortedAttempts()
	bySys := map[string][]attemptRec{}
	for _, a := range attempts {
		bySys[a.System] = append(bySys[a.System], a)
	}
	idemAtts := bySys[sysIdem]
	for _, phase := range []string{"before", "during", "after"} {
		var all []attemptRec
		perRegion := map[string][]attemptRec{}
		for _, a := range idemAtts {
			if phaseOf(a.Start, a.End, during) == phase {
				all = append(all, a)
				perRegion[a.Region] = append(perRegion[a.Region], a)
			}
		}
		for _, region := range env.c.regions {
			out.Phases = append(out.Phases, stats(phase, region, perRegion[region]))
		}
		out.Phases = append(out.Phases, stats(phase, "all", all))
	}
	for i, f := range out.Faults {
		var in []attemptRec
		s, e := int64(f.StartS*1e9), int64(f.EndS*1e9)
		for _, a := range idemAtts {
			if a.Start >= s && a.Start < e {
				in = append(in, a)
			}
		}
		out.FaultWindows = append(out.FaultWindows, stats(fmt.Sprintf("F%d window", i+1), "all", in))
	}

	// Comparison.
	sysRow := func(name string, res *systemResults, atts []attemptRec) report.System {
		res.mu.Lock()
		defer res.mu.Unlock()
		whole := stats("all", "all", atts)
		errs := map[string]int{}
		for _, a := range atts {
			if !a.OK {
				errs[a.Err]++
			}
		}
		return report.System{Name: name, Payments: res.payments, Completed: countKeys(res.deliveries), Abandoned: res.abandoned,
			Availability: whole.Availability, P99Ms: whole.P99Ms, Linearizability: -1, Errors: errs}
	}
	row := sysRow(sysIdem, idemRes, idemAtts)
	row.DoubleCharged = r.guard.Stats().DoubleCharged
	row.DoubleChargeCauses = causes(r.guard.All())
	row.ExactlyOnceViolations, row.ChangedReplays, row.LostCompletions = once.Violations, replays.Violations, noLoss.Violations
	row.Linearizability = lin.Violations
	row.FencedWrites = r.guard.Stats().Rejected
	idemRes.mu.Lock()
	row.Resumed = idemRes.resumed
	idemRes.mu.Unlock()
	out.Systems = append(out.Systems, row)

	var bare []check.Completion
	for _, a := range idemRes.acks {
		bare = append(bare, check.Completion{Key: a.Key, Response: a.Response})
	}
	noGuard := check.ExactlyOnce(r.shadow.All(), bare)
	row2 := row
	row2.Name = sysIdemNoGuard
	row2.DoubleCharged, row2.ExactlyOnceViolations, row2.FencedWrites = r.shadow.Stats().DoubleCharged, noGuard.Violations, 0
	row2.DoubleChargeCauses = causes(r.shadow.All())
	row2.Note = "the idem run's ledger writes, applied to a ledger without the fencing guard"
	out.Systems = append(out.Systems, row2)

	if cfg.Compare {
		nres := r.result(sysNaive)
		nOnce := check.ExactlyOnce(r.naiveLedger.All(), nres.acks)
		nReplays := check.Replays(nres.deliveries, nil)
		nLoss := check.NoLoss(nres.acks, finals[sysNaive])
		row3 := sysRow(sysNaive, nres, bySys[sysNaive])
		row3.DoubleCharged = r.naiveLedger.Stats().DoubleCharged
		row3.DoubleChargeCauses = causes(r.naiveLedger.All())
		row3.ExactlyOnceViolations, row3.ChangedReplays, row3.LostCompletions = nOnce.Violations, nReplays.Violations, nLoss.Violations
		row3.Note = fmt.Sprintf("one lock server in %s, shares the fate of node %s", env.c.node(env.c.naiveHost).region, env.c.naiveHost)
		out.Systems = append(out.Systems, row3)
	}

	out.Timeline = timeline(idemAtts, env.c.regions)
}

// causes counts the extra charges of double-charged keys by the behaviour
// of the instance that wrote them (the last part of its name).
func causes(all map[string][]ledger.Charge) map[string]int {
	out := map[string]int{}
	for _, cs := range all {
		for _, c := range cs[min(1, len(cs)):] {
			out[c.By[strings.LastIndex(c.By, "/")+1:]]++
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func countKeys(ds []check.Delivery) int {
	keys := map[string]bool{}
	for _, d := range ds {
		keys[d.Key] = true
	}
	return len(keys)
}

// timeline buckets attempts by the second they ended in, per client region.
func timeline(atts []attemptRec, regions []string) []report.Series {
	var out []report.Series
	last := int64(0)
	for _, a := range atts {
		last = max(last, a.End)
	}
	n := int(last/1e9) + 1
	for _, region := range regions {
		s := report.Series{Region: region}
		buckets := make([][]attemptRec, n)
		for _, a := range atts {
			if a.Region == region {
				buckets[a.End/1e9] = append(buckets[a.End/1e9], a)
			}
		}
		for i, b := range buckets {
			st := stats("", region, b)
			s.Points = append(s.Points, report.Point{T: float64(i), OK: st.OK, Failed: st.Attempts - st.OK, P50Ms: st.P50Ms, P99Ms: st.P99Ms})
		}
		out = append(out, s)
	}
	return out
}
