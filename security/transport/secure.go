package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"

	"github.com/idem-dev/idem/internal/serving"
	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/security/auth"
	"github.com/idem-dev/idem/security/pki"
)

// Defaults of the Limits fields.
const (
	DefaultMaxConns             = 4096
	DefaultMaxConcurrentStreams = 1024
	// DefaultKeepaliveMinTime is the shortest keepalive ping interval a gRPC
	// client may use; faster pingers are disconnected (GOAWAY).
	DefaultKeepaliveMinTime = 10 * time.Second
)

// Limits bound what one caller can hold open at a listener.
type Limits struct {
	// MaxConns caps the connections open at once per listener (HTTP, gRPC,
	// proxy); past it, accepting waits until one closes. 0 means
	// DefaultMaxConns, negative means no cap.
	MaxConns int
	// MaxConcurrentStreams caps the concurrent RPCs of one gRPC connection;
	// 0 means DefaultMaxConcurrentStreams.
	MaxConcurrentStreams uint32
	// HTTP are the HTTP servers' read, write and idle timeouts (zero fields:
	// internal/serving's defaults).
	HTTP serving.HTTPTimeouts
	// UnauthenticatedIdle is how long a connection to the JSON API or gRPC
	// listener may stay idle without having authenticated a request before
	// it is closed; 0 means DefaultUnauthenticatedIdle.
	UnauthenticatedIdle time.Duration
}

// Config configures a Kit.
type Config struct {
	// CertsDir holds ca.crt, node.crt and node.key (idemctl cert); empty
	// means insecure (plaintext).
	CertsDir string
	// AuthFile is the --auth-file; empty means every caller is root.
	AuthFile string
	// NodeID, when set, must be the node id of node.crt (a node refuses
	// another node's certs dir). Routers leave it empty.
	NodeID string
	// Router: the process is a router; it presents router.crt when the
	// certs dir holds one, else node.crt with a warning at start.
	Router bool
	// Limits at the listeners.
	Limits Limits
	// Logger; nil discards.
	Logger *slog.Logger
	// Registry receives the idem_auth_* metrics; nil registers none.
	Registry *prometheus.Registry
}

// Kit is one process's certificates, authorizer and limits.
type Kit struct {
	cfg   Config
	log   *slog.Logger
	certs *pki.Reloader // nil: insecure
	auth  *auth.Authorizer
	gate  *connGate // the JSON API's and gRPC listeners'
}

// New loads the certs dir (when set) and the auth file; a missing or bad
// file is an error here, at start.
func New(cfg Config) (*Kit, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Limits.MaxConns == 0 {
		cfg.Limits.MaxConns = DefaultMaxConns
	}
	if cfg.Limits.MaxConcurrentStreams == 0 {
		cfg.Limits.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if cfg.Limits.UnauthenticatedIdle == 0 {
		cfg.Limits.UnauthenticatedIdle = DefaultUnauthenticatedIdle
	}
	closed := prometheus.NewCounter(prometheus.CounterOpts{Name: "idem_unauthenticated_connections_closed_total",
		Help: "Connections to the JSON API or gRPC listener closed because they stayed idle without authenticating a request (10 s)."})
	if cfg.Registry != nil {
		if err := cfg.Registry.Register(closed); err != nil {
			return nil, fmt.Errorf("transport: register metrics: %w", err)
		}
	}
	k := &Kit{cfg: cfg, log: cfg.Logger, gate: newConnGate(cfg.Limits.UnauthenticatedIdle, closed)}
	if cfg.CertsDir != "" {
		r, err := pki.NewReloader(pki.ReloaderConfig{Dir: cfg.CertsDir, NodeID: cfg.NodeID, Router: cfg.Router, Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("--certs-dir %s: %w", cfg.CertsDir, err)
		}
		if cfg.Router && r.Kind() == pki.KindNode {
			cfg.Logger.Warn("this router presents a node certificate ("+pki.NodeCertFile+"), which also opens the Raft port of the nodes' shards; "+
				"give it a router certificate (idemctl cert create-router) and remove node.crt and node.key from its certs dir",
				"certs_dir", cfg.CertsDir, "node", r.NodeID())
		}
		k.certs = r
	}
	a, err := auth.New(auth.Config{File: cfg.AuthFile, Logger: cfg.Logger, Registry: cfg.Registry,
		RequireCertificate: cfg.CertsDir != "" && cfg.AuthFile == ""})
	if err != nil {
		return nil, fmt.Errorf("--auth-file %s: %w", cfg.AuthFile, err)
	}
	k.auth = a
	return k, nil
}

// Insecure is the Kit of a process without --certs-dir and --auth-file
// (dev mode, tests): plaintext, every caller root, default limits.
func Insecure() *Kit {
	k, err := New(Config{})
	if err != nil {
		panic("transport: insecure kit: " + err.Error()) // no file is read
	}
	return k
}

// Secure reports whether the Kit has certificates (TLS everywhere).
func (k *Kit) Secure() bool { return k.certs != nil }

// Authorizer is the process's authorizer.
func (k *Kit) Authorizer() *auth.Authorizer { return k.auth }

// Certs is the certificate reloader; nil when insecure.
func (k *Kit) Certs() *pki.Reloader { return k.certs }

// RaftTLS is raftstore's Config.TLS: mutual TLS with node certificates
// only; nil when insecure.
func (k *Kit) RaftTLS() *raftstore.TLSConfig {
	if k.certs == nil {
		return nil
	}
	return &raftstore.TLSConfig{
		Server: k.certs.NodeServerTLS(),
		Client: func(host string) *tls.Config { return k.certs.NodeClientTLS(host) },
	}
}

// DialOptions are the dial options to add (after forward.DefaultDialOptions)
// for gRPC connections to nodes: with certificates, mTLS with node.crt that
// accepts only a node certificate of the CA valid for the dialed host; in
// every mode, the principal of the context is forwarded.
func (k *Kit) DialOptions() []grpc.DialOption {
	opts := []grpc.DialOption{grpc.WithChainUnaryInterceptor(auth.ForwardUnaryClientInterceptor())}
	if k.certs != nil {
		opts = append(opts, grpc.WithTransportCredentials(&nodeCreds{certs: k.certs}))
	}
	return opts
}

// listen binds addr with the connection cap.
func (k *Kit) listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if k.cfg.Limits.MaxConns > 0 {
		ln = netutil.LimitListener(ln, k.cfg.Limits.MaxConns)
	}
	return ln, nil
}

// ListenHTTP binds an HTTP listener whose callers are not idem principals
// (the proxy's): capped, and TLS when the Kit has certificates.
func (k *Kit) ListenHTTP(addr string) (net.Listener, error) {
	ln, err := k.listen(addr)
	if err != nil || k.certs == nil {
		return ln, err
	}
	return tls.NewListener(ln, k.certs.PublicServerTLS()), nil
}

// ListenAPI binds the JSON API's listener: ListenHTTP, and a connection that
// stays idle without authenticating a request is closed after
// Limits.UnauthenticatedIdle. Serve it with HTTPHandler and HTTPTimeouts.
func (k *Kit) ListenAPI(addr string) (net.Listener, error) {
	ln, err := k.listen(addr)
	if err != nil {
		return nil, err
	}
	ln = k.gate.listener(ln)
	if k.certs == nil {
		return ln, nil
	}
	return tls.NewListener(ln, k.certs.PublicServerTLS()), nil
}

// HTTPTimeouts are the timeouts of the process's HTTP servers, with the
// connection hook ListenAPI's listener needs.
func (k *Kit) HTTPTimeouts() serving.HTTPTimeouts {
	t := k.cfg.Limits.HTTP
	t.ConnState = k.gate.connState
	return t
}

// ListenGRPC binds a gRPC listener: capped, closing a connection that stays
// idle without authenticating an RPC after Limits.UnauthenticatedIdle; its
// TLS is in GRPCServerOptions (gRPC must do the handshake to see the peer).
func (k *Kit) ListenGRPC(addr string) (net.Listener, error) {
	ln, err := k.listen(addr)
	if err != nil {
		return nil, err
	}
	return k.gate.listener(ln), nil
}

// HTTPHandler puts the Authorizer in front of the JSON API h (probes and
// /metrics pass without credentials); a request it admits with a principal
// marks its connection authenticated.
func (k *Kit) HTTPHandler(h http.Handler) http.Handler {
	marked := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := auth.PrincipalFrom(r.Context()); ok {
			k.gate.markAddr(r.RemoteAddr)
		}
		h.ServeHTTP(w, r)
	})
	return k.auth.Middleware(marked, auth.JSONAPITarget, nil)
}

