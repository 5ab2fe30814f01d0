package main

import (
	"fmt"
	"testing"

	"github.com/idem-dev/idem/internal/flagdoc"
)

// TestFlagDefaultsAreConfigDefaults: the default --help prints for each
// flag that sets a benchConfig field is defaultBenchConfig's.
func TestFlagDefaultsAreConfigDefaults(t *testing.T) {
	d := defaultBenchConfig()
	fs := flagdoc.NewSet(flagTable(&flagOptions{cfg: defaultBenchConfig()})).FlagSet()
	for _, c := range []struct {
		flag string
		want any
	}{
		{"target", d.Target}, {"namespace", d.Namespace}, {"concurrency", d.Concurrency}, {"duration", d.Duration},
		{"cycles", d.Cycles}, {"body-bytes", d.BodyBytes}, {"warmup", d.Warmup}, {"lease", d.Lease},
		{"request-timeout", d.RequestTimeout}, {"max-attempts", d.MaxAttempts}, {"json", d.JSON},
	} {
		if got := fs.Lookup(c.flag).DefValue; got != fmt.Sprint(c.want) {
			t.Errorf("--%s: default %q, defaultBenchConfig's %v", c.flag, got, c.want)
		}
	}
}
