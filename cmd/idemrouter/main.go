package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/attribute"

	"github.com/idem-dev/idem/internal/cli"
	"github.com/idem-dev/idem/internal/flagdoc"
	"github.com/idem-dev/idem/proxy"
	"github.com/idem-dev/idem/router"
	"github.com/idem-dev/idem/security/transport"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/topology"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "v0.1.0-dev"

func main() {
	cli.ReadSysmon() // GODEBUG's schedtrace: an operator's opt-in, logged at start
	cli.Main("idemrouter", run)
}

type options struct {
	config         string
	region         string
	httpAddr       string
	grpcAddr       string
	requestTimeout time.Duration
	maxResponse    int64
	logLevel       string
	logFormat      string
	showVersion    bool
	gcHeadroom     uint64

	// Proxy mode.
	upstream        string
	proxyAddr       string
	requireKey      bool
	namespaceHeader string
	maxRequestBytes int64
	upstreamTimeout time.Duration
	proxyKeyFile    string
	proxyKeyRandom  bool // no key file: a random key for this process
	maxWait         time.Duration

	sec transport.Flags
	// trace is the tracing flags (cli.TraceOptions).
	trace cli.TraceOptions
	// flags is the parsed flag table.
	flags *flagdoc.Set
}

// Listen addresses by default.
const (
	defaultHTTPAddr  = "127.0.0.1:8090"
	defaultGRPCAddr  = "127.0.0.1:7090"
	defaultProxyAddr = "127.0.0.1:8088"
)

// defaultGCHeadroom is the least room between collections
// (--gc-headroom-bytes; internal/gctune) unless the environment sets GOGC.
const defaultGCHeadroom = 64 << 20

const usageHeader = `idemrouter: the stateless edge router of idem, the multi-region idempotency-key store.

Usage:
  idemrouter --config FILE --region NAME [flags]

It serves the same JSON API (with /healthz, /readyz and /metrics) on
--http-addr and gRPC API on --grpc-addr as a storage node, and forwards each
request to the leader of its key's shard, found from the topology FILE alone.
A key whose shard cannot be reached within --request-timeout (its home region
lost, no leader) gets 503 UNAVAILABLE with Retry-After; the router stays
ready while any node answers. On SIGTERM it drains and exits 0.

Proxy mode (--upstream URL): requests to --proxy-addr go to the upstream.
A POST or PATCH with an Idempotency-Key header is reserved in the store
first, runs upstream once, and its response is stored and replayed to
retries (Idempotent-Replayed: true); a retry while it runs gets 409, the
same key with another request 422 (problem+json); a retry with "Prefer:
wait=N" waits up to N seconds (at most --max-wait) for the running one and
replays its response. Other requests pass through untouched.

` + cli.SysmonUsage + "\n"

func parseFlags(args []string, stdout io.Writer) (*options, error) {
	// The flags' defaults are the Configs': the backend's, the proxy's and
	// the security flags'.
	b, p := router.DefaultBackendConfig(), proxy.DefaultConfig()
	o := &options{
		httpAddr: defaultHTTPAddr, grpcAddr: defaultGRPCAddr, proxyAddr: defaultProxyAddr,
		requestTimeout: b.RequestTimeout, maxResponse: server.DefaultMaxResponseBytes,
		logLevel: "info", logFormat: "text", gcHeadroom: defaultGCHeadroom,
		maxRequestBytes: p.MaxRequestBytes, upstreamTimeout: p.UpstreamTimeout, maxWait: p.MaxWait,
		sec: transport.DefaultFlags(), trace: cli.DefaultTraceOptions(),
	}
	o.flags = flagdoc.NewSet(flagTable(o))
	if err := o.flags.Parse(args, stdout, usageHeader); err != nil {
		return nil, err
	}
	return o, nil
}

