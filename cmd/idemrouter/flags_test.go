package main

import (
	"fmt"
	"io"
	"testing"

	"github.com/idem-dev/idem/proxy"
	"github.com/idem-dev/idem/router"
	"github.com/idem-dev/idem/security/transport"
	"github.com/idem-dev/idem/server"
)

// TestFlagDefaultsAreConfigDefaults: the default --help prints for each
// flag that sets a Config field is that Config's default.
func TestFlagDefaultsAreConfigDefaults(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	b, p, sec := router.DefaultBackendConfig(), proxy.DefaultConfig(), transport.DefaultFlags()
	fs := o.flags.FlagSet()
	for _, c := range []struct {
		flag string
		want any
	}{
		{"request-timeout", b.RequestTimeout},
		{"max-response-bytes", server.DefaultMaxResponseBytes},
		{"max-request-bytes", p.MaxRequestBytes},
		{"upstream-timeout", p.UpstreamTimeout},
		{"max-wait", p.MaxWait},
		{"require-key", p.RequireKey},
		{"namespace-header", p.NamespaceHeader},
		{"max-conns", sec.MaxConns},
		{"http-read-timeout", sec.HTTP.ReadTimeout},
		{"http-write-timeout", sec.HTTP.WriteTimeout},
		{"http-idle-timeout", sec.HTTP.IdleTimeout},
	} {
		f := fs.Lookup(c.flag)
		if f == nil {
			t.Errorf("--%s: no such flag", c.flag)
			continue
		}
		if f.DefValue != fmt.Sprint(c.want) || f.Value.String() != fmt.Sprint(c.want) {
			t.Errorf("--%s: default %q (value %q), Config default %v", c.flag, f.DefValue, f.Value.String(), c.want)
		}
	}
}
