package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemtest"
	"github.com/idem-dev/idem/fsm"
	"google.golang.org/grpc/codes"
)

func TestFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--nope"}, "flag provided but not defined"},
		{[]string{"--target", "soap"}, `--target "soap"`},
		{[]string{"--addr", "localhost"}, `--addr "localhost" is not HOST:PORT`},
		{[]string{"--addr", "127.0.0.1:1,bad"}, `--addr "bad"`},
		{[]string{"--concurrency", "0"}, "--concurrency 0"},
		{[]string{"--duration", "-1s"}, "--duration -1s"},
		{[]string{"--duration", "0"}, "--duration 0s"},
		{[]string{"--cycles", "-3"}, "--cycles -3"},
		{[]string{"--body-bytes", "-1"}, "--body-bytes -1"},
		{[]string{"--warmup", "-1s"}, "--warmup -1s"},
		{[]string{"--lease", "1ms"}, "--lease 1ms"},
		{[]string{"--max-attempts", "0"}, "--max-attempts 0"},
		{[]string{"--namespace", ""}, "--namespace is empty"},
		{[]string{"--concurrency", "x"}, "invalid value"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		// Every problem at once.
		{[]string{"--concurrency", "0", "--body-bytes", "-1"}, "--body-bytes -1"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tt.args, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run(%q) = %v, want an error containing %q", tt.args, err, tt.want)
			}
			if stdout.Len() != 0 {
				t.Errorf("a flag error printed figures: %q", stdout.String())
			}
		})
	}
}

func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"--help"}, &stdout, &stderr); err != nil {
		t.Fatalf("--help = %v, want nil", err)
	}
	if !strings.Contains(stderr.String(), "Usage:") || !strings.Contains(stderr.String(), "-concurrency") {
		t.Errorf("--help printed %q", stderr.String())
	}
}

func TestFlagDefaults(t *testing.T) {
	tests := []struct {
		args         []string
		wantAddrs    string
		wantDuration time.Duration
	}{
		{nil, "127.0.0.1:8080", 10 * time.Second},
		{[]string{"--target", "grpc"}, "127.0.0.1:7070", 10 * time.Second},
		{[]string{"--addr", "a:1, b:2"}, "a:1,b:2", 10 * time.Second},
		{[]string{"--cycles", "5"}, "127.0.0.1:8080", 0},
		{[]string{"--cycles", "5", "--duration", "1s"}, "127.0.0.1:8080", time.Second},
	}
	for _, tt := range tests {
		cfg, err := parseFlags(tt.args, &bytes.Buffer{})
		if err != nil {
			t.Fatalf("parseFlags(%q): %v", tt.args, err)
		}
		if got := strings.Join(cfg.Addrs, ","); got != tt.wantAddrs || cfg.Duration != tt.wantDuration {
			t.Errorf("parseFlags(%q): addrs %s, duration %v; want %s, %v", tt.args, got, cfg.Duration, tt.wantAddrs, tt.wantDuration)
		}
		if cfg.Concurrency != 16 || cfg.BodyBytes != 512 || cfg.Namespace != "bench" || cfg.MaxAttempts != 1 {
			t.Errorf("parseFlags(%q) = %+v", tt.args, cfg)
		}
	}
	if _, err := parseFlags([]string{"-h"}, &bytes.Buffer{}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

func TestSummarise(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	got := summarise(ds)
	want := latency{Count: 100, Mean: 50.5, P50: 50, P90: 90, P99: 99, Max: 100}
	if got != want {
		t.Errorf("summarise(1..100ms) = %+v, want %+v", got, want)
	}
	if got := summarise([]time.Duration{7 * time.Millisecond}); got.P50 != 7 || got.P99 != 7 || got.Max != 7 {
		t.Errorf("summarise of one = %+v", got)
	}
	if got := summarise(nil); got != (latency{}) {
		t.Errorf("summarise(nil) = %+v", got)
	}
}

// runJSON runs idembench with --json and decodes its figures.
func runJSON(t *testing.T, args ...string) report {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), append(args, "--json"), &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	var rep report
	dec := json.NewDecoder(&stdout)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("output is not the report JSON: %v\n%s", err, stdout.String())
	}
	return rep
}

