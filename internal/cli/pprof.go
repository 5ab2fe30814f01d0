package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// CheckLoopback reports an error unless addr is HOST:PORT with a loopback
// host (127.0.0.0/8, ::1 or localhost): the profiling endpoints expose
// memory contents and cost CPU, so they are never served to the network.
func CheckLoopback(flagName, addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q is not HOST:PORT: %v", flagName, addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s %q: only a loopback address (127.0.0.1, ::1, localhost) is allowed", flagName, addr)
	}
	return nil
}

// ServePprof serves net/http/pprof's handlers (/debug/pprof/...) on addr
// until ctx ends. It returns the bound address once the listener is up, so
// a bad address fails at startup; serving errors are logged.
func ServePprof(ctx context.Context, addr string, logger *slog.Logger) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// A CPU profile or trace runs for its ?seconds=; no write timeout.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("pprof server failed", "addr", addr, "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	logger.Info("serving pprof", "addr", ln.Addr().String())
	return ln.Addr(), nil
}
