package main

import (
	"fmt"
	"testing"
)

// TestFlagDefaults: the defaults --help prints are those of
// defaultGlobals and defaultCmdOptions, the values a run starts from.
func TestFlagDefaults(t *testing.T) {
	g, o := defaultGlobals(), defaultCmdOptions()
	fs := commandFlags(findCommand("keys"), &g, &o)
	want, wantOpts := defaultGlobals(), defaultCmdOptions()
	for _, c := range []struct {
		flag string
		want any
	}{
		{"timeout", want.timeout}, {"user", want.user}, {"json", want.json},
		{"limit", wantOpts.keys.limit}, {"older-than", wantOpts.keys.olderThan},
	} {
		f := fs.Lookup(c.flag)
		if f == nil {
			t.Errorf("idemctl keys: no flag --%s", c.flag)
			continue
		}
		if f.DefValue != fmt.Sprint(c.want) {
			t.Errorf("idemctl keys --%s: default %q, want %v", c.flag, f.DefValue, c.want)
		}
	}
	if wantOpts.keys.limit != 100 || want.timeout.String() != "5s" {
		t.Errorf("defaults changed: --limit %d, --timeout %s", wantOpts.keys.limit, want.timeout)
	}
}
