package main

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cli"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/node"
)

func TestRunFlags(t *testing.T) {
	dir := t.TempDir()
	goodTopo, badTopo := cluster.TopologyFiles(t, dir)
	cluster.TestRun(t, run, []cluster.RunCase{
		{Name: "exposed without certs", Args: []string{"--config", goodTopo, "--id", "r1-1", "--http-addr", "0.0.0.0:0"}, WantErr: "refusing to listen beyond loopback without TLS (--http-addr 0.0.0.0:0)"},
		{Name: "exposed dev without certs", Args: []string{"--dev", "--grpc-addr", ":7070"}, WantErr: "--grpc-addr :7070"},
		{Name: "missing certs dir", Args: []string{"--config", goodTopo, "--id", "r1-1", "--certs-dir", filepath.Join(dir, "nocerts")}, WantErr: "--certs-dir"},
		{Name: "missing auth file", Args: []string{"--config", goodTopo, "--id", "r1-1", "--auth-file", filepath.Join(dir, "noauth.yaml")}, WantErr: "--auth-file"},
		{Name: "bad raft cap", Args: []string{"--dev", "--raft-max-conns", "0"}, WantErr: "--raft-max-conns must be positive"},
		{Name: "bad raft cap by its former name", Args: []string{"--dev", "--max-raft-conns", "0"}, WantErr: "--raft-max-conns must be positive"},
		{Name: "help lists testing flags apart", Args: []string{"--help"}, WantOut: "--help-testing lists them"},
		{Name: "help", Args: []string{"--help"}, WantOut: "--clock-skew-margin"},
		{Name: "version", Args: []string{"--version"}, WantOut: "idemnode v"},
		{Name: "nothing", Args: nil, WantErr: "either --dev or --config"},
		{Name: "unknown flag", Args: []string{"--bogus"}, WantErr: "flag provided but not defined: -bogus"},
		{Name: "stray argument", Args: []string{"--dev", "extra"}, WantErr: `unexpected argument "extra"`},
		{Name: "dev and config", Args: []string{"--dev", "--config", "x.yaml"}, WantErr: "exclude each other"},
		{Name: "config without id", Args: []string{"--config", badTopo}, WantErr: "--id is required"},
		{Name: "missing file", Args: []string{"--config", filepath.Join(dir, "nope.yaml"), "--id", "a"}, WantErr: "nope.yaml"},
		{Name: "invalid topology", Args: []string{"--config", badTopo, "--id", "a"}, WantErr: "shards_per_region"},
		{Name: "bad margin", Args: []string{"--dev", "--clock-skew-margin", "-1s"}, WantErr: "--clock-skew-margin must not be negative"},
		{Name: "negative gc headroom", Args: []string{"--dev", "--gc-headroom-bytes", "-1"}, WantErr: `invalid value "-1" for flag -gc-headroom-bytes`},
		{Name: "help names the gc headroom", Args: []string{"--help"}, WantOut: "--gc-headroom-bytes BYTES"},
		{Name: "bad max response", Args: []string{"--dev", "--max-response-bytes", "0"}, WantErr: "--max-response-bytes must be positive"},
		{Name: "testing flag without the environment", Args: []string{"--dev", "--testing-fail-log-commits-after", "3"}, WantErr: "IDEM_ENABLE_FAULT_INJECTION=1"},
		{Name: "crash flag without the environment", Args: []string{"--dev", "--testing-crash-during-restore", "5"}, WantErr: "--testing-crash-during-restore=5: fault injection for tests only"},
		{Name: "help names the crash flag as testing only", Args: []string{"--help-testing"}, WantOut: "TESTING ONLY (needs IDEM_ENABLE_FAULT_INJECTION=1): exit at once with status 86"},
		{Name: "bad max clock offset", Args: []string{"--dev", "--max-clock-offset", "-1s"}, WantErr: "--max-clock-offset must not be negative"},
		{Name: "pprof not loopback", Args: []string{"--dev", "--pprof-addr", "0.0.0.0:6060"}, WantErr: "--pprof-addr \"0.0.0.0:6060\": only a loopback address"},
		{Name: "pprof not host:port", Args: []string{"--dev", "--pprof-addr", "6060"}, WantErr: "--pprof-addr \"6060\" is not HOST:PORT"},
		{Name: "state cache too small", Args: []string{"--dev", "--state-cache-bytes", "1000"}, WantErr: "--state-cache-bytes must be 0 (the default) or at least 64 MiB"},
		{Name: "bad log level", Args: []string{"--dev", "--log-level", "loud"}, WantErr: "--log-level"},
		{Name: "bad packing mode", Args: []string{"--dev", "--raft-pack-commands=sometimes"}, WantErr: "not a packing mode"},
		{Name: "bad log store", Args: []string{"--dev", "--raft-log-store", "rocks"}, WantErr: `--raft-log-store "rocks": want one of pebble, bolt`},
	})
}

