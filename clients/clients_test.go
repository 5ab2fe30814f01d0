package clients

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/launch"

	"github.com/idem-dev/idem/internal/testutil"
)

// suiteTimeout bounds one language's whole test suite.
const suiteTimeout = 10 * time.Minute

// debianNodePath is where Debian's node-* packages (node-express) live; a
// Node.js built elsewhere does not search it on its own.
const debianNodePath = "/usr/share/nodejs"

var (
	buildOnce sync.Once
	binDir    string
	bins      map[string]string
	buildErr  error
)

// binaries builds cmd/idemnode and cmd/idemctl once per test binary (with
// -race when the tests run with it, as every multi-process test here does:
// the suites fail when a node reports a data race) and returns the
// environment that hands them to a suite.
func binaries(t *testing.T) []string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "idem-clients-")
		if buildErr != nil {
			return
		}
		bins, buildErr = launch.Build(binDir, "idemnode", "idemctl")
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return []string{"IDEM_NODE_BIN=" + bins["idemnode"], "IDEM_CTL_BIN=" + bins["idemctl"]}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// need runs check, a check of the machine; when it fails the test skips, or
// fails under CI=true (testutil.Missing).
func need(t *testing.T, what, install string, check *exec.Cmd) {
	t.Helper()
	out, err := check.CombinedOutput()
	if err == nil {
		return
	}
	why := strings.TrimSpace(string(out))
	if why == "" {
		why = err.Error()
	}
	testutil.Missing(t, what+" is missing ("+why+"): "+install)
}

// runSuite runs a language's test suite in dir with IDEM_NODE_BIN and
// IDEM_CTL_BIN set,
// logging its output; a failing suite fails the test.
func runSuite(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), suiteTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), env...), binaries(t)...)
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	t.Logf("%s %s (in %s):\n%s", name, strings.Join(args, " "), dir, out.String())
	if ctx.Err() != nil {
		t.Fatalf("the suite did not finish within %v", suiteTimeout)
	}
	if err != nil {
		t.Fatalf("the suite failed: %v", err)
	}
}

func withNodePath() string {
	if p := os.Getenv("NODE_PATH"); p != "" {
		return "NODE_PATH=" + p + string(os.PathListSeparator) + debianNodePath
	}
	return "NODE_PATH=" + debianNodePath
}

// TestTypeScript runs @idem/client's suite (node --test) against real dev
// nodes: every call, run/once, the Express middleware, the declarations.
func TestTypeScript(t *testing.T) {
	testutil.NeedsProcesses(t)
	nodePath := withNodePath()
	need(t, "Node.js 20+", "apt-get install nodejs", exec.Command("node", "-e",
		`if (Number(process.versions.node.split(".")[0]) < 20) { console.log("node " + process.versions.node + " is older than 20"); process.exit(1) }`))
	check := exec.Command("node", "-e", `require("express")`)
	check.Env = append(os.Environ(), nodePath)
	need(t, "express", "apt-get install node-express", check)
	need(t, "tsc", "apt-get install node-typescript", exec.Command("tsc", "--version"))
	runSuite(t, "typescript", []string{nodePath}, "node", "--test")
}

// python is Debian's interpreter, which sees Debian's python3-* packages
// (pytest, starlette, fastapi, httpx).
const python = "/usr/bin/python3"

// TestPython runs idem-client's suite (pytest) against a real dev node:
// every call, the sync and asyncio run/once, the ASGI middleware under
// Starlette and FastAPI.
func TestPython(t *testing.T) {
	testutil.NeedsProcesses(t)
	need(t, "python3 with pytest, starlette, fastapi and httpx",
		"apt-get install python3-pytest python3-starlette python3-fastapi python3-httpx",
		exec.Command(python, "-c", "import pytest, starlette, fastapi, httpx"))
	runSuite(t, "python", []string{"PYTHONDONTWRITEBYTECODE=1"}, python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
}
