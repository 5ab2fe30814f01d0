package main

import (
	"fmt"
	"testing"

	"github.com/idem-dev/idem/internal/flagdoc"
	"github.com/idem-dev/idem/regionsim"
)

// TestFlagDefaultsAreConfigDefaults: the default --help prints for each
// flag that sets a regionsim.Config field is DefaultConfig's.
func TestFlagDefaultsAreConfigDefaults(t *testing.T) {
	d := regionsim.DefaultConfig()
	fs := flagdoc.NewSet(flagTable(&options{cfg: regionsim.DefaultConfig()})).FlagSet()
	for _, c := range []struct {
		flag string
		want any
	}{
		{"seed", d.Seed}, {"duration", d.Duration}, {"survival", d.Survival}, {"regions", d.Regions},
		{"nodes-per-region", d.NodesPerRegion}, {"shards-per-region", d.ShardsPerRegion},
		{"latency-min", d.LatencyMin}, {"latency-max", d.LatencyMax}, {"jitter", d.Jitter}, {"loss", d.Loss},
		{"workers", d.WorkersPerRegion}, {"rate", d.RatePerRegion}, {"lease", d.Lease}, {"drain", d.DrainTimeout},
		{"compare", d.Compare}, {"work-dir", d.WorkDir}, {"latency-cycles", d.LatencyCycles}, {"latency-budget", d.LatencyBudget},
	} {
		if got := fs.Lookup(c.flag).DefValue; got != fmt.Sprint(c.want) {
			t.Errorf("--%s: default %q, Config default %v", c.flag, got, c.want)
		}
	}
}
