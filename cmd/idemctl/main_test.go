package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-dev/idem/internal/cluster"
)

// TestRunArgs covers what needs no running node: help, flag and argument
// errors, and validation done before any network call.
func TestRunArgs(t *testing.T) {
	dir := t.TempDir()
	topo, err := cluster.Topology(cluster.Spec{Regions: []string{"r1", "r2"}, NodesPerRegion: 3, ShardsPerRegion: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "topology.yaml")
	if err := cluster.WriteTopology(topo, cfg); err != nil {
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
		{name: "help", args: []string{"--help"}, wantOut: "transfer-leader SHARD [TARGET_NODE]"},
		{name: "help command", args: []string{"help"}, wantOut: "Commands:"},
		{name: "help of a command", args: []string{"help", "snapshot"}, wantOut: "--node ID"},
		{name: "command --help", args: []string{"get", "--help"}, wantOut: "--addr HOST:PORT"},
		{name: "status --help", args: []string{"status", "-h"}, wantOut: "--json"},
		{name: "version", args: []string{"--version"}, wantOut: "idemctl v"},
		{name: "no command", args: nil, wantErr: "a command is required"},
		{name: "unknown command", args: []string{"stats"}, wantErr: `unknown command "stats"`},
		{name: "unknown flag", args: []string{"--bogus", "status"}, wantErr: "flag provided but not defined: -bogus"},
		{name: "unknown command flag", args: []string{"status", "--node", "x"}, wantErr: "status: flag provided but not defined: -node"},
		{name: "status without config", args: []string{"status"}, wantErr: "status needs the topology: pass --config FILE"},
		{name: "status takes no arguments", args: []string{"--config", cfg, "status", "now"}, wantErr: "status takes no arguments"},
		{name: "locate arity", args: []string{"--config", cfg, "locate", "payments"}, wantErr: "locate needs NAMESPACE KEY, got 1"},
		{name: "locate bad namespace", args: []string{"--config", cfg, "locate", "Pay", "k"}, wantErr: `namespace "Pay" must match`},
		{name: "locate bad key", args: []string{"--config", cfg, "locate", "pay", "a b"}, wantErr: "not printable ASCII"},
		{name: "get without config or addr", args: []string{"get", "pay", "k"}, wantErr: "get without --addr needs the topology"},
		{name: "transfer unknown shard", args: []string{"--config", cfg, "transfer-leader", "r9-0"}, wantErr: `no shard "r9-0"`},
		{name: "transfer to non-voter", args: []string{"--config", cfg, "transfer-leader", "r1-0", "r2-1"}, wantErr: `"r2-1" is not a voter of shard r1-0`},
		{name: "snapshot non-voter", args: []string{"--config", cfg, "snapshot", "r1-0", "--node", "r2-1"}, wantErr: `--node "r2-1" is not a voter`},
		{name: "snapshot arity", args: []string{"--config", cfg, "snapshot"}, wantErr: "snapshot needs SHARD"},
		{name: "bad timeout", args: []string{"--timeout", "0s", "--config", cfg, "status"}, wantErr: "--timeout must be positive"},
		{name: "missing config file", args: []string{"--config", filepath.Join(dir, "nope.yaml"), "status"}, wantErr: "nope.yaml"},
		{name: "invalid config", args: []string{"--config", bad, "status"}, wantErr: "shards_per_region"},
		{name: "flags after arguments", args: []string{"locate", "pay", "k", "--config", bad}, wantErr: "shards_per_region"},
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

func TestParseInterleaved(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		wantPos  []string
		wantJSON bool
	}{
		{[]string{"ns", "key"}, []string{"ns", "key"}, false},
		{[]string{"--json", "ns", "key"}, []string{"ns", "key"}, true},
		{[]string{"ns", "--json", "key"}, []string{"ns", "key"}, true},
		{[]string{"ns", "key", "--json"}, []string{"ns", "key"}, true},
		{[]string{"ns", "--", "-key-with-dash"}, []string{"ns", "-key-with-dash"}, false},
		{[]string{"--", "--json", "x"}, []string{"--json", "x"}, false},
	} {
		g := globals{}
		fs := commandFlags(findCommand("get"), &g, &cmdOptions{})
		pos, err := parseInterleaved(fs, tc.args)
		if err != nil || strings.Join(pos, "|") != strings.Join(tc.wantPos, "|") || g.json != tc.wantJSON {
			t.Errorf("parseInterleaved(%q) = %q, json=%v, %v; want %q, json=%v", tc.args, pos, g.json, err, tc.wantPos, tc.wantJSON)
		}
	}
}