// backendConfig turns flags into a router.BackendConfig, reporting every
// problem at once on one line.
func backendConfig(o *options) (router.BackendConfig, error) {
	var errs []error
	cfg := router.DefaultBackendConfig()
	cfg.Region = o.region
	cfg.RequestTimeout = o.requestTimeout
	if o.requestTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--request-timeout must be positive, got %s", o.requestTimeout))
	}
	if o.maxResponse <= 0 || o.maxResponse > server.MaxMaxResponseBytes {
		errs = append(errs, fmt.Errorf("--max-response-bytes must be 1..%d, got %d", server.MaxMaxResponseBytes, o.maxResponse))
	} else {
		cfg.MaxMessageBytes = server.Config{MaxResponseBytes: o.maxResponse}.GRPCMaxMessageBytes()
	}
	if o.config == "" {
		errs = append(errs, errors.New("--config FILE is required (see --help)"))
	}
	if o.region == "" {
		errs = append(errs, errors.New("--region NAME is required (see --help)"))
	}
	for _, a := range []struct{ flag, addr string }{{"--http-addr", o.httpAddr}, {"--grpc-addr", o.grpcAddr}} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q is not HOST:PORT", a.flag, a.addr))
		}
	}
	if o.config != "" {
		t, err := topology.LoadFile(o.config)
		if err != nil {
			errs = append(errs, err)
		} else {
			cfg.Topology = t
			if _, ok := t.RegionByName(o.region); o.region != "" && !ok {
				var names []string
				for _, r := range t.Regions {
					names = append(names, r.Name)
				}
				errs = append(errs, fmt.Errorf("--region %q is not a region of %s (regions: %v)", o.region, o.config, names))
			}
		}
	}
	addrs := map[string]string{"--http-addr": o.httpAddr, "--grpc-addr": o.grpcAddr}
	if o.upstream != "" {
		addrs["--proxy-addr"] = o.proxyAddr
	}
	if err := o.sec.Check(addrs); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return cfg, cli.OneLine(errs...)
	}
	return cfg, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if o.showVersion {
		fmt.Fprintln(stdout, "idemrouter", version)
		return nil
	}
	logger, err := cli.NewLogger(stderr, o.logLevel, o.logFormat)
	if err != nil {
		return err
	}
	o.flags.Warn(logger)
	tp, stopTracing, err := cli.StartTracing(ctx, o.trace, "idemrouter", version, logger, attribute.String("idem.region", o.region))
	if err != nil {
		return err
	}
	defer stopTracing()
	logger = cli.TraceLogger(logger, tp)
	cfg, err := processConfig(o)
	if err != nil {
		return err
	}
	// Go's GOGC=100 for a large live heap; a router's is a few MiB.
	defer cli.PaceGC(logger, 100, o.gcHeadroom)()
	cli.LogSysmon(logger)
	cfg.Logger = logger.With("region", o.region)
	cfg.TracerProvider, cfg.TraceKeys = tp, o.trace.Keys
	cfg.Registry = prometheus.NewRegistry()
	cfg.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if o.proxyKeyRandom {
		cfg.Logger.Warn("proxy: no --proxy-key-file (nor proxy.key in --certs-dir): callers named by their Authorization header get namespaces that change with every restart and differ between routers, so their replays do not survive either")
	}
	if cfg.Security, err = o.sec.RouterKit(cfg.Logger, cfg.Registry); err != nil {
		return err
	}
	cfg.Security.ReloadOnSIGHUP(ctx)
	p, err := router.NewProcess(cfg)
	if err != nil {
		return cli.OneLine(err)
	}
	return processError(p.Run(ctx))
}

// processConfig turns flags into a router.ProcessConfig, reporting every
// problem at once on one line.
func processConfig(o *options) (router.ProcessConfig, error) {
	bcfg, err := backendConfig(o)
	cfg := router.ProcessConfig{
		Backend: bcfg, HTTPAddr: o.httpAddr, GRPCAddr: o.grpcAddr, MaxResponseBytes: o.maxResponse, Version: version,
	}
	// Proxy mode: the proxy runs over the same in-process backend, and is
	// served and drained with the API.
	var proxyErrs []error
	if o.upstream != "" {
		pcfg := proxy.DefaultConfig()
		pcfg.Upstream, pcfg.RequireKey = o.upstream, o.requireKey
		pcfg.NamespaceHeader, pcfg.MaxRequestBytes = o.namespaceHeader, o.maxRequestBytes
		pcfg.UpstreamTimeout = o.upstreamTimeout
		switch {
		case o.maxWait < 0 || o.maxWait > proxy.DefaultMaxWait:
			err = errors.Join(err, fmt.Errorf("--max-wait must be 0..%s, got %s", proxy.DefaultMaxWait, o.maxWait))
		case o.maxWait == 0:
			pcfg.MaxWait = -1 // Prefer: wait ignored
		default:
			pcfg.MaxWait = o.maxWait
		}
		pcfg.MaxStoredBodyBytes = o.maxResponse
		pcfg.StoreTimeout = o.requestTimeout
		key, kerr := proxyKey(o)
		if kerr != nil {
			err = errors.Join(err, kerr)
		}
		pcfg.AuthorizationKey = key
		cfg.Proxy, cfg.ProxyAddr = &pcfg, o.proxyAddr
		if _, _, err := net.SplitHostPort(o.proxyAddr); err != nil {
			proxyErrs = append(proxyErrs, fmt.Errorf("--proxy-addr %q is not HOST:PORT", o.proxyAddr))
		}
	} else if o.requireKey || o.namespaceHeader != "" {
		proxyErrs = append(proxyErrs, errors.New("--require-key and --namespace-header are proxy-mode flags: they need --upstream URL"))
	}
	if len(proxyErrs) > 0 {
		return cfg, cli.OneLine(append([]error{err}, proxyErrs...)...)
	}
	return cfg, err
}

// proxyKeyFileName is the proxy's Authorization-hash key in a certs dir.
const proxyKeyFileName = "proxy.key"

// proxyKey reads the key of the proxy's Authorization hash: --proxy-key-file,
// else proxy.key in --certs-dir when present, else a random one (logged at
// start by the proxy as per-process).
func proxyKey(o *options) ([]byte, error) {
	path := o.proxyKeyFile
	if path == "" && o.sec.CertsDir != "" {
		if _, err := os.Stat(filepath.Join(o.sec.CertsDir, proxyKeyFileName)); err == nil {
			path = filepath.Join(o.sec.CertsDir, proxyKeyFileName)
		}
	}
	if path == "" {
		o.proxyKeyRandom = true
		key := make([]byte, 32)
		_, err := rand.Read(key)
		return key, err
	}
	key, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--proxy-key-file: %w", err)
	}
	if len(key) < 32 {
		return nil, fmt.Errorf("--proxy-key-file %s: %d bytes, need at least 32 (head -c 32 /dev/urandom > %s)", path, len(key), path)
	}
	return key, nil
}

// processError puts the process's error on one line, naming the flag of a
// listener that could not be bound.
func processError(err error) error {
	if le, ok := errors.AsType[*router.ListenError](err); ok {
		return fmt.Errorf("--%s-addr: %w", le.Listener, le.Err)
	}
	return cli.OneLine(err)
}
