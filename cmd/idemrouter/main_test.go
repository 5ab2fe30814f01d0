package main

import (
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
)

func TestRunFlags(t *testing.T) {
	dir := t.TempDir()
	good, bad := cluster.TopologyFiles(t, dir)
	cluster.TestRun(t, run, []cluster.RunCase{
		{Name: "help", Args: []string{"--help"}, WantOut: "--request-timeout"},
		{Name: "help lists region", Args: []string{"-h"}, WantOut: "--region NAME"},
		{Name: "version", Args: []string{"--version"}, WantOut: "idemrouter v"},
		{Name: "help names the gc headroom", Args: []string{"--help"}, WantOut: "--gc-headroom-bytes BYTES"},
		{Name: "negative gc headroom", Args: []string{"--config", good, "--region", "r1", "--gc-headroom-bytes", "-1"}, WantErr: `invalid value "-1" for flag -gc-headroom-bytes`},
		{Name: "nothing", Args: nil, WantErr: "--config FILE is required"},
		{Name: "no region", Args: []string{"--config", good}, WantErr: "--region NAME is required"},
		{Name: "unknown region", Args: []string{"--config", good, "--region", "mars"}, WantErr: `--region "mars" is not a region of`},
		{Name: "unknown flag", Args: []string{"--bogus"}, WantErr: "flag provided but not defined: -bogus"},
		{Name: "stray argument", Args: []string{"--config", good, "--region", "r1", "extra"}, WantErr: `unexpected argument "extra"`},
		{Name: "missing file", Args: []string{"--config", filepath.Join(dir, "nope.yaml"), "--region", "r1"}, WantErr: "nope.yaml"},
		{Name: "invalid topology", Args: []string{"--config", bad, "--region", "r1"}, WantErr: "shards_per_region"},
		{Name: "zero timeout", Args: []string{"--config", good, "--region", "r1", "--request-timeout", "0s"}, WantErr: "--request-timeout must be positive"},
		{Name: "bad timeout", Args: []string{"--config", good, "--region", "r1", "--request-timeout", "soon"}, WantErr: "request-timeout"},
		{Name: "bad address", Args: []string{"--config", good, "--region", "r1", "--http-addr", "localhost"}, WantErr: `--http-addr "localhost" is not HOST:PORT`},
		{Name: "every problem at once", Args: []string{"--request-timeout", "-1s", "--grpc-addr", "x"}, WantErr: "--request-timeout must be positive, got -1s; --config FILE is required"},
		{Name: "bad max response", Args: []string{"--config", good, "--region", "r1", "--max-response-bytes", "0"}, WantErr: "--max-response-bytes must be 1.."},
		{Name: "bad log level", Args: []string{"--config", good, "--region", "r1", "--log-level", "loud"}, WantErr: "--log-level"},
		{Name: "exposed without certs", Args: []string{"--config", good, "--region", "r1", "--http-addr", "0.0.0.0:8090"}, WantErr: "refusing to listen beyond loopback without TLS (--http-addr 0.0.0.0:8090)"},
		{Name: "exposed proxy without certs", Args: []string{"--config", good, "--region", "r1", "--upstream", "http://127.0.0.1:1", "--proxy-addr", "[::]:8088"}, WantErr: "--proxy-addr [::]:8088"},
		{Name: "missing certs dir", Args: []string{"--config", good, "--region", "r1", "--certs-dir", filepath.Join(dir, "nocerts")}, WantErr: "--certs-dir"},
		{Name: "bad log format", Args: []string{"--config", good, "--region", "r1", "--log-format", "xml"}, WantErr: "--log-format"},
		{Name: "upstream not http", Args: []string{"--config", good, "--region", "r1", "--upstream", "ftp://x"}, WantErr: `Upstream "ftp://x" must be an absolute http:// or https:// URL`},
		{Name: "upstream not a URL", Args: []string{"--config", good, "--region", "r1", "--upstream", "notaurl"}, WantErr: `Upstream "notaurl" must be an absolute`},
		{Name: "bad namespace header", Args: []string{"--config", good, "--region", "r1", "--upstream", "http://127.0.0.1:9", "--namespace-header", "bad header"}, WantErr: `NamespaceHeader "bad header" is not a valid header name`},
		{Name: "negative max request", Args: []string{"--config", good, "--region", "r1", "--upstream", "http://127.0.0.1:9", "--max-request-bytes", "-5"}, WantErr: "MaxRequestBytes -5 is negative"},
		{Name: "bad proxy address", Args: []string{"--config", good, "--region", "r1", "--upstream", "http://127.0.0.1:9", "--proxy-addr", "nowhere"}, WantErr: `--proxy-addr "nowhere" is not HOST:PORT`},
		{Name: "proxy flag without upstream", Args: []string{"--config", good, "--region", "r1", "--require-key"}, WantErr: "need --upstream URL"},
	})
}

// TestRunWithoutNodes runs the router in-process against a topology whose
// nodes are all down: it serves /healthz, is not ready, answers a key with
// 503 UNAVAILABLE and Retry-After well before the request timeout, and
// drains and returns nil when its context ends.
func TestRunWithoutNodes(t *testing.T) {
	dir := t.TempDir()
	topo, err := launch.Topology(launch.Spec{Regions: []string{"r1"}, NodesPerRegion: 3, ShardsPerRegion: 2})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "topology.yaml")
	if err := launch.WriteTopology(topo, path); err != nil {
		t.Fatal(err)
	}
	ports, err := launch.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	var stderr bytes.Buffer
	go func() {
		done <- run(ctx, []string{"--config", path, "--region", "r1", "--http-addr", httpAddr,
			"--grpc-addr", "127.0.0.1:" + strconv.Itoa(ports[1]), "--request-timeout", "1m"}, &bytes.Buffer{}, &stderr)
	}()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := launch.WaitHTTP(wctx, "http://"+httpAddr+"/healthz"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + httpAddr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with no node up: %d, want 503", resp.StatusCode)
	}
	start := time.Now()
	r, err := cluster.NewAPI(httpAddr).Reserve(ctx, "payments", "order-1", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusServiceUnavailable || r.ErrCode() != "UNAVAILABLE" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("reserve with no node up: %s (Retry-After %q), want 503 UNAVAILABLE with Retry-After", r, r.Header.Get("Retry-After"))
	}
	// Refused connections answer at once, not at the one-minute request
	// timeout; half of it is a margin no loaded box needs.
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("refused connections took %s to answer (request timeout 1m)", d)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return within 15s of the cancel")
	}
	if !strings.Contains(stderr.String(), "idemrouter serving") || !strings.Contains(stderr.String(), "stopped") {
		t.Fatalf("log lacks the start and stop lines:\n%s", stderr.String())
	}
}
