package cluster

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-dev/idem/internal/launch"
)

// RunCase is one row of a command's table test of its run function.
type RunCase struct {
	Name    string
	Args    []string
	WantErr string // a substring of the error; "" means run succeeds
	WantOut string // a substring of stdout
}

// TestRun runs every case through run (a command's run(ctx, args, stdout,
// stderr)) as a subtest: the error must mention WantErr and fit on one line
// (the contract's "one clear line"), stdout must contain WantOut.
func TestRun(t *testing.T, run func(ctx context.Context, args []string, stdout, stderr io.Writer) error, cases []RunCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tc.Args, &stdout, &stderr)
			if tc.WantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
			} else if err == nil || !strings.Contains(err.Error(), tc.WantErr) {
				t.Fatalf("error %v, want it to mention %q", err, tc.WantErr)
			} else if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
			if !strings.Contains(stdout.String(), tc.WantOut) {
				t.Fatalf("stdout %q lacks %q", stdout.String(), tc.WantOut)
			}
		})
	}
}

// TopologyFiles writes into dir a valid topology (two regions of three
// nodes, one shard each) and one that fails validation, and returns their
// paths: the inputs of the commands' flag tests.
func TopologyFiles(t testing.TB, dir string) (good, bad string) {
	t.Helper()
	topo, err := launch.Topology(launch.Spec{Regions: []string{"r1", "r2"}, NodesPerRegion: 3, ShardsPerRegion: 1})
	if err != nil {
		t.Fatal(err)
	}
	good = filepath.Join(dir, "topology.yaml")
	if err := launch.WriteTopology(topo, good); err != nil {
		t.Fatal(err)
	}
	bad = filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("cluster: x\nshards_per_region: 0\nreplicas: 9\nregions: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return good, bad
}
