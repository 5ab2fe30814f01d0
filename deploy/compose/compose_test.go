package compose

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/testutil"
)

// smokeTimeout bounds smoke.sh (its own watchdog, IDEM_SMOKE_TIMEOUT) and, a
// little later, the process itself.
const smokeTimeout = 5 * time.Minute

func TestComposeSmoke(t *testing.T) {
	testutil.NeedsProcesses(t)
	if os.Getenv("IDEM_DOCKER_TESTS") != "1" {
		t.Skip("set IDEM_DOCKER_TESTS=1 to run deploy/compose/smoke.sh against the local Docker Engine (builds the idem:dev image, starts four containers)")
	}
	if _, err := exec.LookPath("docker"); err != nil {
		t.Fatalf("IDEM_DOCKER_TESTS=1 but docker is not installed: %v", err)
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatalf("smoke.sh needs curl: %v", err)
	}
	script, err := filepath.Abs("smoke.sh")
	if err != nil {
		t.Fatal(err)
	}

	project := fmt.Sprintf("idemsmoketest%d", os.Getpid())
	env := append(os.Environ(),
		"IDEM_SMOKE_PROJECT="+project,
		"IDEM_SMOKE_TIMEOUT="+strconv.Itoa(int(smokeTimeout.Seconds())),
	)
	ports := freePorts(t, 9)
	for i, name := range []string{
		"IDEM_NODE1_HTTP_PORT", "IDEM_NODE2_HTTP_PORT", "IDEM_NODE3_HTTP_PORT", "IDEM_ROUTER_HTTP_PORT",
		"IDEM_NODE1_GRPC_PORT", "IDEM_NODE2_GRPC_PORT", "IDEM_NODE3_GRPC_PORT", "IDEM_ROUTER_GRPC_PORT",
		"IDEM_DEFAULT_HTTP_PORT",
	} {
		env = append(env, name+"="+strconv.Itoa(ports[i]))
	}
	// smoke.sh removes its project on every exit; this is for a script
	// killed by the test's deadline before its trap ran.
	t.Cleanup(func() { composeDown(t, project, env) })

	ctx, cancel := context.WithTimeout(t.Context(), smokeTimeout+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.WaitDelay = 30 * time.Second
	err = cmd.Run()
	t.Logf("smoke.sh output:\n%s", out.String())
	if err != nil {
		t.Fatalf("smoke.sh failed: %v (output above)", err)
	}
	if !strings.Contains(out.String(), "smoke: PASS") {
		t.Fatal("smoke.sh exited 0 without printing \"smoke: PASS\"")
	}
}

// freePorts returns n distinct free TCP ports on 127.0.0.1, from listening
// on :0 (all held at once, so none repeats).
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// composeDown removes the project's containers, network and volumes with
// whichever compose the host has.
func composeDown(t *testing.T, project string, env []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := []string{"-p", project, "-f", "docker-compose.yml", "down", "-v", "--remove-orphans", "-t", "20"}
	var cmd *exec.Cmd
	if exec.CommandContext(ctx, "docker", "compose", "version").Run() == nil {
		cmd = exec.CommandContext(ctx, "docker", append([]string{"compose"}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, "docker-compose", args...)
	}
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Logf("compose down -v of project %s: %v\n%s", project, err, out)
	}
}
