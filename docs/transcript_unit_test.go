package docs

import (
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseFindsOnlyConsoleBlocks(t *testing.T) {
	text := strings.Join([]string{
		"# Title",
		"$ not in a block",
		"```sh",
		"$ echo sh block",
		"```",
		"````console",
		"$ echo four backticks",
		"```",
		"not the end: a shorter fence",
		"````",
		"~~~ console ",
		"$ echo tildes",
		"tildes",
		"~~~",
		"```consoles",
		"$ echo other info string",
		"```",
		"```text",
		"    ```console",
		"    $ echo shown inside a text block",
		"    ```",
		"```",
		"- item",
		"",
		"  ```console",
		"  $ echo in a list",
		"  in a list",
		"  ```",
	}, "\n")
	d, err := parseDoc("x.md", text)
	if err != nil {
		t.Fatal(err)
	}
	var got [][2]string
	for _, c := range d.cmds {
		got = append(got, [2]string{c.text, strings.Join(c.want, "|")})
	}
	want := [][2]string{
		{"echo four backticks", "```|not the end: a shorter fence"},
		{"echo tildes", "tildes"},
		{"echo in a list", "in a list"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("commands %q, want %q", got, want)
	}
	if d.cmds[2].indent != "  " || d.cmds[2].line != 25 {
		t.Fatalf("list block: indent %q line %d, want \"  \" and 25", d.cmds[2].indent, d.cmds[2].line)
	}
}

func TestParseGroupsCommandsAndOutput(t *testing.T) {
	text := strings.Join([]string{
		"```console",
		"",
		"$ first \\",
		"    --flag",
		"out 1",
		"",
		"out 2",
		"",
		"$ second &",
		"$ cat <<-'END' >f",
		"\tbody $x",
		"\tEND",
		"$ third",
		"```",
	}, "\n")
	d, err := parseDoc("x.md", text)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		text       string
		background bool
		want       []string
		line       int
	}
	var cmds []got
	for _, c := range d.cmds {
		cmds = append(cmds, got{c.text, c.background, c.want, c.line})
	}
	want := []got{
		{"first \\\n    --flag", false, []string{"out 1", "", "out 2"}, 2},
		{"second ", true, nil, 8},
		{"cat <<-'END' >f\n\tbody $x\n\tEND", false, nil, 9},
		{"third", false, nil, 12},
	}
	if !reflect.DeepEqual(cmds, want) {
		t.Fatalf("got  %+v\nwant %+v", cmds, want)
	}
}

func TestParseRejectsMalformedBlocks(t *testing.T) {
	for name, text := range map[string]string{
		"output first":    "```console\nhello\n$ echo hello\n```",
		"unclosed":        "```console\n$ echo hello\n",
		"continuation":    "```console\n$ echo \\\n```",
		"open heredoc":    "```console\n$ cat <<EOF\nbody\n```",
		"unclosed other":  "```sh\necho\n",
		"output no space": "```console\n$echo hi\nhi\n```",
	} {
		if _, err := parseDoc("x.md", text); err == nil {
			t.Errorf("%s: parsed without an error:\n%s", name, text)
		}
	}
}

func TestGoRunRunsTheBuiltBinary(t *testing.T) {
	for in, want := range map[string]string{
		"go run ./cmd/idemnode --dev":                "idemnode --dev",
		"go run ./cmd/idemctl/ status":               "idemctl status",
		"x=$(go run ./cmd/idemctl get a b)":          "x=$(idemctl get a b)",
		"go run ./examples/proxy":                    "go run ./examples/proxy",
		"go run ./cmd/idemnode --dev --data-dir d &": "idemnode --dev --data-dir d &",
	} {
		if got := (command{text: in}).shellText(); got != want {
			t.Errorf("%q runs as %q, want %q", in, got, want)
		}
	}
}

func TestNormalise(t *testing.T) {
	for in, want := range map[string]string{
		`{"lease_expires_at":"2026-12-04T10:23:32.123456789Z"}`: `{"lease_expires_at":"<time>"}`,
		`time=2026-12-04T10:23:32.123+00:00 level=INFO`:         `time=<time> level=INFO`,
		`request 550E8400-e29b-41d4-a716-446655440000 done`:     `request <uuid> done`,
		`took 1.5ms, then 2m3.25s, then 45µs, then 7h`:          `took <duration>, then <duration>, then <duration>, then <duration>`,
		`"owner_token":"k_T6HB-U-CxAjBCIevvX6Q"`:                `"owner_token":"<owner-token>"`,
		`ACQUIRED owner=k_T6HB-U-CxAjBCIevvX6Q fencing_token=3`: `ACQUIRED owner=<owner-token> fencing_token=3`,
		`"owner_token":"my-own-token"`:                          `"owner_token":"my-own-token"`,
		`sha256:9f2c order-42 127.0.0.1:8080 lease_ms=30000`:    `sha256:9f2c order-42 127.0.0.1:8080 lease_ms=30000`,
		`"retry_after_ms":1000, 1min, go1.26   `:                `"retry_after_ms":1000, 1min, go1.26`,
		`KEY      STATE        TOKEN`:                           `KEY  STATE  TOKEN`,
		`   indented  a b`:                                      `   indented  a b`,
	} {
		if got := normalise(in); got != want {
			t.Errorf("normalise(%q)\n = %q\nwant %q", in, got, want)
		}
	}
}

func TestMatchOutput(t *testing.T) {
	for _, tc := range []struct {
		want, got string
		match     bool
	}{
		{"a\nb", "a\nb", true},
		{"a\nb", "a\nc", false},
		{"a", "a\nb", false},
		{"a\nb", "a", false},
		{"", "", true},
		{"", "x", false},
		{"expires 2025-01-01T00:00:00Z", "expires 2026-12-04T10:00:00.1Z", true},
		{"expires 2025-01-01T00:00:00Z", "expires never", false},
		{"fencing_token=...", "fencing_token=12", true},
		{"fencing_token=3 ...", "fencing_token=4 x", false},
		{"a\n...\nz", "a\nz", true},
		{"a\n...\nz", "a\nb\nc\nz", true},
		{"a\n...\nz", "a\nb\nc", false},
		{"(a.b)", "(axb)", false},
	} {
		if got := matchOutput(lines(tc.want), lines(tc.got)); got != tc.match {
			t.Errorf("match(want %q, got %q) = %v, want %v", tc.want, tc.got, got, tc.match)
		}
	}
}

func TestContainsInOrder(t *testing.T) {
	log := lines("time=2026-12-04T10:00:00Z msg=start\nnoise\nmsg=listening addr=127.0.0.1:8080\nmsg=ready")
	for want, ok := range map[string]bool{
		"time=<time> msg=start\nmsg=ready":    true,
		"msg=start":                           false,
		"time=2025-01-01T00:00:00Z msg=start": true,
		"msg=listening addr=...":              true,
		"msg=ready\nmsg=start":                false,
		"msg=stopped":                         false,
		"":                                    true,
	} {
		if got := containsInOrder(lines(want), log); got != ok {
			t.Errorf("containsInOrder(%q) = %v, want %v", want, got, ok)
		}
	}
}

func lines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func readRunnerDoc(t *testing.T) (string, *doc) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "runner.md"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseDoc("testdata/runner.md", string(b))
	if err != nil {
		t.Fatal(err)
	}
	return string(b), d
}