func checkFigures(t *testing.T, rep report, wantOK int) {
	t.Helper()
	if rep.CyclesOK != wantOK || rep.CyclesFailed != 0 || len(rep.Errors) != 0 {
		t.Errorf("cycles %d ok, %d failed, errors %v; want %d ok and no errors", rep.CyclesOK, rep.CyclesFailed, rep.Errors, wantOK)
	}
	if rep.CyclesPerSec <= 0 || rep.Elapsed <= 0 {
		t.Errorf("rate %v cycles/s over %vs", rep.CyclesPerSec, rep.Elapsed)
	}
	for name, l := range map[string]latency{"cycle": rep.Cycle, "reserve": rep.Reserve, "complete": rep.Complete} {
		if l.Count != wantOK || !(0 < l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.Max) {
			t.Errorf("%s latency %+v: want %d samples with 0 < p50 <= p90 <= p99 <= max", name, l, wantOK)
		}
	}
	if rep.Cycle.P50 < rep.Reserve.P50 || rep.Cycle.Max < rep.Complete.Max {
		t.Errorf("a cycle (%+v) is shorter than one of its steps (%+v, %+v)", rep.Cycle, rep.Reserve, rep.Complete)
	}
}

func TestGRPC(t *testing.T) {
	srv, err := idemtest.Start(idemtest.Config{MaxResponseBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	rep := runJSON(t, "--target", "grpc", "--addr", srv.Addr(), "--cycles", "300", "--concurrency", "4", "--body-bytes", "100", "--namespace", "bench-grpc")
	checkFigures(t, rep, 300)
	if rep.Stopped != "cycles" || rep.Config.Target != "grpc" || rep.Config.Concurrency != 4 || rep.Config.Addrs[0] != srv.Addr() {
		t.Errorf("report config %+v, stopped by %s", rep.Config, rep.Stopped)
	}
	if r, c := srv.Calls(idemtest.MethodReserve), srv.Calls(idemtest.MethodComplete); r != 300 || c != 300 {
		t.Errorf("server saw %d reserves and %d completes, want 300 each", r, c)
	}

	// Failures are counted by step and kind, and do not stop the run.
	srv.FailNext(idemtest.MethodComplete, 5, codes.Unavailable)
	srv.FailNext(idemtest.MethodReserve, 3, codes.PermissionDenied)
	rep = runJSON(t, "--target", "grpc", "--addr", srv.Addr(), "--cycles", "100", "--concurrency", "2", "--body-bytes", "100")
	if rep.CyclesOK != 92 || rep.CyclesFailed != 8 || rep.Errors["complete:unavailable"] != 5 || rep.Errors["reserve:permissiondenied"] != 3 || len(rep.Errors) != 2 {
		t.Errorf("with 8 injected failures: %d ok, %d failed, errors %v", rep.CyclesOK, rep.CyclesFailed, rep.Errors)
	}
	if !strings.Contains(rep.FirstErrors["complete:unavailable"], "injected failure") {
		t.Errorf("first errors %v lack the server's message", rep.FirstErrors)
	}
}

func TestRunFailsWhenNothingSucceeds(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	var stdout bytes.Buffer
	err = run(t.Context(), []string{"--target", "grpc", "--addr", dead, "--cycles", "3", "--concurrency", "1"}, &stdout, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "no cycle succeeded") {
		t.Errorf("run against a dead address = %v", err)
	}
	if !strings.Contains(stdout.String(), "reserve:unavailable") {
		t.Errorf("figures lack the error counts:\n%s", stdout.String())
	}
}

// jsonAPI serves the two endpoints idembench uses, the JSON API's way, over
// an idemtest store.
type jsonAPI struct {
	t         *testing.T
	store     *idemtest.Server
	bodyBytes int
	reserves  atomic.Int64
	completes atomic.Int64
	// leader, when set, goes in every reserve answer's Idem-Leader header.
	leader atomic.Value // string
}

func (a *jsonAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	writeErr := func(status int, code, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"code":%q,"message":%q}}`, code, msg)
	}
	path := r.URL.EscapedPath()
	m := regexp.MustCompile(`^/v1/namespaces/([^/]+)/keys/([^/]+):(reserve|complete)$`).FindStringSubmatch(path)
	if r.Method != http.MethodPost || m == nil {
		writeErr(404, "NOT_FOUND", "no such endpoint: "+r.Method+" "+path)
		return
	}
	ns, key, verb := m[1], m[2], m[3]
	if !regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`).MatchString(ns) {
		writeErr(400, "INVALID_ARGUMENT", "bad namespace "+ns)
		return
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	now := time.Now()
	switch verb {
	case "reserve":
		a.reserves.Add(1)
		var req struct {
			LeaseMs int64 `json:"lease_ms"`
		}
		if err := dec.Decode(&req); err != nil {
			writeErr(400, "INVALID_ARGUMENT", err.Error())
			return
		}
		res := a.store.Apply(fsm.Command{Op: fsm.OpReserve, Namespace: ns, Key: key, OwnerToken: client.NewOwnerToken(), Lease: int64(30 * time.Second), Now: now.UnixNano()})
		if leader, _ := a.leader.Load().(string); leader != "" {
			w.Header().Set("Idem-Leader", leader)
		}
		json.NewEncoder(w).Encode(map[string]string{
			"outcome":          res.Outcome.String(),
			"owner_token":      res.OwnerToken,
			"fencing_token":    strconv.FormatUint(res.FencingToken, 10),
			"lease_expires_at": time.Unix(0, res.LeaseExpiresAt).UTC().Format(time.RFC3339Nano),
		})
	case "complete":
		a.completes.Add(1)
		var req struct {
			OwnerToken string `json:"owner_token"`
			Response   struct {
				Status  int32             `json:"status"`
				Headers map[string]string `json:"headers"`
				Body    string            `json:"body"`
			} `json:"response"`
		}
		if err := dec.Decode(&req); err != nil {
			writeErr(400, "INVALID_ARGUMENT", err.Error())
			return
		}
		body, err := base64.StdEncoding.DecodeString(req.Response.Body)
		if err != nil || len(body) != a.bodyBytes {
			a.t.Errorf("complete carried a body of %d bytes (%v), want %d", len(body), err, a.bodyBytes)
		}
		res := a.store.Apply(fsm.Command{Op: fsm.OpComplete, Namespace: ns, Key: key, OwnerToken: req.OwnerToken, Now: now.UnixNano(),
			Response: &fsm.Response{Status: req.Response.Status, Headers: req.Response.Headers, Body: body}, Retention: int64(time.Hour)})
		if res.Outcome != fsm.OutcomeOK {
			writeErr(409, "NOT_OWNER", "not the owner")
			return
		}
		fmt.Fprintf(w, `{"completed_at":%q,"expires_at":%q}`, time.Unix(0, res.CompletedAt).UTC().Format(time.RFC3339Nano), time.Unix(0, res.ExpiresAt).UTC().Format(time.RFC3339Nano))
	}
}

func startJSONAPI(t *testing.T, bodyBytes int) (*jsonAPI, *httptest.Server, *atomic.Int64) {
	store, err := idemtest.Start(idemtest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	api := &jsonAPI{t: t, store: store, bodyBytes: bodyBytes}
	var conns atomic.Int64
	hs := httptest.NewUnstartedServer(api)
	hs.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	hs.Start()
	t.Cleanup(hs.Close)
	return api, hs, &conns
}

func TestJSON(t *testing.T) {
	api, hs, conns := startJSONAPI(t, 64)
	addr := strings.TrimPrefix(hs.URL, "http://")
	rep := runJSON(t, "--target", "json", "--addr", addr, "--cycles", "300", "--concurrency", "4", "--body-bytes", "64")
	checkFigures(t, rep, 300)
	if r, c := api.reserves.Load(), api.completes.Load(); r != 300 || c != 300 {
		t.Errorf("server saw %d reserves and %d completes, want 300 each", r, c)
	}
	// A dial racing a connection's return to the pool may add one or two.
	if n := conns.Load(); n > 8 {
		t.Errorf("600 requests opened %d connections; 4 workers over keep-alive need about 4", n)
	}

	// An error answer is counted under the API's error code.
	var stdout bytes.Buffer
	err := run(t.Context(), []string{"--target", "json", "--addr", addr, "--cycles", "10", "--concurrency", "1", "--namespace", "Bad", "--json"}, &stdout, &bytes.Buffer{})
	var rep2 report
	if jerr := json.Unmarshal(stdout.Bytes(), &rep2); err == nil || jerr != nil || rep2.Errors["reserve:invalid_argument"] != 10 || rep2.CyclesFailed != 10 {
		t.Errorf("run with a bad namespace = %v; figures %+v (%v), want 10 reserve:invalid_argument", err, rep2, jerr)
	}
}

// Each complete goes to the address its reserve's Idem-Leader named when
// that address is one of --addr, and round-robin otherwise.
func TestJSONFollowsLeaderHint(t *testing.T) {
	store, err := idemtest.Start(idemtest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	apis := []*jsonAPI{{t: t, store: store, bodyBytes: 64}, {t: t, store: store, bodyBytes: 64}}
	var addrs []string
	for _, a := range apis {
		hs := httptest.NewServer(a)
		t.Cleanup(hs.Close)
		addrs = append(addrs, strings.TrimPrefix(hs.URL, "http://"))
	}
	for _, a := range apis {
		a.leader.Store(addrs[1])
	}
	rep := runJSON(t, "--target", "json", "--addr", strings.Join(addrs, ","), "--cycles", "100", "--concurrency", "2", "--body-bytes", "64")
	checkFigures(t, rep, 100)
	if r0, r1 := apis[0].reserves.Load(), apis[1].reserves.Load(); r0 == 0 || r1 == 0 || r0+r1 != 100 {
		t.Errorf("reserves %d and %d, want 100 rotating over both", r0, r1)
	}
	if c0, c1 := apis[0].completes.Load(), apis[1].completes.Load(); c0 != 0 || c1 != 100 {
		t.Errorf("completes %d and %d, want all 100 on the named leader", c0, c1)
	}

	// A leader outside --addr (a node the caller cannot reach, say) is not
	// followed.
	for _, a := range apis {
		a.leader.Store("192.0.2.1:8080")
		a.reserves.Store(0)
		a.completes.Store(0)
	}
	rep = runJSON(t, "--target", "json", "--addr", strings.Join(addrs, ","), "--cycles", "100", "--concurrency", "2", "--body-bytes", "64")
	checkFigures(t, rep, 100)
	if c0, c1 := apis[0].completes.Load(), apis[1].completes.Load(); c0 == 0 || c1 == 0 || c0+c1 != 100 {
		t.Errorf("completes %d and %d, want 100 rotating over both", c0, c1)
	}
}

// The text output of a timed run with warmup.
func TestTextOutput(t *testing.T) {
	api, hs, _ := startJSONAPI(t, 512)
	addr := strings.TrimPrefix(hs.URL, "http://")
	var stdout, stderr bytes.Buffer
	start := time.Now()
	err := run(t.Context(), []string{"--addr", addr, "--duration", "300ms", "--warmup", "100ms", "--concurrency", "2"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Errorf("a 100ms warmup and a 300ms run took %v", took)
	}
	out := stdout.String()
	m := regexp.MustCompile(`(?m)^cycles: (\d+) ok, 0 failed in ([0-9.]+)s \(stopped by duration\): ([0-9.]+) cycles/s$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no cycles line in:\n%s", out)
	}
	ok, _ := strconv.Atoi(m[1])
	elapsed, _ := strconv.ParseFloat(m[2], 64)
	if ok == 0 || elapsed < 0.3 || int64(ok) >= api.completes.Load() {
		t.Errorf("%d cycles in %vs, of %d completes served: want some, over >= 300ms, with warmup cycles not counted", ok, elapsed, api.completes.Load())
	}
	for _, want := range []string{
		"config: target=json addr=" + addr + " namespace=bench concurrency=2 duration=300ms warmup=100ms body-bytes=512",
		"errors: 0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, row := range []string{"cycle", "reserve", "complete"} {
		re := regexp.MustCompile(`(?m)^` + row + ` +(\d+)( +[0-9.]+ms){5}$`)
		if !re.MatchString(out) {
			t.Errorf("no %s latency row in:\n%s", row, out)
		}
	}
}

// SIGINT (here: the context ending) stops a long run early, still reporting,
// and the requests it cut short are not counted as errors.
func TestInterrupted(t *testing.T) {
	srv, err := idemtest.Start(idemtest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Interrupt once cycles have completed, however slow the box is.
	go func() {
		defer cancel()
		for deadline := time.Now().Add(time.Minute); srv.Calls(idemtest.MethodComplete) < 20; {
			if time.Now().After(deadline) {
				t.Errorf("no 20 completed cycles within a minute (%d)", srv.Calls(idemtest.MethodComplete))
				return
			}
			time.Sleep(5 * time.Millisecond) // polling interval
		}
	}()
	var stdout bytes.Buffer
	start := time.Now()
	if err := run(ctx, []string{"--target", "grpc", "--addr", srv.Addr(), "--duration", "1h", "--concurrency", "4", "--json"}, &stdout, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Minute {
		t.Errorf("an interrupted run took %v to stop", took)
	}
	var rep report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Stopped != "interrupted" || rep.CyclesOK == 0 || len(rep.Errors) != 0 {
		t.Errorf("stopped by %s with %d ok cycles and errors %v; want an interrupted run with cycles and no errors", rep.Stopped, rep.CyclesOK, rep.Errors)
	}
}
