package main

import (
	"github.com/idem-dev/idem/internal/flagdoc"
)

// flagOptions are what idembench's flags set: a run's configuration, which
// holds defaultBenchConfig() when the table is built, and the flags that
// become part of it after parsing.
type flagOptions struct {
	cfg                   benchConfig
	addrs, certsDir, user string
}

// Sections of idembench's --help, in order.
const (
	secLoad     = "Load"
	secSecurity = "Security"
	secOutput   = "Output"
)

// flagTable is idembench's flags.
func flagTable(o *flagOptions) flagdoc.Table {
	c := &o.cfg
	return flagdoc.Table{
		Command:  "idembench",
		Sections: []string{secLoad, secSecurity, secOutput},
		Flags: []flagdoc.Flag{
			{Name: "target", Value: &c.Target, Section: secLoad, Usage: "API to load: `json` (HTTP) or grpc"},
			{Name: "addr", Value: &o.addrs, Section: secLoad, Usage: "comma-separated `HOST:PORT` list of nodes or routers; requests rotate over them (default " + defaultJSONAddr + " for json, " + defaultGRPCAddr + " for grpc)"},
			{Name: "namespace", Value: &c.Namespace, Section: secLoad, Usage: "`NAMESPACE` the keys are made in"},
			{Name: "concurrency", Value: &c.Concurrency, Section: secLoad, Usage: "number of workers, each with one cycle in flight"},
			{Name: "duration", Value: &c.Duration, Section: secLoad, Usage: "how long to measure; with --cycles and no --duration, no time limit"},
			{Name: "cycles", Value: &c.Cycles, Section: secLoad, Usage: "stop after `N` measured cycles in all (0: run for --duration)"},
			{Name: "body-bytes", Value: &c.BodyBytes, Section: secLoad, Usage: "size of the response body each complete stores"},
			{Name: "warmup", Value: &c.Warmup, Section: secLoad, Usage: "run this long before measuring; warmup cycles are not counted"},
			{Name: "lease", Value: &c.Lease, Section: secLoad, Usage: "lease of each reserve (0: the store's default)"},
			{Name: "request-timeout", Value: &c.RequestTimeout, Section: secLoad, Usage: "deadline of one request"},
			{Name: "max-attempts", Value: &c.MaxAttempts, Section: secLoad, Usage: "grpc only: attempts per request, with the client's backoff (1: no retries, every failure counts)"},

			{Name: "certs-dir", Value: &o.certsDir, Section: secSecurity, Usage: "secure cluster: `DIR` with ca.crt and client.NAME.crt/.key of --user (TLS on every request)"},
			{Name: "user", Value: &o.user, Section: secSecurity, Usage: "secure cluster: the principal `NAME` whose client certificate to present"},

			{Name: "json", Value: &c.JSON, Section: secOutput, Usage: "print the figures as one JSON object instead of text"},
		},
	}
}
