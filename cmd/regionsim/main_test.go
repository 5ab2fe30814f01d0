package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/regionsim/check"
	"github.com/idem-dev/idem/regionsim/report"
)

func TestHelpListsScenariosAndFlags(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--help"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"race", "crash-mid-request", "clock-skew", "cross-region-retry", "region-partition",
		"stall-past-lease", "consumer-redelivery", "reconfigure", "leader-kill", "--scenario", "--seed", "--duration", "--survival",
		"--regions", "--nodes-per-region", "--json", "--html"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help does not mention %q", want)
		}
	}
}

func TestBadFlagsFailWithOneLine(t *testing.T) {
	for _, args := range [][]string{
		{"--scenario", "nope"},
		{"--survival", "planet"},
		{"--survival", "region", "--regions", "2"},
		{"--duration", "1s"},
		{"--bogus"},
		{"stray"},
	} {
		var out bytes.Buffer
		err := run(context.Background(), args, &out, &out)
		if err == nil {
			t.Errorf("%v: accepted", args)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error spans lines: %q", args, err)
		}
	}
}

func TestReplayCommand(t *testing.T) {
	o, err := parseFlags([]string{"--scenario", "clock-skew", "--seed", "42", "--duration", "7s", "--survival", "region", "--rate", "3"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	got := replayCommand(o)
	for _, want := range []string{"go run ./cmd/regionsim", "--scenario clock-skew", "--seed 42", "--duration 7s", "--survival region", "--regions 3", "--nodes-per-region 3", "--rate 3"} {
		if !strings.Contains(got, want) {
			t.Errorf("replay command %q lacks %q", got, want)
		}
	}
	// The replay command parses back to the same configuration.
	again, err := parseFlags(strings.Fields(strings.TrimPrefix(got, "go run ./cmd/regionsim ")), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	o.cfg.Progress, again.cfg.Progress = nil, nil
	if replayCommand(again) != got {
		t.Fatalf("replay of the replay differs:\n%s\n%s", replayCommand(again), got)
	}
}

// TestFromJSONRendersAFailingReport: a saved report with a violation renders
// as FAIL in text and HTML, with the replay command.
func TestFromJSONRendersAFailingReport(t *testing.T) {
	dir := t.TempDir()
	rep := &report.Report{Seed: 9, Command: "go run ./cmd/regionsim --seed 9", Started: time.Now(),
		Setup: report.Setup{Regions: []string{"us-east"}, NodesPerRegion: 3, Survival: "zone"},
		Scenarios: []report.Scenario{{Name: "race", Checks: []check.Outcome{{Check: check.CheckExactlyOnce, Checked: 3, Violations: 1,
			Findings: []check.Finding{{Key: "k1", Detail: "charged 2 times"}}}},
			Systems: []report.System{{Name: "idem", Payments: 3, DoubleCharged: 1, ExactlyOnceViolations: 1}}}}}
	jsonPath := filepath.Join(dir, "r.json")
	f, _ := os.Create(jsonPath)
	report.WriteJSON(f, rep)
	f.Close()
	htmlPath := filepath.Join(dir, "r.html")
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--from-json", jsonPath, "--html", htmlPath}, &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"FAIL", "charged 2 times", "replay: go run ./cmd/regionsim --seed 9"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, out.String())
		}
	}
	page, err := os.ReadFile(htmlPath)
	if err != nil || !strings.Contains(string(page), "charged 2 times") || !strings.Contains(string(page), "badge fail") {
		t.Fatalf("HTML report: %v\n%s", err, page)
	}
}

func TestLatencyFlags(t *testing.T) {
	o, err := parseFlags([]string{"--latency", "--survival", "region", "--latency-cycles", "50"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !o.latency || o.cfg.LatencyCycles != 50 || o.htmlPath != "regionsim-latency-region.html" {
		t.Errorf("parsed %+v", o)
	}
	if got, want := latencyCommand(o), "go run ./cmd/regionsim --latency --survival region --latency-cycles 50"; got != want {
		t.Errorf("latency command %q, want %q", got, want)
	}
	o, err = parseFlags([]string{"--latency", "--html", ""}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.htmlPath != "" {
		t.Errorf("--html \"\" gave %q", o.htmlPath)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--latency", "--latency-cycles", "0"}, &out, &out); err == nil || !strings.Contains(err.Error(), "latency cycles") {
		t.Errorf("--latency-cycles 0: %v", err)
	}
}
