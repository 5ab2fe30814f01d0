package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
)

func TestRunFlags(t *testing.T) {
	dir := t.TempDir()
	topo, err := cluster.Topology(cluster.Spec{Regions: []string{"r1", "r2"}, NodesPerRegion: 3, ShardsPerRegion: 1})
	if err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "topology.yaml")
	if err := cluster.WriteTopology(topo, good); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("cluster: x\nshards_per_region: 0\nreplicas: 9\nregions: []\n"), 0o644)
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string // substring; "" means success
		wantOut string
	}{
		{name: "help", args: []string{"--help"}, wantOut: "--request-timeout"},
		{name: "help lists region", args: []string{"-h"}, wantOut: "--region NAME"},
		{name: "version", args: []string{"--version"}, wantOut: "idemrouter v"},
		{name: "nothing", args: nil, wantErr: "--config FILE is required"},
		{name: "no region", args: []string{"--config", good}, wantErr: "--region NAME is required"},
		{name: "unknown region", args: []string{"--config", good, "--region", "mars"}, wantErr: `--region "mars" is not a region of`},
		{name: "unknown flag", args: []string{"--bogus"}, wantErr: "flag provided but not defined: -bogus"},
		{name: "stray argument", args: []string{"--config", good, "--region", "r1", "extra"}, wantErr: `unexpected argument "extra"`},
		{name: "missing file", args: []string{"--config", filepath.Join(dir, "nope.yaml"), "--region", "r1"}, wantErr: "nope.yaml"},
		{name: "invalid topology", args: []string{"--config", bad, "--region", "r1"}, wantErr: "shards_per_region"},
		{name: "zero timeout", args: []string{"--config", good, "--region", "r1", "--request-timeout", "0s"}, wantErr: "--request-timeout must be positive"},
		{name: "bad timeout", args: []string{"--config", good, "--region", "r1", "--request-timeout", "soon"}, wantErr: "request-timeout"},
		{name: "bad address", args: []string{"--config", good, "--region", "r1", "--http-addr", "localhost"}, wantErr: `--http-addr "localhost" is not HOST:PORT`},
		{name: "every problem at once", args: []string{"--request-timeout", "-1s", "--grpc-addr", "x"}, wantErr: "--request-timeout must be positive, got -1s; --config FILE is required"},
		{name: "bad max response", args: []string{"--config", good, "--region", "r1", "--max-response-bytes", "0"}, wantErr: "--max-response-bytes must be 1.."},
		{name: "bad log level", args: []string{"--config", good, "--region", "r1", "--log-level", "loud"}, wantErr: "--log-level"},
		{name: "bad log format", args: []string{"--config", good, "--region", "r1", "--log-format", "xml"}, wantErr: "--log-format"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tc.args, &stdout, &stderr)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
			} else if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want it to mention %q", err, tc.wantErr)
			} else if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
			if !strings.Contains(stdout.String(), tc.wantOut) {
				t.Fatalf("stdout %q lacks %q", stdout.String(), tc.wantOut)
			}
		})
	}
}

// TestRunWithoutNodes runs the router in-process against a topology whose
// nodes are all down: it serves /healthz, is not ready, answers a key with
// 503 UNAVAILABLE and Retry-After well before the request timeout, and
// drains and returns nil when its context ends.
func TestRunWithoutNodes(t *testing.T) {
	dir := t.TempDir()
	topo, err := cluster.Topology(cluster.Spec{Regions: []string{"r1"}, NodesPerRegion: 3, ShardsPerRegion: 2})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "topology.yaml")
	if err := cluster.WriteTopology(topo, path); err != nil {
		t.Fatal(err)
	}
	ports, err := cluster.FreePorts(2)
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
			"--grpc-addr", "127.0.0.1:" + strconv.Itoa(ports[1]), "--request-timeout", "3s"}, &bytes.Buffer{}, &stderr)
	}()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := cluster.WaitHTTP(wctx, "http://"+httpAddr+"/healthz"); err != nil {
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
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("refused connections took %s to answer", d)
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
