package main

import (
	"github.com/idem-dev/idem/internal/flagdoc"
)

// Sections of idemrouter's --help, in order.
const (
	secRouter   = "Router"
	secProxy    = "Proxy mode"
	secSecurity = "Security"
	secProcess  = "Process"
	secTracing  = "Tracing"
)

// flagTable is idemrouter's flags: each sets a field of o, whose value when
// the table is built is the flag's default.
func flagTable(o *options) flagdoc.Table {
	flags := []flagdoc.Flag{
		{Name: "config", Value: &o.config, Section: secRouter, Usage: "cluster topology `FILE` (YAML or JSON), the same file as the nodes'; required"},
		{Name: "region", Value: &o.region, Section: secRouter, Usage: "the region this router runs in, a region `NAME` of the topology; required"},
		{Name: "http-addr", Value: &o.httpAddr, Section: secRouter, Usage: "`HOST:PORT` for the JSON API, /metrics, /healthz, /readyz"},
		{Name: "grpc-addr", Value: &o.grpcAddr, Section: secRouter, Usage: "`HOST:PORT` for the gRPC API"},
		{Name: "request-timeout", Value: &o.requestTimeout, Section: secRouter, Usage: "deadline `D` for one forwarded request, plus a second per MiB of response or checkpoint it carries; past it the answer is 503 UNAVAILABLE"},
		{Name: "max-response-bytes", Value: &o.maxResponse, Section: secRouter, Usage: "largest stored response body in decoded `BYTES`; set it as on the nodes"},

		{Name: "upstream", Value: &o.upstream, Section: secProxy, Usage: "proxy mode: the `URL` of the service to put idem in front of"},
		{Name: "proxy-addr", Value: &o.proxyAddr, Section: secProxy, Usage: "proxy mode: `HOST:PORT` where clients send their API traffic"},
		{Name: "require-key", Value: &o.requireKey, Section: secProxy, Usage: "proxy mode: a POST or PATCH without Idempotency-Key gets 400"},
		{Name: "namespace-header", Value: &o.namespaceHeader, Section: secProxy, Usage: "proxy mode: the request header `NAME` naming the caller (its namespace); when set and missing, 401. Setting it declares that every caller reaches the proxy through a gateway that sets or overwrites this header: the proxy trusts it as sent"},
		{Name: "proxy-key-file", Value: &o.proxyKeyFile, Section: secProxy, Usage: "proxy mode: `FILE` with the secret (at least 32 bytes) keying the hash of Authorization that names callers without a namespace header or client certificate; every router must have the same (default: proxy.key in --certs-dir when present, else a random key per process, so replays do not survive a restart)"},
		{Name: "max-request-bytes", Value: &o.maxRequestBytes, Section: secProxy, Usage: "proxy mode: largest body of a keyed request in `BYTES`; larger gets 413"},
		{Name: "upstream-timeout", Value: &o.upstreamTimeout, Section: secProxy, Usage: "proxy mode: ceiling `D` of one keyed upstream request; past it the caller gets 504 and the key is released"},
		{Name: "max-wait", Value: &o.maxWait, Section: secProxy, Usage: "proxy mode: longest `D` a request with \"Prefer: wait=N\" waits for a running request with its key (then 409); at most the default, 0 ignores Prefer: wait"},

		{Name: "log-level", Value: &o.logLevel, Section: secProcess, Usage: "log `LEVEL`: debug, info, warn or error"},
		{Name: "log-format", Value: &o.logFormat, Section: secProcess, Usage: "log `FORMAT`: text or json"},
		{Name: "gc-headroom-bytes", Value: &o.gcHeadroom, Section: secProcess, Usage: "let the Go heap grow by at least `BYTES` past what the last garbage collection found live before the next (Go collects at GOGC=100, which for a router's few MiB of live heap is over a dozen times a second under load); 0: GOGC=100 alone. GOGC in the environment replaces both"},
		{Name: "version", Value: &o.showVersion, Section: secProcess, Usage: "print the version and exit"},
	}
	flags = append(flags, o.sec.FlagTable(secSecurity)...)
	flags = append(flags, o.trace.FlagTable(secTracing)...)
	return flagdoc.Table{
		Command:  "idemrouter",
		Sections: []string{secRouter, secProxy, secSecurity, secProcess, secTracing},
		Flags:    flags,
	}
}
