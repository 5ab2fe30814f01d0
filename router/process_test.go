package router

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/proxy"
)

func processConfig(t *testing.T, c *fakeCluster) ProcessConfig {
	t.Helper()
	bcfg := DefaultBackendConfig()
	bcfg.Topology, bcfg.Ring, bcfg.Region = c.topo, c.ring, "r1"
	return ProcessConfig{Backend: bcfg, HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		Logger: testutil.Logger(t, slog.LevelDebug), Version: "test"}
}

func TestProcessConfigValidate(t *testing.T) {
	c := newFakeCluster(t, "r1")
	ok := processConfig(t, c)
	for _, tc := range []struct {
		name   string
		adjust func(*ProcessConfig)
		want   []string
	}{
		{"ok", func(*ProcessConfig) {}, nil},
		{"no addresses", func(c *ProcessConfig) { c.HTTPAddr = "" }, []string{"listen address"}},
		{"proxy without address", func(c *ProcessConfig) { p := proxy.DefaultConfig(); c.Proxy = &p }, []string{"proxy listen address"}},
		{"bad backend and negatives", func(c *ProcessConfig) { c.Backend.Region = "mars"; c.MaxResponseBytes = -1 },
			[]string{`region "mars"`, "must not be negative"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.adjust(&cfg)
			_, err := NewProcess(cfg)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestProcessServesAndDrains: the process answers on the addresses it
// bound, and returns nil once ctx ends, with its listeners closed.
func TestProcessServesAndDrains(t *testing.T) {
	c := newFakeCluster(t, "r1")
	p, err := NewProcess(processConfig(t, c))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	url := "http://" + p.HTTPAddr() + "/readyz"
	testutil.Eventually(t, 10*time.Second, "/readyz to answer 200", func() (bool, string) {
		resp, err := http.Get(url)
		if err != nil {
			return false, err.Error()
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status + " " + string(body)
	})
	// The operator console is served on the same port, with its headers.
	resp, err := http.Get("http://" + p.HTTPAddr() + "/ui/keys")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "idemrouter") ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("the router's console: %s %v\n%s", resp.Status, resp.Header, page)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after ctx ended: %v, want nil (clean drain)", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return after ctx ended")
	}
	for _, addr := range []string{p.HTTPAddr(), p.GRPCAddr()} {
		if conn, err := net.Dial("tcp", addr); err == nil {
			conn.Close()
			t.Fatalf("%s still accepts connections after the drain", addr)
		}
	}
}

// TestProcessStartNamesTheBusyListener: a listener that cannot be bound is
// reported as a *ListenError naming it, and the HTTP listener bound before
// it is released.
func TestProcessStartNamesTheBusyListener(t *testing.T) {
	c := newFakeCluster(t, "r1")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg := processConfig(t, c)
	cfg.HTTPAddr = freeAddrs(t, 1)[0]
	cfg.GRPCAddr = busy.Addr().String()
	p, err := NewProcess(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = p.Start(t.Context())
	var le *ListenError
	if !errors.As(err, &le) || le.Listener != "grpc" {
		t.Fatalf("Start on a busy gRPC address: %v, want a *ListenError for grpc", err)
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		t.Fatalf("the HTTP address is still held after the failed Start: %v", err)
	}
	ln.Close()
}
