package regionsim

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/regionsim/report"
)

// TestMeasureLatency measures a few cycles per cell under zone survival and
// checks that every cell answered without errors and that the figures are
// physically possible: a key homed in another region cannot answer faster
// than one simulated WAN round trip, which proves the traffic crossed the
// simulated WAN. How fast anything is stays a figure of `regionsim
// --latency` (README), never an assertion here.
func TestMeasureLatency(t *testing.T) {
	needBinaries(t)
	cfg := DefaultConfig()
	cfg.LatencyCycles, cfg.LatencyWarmup = 12, 2
	cfg.LatencyBudget = 40 * time.Second
	cfg.Binaries = bins
	cfg.WorkDir = t.TempDir()
	cfg.Logger = testutil.Logger(t, slog.LevelWarn)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	started := time.Now()
	rep, err := MeasureLatency(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	if err := report.WriteLatencyText(&text, rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("measured in %s:\n%s", time.Since(started).Round(time.Second), text.String())
	if want := cfg.Regions * cfg.Regions; len(rep.Cells) != want {
		t.Fatalf("%d cells, want %d", len(rep.Cells), want)
	}
	if want := cfg.Regions * cfg.ShardsPerRegion; len(rep.Leaders) != want {
		t.Errorf("leaders of %d shards recorded, want %d: %v", len(rep.Leaders), want, rep.Leaders)
	}
	// A remote round trip is at least twice the smallest one-way latency,
	// less jitter each way.
	rtt := func(oneWayMs float64) float64 { return 2*oneWayMs - 2*float64(cfg.Jitter)/1e6 }
	for _, c := range rep.Cells {
		if c.Cycles != cfg.LatencyCycles || c.Errors != 0 {
			t.Errorf("router %s, home %s: %d cycles and %d errors, want %d and 0 (notes: %v)",
				c.RouterRegion, c.HomeRegion, c.Cycles, c.Errors, cfg.LatencyCycles, rep.Notes)
		}
		plausible(t, c.RouterRegion+" -> "+c.HomeRegion, c.LatencyStats)
		if c.RouterRegion != c.HomeRegion && c.ReserveP50Ms < rtt(c.WANOneWayMs) {
			t.Errorf("router %s, home %s: reserve p50 %.1f ms is below the WAN round trip %.0f ms",
				c.RouterRegion, c.HomeRegion, c.ReserveP50Ms, rtt(c.WANOneWayMs))
		}
	}
	plausible(t, "local home", rep.LocalHome)
	plausible(t, "remote home", rep.RemoteHome)
	if rep.LocalHome.Cycles != cfg.Regions*cfg.LatencyCycles || rep.RemoteHome.Cycles != cfg.Regions*(cfg.Regions-1)*cfg.LatencyCycles {
		t.Errorf("pooled cycles local %d, remote %d", rep.LocalHome.Cycles, rep.RemoteHome.Cycles)
	}
	if min := rtt(float64(cfg.LatencyMin) / 1e6); rep.RemoteHome.ReserveP50Ms < min {
		t.Errorf("remote-home reserve p50 %.1f ms is below the smallest WAN round trip %.0f ms", rep.RemoteHome.ReserveP50Ms, min)
	}
	var page strings.Builder
	if err := report.WriteLatencyHTML(&page, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), "remote home") {
		t.Error("HTML report lacks the pooled rows")
	}
}

// plausible checks that s holds positive, ordered percentiles (a bound on
// their size would be a timed assertion: figures belong to regionsim --latency).
func plausible(t *testing.T, what string, s report.LatencyStats) {
	t.Helper()
	if s.Cycles == 0 || s.ReserveP50Ms <= 0 || s.CompleteP50Ms <= 0 ||
		s.ReserveP99Ms < s.ReserveP50Ms || s.CompleteP99Ms < s.CompleteP50Ms {
		t.Errorf("%s: implausible figures %+v", what, s)
	}
}
