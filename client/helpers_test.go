package client_test

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemtest"
)

const ns = "test"

func startServer(t *testing.T, cfg idemtest.Config) *idemtest.Server {
	t.Helper()
	srv, err := idemtest.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// newClient returns a client with fast retries that logs to the test.
func newClient(t *testing.T, endpoints []string, adjust ...func(*client.Config)) *client.Client {
	t.Helper()
	cfg := client.DefaultConfig(endpoints...)
	cfg.BaseBackoff = time.Millisecond
	cfg.MaxBackoff = 5 * time.Millisecond
	cfg.RequestTimeout = 5 * time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	for _, f := range adjust {
		f(&cfg)
	}
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// deadAddr returns a loopback address nobody listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	return addr
}
