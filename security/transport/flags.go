package transport

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem/internal/flagdoc"
	"github.com/idem-dev/idem/internal/serving"
)

// Flags are the trust-boundary flags idemnode and idemrouter share; the
// mains put them in their flag tables with FlagTable and turn them into a
// Kit with Kit.
type Flags struct {
	CertsDir string
	AuthFile string
	Insecure bool
	MaxConns int
	HTTP     serving.HTTPTimeouts
}

// DefaultFlags returns Flags holding the defaults: no certificates, no
// auth file, DefaultMaxConns and the serving package's HTTP timeouts.
func DefaultFlags() Flags {
	return Flags{MaxConns: DefaultMaxConns, HTTP: serving.HTTPTimeouts{
		ReadTimeout:  serving.DefaultReadTimeout,
		WriteTimeout: serving.DefaultWriteTimeout,
		IdleTimeout:  serving.DefaultIdleTimeout,
	}}
}

// FlagTable returns the entries of --certs-dir, --auth-file, --insecure,
// --max-conns and the --http-*-timeout flags for a command's flag table,
// in section; what f holds is their default (start from DefaultFlags).
func (f *Flags) FlagTable(section string) []flagdoc.Flag {
	return []flagdoc.Flag{
		{Name: "certs-dir", Value: &f.CertsDir, Section: section, Usage: "secure mode: `DIR` with ca.crt, node.crt and node.key (idemctl cert create-ca / create-node): TLS on every listener, mTLS with node certificates between processes and on the Raft port"},
		{Name: "auth-file", Value: &f.AuthFile, Section: section, Usage: "principals, namespaces, roles and rates (`FILE`, YAML or JSON); without it every caller is root. Reloaded on SIGHUP (with the certificates)"},
		{Name: "insecure", Value: &f.Insecure, Section: section, Usage: "allow listening beyond loopback without --certs-dir: plaintext and unauthenticated; for trusted networks only"},
		{Name: "max-conns", Value: &f.MaxConns, Section: section, Usage: "cap on the connections open at once per listener (JSON, gRPC, proxy); past it new ones wait. A JSON or gRPC connection idle 10 s without having authenticated a request is closed"},
		{Name: "http-read-timeout", Value: &f.HTTP.ReadTimeout, Section: section, Usage: "HTTP listeners: longest time `D` to read one request, body included; a slower client is cut off"},
		{Name: "http-write-timeout", Value: &f.HTTP.WriteTimeout, Section: section, Usage: "HTTP listeners: longest time `D` from a request's headers to the end of its answer (the proxy adds --upstream-timeout)"},
		{Name: "http-idle-timeout", Value: &f.HTTP.IdleTimeout, Section: section, Usage: "HTTP listeners: keep-alive connections idle for `D` are closed"},
	}
}

// Check applies the secure-by-default rule to the process's listen
// addresses (flag name -> HOST:PORT), see CheckExposure, and checks the
// limits.
func (f *Flags) Check(addrs map[string]string) error {
	var errs []error
	if f.MaxConns <= 0 {
		errs = append(errs, fmt.Errorf("--max-conns must be positive, got %d", f.MaxConns))
	}
	if f.HTTP.ReadTimeout <= 0 || f.HTTP.WriteTimeout <= 0 || f.HTTP.IdleTimeout <= 0 {
		errs = append(errs, errors.New("--http-read-timeout, --http-write-timeout and --http-idle-timeout must be positive"))
	}
	return errors.Join(append(errs, CheckExposure(addrs, f.CertsDir, f.Insecure))...)
}

// Kit builds the process's Kit from the flags; nodeID is the node id
// node.crt must carry ("" for routers).
func (f *Flags) Kit(nodeID string, log *slog.Logger, reg *prometheus.Registry) (*Kit, error) {
	return New(Config{CertsDir: f.CertsDir, AuthFile: f.AuthFile, NodeID: nodeID,
		Limits: Limits{MaxConns: f.MaxConns, HTTP: f.HTTP}, Logger: log, Registry: reg})
}

// RouterKit is Kit for a router: router.crt when the certs dir holds one,
// else a node certificate (v1.1) with a warning.
func (f *Flags) RouterKit(log *slog.Logger, reg *prometheus.Registry) (*Kit, error) {
	return New(Config{CertsDir: f.CertsDir, AuthFile: f.AuthFile, Router: true,
		Limits: Limits{MaxConns: f.MaxConns, HTTP: f.HTTP}, Logger: log, Registry: reg})
}