func TestRewriteRoundTrip(t *testing.T) {
	text, d := readRunnerDoc(t)
	same := map[int][]string{}
	for k, c := range d.cmds {
		same[k] = c.want
	}
	if got := d.rewrite(same); got != text {
		t.Fatalf("rewriting every command with its own output changed the text:\n%s", got)
	}
	if got := d.rewrite(nil); got != text {
		t.Fatalf("rewriting nothing changed the text:\n%s", got)
	}
	changed := map[int][]string{}
	for k := range d.cmds {
		changed[k] = []string{"new " + strings.Repeat("x", k), "", "second line"}
	}
	out := d.rewrite(changed)
	d2, err := parseDoc(d.path, out)
	if err != nil {
		t.Fatal(err)
	}
	if len(d2.cmds) != len(d.cmds) {
		t.Fatalf("after rewrite %d commands, want %d:\n%s", len(d2.cmds), len(d.cmds), out)
	}
	for k, c := range d2.cmds {
		if c.text != d.cmds[k].text || !reflect.DeepEqual(c.want, changed[k]) {
			t.Errorf("command %d after rewrite: %q with %q, want %q with %q", k, c.text, c.want, d.cmds[k].text, changed[k])
		}
	}
	if !strings.Contains(out, "     new ") || !strings.Contains(out, "A long-running process") {
		t.Errorf("rewrite lost the indentation or the prose:\n%s", out)
	}
}

