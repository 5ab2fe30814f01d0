package report

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/idem-dev/idem/regionsim/check"
)

func sample(pass bool) *Report {
	violations := 0
	if !pass {
		violations = 2
	}
	sc := Scenario{
		Name: "leader-kill", FailureMode: "leader crash", Description: "kills leaders", Passed: pass, LoadS: 20,
		Faults: []Fault{{Name: "SIGKILL the busiest leader", Detail: "killed us-east-1", StartS: 5, EndS: 7}},
		Checks: []check.Outcome{{Check: check.CheckExactlyOnce, Checked: 10, Violations: violations,
			Findings: []check.Finding{{Key: "0190-key", Detail: "charged 2 times"}}[:violations/2]}},
		Phases: []Phase{{Phase: "before", Region: "us-east", Attempts: 10, OK: 9, Availability: 0.9, P50Ms: 120, P99Ms: 1500}},
		Systems: []System{
			{Name: "idem", Payments: 10, Completed: 10, DoubleCharged: violations / 2, Resumed: 3, Availability: 0.9, P99Ms: 300},
			{Name: "naive SET NX PX lock", Payments: 12, Completed: 11, DoubleCharged: 3, LostCompletions: 4, Linearizability: -1, Availability: 0.8},
		},
		Timeline: []Series{{Region: "us-east", Points: []Point{{T: 0, OK: 3, P99Ms: 200}, {T: 1, OK: 0, Failed: 2}, {T: 2, OK: 4, P99Ms: 150}}}},
	}
	return &Report{Passed: pass, Seed: 5, Command: "go run ./cmd/regionsim --seed 5",
		Setup:     Setup{Regions: []string{"us-east", "eu-west"}, NodesPerRegion: 3, Links: []Link{{"us-east", "eu-west", 30}}},
		Scenarios: []Scenario{sc, sc}}
}

func TestTotalsAndHeadline(t *testing.T) {
	tot := Totals(sample(true))
	if len(tot) != 2 || tot[0].Payments != 20 || tot[0].Resumed != 6 || tot[1].DoubleCharged != 6 || tot[1].LostCompletions != 8 || tot[1].Linearizability != -1 {
		t.Fatalf("totals %+v", tot)
	}
	h := Headline(tot)
	if !strings.Contains(h, "idem: 20 payments, nothing let through") || !strings.Contains(h, "6 double-charged keys") {
		t.Fatalf("headline %q", h)
	}
}

func TestRenderings(t *testing.T) {
	for _, pass := range []bool{true, false} {
		r := sample(pass)
		var text, page, js bytes.Buffer
		if err := WriteText(&text, r); err != nil {
			t.Fatal(err)
		}
		if err := WriteHTML(&page, r); err != nil {
			t.Fatal(err)
		}
		if err := WriteJSON(&js, r); err != nil {
			t.Fatal(err)
		}
		var back Report
		if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Scenarios[0].Systems[1].LostCompletions != 4 {
			t.Fatalf("JSON round trip: %v", err)
		}
		wantVerdict := "verdict: PASS"
		if !pass {
			wantVerdict = "verdict: FAIL"
			if !strings.Contains(text.String(), "replay: go run ./cmd/regionsim --seed 5") || !strings.Contains(text.String(), "charged 2 times") {
				t.Fatalf("a failing text report must show the finding and the replay command:\n%s", text.String())
			}
		}
		if !strings.Contains(text.String(), "idem: 6 attempts resumed from an earlier attempt's checkpoint") {
			t.Fatalf("text report lacks the resumed attempts:\n%s", text.String())
		}
		if !strings.Contains(text.String(), wantVerdict) {
			t.Fatalf("text report lacks %q:\n%s", wantVerdict, text.String())
		}
		html := page.String()
		for _, want := range []string{"<svg", "SIGKILL the busiest leader", `id="leader-kill"`, "naive SET NX PX lock", "<polyline", "3 attempts resumed from a checkpoint"} {
			if !strings.Contains(html, want) {
				t.Fatalf("HTML lacks %q", want)
			}
		}
		if strings.Contains(html, "<script") || strings.Contains(html, "http://") || strings.Contains(html, "https://") {
			t.Fatal("the HTML report must be self-contained (no scripts, no external resources)")
		}
	}
}
