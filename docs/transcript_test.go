package docs

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
)

var rewriteFlag = flag.Bool("rewrite", false,
	"write the actual output of every console block command that does not match back into README.md and docs/*.md")

const (
	// commandTimeout bounds one command; a document waits for readiness
	// with commands that retry (curl --retry), well within it.
	commandTimeout = 60 * time.Second
	// stopGrace is how long a background process has to exit after SIGTERM
	// before its process group gets SIGKILL.
	stopGrace = 10 * time.Second
	// holdPortsTimeout bounds the wait for another test process of the
	// same run to let go of the fixed ports a file needs.
	holdPortsTimeout = 6 * time.Minute
)

// TestTranscripts runs the console blocks of README.md and docs/*.md, one
// subtest per file, against the repository's binaries, and compares what
// every command prints with what the document shows (rules in doc.go).
func TestTranscripts(t *testing.T) {
	testutil.NeedsProcesses(t)
	testutil.NeedsCommand(t, "curl", "apt-get install curl; the pages' console blocks call it")
	docs, err := transcriptDocs("..")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Skip("no console blocks in README.md or docs/*.md")
	}
	binDir := t.TempDir()
	names, err := commandNames("../cmd")
	if err != nil {
		t.Fatal(err)
	}
	names = usedCommands(names, docs)
	if _, err := launch.Build(binDir, names...); err != nil {
		t.Fatal(err)
	}
	help, _ := exec.Command(filepath.Join(binDir, "idemnode"), "--help").CombinedOutput()
	devAddrs := devDefaults(string(help))
	for _, d := range docs {
		t.Run(d.path, func(t *testing.T) {
			needsOfPage(t, d)
			// Other test processes that start examples on these fixed
			// ports (deploy's scripts) take turns with this one.
			need := neededPorts(d, devAddrs, "..")
			ctx, cancel := context.WithTimeout(t.Context(), holdPortsTimeout)
			defer cancel()
			release, err := launch.HoldPorts(ctx, slices.Sorted(maps.Keys(need))...)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			if err := listenCheck(need); err != nil {
				t.Fatal(err)
			}
			r, err := newRunner(binDir, t.TempDir(), "..")
			if err != nil {
				t.Fatal(err)
			}
			res := r.run(t.Context(), d)
			report(t, d, res, *rewriteFlag)
			if t.Failed() {
				t.Log(r.logTails())
			}
		})
	}
}

// pageNeeds are what a page's commands need beyond Go and curl: a command
// containing the key needs check to succeed (install says how), else the
// page skips, or fails under CI=true (.ci/run installs them).
var pageNeeds = map[string]struct {
	check   []string
	install string
}{
	"node examples/express/": {[]string{"bash", "-c", "NODE_PATH=/usr/share/nodejs node -e 'require(\"express\")'"}, "apt-get install nodejs node-express"},
	"examples/fastapi/":      {[]string{"/usr/bin/python3", "-c", "import fastapi, uvicorn"}, "apt-get install python3-fastapi python3-uvicorn"},
}

func needsOfPage(t *testing.T, d *doc) {
	t.Helper()
	for key, need := range pageNeeds {
		if !slices.ContainsFunc(d.cmds, func(c command) bool { return strings.Contains(c.text, key) }) {
			continue
		}
		if out, err := exec.Command(need.check[0], need.check[1:]...).CombinedOutput(); err != nil {
			testutil.Missing(t, fmt.Sprintf("%s needs what %q checks (%v: %s): %s", d.path, strings.Join(need.check, " "), err, strings.TrimSpace(string(out)), need.install))
		}
	}
}

// report turns a run's result into test failures, or with rewrite into a
// rewritten document.
func report(t *testing.T, d *doc, res result, rewrite bool) {
	t.Helper()
	for _, f := range res.failures {
		t.Error(f)
	}
	if rewrite {
		if len(res.mismatched) == 0 {
			return
		}
		text := d.rewrite(res.mismatched)
		if err := os.WriteFile(filepath.Join("..", d.path), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: rewrote the output of %d command(s)", d.path, len(res.mismatched))
		return
	}
	for _, k := range slices.Sorted(maps.Keys(res.mismatched)) {
		c := d.cmds[k]
		t.Errorf("%s\nwant:\n%s\ngot:\n%s", c.where(d.path), indentLines(c.want), indentLines(res.mismatched[k]))
	}
	if len(res.mismatched) > 0 {
		t.Log("after a deliberate change: go test ./docs -run TestTranscripts -rewrite, and review the diff")
	}
}

func indentLines(lines []string) string {
	if len(lines) == 0 {
		return "    (nothing)"
	}
	return "    " + strings.Join(lines, "\n    ")
}

// transcriptDocs parses README.md and docs/*.md under root and returns the
// ones with console blocks, paths relative to root.
func transcriptDocs(root string) ([]*doc, error) {
	paths, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	paths = append([]string{filepath.Join(root, "README.md")}, paths...)
	var docs []*doc
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(root, p)
		d, err := parseDoc(filepath.ToSlash(rel), string(b))
		if err != nil {
			return nil, err
		}
		if len(d.cmds) > 0 {
			docs = append(docs, d)
		}
	}
	return docs, nil
}

