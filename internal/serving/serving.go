// Package serving is the graceful stop that idemnode and idemrouter share:
// serve a set of listeners until the process is told to stop (or one of them
// fails), then stop taking requests and let the in-flight ones finish within
// a deadline, cutting off what is left.
//
//	servers := []serving.Server{serving.HTTP("http", httpLn, h, log), serving.GRPC("grpc", grpcLn, gs)}
//	err := serving.Serve(ctx, log, servers)      // until ctx ends or a server fails
//	drainCtx, cancel := context.WithTimeout(context.Background(), serving.DrainTimeout)
//	err = errors.Join(err, serving.Drain(drainCtx, servers))
package serving

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"

	"github.com/idem-dev/idem/contract"
)

// DrainTimeout bounds a process's drain on SIGTERM (in-flight requests,
// and for a node the leadership hand-over and closing its Raft groups),
// inside the contract's 15 s.
const DrainTimeout = 12 * time.Second

// ReadHeaderTimeout bounds how long an HTTP client may take to send its
// request headers (slowloris).
const ReadHeaderTimeout = 10 * time.Second

// Server is one listener and the server answering on it.
type Server interface {
	// Serve answers on the listener until Drain or Close; it returns nil
	// when stopped that way.
	Serve() error
	// Drain stops taking requests and waits for the in-flight ones; when
	// ctx ends first it cuts them off and says so.
	Drain(ctx context.Context) error
	// Close releases the listener of a server that never served.
	Close()
}

// Defaults of HTTPTimeouts.
const (
	// DefaultReadTimeout bounds reading a whole request, body included: a
	// client that trickles its body is cut off (the API's largest body, a
	// stored response of 1 MiB in base64, takes far less on any link).
	DefaultReadTimeout = 30 * time.Second
	// DefaultWriteTimeout bounds a request from the end of its headers to
	// the end of its answer: above the contract's longest wait (wait_ms
	// 30 s) plus a forwarded request's deadline.
	DefaultWriteTimeout = 60 * time.Second
	// DefaultIdleTimeout closes keep-alive connections idle that long.
	DefaultIdleTimeout = 120 * time.Second
)

// HTTPTimeouts bound how long one connection may hold an HTTP server
// (net/http's fields of the same names); zero takes the default above.
type HTTPTimeouts struct {
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// ConnState, if set, is the server's http.Server.ConnState hook.
	ConnState func(net.Conn, http.ConnState)
}

func (t HTTPTimeouts) withDefaults() HTTPTimeouts {
	if t.ReadTimeout == 0 {
		t.ReadTimeout = DefaultReadTimeout
	}
	if t.WriteTimeout == 0 {
		t.WriteTimeout = DefaultWriteTimeout
	}
	if t.IdleTimeout == 0 {
		t.IdleTimeout = DefaultIdleTimeout
	}
	return t
}

// HTTP returns a Server for handler h on ln, named name in errors ("http",
// "proxy"), logging the server's own complaints to log at warn level, with
// the default timeouts.
func HTTP(name string, ln net.Listener, h http.Handler, log *slog.Logger) Server {
	return HTTPWithTimeouts(name, ln, h, log, HTTPTimeouts{})
}

// HTTPWithTimeouts is HTTP with timeouts t (zero fields: the defaults).
func HTTPWithTimeouts(name string, ln net.Listener, h http.Handler, log *slog.Logger, t HTTPTimeouts) Server {
	t = t.withDefaults()
	return &httpServer{name: name, ln: ln, srv: &http.Server{
		Handler: h, ReadHeaderTimeout: min(ReadHeaderTimeout, t.ReadTimeout), ReadTimeout: t.ReadTimeout,
		WriteTimeout: t.WriteTimeout, IdleTimeout: t.IdleTimeout,
		// net/http's default is 1 MiB of header block per request.
		MaxHeaderBytes: contract.MaxRequestHeaderBytes,
		ConnState:      t.ConnState,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}}
}

type httpServer struct {
	name string
	ln   net.Listener
	srv  *http.Server
}

func (h *httpServer) Serve() error {
	if err := h.srv.Serve(h.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("%s: %w", h.name, err)
	}
	return nil
}

func (h *httpServer) Close() { h.ln.Close() }

func (h *httpServer) Drain(ctx context.Context) error {
	if err := h.srv.Shutdown(ctx); err != nil {
		h.srv.Close()
		return fmt.Errorf("%s: drain: %w", h.name, err)
	}
	return nil
}

// GRPC returns a Server for srv on ln, named name in errors.
func GRPC(name string, ln net.Listener, srv *grpc.Server) Server {
	return &grpcServer{name: name, ln: ln, srv: srv}
}

type grpcServer struct {
	name string
	ln   net.Listener
	srv  *grpc.Server
}

func (g *grpcServer) Serve() error {
	if err := g.srv.Serve(g.ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("%s: %w", g.name, err)
	}
	return nil
}

func (g *grpcServer) Close() { g.ln.Close() }

func (g *grpcServer) Drain(ctx context.Context) error {
	stopped := make(chan struct{})
	go func() { g.srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
		return nil
	case <-ctx.Done():
		g.srv.Stop()
		<-stopped
		return fmt.Errorf("%s: drain: in-flight requests did not finish in time; cut off", g.name)
	}
}

// Serve runs every server until ctx ends (nil) or one of them fails (its
// error, logged). It does not stop the others: call Drain next, either way.
func Serve(ctx context.Context, log *slog.Logger, servers []Server) error {
	errc := make(chan error, len(servers))
	for _, s := range servers {
		go func() {
			if err := s.Serve(); err != nil {
				errc <- err
			}
		}()
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		log.Error("server failed", "error", err)
		return err
	}
}

// Drain drains every server at once within ctx and joins their errors.
func Drain(ctx context.Context, servers []Server) error {
	errs := make(chan error, len(servers))
	for _, s := range servers {
		go func() { errs <- s.Drain(ctx) }()
	}
	var all []error
	for range servers {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// Close releases the listeners of servers that never served.
func Close(servers []Server) {
	for _, s := range servers {
		s.Close()
	}
}
