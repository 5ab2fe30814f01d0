package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-dev/idem/internal/cluster"
)

// TestRunArgs covers what needs no running node: help, flag and argument
// errors, and validation done before any network call.
func TestRunArgs(t *testing.T) {
	dir := t.TempDir()
	cfg, bad := cluster.TopologyFiles(t, dir)
	cluster.TestRun(t, run, []cluster.RunCase{
		{Name: "help", Args: []string{"--help"}, WantOut: "transfer-leader SHARD [TARGET_NODE]"},
		{Name: "help command", Args: []string{"help"}, WantOut: "Commands:"},
		{Name: "help of a command", Args: []string{"help", "snapshot"}, WantOut: "--node ID"},
		{Name: "command --help", Args: []string{"get", "--help"}, WantOut: "--addr HOST:PORT"},
		{Name: "status --help", Args: []string{"status", "-h"}, WantOut: "--json"},
		{Name: "version", Args: []string{"--version"}, WantOut: "idemctl v"},
		{Name: "no command", Args: nil, WantErr: "a command is required"},
		{Name: "unknown command", Args: []string{"stats"}, WantErr: `unknown command "stats"`},
		{Name: "unknown flag", Args: []string{"--bogus", "status"}, WantErr: "flag provided but not defined: -bogus"},
		{Name: "unknown command flag", Args: []string{"status", "--node", "x"}, WantErr: "status: flag provided but not defined: -node"},
		{Name: "status without config", Args: []string{"status"}, WantErr: "status needs the topology: pass --config FILE"},
		{Name: "status takes no arguments", Args: []string{"--config", cfg, "status", "now"}, WantErr: "status takes no arguments"},
		{Name: "locate arity", Args: []string{"--config", cfg, "locate", "payments"}, WantErr: "locate needs NAMESPACE KEY, got 1"},
		{Name: "locate bad namespace", Args: []string{"--config", cfg, "locate", "Pay", "k"}, WantErr: `namespace "Pay" must match`},
		{Name: "locate bad key", Args: []string{"--config", cfg, "locate", "pay", "a b"}, WantErr: "not printable ASCII"},
		{Name: "get without config or addr", Args: []string{"get", "pay", "k"}, WantErr: "get without --addr needs the topology"},
		{Name: "transfer unknown shard", Args: []string{"--config", cfg, "transfer-leader", "r9-0"}, WantErr: `no shard "r9-0"`},
		{Name: "transfer to non-voter", Args: []string{"--config", cfg, "transfer-leader", "r1-0", "r2-1"}, WantErr: `"r2-1" is not a voter of shard r1-0`},
		{Name: "snapshot non-voter", Args: []string{"--config", cfg, "snapshot", "r1-0", "--node", "r2-1"}, WantErr: `--node "r2-1" is not a voter`},
		{Name: "snapshot arity", Args: []string{"--config", cfg, "snapshot"}, WantErr: "snapshot needs SHARD"},
		{Name: "bad timeout", Args: []string{"--timeout", "0s", "--config", cfg, "status"}, WantErr: "--timeout must be positive"},
		{Name: "missing config file", Args: []string{"--config", filepath.Join(dir, "nope.yaml"), "status"}, WantErr: "nope.yaml"},
		{Name: "invalid config", Args: []string{"--config", bad, "status"}, WantErr: "shards_per_region"},
		{Name: "namespaces --help", Args: []string{"namespaces", "--help"}, WantOut: "--tombstone-s N"},
		{Name: "namespaces unknown", Args: []string{"--config", cfg, "namespaces", "drop", "pay"}, WantErr: `unknown namespaces command "drop"`},
		{Name: "namespaces bad name", Args: []string{"--config", cfg, "namespaces", "get-policy", "Pay"}, WantErr: `namespace "Pay" must match`},
		{Name: "get-policy with policy flags", Args: []string{"--config", cfg, "namespaces", "get-policy", "pay", "--max-lease-ms", "5"}, WantErr: "takes no policy flags"},
		{Name: "set-policy not a number", Args: []string{"--config", cfg, "namespaces", "set-policy", "pay", "--tombstone-s", "7d"}, WantErr: `"7d" is not an integer`},
		{Name: "flags after arguments", Args: []string{"locate", "pay", "k", "--config", bad}, WantErr: "shards_per_region"},
	})
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

// TestIdemctlLinksNoServer keeps idemctl a small client: it must link neither
// the API server, the node nor the Prometheus client.
func TestIdemctlLinksNoServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/idem-dev/idem/cmd/idemctl").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case dep == "github.com/idem-dev/idem/server", dep == "github.com/idem-dev/idem/node",
			strings.HasPrefix(dep, "github.com/prometheus/client_golang"):
			t.Errorf("idemctl links %s", dep)
		}
	}
}
