package deploy

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
)

// examples/three-regions.sh fails loudly when one of its processes cannot
// bind its port: with the ap-south router's HTTP port taken it must exit
// non-zero, name that router and not claim that the regions are up.
func TestThreeRegionsScriptFailsOnATakenPort(t *testing.T) {
	testutil.NeedsProcesses(t)
	testutil.NeedsCommand(t, "curl", "apt-get install curl; the script calls it")
	// The script's fixed ports are also the documentation's (docs'
	// transcripts run a region of deploy/examples on them): take turns.
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	release, err := launch.HoldPorts(ctx, threeRegionsPorts(t)...)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	ln, err := net.Listen("tcp", "127.0.0.1:8092")
	if err != nil {
		t.Skipf("cannot take 127.0.0.1:8092 for the test (in use?): %v", err)
	}
	defer ln.Close()
	go func() { // accept and hold connections: a port that answers nothing
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	ctx, cancel = context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join("examples", "three-regions.sh"))
	cmd.Env = append(os.Environ(), "INSECURE=1", "IDEM_DEMO_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err == nil || !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("the script should exit 1 with a router's port taken, got %v:\n%s", err, out)
	}
	if !strings.Contains(string(out), "three-regions: router-ap-south exited") {
		t.Errorf("the script does not say that the ap-south router exited:\n%s", out)
	}
	if strings.Contains(string(out), "Three regions are up") {
		t.Errorf("the script claims the regions are up:\n%s", out)
	}
}

// threeRegionsPorts lists the loopback ports examples/three-regions.sh uses:
// its topology's and its routers' (7090-7092, 8090-8092).
func threeRegionsPorts(t *testing.T) []int {
	t.Helper()
	topo, err := os.ReadFile(filepath.Join("examples", "three-region.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ports := []int{7090, 7091, 7092, 8090, 8091, 8092}
	for _, m := range regexp.MustCompile(`127\.0\.0\.1:(\d+)`).FindAllStringSubmatch(string(topo), -1) {
		p, _ := strconv.Atoi(m[1])
		ports = append(ports, p)
	}
	slices.Sort(ports)
	return slices.Compact(ports)
}