// markUnary and markStream mark the connection of an RPC the Authorizer
// admitted (they run after its interceptors) as authenticated.
func (k *Kit) markUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	k.markPeer(ctx)
	return handler(ctx, req)
}

func (k *Kit) markStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	k.markPeer(ss.Context())
	return handler(srv, ss)
}

func (k *Kit) markPeer(ctx context.Context) {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		k.gate.markAddr(p.Addr.String())
	}
}

// GRPCServerOptions are the options of a gRPC server of the Idempotency and
// Admin services: TLS when secure, the Authorizer's interceptors, the stream
// cap and the keepalive enforcement policy.
func (k *Kit) GRPCServerOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(k.auth.UnaryServerInterceptor(nil), k.markUnary),
		grpc.ChainStreamInterceptor(k.auth.StreamServerInterceptor(nil), k.markStream),
		// A client must finish its TLS handshake (or, in plaintext, send
		// HTTP/2's preface) within this.
		grpc.ConnectionTimeout(DefaultUnauthenticatedIdle),
		grpc.MaxConcurrentStreams(k.cfg.Limits.MaxConcurrentStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: DefaultKeepaliveMinTime, PermitWithoutStream: true}),
		// Idle connections are closed so that a client cannot hold its
		// share of MaxConns forever without sending anything.
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 5 * time.Minute}),
	}
	if k.certs != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(k.certs.PublicServerTLS("h2"))))
	}
	return opts
}

// Reload re-reads the certificate files and the auth file; each that fails
// to load keeps the one in force (both are logged by their packages).
func (k *Kit) Reload() error {
	var errs []error
	if k.certs != nil {
		if err := k.certs.Reload(); err != nil {
			errs = append(errs, fmt.Errorf("certificates: %w", err))
		}
	}
	if err := k.auth.Reload(); err != nil {
		errs = append(errs, fmt.Errorf("auth file: %w", err))
	}
	return errors.Join(errs...)
}

// ReloadOnSIGHUP calls Reload on every SIGHUP until ctx ends, logging the
// outcome. It subscribes before it returns (so a SIGHUP right after start
// does not kill the process) and serves in its own goroutine.
func (k *Kit) ReloadOnSIGHUP(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if err := k.Reload(); err != nil {
					k.log.Error("reload on SIGHUP kept the previous files", "error", err)
				} else {
					k.log.Info("reloaded certificates and auth file on SIGHUP")
				}
			}
		}
	}()
}