// --raft-pack-commands: auto by default; bare (as when it was a bool) on;
// =true and =false still work.
func TestPackFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want node.PackMode
	}{
		{nil, node.PackAuto},
		{[]string{"--raft-pack-commands"}, node.PackOn},
		{[]string{"--raft-pack-commands=true"}, node.PackOn},
		{[]string{"--raft-pack-commands=false"}, node.PackOff},
		{[]string{"--raft-pack-commands=off"}, node.PackOff},
		{[]string{"--raft-pack-commands=auto"}, node.PackAuto},
	} {
		o, cfg := devConfig(t, tc.args...)
		if o.cfg.PackCommands != tc.want || cfg.PackCommands != tc.want {
			t.Errorf("%v: mode %v, node config %v; want %v", tc.args, o.cfg.PackCommands, cfg.PackCommands, tc.want)
		}
	}
	// As a boolean-style flag it never takes the next argument as its value.
	if _, err := parseFlags([]string{"--dev", "--raft-pack-commands", "off"}, io.Discard); err == nil || !strings.Contains(err.Error(), `unexpected argument "off"`) {
		t.Errorf("--raft-pack-commands off: %v, want the stray argument refused (the value needs =)", err)
	}
}

// TestDevModeEndToEnd runs the real binary in dev mode and walks every
// endpoint through its outcomes and errors, then restarts it on the same
// data dir and drains it with SIGTERM.
func TestDevModeEndToEnd(t *testing.T) {
	ports, err := launch.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	dir := t.TempDir()
	p := &launch.Process{Name: "dev", Bin: binaries.Path(t, "idemnode"), Log: filepath.Join(dir, "dev.log"), Args: []string{
		"--dev", "--data-dir", filepath.Join(dir, "data"), "--http-addr", httpAddr,
		"--grpc-addr", "127.0.0.1:" + strconv.Itoa(ports[1]), "--raft-addr", "127.0.0.1:" + strconv.Itoa(ports[2]),
		"--max-response-bytes", "1000", "--clock-skew-margin", "100ms",
	}}
	start := func() {
		t.Helper()
		started := time.Now()
		startReady(t, p, httpAddr)
		t.Logf("dev node ready in %s", time.Since(started))
	}
	start()
	t.Cleanup(func() { p.Kill() })
	api := cluster.NewAPI(httpAddr)
	ctx := t.Context()
	ok := want(t, http.StatusOK)

	// Liveness and metrics.
	ok(api.Do(ctx, "GET", "/healthz", nil))
	m := ok(api.Do(ctx, "GET", "/metrics", nil))
	if !bytes.Contains(m.Raw, []byte("idem_")) {
		t.Fatal("/metrics has no idem_ metrics")
	}
	// The collector is paced for a small live heap (internal/gctune): more
	// room than the node's GOGC=50 gives it.
	if g, err := cluster.MetricSum(ctx, httpAddr, "go_gc_gogc_percent"); err != nil || g <= 50 {
		t.Fatalf("go_gc_gogc_percent %v: the dev node's small heap should get --gc-headroom-bytes of room, GOGC above 50 (%v)", g, err)
	}

	// Reserve outcomes.
	acq := ok(api.Reserve(ctx, "payments", "order:1", map[string]any{"fingerprint": "sha:1"}))
	if acq.Str("outcome") != "ACQUIRED" || len(acq.Str("owner_token")) < 16 || acq.Str("fencing_token") == "" || acq.Str("lease_expires_at") == "" {
		t.Fatalf("acquire: %s", acq)
	}
	owner := acq.Str("owner_token")
	if r := ok(api.Reserve(ctx, "payments", "order:1", map[string]any{"fingerprint": "sha:1"})); r.Str("outcome") != "IN_PROGRESS" || r.Body["retry_after_ms"] == nil {
		t.Fatalf("second reserve: %s", r)
	}
	if r := ok(api.Reserve(ctx, "payments", "order:1", map[string]any{"fingerprint": "sha:2"})); r.Str("outcome") != "FINGERPRINT_MISMATCH" {
		t.Fatalf("mismatch: %s", r)
	}
	if r := ok(api.Reserve(ctx, "payments", "order:1", map[string]any{"fingerprint": "sha:1", "owner_token": owner})); r.Str("outcome") != "ACQUIRED" || r.Str("fencing_token") != acq.Str("fencing_token") {
		t.Fatalf("same owner again: %s", r)
	}
	if r := ok(api.Heartbeat(ctx, "payments", "order:1", map[string]any{"owner_token": owner, "lease_ms": 60000})); r.Str("lease_expires_at") == "" {
		t.Fatalf("heartbeat: %s", r)
	}
	g := ok(api.Get(ctx, "payments", "order:1"))
	if g.Str("state") != "IN_PROGRESS" || g.Body["owner_token"] != nil || g.Str("fencing_token") != acq.Str("fencing_token") {
		t.Fatalf("get in progress: %s", g)
	}
	body := base64.StdEncoding.EncodeToString([]byte(`{"charge":"ch_1"}`))
	done := ok(api.Complete(ctx, "payments", "order:1", map[string]any{"owner_token": owner,
		"response": map[string]any{"status": 201, "headers": map[string]string{"Content-Type": "application/json"}, "body": body}}))
	again := ok(api.Complete(ctx, "payments", "order:1", map[string]any{"owner_token": owner, "retention_s": 5,
		"response": map[string]any{"status": 201, "headers": map[string]string{"Content-Type": "application/json"}, "body": body}}))
	if done.Str("completed_at") != again.Str("completed_at") || done.Str("expires_at") != again.Str("expires_at") {
		t.Fatalf("repeated complete: %s vs %s", done, again)
	}
	replay := ok(api.Reserve(ctx, "payments", "order:1", map[string]any{"fingerprint": "sha:1"}))
	resp, _ := replay.Body["response"].(map[string]any)
	if replay.Str("outcome") != "COMPLETED" || resp["body"] != body || resp["status"] != float64(201) {
		t.Fatalf("replay: %s", replay)
	}
	// Release: of a completed key 409, of an in-progress key 200 and a larger token next.
	want(t, 409)(api.Release(ctx, "payments", "order:1", map[string]any{"owner_token": owner}))
	r2 := ok(api.Reserve(ctx, "payments", "order:2", nil))
	ok(api.Release(ctx, "payments", "order:2", map[string]any{"owner_token": r2.Str("owner_token")}))
	r3 := ok(api.Reserve(ctx, "payments", "order:2", nil))
	f2, _ := strconv.ParseUint(r2.Str("fencing_token"), 10, 64)
	f3, _ := strconv.ParseUint(r3.Str("fencing_token"), 10, 64)
	if r3.Str("outcome") != "ACQUIRED" || f3 <= f2 {
		t.Fatalf("after release: %s (before %s)", r3, r2)
	}
	// RECLAIMED after a short lease and the 100ms margin.
	short := ok(api.Reserve(ctx, "payments", "order:3", map[string]any{"lease_ms": 100}))
	testutil.Until(t, 5*time.Second, "RECLAIMED", func() bool {
		r := ok(api.Reserve(ctx, "payments", "order:3", nil))
		if r.Str("outcome") == "RECLAIMED" {
			if r.Str("previous_fencing_token") != short.Str("fencing_token") {
				t.Fatalf("reclaim: %s", r)
			}
			return true
		}
		return false
	})

	// Documented errors; the node keeps serving after each.
	for _, tc := range []struct {
		method, path string
		body         any
		status       int
		code         string
	}{
		{"POST", cluster.KeyPath("payments", "k") + ":reserve", "{not json", 400, "INVALID_ARGUMENT"},
		{"POST", cluster.KeyPath("payments", "k") + ":reserve", `{"lease_ms": 50}`, 400, "INVALID_ARGUMENT"},
		{"POST", cluster.KeyPath("payments", "k") + ":reserve", `{"extra": true}`, 400, "INVALID_ARGUMENT"},
		{"POST", cluster.KeyPath("payments", "k") + ":reserve", `{"owner_token": "short"}`, 400, "INVALID_ARGUMENT"},
		{"POST", cluster.KeyPath("Bad_NS", "k") + ":reserve", `{}`, 400, "INVALID_ARGUMENT"},
		{"POST", "/v1/namespaces/payments/keys/:reserve", `{}`, 404, "NOT_FOUND"},
		{"POST", cluster.KeyPath("payments", "k") + ":explode", `{}`, 404, "NOT_FOUND"},
		{"GET", "/v2/whatever", nil, 404, "NOT_FOUND"},
		{"GET", cluster.KeyPath("payments", "never-seen"), nil, 404, "NOT_FOUND"},
		{"POST", cluster.KeyPath("payments", "k") + ":heartbeat", `{}`, 400, "INVALID_ARGUMENT"},
		{"POST", cluster.KeyPath("payments", "nobody") + ":heartbeat", `{"owner_token":"abcdefghijklmnop"}`, 409, "NOT_OWNER"},
		{"POST", cluster.KeyPath("payments", "order:2") + ":complete", `{"owner_token":"` + r3.Str("owner_token") + `","response":{"status":200,"body":"` +
			base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("x"), 1001)) + `"}}`, 413, "PAYLOAD_TOO_LARGE"},
		{"POST", cluster.KeyPath("payments", "order:2") + ":complete", `{"owner_token":"` + r3.Str("owner_token") + `","response":{"status":600}}`, 400, "INVALID_ARGUMENT"},
	} {
		r, err := api.Do(ctx, tc.method, tc.path, tc.body)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != tc.status || r.ErrCode() != tc.code {
			t.Fatalf("%s %s %v: got %s, want %d %s", tc.method, tc.path, tc.body, r, tc.status, tc.code)
		}
		ok(api.Do(ctx, "GET", "/healthz", nil))
	}

	// Restart on the same data dir: the completed record replays byte for byte.
	if err := p.Stop(15 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	start()
	after := ok(api.Reserve(ctx, "payments", "order:1", map[string]any{"fingerprint": "sha:1"}))
	if !bytes.Equal(after.Raw, replay.Raw) {
		t.Fatalf("replay changed across restart:\n%s\n%s", replay.Raw, after.Raw)
	}
	stopped := time.Now()
	if err := p.Stop(15 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	t.Logf("drained in %s", time.Since(stopped))
}

// startDev starts a dev node on free loopback ports with env added to its
// environment and extra flags, and waits until it is ready; it is killed
// when the test ends. It returns the node's HTTP address and process.
func startDev(t *testing.T, env []string, extra ...string) (string, *launch.Process) {
	t.Helper()
	return startDevVia(t, nil, env, extra...)
}

// startDevVia is startDev with the node started through launcher: a
// command that ends by executing its arguments (nil: none).
func startDevVia(t *testing.T, launcher []string, env []string, extra ...string) (string, *launch.Process) {
	t.Helper()
	ports, err := launch.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	dir := t.TempDir()
	bin, args := binaries.Path(t, "idemnode"), []string(nil)
	if len(launcher) > 0 {
		bin, args = launcher[0], append(slices.Clone(launcher[1:]), binaries.Path(t, "idemnode"))
	}
	p := &launch.Process{Name: "dev", Bin: bin, Log: filepath.Join(dir, "dev.log"), Env: env, Args: append(append(args,
		"--dev", "--data-dir", filepath.Join(dir, "data"), "--http-addr", httpAddr,
		"--grpc-addr", "127.0.0.1:"+strconv.Itoa(ports[1]), "--raft-addr", "127.0.0.1:"+strconv.Itoa(ports[2])),
		extra...)}
	t.Cleanup(func() { p.Kill() })
	startReady(t, p, httpAddr)
	return httpAddr, p
}

// idemnode runs as Go runs it: no re-execution, its environment as given
// (the GODEBUG an operator set, nothing added), and no line about Go's
// system monitor at start (internal/cli, sysmon.go).
func TestSysmonLeftToGo(t *testing.T) {
	if os.Getenv("GODEBUG") != "" {
		t.Skip("GODEBUG is set in the test's environment; the node would read that one first")
	}
	_, p := startDev(t, []string{"GODEBUG=gctrace=0"})
	env := environOf(t, p.Pid())
	if !slices.Contains(env, "GODEBUG=gctrace=0") {
		t.Fatalf("the node's GODEBUG is not the one it was given, gctrace=0: %q", env)
	}
	data, _ := os.ReadFile(p.Log)
	if bytes.Contains(data, []byte("system monitor")) {
		t.Fatalf("the log speaks of the system monitor although nothing asked for it:\n%s", data)
	}
}

// GODEBUG=schedtrace=2147483647 is the operator's opt-in: the node runs with
// it as given and says so at start.
func TestSysmonOptIn(t *testing.T) {
	if os.Getenv("GODEBUG") != "" {
		t.Skip("GODEBUG is set in the test's environment; the node would read that one first")
	}
	_, p := startDev(t, []string{"GODEBUG=" + cli.SysmonSetting})
	if env := environOf(t, p.Pid()); !slices.Contains(env, "GODEBUG="+cli.SysmonSetting) {
		t.Fatalf("the node's environment lacks GODEBUG=%s: %q", cli.SysmonSetting, env)
	}
	data, _ := os.ReadFile(p.Log)
	if !bytes.Contains(data, []byte(`system monitor kept out of its deep sleep (see docs/operations.md, \"Go's system monitor\")" reason="GODEBUG has schedtrace=2147483647"`)) {
		t.Fatalf("the log does not say the operator's opt-in is on:\n%s", data)
	}
}

// A dev node's first log lines are for someone starting idem for the first
// time: where its data is, where it listens and how to stop it, each said
// once; the collector's pacing is a debug line, not the first thing read.
func TestDevNodeStartLog(t *testing.T) {
	httpAddr, p := startDev(t, nil)
	data, err := os.ReadFile(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) == 0 || !strings.Contains(lines[0], `msg="state engine open"`) || !strings.Contains(lines[0], " dir=") {
		t.Fatalf("the first log line should say where the data is, it is %q:\n%s", lines[0], data)
	}
	if bytes.Contains(data, []byte("garbage collector paced")) {
		t.Errorf("the collector's pacing is logged at the default level:\n%s", data)
	}
	serving := -1
	for i, l := range lines {
		if strings.Count(l, " node=") > 1 {
			t.Errorf("line %d names the node more than once: %s", i+1, l)
		}
		if strings.Contains(l, `msg="raft host listening"`) && !strings.Contains(l, " listen=127.0.0.1:") {
			t.Errorf("the Raft listener's line lacks its address: %s", l)
		}
		if serving < 0 && strings.Contains(l, `msg="idemnode serving"`) {
			serving = i
		}
	}
	if serving < 0 {
		t.Fatalf("no \"idemnode serving\" line:\n%s", data)
	}
	for _, want := range []string{" http=" + httpAddr, " grpc=127.0.0.1:", " raft=127.0.0.1:", " data_dir=", ` stop="SIGTERM or Ctrl-C`} {
		if !strings.Contains(lines[serving], want) {
			t.Errorf("the serving line lacks %q: %s", want, lines[serving])
		}
	}
	// Before it serves, a dev node logs its data, its Raft listener, each
	// shard's state and bootstrap (the meta group and its shard), admission
	// and packing: 13 lines. A few more is a drift to look at, not a failure
	// of idem, but the test holds the line.
	// Leadership lines interleave by timing, so what is bounded is the
	// kinds of line (distinct msg values, 7 today), not their count.
	kinds := map[string]bool{}
	for i, l := range lines[:serving+1] {
		msg, ok := slogMsg(l)
		if !ok {
			t.Fatalf("line %d is not a slog text line with a msg: %s", i+1, l)
		}
		kinds[msg] = true
	}
	t.Logf("%d kinds of log line before the node serves: %q", len(kinds), slices.Sorted(maps.Keys(kinds)))
	if len(kinds) > 10 {
		t.Errorf("%d kinds of log line before the node serves, want at most 10: %q\n%s", len(kinds), slices.Sorted(maps.Keys(kinds)), strings.Join(lines[:serving+1], "\n"))
	}
}

// slogMsg is the whole msg value of a line of slog's text handler: quoted
// (and then unquoted here) when it holds a space, '=' or '"', bare when not.
func slogMsg(line string) (string, bool) {
	i := strings.Index(" "+line, " msg=")
	if i < 0 {
		return "", false
	}
	v := line[i+len("msg="):]
	if strings.HasPrefix(v, `"`) {
		q, err := strconv.QuotedPrefix(v)
		if err != nil {
			return "", false
		}
		msg, err := strconv.Unquote(q)
		return msg, err == nil
	}
	msg, _, _ := strings.Cut(v, " ")
	return msg, true
}

// A node in a cgroup with a memory limit (a container's) sets Go's soft
// memory limit to 90% of it, so the collector works harder near the limit
// instead of the kernel killing the node over it; GOMEMLIMIT in the
// environment wins. The test makes a cgroup v1 memory group of its own and
// starts the node in it: it needs root and a writable v1 memory hierarchy
// (internal/gctune's unit tests cover v2 and the parsing everywhere).
func TestMemorySoftLimitFromCgroup(t *testing.T) {
	const mount = "/sys/fs/cgroup/memory"
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a cgroup")
	}
	if _, err := os.Stat(filepath.Join(mount, "memory.limit_in_bytes")); err != nil {
		t.Skipf("no cgroup v1 memory hierarchy at %s: %v", mount, err)
	}
	group := filepath.Join(mount, fmt.Sprintf("idem-test-%d", os.Getpid()))
	if err := os.Mkdir(group, 0o755); err != nil {
		t.Skipf("cannot make a cgroup here: %v", err)
	}
	t.Cleanup(func() {
		// The group can be removed once the node in it has exited; the
		// node is killed by startDev's cleanup, which runs first.
		for range 50 {
			if os.Remove(group) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	const limit = 1 << 30
	if err := os.WriteFile(filepath.Join(group, "memory.limit_in_bytes"), []byte(strconv.Itoa(limit)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The shell joins the group, then becomes the node.
	launcher := []string{"/bin/sh", "-c", `echo $$ > "` + filepath.Join(group, "cgroup.procs") + `" && exec "$@"`, "sh"}
	for _, tc := range []struct {
		name string
		env  []string
		want float64
		log  string
	}{
		{"from the cgroup", nil, float64(limit / 10 * 9), `memory soft limit set from the cgroup's limit`},
		{"GOMEMLIMIT wins", []string{"GOMEMLIMIT=300MiB"}, 300 << 20, `memory soft limit left to GOMEMLIMIT from the environment`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			httpAddr, p := startDevVia(t, launcher, tc.env)
			if got, err := cluster.MetricSum(t.Context(), httpAddr, "go_gc_gomemlimit_bytes"); err != nil || got != tc.want {
				t.Fatalf("go_gc_gomemlimit_bytes %v (%v), want %v", got, err, tc.want)
			}
			if data, _ := os.ReadFile(p.Log); !bytes.Contains(data, []byte(tc.log)) {
				t.Fatalf("the log lacks %q:\n%s", tc.log, data)
			}
			p.Kill()
		})
	}
}

// environOf is the environment process pid runs with now (after any exec).
func environOf(t *testing.T, pid int) []string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
}

// GOGC in the environment replaces the node's pacing (GOGC=50 and the
// --gc-headroom-bytes room) entirely.
func TestGOGCFromTheEnvironmentWins(t *testing.T) {
	httpAddr, p := startDev(t, []string{"GOGC=80"})
	// Collections meanwhile would have moved a tuner's GOGC off 80.
	if g, err := cluster.MetricSum(t.Context(), httpAddr, "go_gc_gogc_percent"); err != nil || g != 80 {
		t.Fatalf("go_gc_gogc_percent %v (%v), want the environment's 80", g, err)
	}
	data, _ := os.ReadFile(p.Log)
	if !bytes.Contains(data, []byte("garbage collector left to GOGC from the environment")) {
		t.Fatalf("the log does not say GOGC came from the environment:\n%s", data)
	}
}

func TestSlogMsg(t *testing.T) {
	for _, msg := range []string{"serving", "state engine open", `say "hi"`, "a=b", "trailing "} {
		var buf bytes.Buffer
		slog.New(slog.NewTextHandler(&buf, nil)).Info(msg, "dir", "/tmp/x y", "msg2", "msg=no")
		if got, ok := slogMsg(strings.TrimSuffix(buf.String(), "\n")); !ok || got != msg {
			t.Errorf("slogMsg(%q) = %q, %v; want %q", buf.String(), got, ok, msg)
		}
	}
}