// fakeBin makes a bin dir holding `hello`, which greets its argument or,
// with --serve, prints "serving" and runs until killed.
func fakeBin(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	script := "#!/usr/bin/env bash\nif [ \"$1\" = --serve ]; then echo serving; exec sleep 600; fi\necho \"hello, $1\"\n"
	if err := os.WriteFile(filepath.Join(dir, "hello"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func runText(t *testing.T, text string, timeout time.Duration) (*doc, *runner, result) {
	t.Helper()
	d, err := parseDoc("test.md", text)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRunner(fakeBin(t), t.TempDir(), "..")
	if err != nil {
		t.Fatal(err)
	}
	if timeout > 0 {
		r.timeout = timeout
	}
	return d, r, r.run(t.Context(), d)
}

// TestRunnerFollowsTheFormat runs testdata/runner.md, which uses every rule
// of the format, and checks it passes and leaves no process behind.
func TestRunnerFollowsTheFormat(t *testing.T) {
	text, _ := readRunnerDoc(t)
	d, r, res := runText(t, text, 0)
	for _, f := range res.failures {
		t.Error(f)
	}
	for k, got := range res.mismatched {
		t.Errorf("%s\nwant %q\ngot  %q", d.cmds[k].where(d.path), d.cmds[k].want, got)
	}
	if len(r.bg) != 1 {
		t.Fatalf("%d background processes, want 1", len(r.bg))
	}
	if err := syscall.Kill(-r.bg[0].cmd.Process.Pid, 0); err != syscall.ESRCH {
		t.Errorf("the background process group is still there after the run (kill 0: %v)", err)
	}
	if _, err := os.Stat(filepath.Join(r.dir, "sub")); err != nil {
		t.Errorf("the directory a command made is not in the working directory: %v", err)
	}
}

func TestRunnerReportsMismatches(t *testing.T) {
	text := "```console\n$ echo right\nright\n$ echo wrong\nright\n$ echo more\nmore\n```\n"
	d, _, res := runText(t, text, 0)
	if len(res.failures) != 0 {
		t.Fatalf("failures: %q", res.failures)
	}
	if !reflect.DeepEqual(res.mismatched, map[int][]string{1: {"wrong"}}) {
		t.Fatalf("mismatched %v, want command 1 with [wrong]", res.mismatched)
	}
	// Rewriting takes the actual output, and the result then passes.
	d2, err := parseDoc(d.path, d.rewrite(res.mismatched))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"wrong"}; !reflect.DeepEqual(d2.cmds[1].want, want) {
		t.Fatalf("after rewrite command 1 expects %q, want %q", d2.cmds[1].want, want)
	}
}

func TestRunnerFailsSilentFailures(t *testing.T) {
	_, _, res := runText(t, "```console\n$ false\n$ curl -sf http://127.0.0.1:1/readyz | cat\n$ echo after\nafter\n```\n", 0)
	if len(res.failures) != 2 || !strings.Contains(res.failures[0], "$ false") || !strings.Contains(res.failures[1], "curl") {
		t.Fatalf("failures %q, want one for `false` and one for the curl pipeline", res.failures)
	}
	if len(res.mismatched) != 0 {
		t.Fatalf("mismatched %v, want none", res.mismatched)
	}
}

func TestRunnerStopsAtATimeout(t *testing.T) {
	_, _, res := runText(t, "```console\n$ echo a; sleep 30\na\n$ echo b\nb\n```\n", 300*time.Millisecond)
	if len(res.failures) != 2 || !strings.Contains(res.failures[0], "timed out") || !strings.Contains(res.failures[1], "not run") {
		t.Fatalf("failures %q, want a timeout and a command not run", res.failures)
	}
}

func TestRunnerChecksBackgroundProcesses(t *testing.T) {
	_, _, res := runText(t, "```console\n$ echo $$ >pid &\n$ hello --serve &\nlistening\n"+
		"$ for i in $(seq 1000); do kill -0 $(cat pid) 2>/dev/null || break; sleep 0.01; done\n```\n", 0)
	if len(res.failures) != 2 || !strings.Contains(res.failures[0], "exited") || !strings.Contains(res.failures[1], "did not print") {
		t.Fatalf("failures %q, want an early exit and a missing line", res.failures)
	}
}

func TestCheckPortsNamesTheTakenPort(t *testing.T) {
	l, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := l.Addr().String()
	d, err := parseDoc("p.md", "```console\n$ curl -s "+addr+"/readyz\n```\n")
	if err != nil {
		t.Fatal(err)
	}
	err = checkPorts(d, nil, "..")
	if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "p.md:2") {
		t.Fatalf("checkPorts with %s taken: %v", addr, err)
	}
	l.Close()
	if err := checkPorts(d, nil, ".."); err != nil {
		t.Fatalf("checkPorts with %s free: %v", addr, err)
	}
	dev, err := parseDoc("p.md", "```console\n$ go run ./cmd/idemnode --dev --http-addr 127.0.0.1:1 &\n```\n")
	if err != nil {
		t.Fatal(err)
	}
	l2, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	err = checkPorts(dev, map[string]string{"--grpc-addr": l2.Addr().String(), "--http-addr": addr}, "..")
	if err == nil || !strings.Contains(err.Error(), l2.Addr().String()) || !strings.Contains(err.Error(), "--grpc-addr") {
		t.Fatalf("checkPorts with a dev node's default %s taken: %v", l2.Addr(), err)
	}
}

func TestCheckPortsReadsTheFilesACommandNames(t *testing.T) {
	l, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "deploy"), 0o755); err != nil {
		t.Fatal(err)
	}
	topo := "nodes:\n  - raft_addr: " + l.Addr().String() + "\n"
	if err := os.WriteFile(filepath.Join(root, "deploy", "t.yaml"), []byte(topo), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := parseDoc("p.md", "```console\n$ idemnode --config deploy/t.yaml --id n1 &\n```\n")
	if err != nil {
		t.Fatal(err)
	}
	err = checkPorts(d, nil, root)
	if err == nil || !strings.Contains(err.Error(), l.Addr().String()) || !strings.Contains(err.Error(), "in deploy/t.yaml") {
		t.Fatalf("checkPorts with %s of deploy/t.yaml taken: %v", l.Addr(), err)
	}
}