// commandNames lists the binaries under cmd/.
func commandNames(cmdDir string) ([]string, error) {
	entries, err := os.ReadDir(cmdDir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// usedCommands returns the names of the binaries some document's command
// runs (idemnode always: its --help gives a dev node's ports), so a run links
// only those.
func usedCommands(names []string, docs []*doc) []string {
	var used []string
	for _, name := range names {
		re := regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\b`)
		for _, d := range docs {
			if name == "idemnode" || slices.ContainsFunc(d.cmds, func(c command) bool { return re.MatchString(c.shellText()) }) {
				used = append(used, name)
				break
			}
		}
	}
	return used
}

var (
	loopbackPortRe = regexp.MustCompile(`(?:127\.0\.0\.1|localhost|\[::1\]|0\.0\.0\.0):(\d{2,5})\b`)
	devDefaultRe   = regexp.MustCompile(`(?m)^\s*(--[a-z-]+) HOST:PORT\n.*\(dev default ([0-9.]+:\d+)`)
)

// devDefaults reads from idemnode's --help the addresses a --dev node takes
// when the command does not name them, by flag.
func devDefaults(help string) map[string]string {
	out := map[string]string{}
	for _, m := range devDefaultRe.FindAllStringSubmatch(help, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// checkPorts fails when a loopback port the document uses is taken: the
// ports named in its commands or in the files of the repository at root that
// they name, and a dev node's default ones. A transcript
// that talked to someone else's process would fail in confusing ways.
func checkPorts(d *doc, devAddrs map[string]string, root string) error {
	return listenCheck(neededPorts(d, devAddrs, root))
}

// neededPorts returns the loopback ports a document uses, each with the
// command that needs it: the ports named in its commands or in the files of
// the repository at root that they name, and a dev node's default ones.
func neededPorts(d *doc, devAddrs map[string]string, root string) map[int]string {
	need := map[int]string{} // port -> the command that names it
	for _, c := range d.cmds {
		text := c.shellText()
		for _, m := range loopbackPortRe.FindAllStringSubmatch(text, -1) {
			p, _ := strconv.Atoi(m[1])
			if _, ok := need[p]; !ok {
				need[p] = c.where(d.path)
			}
		}
		// A repository file the command names (a topology file) names ports too.
		for _, word := range strings.Fields(text) {
			path := filepath.Join(root, filepath.FromSlash(word))
			if st, err := os.Stat(path); err != nil || !st.Mode().IsRegular() || st.Size() > 1<<20 || !filepath.IsLocal(word) {
				continue
			}
			b, err := os.ReadFile(path)
			if err != nil {
				continue
			}
			for _, m := range loopbackPortRe.FindAllStringSubmatch(string(b), -1) {
				p, _ := strconv.Atoi(m[1])
				if _, ok := need[p]; !ok {
					need[p] = c.where(d.path) + " (in " + word + ")"
				}
			}
		}
		if strings.Contains(text, "idemnode") && strings.Contains(text, "--dev") {
			for flagName, addr := range devAddrs {
				if strings.Contains(text, flagName) {
					continue
				}
				_, port, _ := net.SplitHostPort(addr)
				p, _ := strconv.Atoi(port)
				if _, ok := need[p]; !ok {
					need[p] = c.where(d.path) + " (a dev node's default " + flagName + ")"
				}
			}
		}
	}
	return need
}

// listenCheck fails for each port it cannot listen on.
func listenCheck(need map[int]string) error {
	var errs []error
	for _, p := range slices.Sorted(maps.Keys(need)) {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			errs = append(errs, fmt.Errorf("port 127.0.0.1:%d is taken by another process, and the transcript needs it free for\n    %s\n  stop what listens there (a dev node? `ss -ltnp 'sport = :%d'`) and run the test again", p, need[p], p))
			continue
		}
		l.Close()
	}
	return errors.Join(errs...)
}

// runner runs one document's commands in one working directory.
type runner struct {
	dir      string   // the working directory every command starts in
	state    string   // where the shell's variables and cwd live between commands
	env      []string // the commands' environment: PATH starts with the built binaries
	baseline string   // variables bash has before any command: not carried over
	timeout  time.Duration
	bg       []*bgProc
}

type bgProc struct {
	cmd    *exec.Cmd
	k      int    // index of its command
	log    string // file that receives its output
	done   chan struct{}
	err    error // from Wait, once done is closed
	killed bool
}

// result is what running a document found: the commands whose output did
// not match (their actual output, by command index) and every other failure.
type result struct {
	mismatched map[int][]string
	failures   []string
}

// newRunner prepares dir as the working directory: it holds a symlink to each
// top-level entry of the repository at root, so documents can name the
// repository's files (deploy/examples/...), and everything commands write
// lands in dir itself.
func newRunner(binDir, dir, root string) (*runner, error) {
	absRoot, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(absRoot)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || e.Name() == "tmp" || e.Name() == "idem-data" {
			continue
		}
		if err := os.Symlink(filepath.Join(absRoot, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			return nil, err
		}
	}
	state, err := os.MkdirTemp("", "idem-transcript-")
	if err != nil {
		return nil, err
	}
	r := &runner{dir: dir, state: state, timeout: commandTimeout}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PATH=") {
			r.env = append(r.env, kv)
		}
	}
	r.env = append(r.env, "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	if err := os.WriteFile(filepath.Join(state, "cwd"), []byte(dir), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(state, "vars"), nil, 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command("bash", "--noprofile", "--norc", "-c", "compgen -v")
	cmd.Env = r.env
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("bash: %v", err)
	}
	r.baseline = " " + strings.Join(strings.Fields(string(out)), " ") + " __transcript_status __transcript_v "
	return r, nil
}

// prelude restores the previous command's directory and variables.
func (r *runner) prelude() string {
	return fmt.Sprintf("cd -- \"$(cat %q)\" && . %q\nset -o pipefail\n",
		filepath.Join(r.state, "cwd"), filepath.Join(r.state, "vars"))
}

// epilogue saves the directory and the variables and functions the command
// set, then exits with the command's status.
func (r *runner) epilogue() string {
	return fmt.Sprintf(`
__transcript_status=$?
pwd >%[1]q
for __transcript_v in $(compgen -v); do
  case %[3]q in *" $__transcript_v "*) ;; *) declare -p "$__transcript_v" ;; esac
done >%[2]q 2>/dev/null
declare -f >>%[2]q
exit $__transcript_status
`, filepath.Join(r.state, "cwd"), filepath.Join(r.state, "vars"), r.baseline)
}

// run runs every command of d in order, then stops the background ones.
func (r *runner) run(ctx context.Context, d *doc) result {
	res := result{mismatched: map[int][]string{}}
	defer os.RemoveAll(r.state)
	stopped := false
	for k, c := range d.cmds {
		if stopped {
			res.failures = append(res.failures, c.where(d.path)+": not run: an earlier command timed out")
			continue
		}
		if c.background {
			if err := r.start(k, c); err != nil {
				res.failures = append(res.failures, fmt.Sprintf("%s: %v", c.where(d.path), err))
			}
			continue
		}
		out, err := r.foreground(ctx, c)
		got := outputLines(out)
		if err != nil {
			var exit *exec.ExitError
			switch {
			case errors.As(err, &exit) && len(got) > 0:
				// A failing command that says why: the comparison decides.
			case errors.As(err, &exit):
				res.failures = append(res.failures, fmt.Sprintf("%s: %v, and printed nothing", c.where(d.path), err))
				continue
			default:
				res.failures = append(res.failures, fmt.Sprintf("%s: %v\noutput so far:\n%s", c.where(d.path), err, indentLines(got)))
				stopped = true
				continue
			}
		}
		if !matchOutput(c.want, got) {
			res.mismatched[k] = got
		}
	}
	res.failures = append(res.failures, r.stopAll(d)...)
	res.failures = append(res.failures, r.raceReports()...)
	return res
}

// raceMarker starts every report of the race detector.
const raceMarker = "WARNING: DATA RACE"

// raceReports looks for data races in the logs the commands wrote into the
// working directory (a page may send a node's output to a file), as the
// binaries are built with -race when the test runs with it.
func (r *runner) raceReports() []string {
	var failures []string
	for _, path := range r.logs() {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		if i := bytes.Index(b, []byte(raceMarker)); i >= 0 {
			failures = append(failures, fmt.Sprintf("%s reports a data race:\n%s",
				filepath.Base(path), indentLines(outputLines(string(b[i:min(len(b), i+4000)])))))
		}
	}
	return failures
}

// logs lists the *.log files the commands wrote at the top of the working
// directory.
func (r *runner) logs() []string {
	paths, _ := filepath.Glob(filepath.Join(r.dir, "*.log"))
	return paths
}

// logTails returns the last lines of the logs in the working directory, to
// show with a failure (a node that did not start says why there).
func (r *runner) logTails() string {
	var b strings.Builder
	for _, path := range r.logs() {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "%s (last lines):\n%s\n", filepath.Base(path), indentLines(tail(outputLines(string(data)), 20)))
	}
	return b.String()
}

// errTimeout is a command that ran past the runner's timeout.
var errTimeout = errors.New("timed out")

// foreground runs one command to its end, output and errors merged, and then
// kills whatever it left running in its process group.
func (r *runner) foreground(ctx context.Context, c command) (string, error) {
	var out bytes.Buffer
	cmd := exec.Command("bash", "--noprofile", "--norc", "-c", r.prelude()+c.shellText()+"\n"+r.epilogue())
	cmd.Dir = r.dir
	cmd.Env = r.env
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return "", err
	}
	pgid := cmd.Process.Pid
	defer syscall.Kill(-pgid, syscall.SIGKILL)
	timer := time.AfterFunc(r.timeout, func() { syscall.Kill(-pgid, syscall.SIGKILL) })
	defer timer.Stop()
	stop := context.AfterFunc(ctx, func() { syscall.Kill(-pgid, syscall.SIGKILL) })
	defer stop()
	err := cmd.Wait()
	if !timer.Stop() {
		return out.String(), fmt.Errorf("%w after %s", errTimeout, r.timeout)
	}
	if ctx.Err() != nil {
		return out.String(), ctx.Err()
	}
	if errors.Is(err, exec.ErrWaitDelay) {
		err = nil // the command finished; a child it left held the output open
	}
	return out.String(), err
}

// start starts a background command in its own process group, its output
// going to a log file.
func (r *runner) start(k int, c command) error {
	logPath := filepath.Join(r.state, fmt.Sprintf("background-%d.log", k))
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	// The trap keeps bash from dying at once on the group's SIGTERM: it runs
	// once the command (a node draining) has exited, so "done" means the
	// process let go of its ports. A trapped signal is not inherited: the
	// command gets SIGTERM as usual.
	cmd := exec.Command("bash", "--noprofile", "--norc", "-c", r.prelude()+"trap : TERM\n"+c.shellText())
	cmd.Dir = r.dir
	cmd.Env = r.env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	p := &bgProc{cmd: cmd, k: k, log: logPath, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	r.bg = append(r.bg, p)
	return nil
}

// stopAll stops the background processes (SIGTERM to the group, SIGKILL
// after stopGrace) and checks each one ran until then and printed the lines
// its document shows.
func (r *runner) stopAll(d *doc) []string {
	var failures []string
	for _, p := range r.bg {
		select {
		case <-p.done:
		default:
			p.killed = true
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		}
	}
	for _, p := range r.bg {
		select {
		case <-p.done:
		case <-time.After(stopGrace):
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // what it left behind
		c := d.cmds[p.k]
		b, _ := os.ReadFile(p.log)
		got := outputLines(string(b))
		if !p.killed {
			failures = append(failures, fmt.Sprintf("%s: the background command exited (%v) before the transcript ended; its output:\n%s",
				c.where(d.path), p.err, indentLines(tail(got, 30))))
			continue
		}
		if i := strings.Index(string(b), raceMarker); i >= 0 {
			failures = append(failures, fmt.Sprintf("%s: the background process reported a data race:\n%s",
				c.where(d.path), indentLines(outputLines(string(b[i:min(len(b), i+4000)])))))
		}
		if !containsInOrder(c.want, got) {
			failures = append(failures, fmt.Sprintf("%s: the background command did not print, in order:\n%s\nits output:\n%s",
				c.where(d.path), indentLines(c.want), indentLines(tail(got, 30))))
		}
	}
	return failures
}

func tail(lines []string, n int) []string {
	if len(lines) > n {
		return lines[len(lines)-n:]
	}
	return lines
}
