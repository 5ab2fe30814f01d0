package clients

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/testutil"
)

// installBlock returns the commands of the first ```sh block under the
// "## Install" heading of a package's README.
func installBlock(t *testing.T, readme string) []string {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n## Install\n")
	if !ok {
		t.Fatalf("%s has no \"## Install\" section", readme)
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	_, block, ok := strings.Cut(rest, "\n```sh\n")
	if !ok {
		t.Fatalf("%s, Install: no ```sh block", readme)
	}
	block, _, _ = strings.Cut(block, "\n```")
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return lines
}

// copyPackage copies the package dir (its sources, without what builds and
// installs leave in it) to dst.
func copyPackage(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		switch name := d.Name(); {
		case d.IsDir() && (name == "build" || name == "node_modules" || name == "__pycache__" || strings.HasSuffix(name, ".egg-info")):
			return filepath.SkipDir
		case d.IsDir():
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// runInstall runs a README's install commands, as its reader would, in a
// fresh directory beside a copy of the package at idem/clients/<pkg>, with
// no registry reachable (the commands say --offline / --no-index). A line
// "apt-get install ... PKG..." is not run: each package it names must be
// installed (.ci/run installs them), else the test skips, or fails under
// CI=true. The last command's output must contain want.
func runInstall(t *testing.T, pkg, want string, env ...string) {
	t.Helper()
	testutil.NeedsProcesses(t)
	lines := installBlock(t, filepath.Join(pkg, "README.md"))
	var script []string
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, "apt-get install"); ok {
			for _, p := range strings.Fields(rest) {
				if strings.HasPrefix(p, "-") {
					continue
				}
				if out, err := exec.Command("dpkg-query", "-W", "-f=${Status}", p).Output(); err != nil || !strings.Contains(string(out), "install ok installed") {
					testutil.Missing(t, "Debian's "+p+" is not installed: apt-get install "+p)
				}
			}
			continue
		}
		script = append(script, l)
	}
	dir := t.TempDir()
	copyPackage(t, pkg, filepath.Join(dir, "idem", "clients", pkg))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", strings.Join(script, "\n"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("%s's install commands (in a fresh directory):\n%s\n%s", pkg, strings.Join(script, "\n"), out.String())
	if err != nil {
		t.Fatalf("%s: the README's install commands failed: %v", pkg, err)
	}
	if !strings.Contains(out.String(), want) {
		t.Fatalf("%s: the install's last command printed no %q", pkg, want)
	}
}

// TestPythonInstallFromTheREADME: `pip install` of the package works in a
// fresh virtualenv with no PyPI, exactly as clients/python/README.md says,
// with Debian's build backend.
func TestPythonInstallFromTheREADME(t *testing.T) {
	// "python3" is Debian's, whose python3-setuptools the README relies on,
	// whatever else comes first on PATH.
	bin := t.TempDir()
	if err := os.Symlink(python, filepath.Join(bin, "python3")); err != nil {
		t.Fatal(err)
	}
	need(t, "Debian's python3", "apt-get install python3", exec.Command(python, "--version"))
	runInstall(t, "python", "Client", "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"PIP_NO_INDEX=1", "PIP_DISABLE_PIP_VERSION_CHECK=1", "PYTHONDONTWRITEBYTECODE=1")
}

// TestTypeScriptInstallFromTheREADME: `npm install` of the package works
// offline into a fresh directory, exactly as clients/typescript/README.md
// says.
func TestTypeScriptInstallFromTheREADME(t *testing.T) {
	need(t, "npm", "apt-get install npm", exec.Command("npm", "--version"))
	// A registry nobody answers: the install must not need one.
	runInstall(t, "typescript", "function", "npm_config_registry=http://127.0.0.1:9/",
		"npm_config_cache="+t.TempDir(), "npm_config_update_notifier=false")
}