func TestDevDefaults(t *testing.T) {
	help := "  --grpc-addr HOST:PORT\n        HOST:PORT for the gRPC API (dev default 127.0.0.1:7070; else the topology's)\n" +
		"  --http-addr HOST:PORT\n        HOST:PORT for the JSON API (dev default 127.0.0.1:8080; else ...)\n" +
		"  --data-dir DIR\n        DIR (default ./idem-data/<id>, dev: ./idem-data/dev)\n"
	want := map[string]string{"--grpc-addr": "127.0.0.1:7070", "--http-addr": "127.0.0.1:8080"}
	if got := devDefaults(help); !reflect.DeepEqual(got, want) {
		t.Fatalf("devDefaults = %v, want %v", got, want)
	}
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

func TestUsedCommands(t *testing.T) {
	d, err := parseDoc("x.md", "```console\n$ go run ./cmd/idemctl status\n$ echo idemrouter-ish; idembench2\n```\n")
	if err != nil {
		t.Fatal(err)
	}
	got := usedCommands([]string{"idembench", "idemctl", "idemnode", "idemrouter", "regionsim"}, []*doc{d})
	if want := []string{"idemctl", "idemnode", "idemrouter"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("usedCommands = %q, want %q", got, want)
	}
}

// TestEveryPageParses checks README.md and docs/*.md as TestTranscripts reads
// them, without running anything: an unclosed fence or output before a
// command fails here, under -short too, and so does a walkthrough that is
// no longer a console block.
func TestEveryPageParses(t *testing.T) {
	docs, err := transcriptDocs("..")
	if err != nil {
		t.Fatal(err)
	}
	runnable := map[string]bool{}
	for _, d := range docs {
		t.Logf("%s: %d commands", d.path, len(d.cmds))
		runnable[d.path] = true
	}
	// The walkthroughs a newcomer follows stay runnable, hence tested.
	for _, path := range []string{"README.md", "docs/getting-started.md"} {
		if !runnable[path] {
			t.Errorf("%s has no console block: its walkthrough would no longer be tested", path)
		}
	}
}

func TestRunnerFindsDataRacesInLogs(t *testing.T) {
	_, r, res := runText(t, "```console\n$ printf 'ok\\nWARNING: DATA RACE\\nRead at 0x1\\n' >node.log\n$ echo done\ndone\n```\n", 0)
	if len(res.failures) != 1 || !strings.Contains(res.failures[0], "node.log reports a data race") || !strings.Contains(res.failures[0], "Read at 0x1") {
		t.Fatalf("failures %q, want the race in node.log", res.failures)
	}
	if tails := r.logTails(); !strings.Contains(tails, "node.log (last lines):\n    ok\n") {
		t.Fatalf("log tails %q, want node.log's lines", tails)
	}
}

// TestRunnerWaitsForABackgroundProcessToExit checks that stopping waits for
// the command itself, not only for the bash around it: a node that drains on
// SIGTERM holds its ports until it exits, and the next file needs them.
func TestRunnerWaitsForABackgroundProcessToExit(t *testing.T) {
	text := "```console\n$ bash -c 'trap \"sleep 0.2; echo drained; exit 0\" TERM; touch up; while :; do sleep 0.05; done'; true &\ndrained\n" +
		"$ for i in $(seq 1000); do [ -e up ] && break; sleep 0.01; done; echo ok\nok\n```\n"
	_, _, res := runText(t, text, 0)
	if len(res.failures) != 0 || len(res.mismatched) != 0 {
		t.Fatalf("failures %q, mismatched %v: want the drained line, printed after SIGTERM", res.failures, res.mismatched)
	}
}
