package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/node"
)

// devProcess lays out (does not start) a dev node on free loopback ports.
func devProcess(t *testing.T, dir string, extra ...string) (*launch.Process, *cluster.API, string) {
	t.Helper()
	ports, err := launch.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	p := &launch.Process{Name: "dev", Bin: binaries.Path(t, "idemnode"), Log: filepath.Join(dir, "dev.log"), Args: append([]string{
		"--dev", "--data-dir", filepath.Join(dir, "data"), "--http-addr", httpAddr,
		"--grpc-addr", "127.0.0.1:" + strconv.Itoa(ports[1]), "--raft-addr", "127.0.0.1:" + strconv.Itoa(ports[2]),
	}, extra...)}
	t.Cleanup(func() { p.Kill() })
	return p, cluster.NewAPI(httpAddr), httpAddr
}

func startReady(t *testing.T, p *launch.Process, httpAddr string) {
	t.Helper()
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := launch.WaitHTTP(ctx, "http://"+httpAddr+"/readyz"); err != nil {
		data, _ := os.ReadFile(p.Log)
		t.Fatalf("%v\n%s", err, data)
	}
}

// exitLine starts p, which must exit non-zero by itself, and returns what
// it wrote after the offset of its log.
func mustRefuse(t *testing.T, p *launch.Process) string {
	t.Helper()
	before, _ := os.ReadFile(p.Log)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := p.Wait(ctx)
	after, _ := os.ReadFile(p.Log)
	out := string(after[len(before):])
	if err == nil || strings.Contains(err.Error(), "still running") {
		t.Fatalf("node did not refuse to start (%v); output:\n%s", err, out)
	}
	if strings.Contains(out, "goroutine ") || strings.Contains(out, "panic") {
		t.Fatalf("refusal with a panic or stack trace:\n%s", out)
	}
	return out
}

// lastLine is the process's last non-empty output line: what main printed.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

// TestLostStateIsRefused: a data dir that kept its identity file but lost
// its Raft log (deleted, or emptied) makes the node exit non-zero with one
// line naming the dir and idemctl replace-node, instead of bootstrapping an
// empty state where fencing tokens would start over; a damaged log gives
// one line naming it, never a panic; so does a shared bolt log of
// development builds (raft/log.db), which no release reads.
func TestLostStateIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p, api, httpAddr := devProcess(t, dir)
	startReady(t, p, httpAddr)
	ok := want(t, 200)
	first := ok(api.Reserve(t.Context(), "payments", "lost-1", nil))
	if err := p.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(dir, "data")
	// The log's files: the pebble log's directory.
	logPath := filepath.Join(dataDir, "raft", "raftlog")
	entries, err := os.ReadDir(logPath)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		files = append(files, filepath.Join(logPath, e.Name()))
	}
	saved := map[string][]byte{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		saved[f] = data
	}
	// overwrite damages the log's content: pebble's MANIFEST and WAL.
	overwrite := func() error {
		for _, f := range files {
			if !strings.HasPrefix(filepath.Base(f), "MANIFEST") && !strings.HasSuffix(f, ".log") {
				continue
			}
			if err := os.WriteFile(f, bytes.Repeat([]byte{0xA5}, 64<<10), 0o600); err != nil {
				return err
			}
		}
		return nil
	}
	for _, tc := range []struct {
		name    string
		damage  func() error
		mention []string
	}{
		{"log deleted", func() error { return os.RemoveAll(logPath) }, []string{dataDir, "idemctl replace-node", "missing or truncated"}},
		{"log overwritten", overwrite, []string{logPath, "corrupt"}},
	} {
		if err := tc.damage(); err != nil {
			t.Fatal(err)
		}
		line := lastLine(mustRefuse(t, p))
		for _, m := range tc.mention {
			if !strings.Contains(line, m) {
				t.Errorf("%s: last line %q does not mention %q", tc.name, line, m)
			}
		}
		// Put the log back exactly as it was.
		if err := os.RemoveAll(logPath); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(logPath, 0o750); err != nil {
			t.Fatal(err)
		}
		for f, data := range saved {
			if err := os.WriteFile(f, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A shared bolt log beside it (a development build's) is refused, not
	// ignored.
	shared := filepath.Join(dataDir, "raft", "log.db")
	if err := os.WriteFile(shared, []byte("bolt"), 0o600); err != nil {
		t.Fatal(err)
	}
	if line := lastLine(mustRefuse(t, p)); !strings.Contains(line, shared) || !strings.Contains(line, "idemctl replace-node") {
		t.Errorf("shared bolt log: last line %q does not name %s and idemctl replace-node", line, shared)
	}
	if err := os.Remove(shared); err != nil {
		t.Fatal(err)
	}
	// With its log back the node starts and still holds the record.
	startReady(t, p, httpAddr)
	if g := ok(api.Get(t.Context(), "payments", "lost-1")); g.Str("fencing_token") != first.Str("fencing_token") {
		t.Fatalf("record after restore: %s, reserved %s", g, first)
	}
}

// TestFaultInjectionNeedsTheEnvironment: a --testing-* flag without
// IDEM_ENABLE_FAULT_INJECTION=1 refuses to start with one line; with it the
// node warns that fault injection is on.
func TestFaultInjectionNeedsTheEnvironment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p, _, httpAddr := devProcess(t, dir, "--testing-clock-offset", "1h")
	line := lastLine(mustRefuse(t, p))
	if !strings.Contains(line, "IDEM_ENABLE_FAULT_INJECTION=1") || !strings.Contains(line, "--testing-clock-offset=1h0m0s") {
		t.Fatalf("refusal line %q", line)
	}
	p.Env = []string{launch.FaultInjectionEnv}
	startReady(t, p, httpAddr)
	data, _ := os.ReadFile(p.Log)
	if !bytes.Contains(data, []byte("FAULT INJECTION is on")) {
		t.Fatalf("no fault-injection warning in the log:\n%s", data)
	}
}

// TestStorageFailureFailsStop: with the Raft log's commits failing after N
// (fault injection), the node never acknowledges a write it could not make
// durable: it logs one line and exits non-zero by itself; restarted without
// the fault it holds every completion it acknowledged.
func TestStorageFailureFailsStop(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p, api, httpAddr := devProcess(t, dir, "--testing-fail-log-commits-after", "150")
	p.Env = []string{launch.FaultInjectionEnv}
	startReady(t, p, httpAddr)

	type done struct{ key, body string }
	var acked []done
	errs := 0
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for i := 0; i < 2000 && p.Running(); i++ {
		key := fmt.Sprintf("fs-%d", i)
		r, err := api.Reserve(ctx, "payments", key, nil)
		if err != nil || r.Status != 200 {
			errs++
			continue
		}
		body := base64.StdEncoding.EncodeToString([]byte("done " + key))
		c, err := api.Complete(ctx, "payments", key, map[string]any{"owner_token": r.Str("owner_token"),
			"response": map[string]any{"status": 200, "body": body}})
		if err != nil || c.Status != 200 {
			errs++
			continue
		}
		acked = append(acked, done{key, body})
	}
	err := p.Wait(ctx)
	if err == nil || strings.Contains(err.Error(), "still running") {
		t.Fatalf("the node did not exit non-zero after the storage failure: %v", err)
	}
	data, _ := os.ReadFile(p.Log)
	if n := bytes.Count(data, []byte("raft log storage failed")); n != 1 {
		t.Fatalf("%d storage failure lines in the log, want 1:\n%s", n, data)
	}
	if len(acked) == 0 {
		t.Fatal("nothing was acknowledged before the failure")
	}
	t.Logf("%d completions acknowledged, %d calls failed, then the node exited: %v", len(acked), errs, err)

	// Restart without the fault: every acknowledged completion is there.
	p.Args = slicesWithout(p.Args, "--testing-fail-log-commits-after", "150")
	startReady(t, p, httpAddr)
	for _, d := range acked {
		r, err := api.Reserve(t.Context(), "payments", d.key, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, _ := r.Body["response"].(map[string]any)
		if r.Str("outcome") != "COMPLETED" || resp["body"] != d.body {
			t.Fatalf("acknowledged completion of %s lost after the restart: %s", d.key, r)
		}
	}
}

// slicesWithout returns args without the flag and value pair.
func slicesWithout(args []string, flag, value string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == flag && i+1 < len(args) && args[i+1] == value {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// TestSkewedNodeNeverLeads: in a three-node region one node's clock is
// three hours ahead (fault injection). It reports not ready, saying why; it
// leads no shard, and hands a leadership forced on it straight back; its
// metric shows the offset; and its clock never reaches the state: leases
// and retention end by the quorum's clock, so no record expires early.
func TestSkewedNodeNeverLeads(t *testing.T) {
	t.Parallel()
	topo, err := launch.Topology(launch.Spec{Cluster: "skew", NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"), "--clock-skew-margin", "100ms")
	if err != nil {
		t.Fatal(err)
	}
	skewed := topo.Nodes()[2].ID
	p := c.Nodes[skewed]
	p.Args = append(p.Args, "--testing-clock-offset", "3h")
	p.Env = []string{launch.FaultInjectionEnv}
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	var good []string
	for _, n := range topo.Nodes() {
		if n.ID != skewed {
			good = append(good, n.ID)
			if err := launch.WaitHTTP(ctx, "http://"+n.HTTPAddr+"/readyz"); err != nil {
				t.Fatal(err)
			}
		}
	}
	sapi := cluster.NewAPI(c.HTTPAddr(skewed))
	testutil.Until(t, 30*time.Second, "the skewed node's /readyz to say why", func() bool {
		r, err := sapi.Do(ctx, "GET", "/readyz", nil)
		return err == nil && r.Status == 503 && strings.Contains(string(r.Raw), "clock")
	})

	api := cluster.NewAPI(c.HTTPAddr(good[0]))
	ok := want(t, 200)
	// A completion kept 60 s and a reservation leased 60 s: with the
	// skewed clock stamped anywhere they would be gone at once.
	owner := "owner-token-skew-0001"
	ok(api.Reserve(ctx, "payments", "done", map[string]any{"owner_token": owner}))
	ok(api.Complete(ctx, "payments", "done", map[string]any{"owner_token": owner, "retention_s": 60,
		"response": map[string]any{"status": 200, "body": base64.StdEncoding.EncodeToString([]byte("ok"))}}))
	held := ok(api.Reserve(ctx, "payments", "held", map[string]any{"owner_token": "owner-token-skew-0002", "lease_ms": 60000}))

	leadsNothing := func(what string) {
		t.Helper()
		testutil.Until(t, 20*time.Second, what, func() bool {
			leaders, err := c.ShardLeaders(ctx)
			if err != nil {
				return false
			}
			for _, l := range leaders {
				if l == skewed {
					return false
				}
			}
			return len(leaders) == len(topo.Shards())
		})
	}
	leadsNothing("every shard led by a node with a good clock")

	// Force the leadership onto it: it hands it back, and writes through
	// it meanwhile are stamped with the quorum's time.
	for _, s := range topo.Shards() {
		leaders, _ := c.ShardLeaders(ctx)
		t.Logf("transfer of %s to the skewed node: %v", s.ID, transferLeader(t, c, leaders[s.ID], s.ID, skewed))
		for i := range 20 {
			sapi.Reserve(ctx, "payments", fmt.Sprintf("during-%s-%d", s.ID, i), nil)
		}
	}
	leadsNothing("the skewed node handing every forced leadership back")

	if r := ok(api.Reserve(ctx, "payments", "done", nil)); r.Str("outcome") != "COMPLETED" {
		t.Fatalf("completion kept 60 s after the skewed node led: %s", r)
	}
	if r := ok(api.Reserve(ctx, "payments", "held", map[string]any{"owner_token": "owner-token-skew-0003"})); r.Str("outcome") != "IN_PROGRESS" {
		t.Fatalf("60 s lease reserved %s, after the skewed node led: %s", held.Str("lease_expires_at"), r)
	}
	g := ok(api.Get(ctx, "payments", "held"))
	if exp, err := time.Parse(time.RFC3339Nano, g.Str("lease_expires_at")); err != nil || exp.After(time.Now().Add(2*time.Minute)) {
		t.Fatalf("lease end %s stamped by the skewed clock", g.Str("lease_expires_at"))
	}
	m := ok(sapi.Do(ctx, "GET", "/metrics", nil))
	if !regexp.MustCompile(`idem_node_clock_offset_seconds\{peer="[^"]+"\} -10[0-9]{3}`).Match(m.Raw) ||
		!bytes.Contains(m.Raw, []byte("idem_node_clock_skewed 1")) {
		t.Fatalf("the skewed node's metrics do not show the 3h offset:\n%s", grepLines(m.Raw, "idem_node_clock"))
	}
}

func grepLines(b []byte, sub string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestFullDiskKeepsReadsAndResumes runs a dev node on a small tmpfs (root
// only) and fills it: below the reserve new keys get 429 with Retry-After,
// replays and reads keep working and /readyz stays 200; once the space is
// freed, writes resume by themselves.
func TestFullDiskKeepsReadsAndResumes(t *testing.T) {
	mnt := smallFS(t, "96m")
	t.Parallel()
	p, api, httpAddr := devProcess(t, mnt, "--disk-reserve-bytes", strconv.Itoa(32<<20))
	startReady(t, p, httpAddr)
	ctx := t.Context()
	ok := want(t, 200)
	owner := "owner-token-full-0001"
	ok(api.Reserve(ctx, "payments", "done", map[string]any{"owner_token": owner}))
	body := base64.StdEncoding.EncodeToString([]byte("charged"))
	ok(api.Complete(ctx, "payments", "done", map[string]any{"owner_token": owner, "response": map[string]any{"status": 200, "body": body}}))

	// Fill the filesystem to 20 MiB short of full: below the 32 MiB reserve.
	filler := fillFS(t, mnt, 20<<20)

	i := 0
	testutil.Until(t, 10*time.Second, "a new key to get 429", func() bool {
		i++
		r, err := api.Reserve(ctx, "payments", fmt.Sprintf("new-%d", i), nil)
		if err == nil && r.Status == 429 {
			if r.ErrCode() != "RESOURCE_EXHAUSTED" || r.Header.Get("Retry-After") == "" {
				t.Fatalf("refusal: %s (Retry-After %q)", r, r.Header.Get("Retry-After"))
			}
			return true
		}
		return false
	})
	if r := ok(api.Reserve(ctx, "payments", "done", nil)); r.Str("outcome") != "COMPLETED" {
		t.Fatalf("replay with a full disk: %s", r)
	}
	ok(api.Get(ctx, "payments", "done"))
	ok(api.Do(ctx, "GET", "/readyz", nil))

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testutil.Until(t, 10*time.Second, "writes to resume", func() bool {
		i++
		r, err := api.Reserve(ctx, "payments", fmt.Sprintf("new-%d", i), nil)
		return err == nil && r.Status == 200
	})
	m := ok(api.Do(ctx, "GET", "/metrics", nil))
	if !regexp.MustCompile(`idem_node_admission_refusals_total\{reason="disk_reserve"\} [1-9]`).Match(m.Raw) {
		t.Fatalf("refusals not counted:\n%s", grepLines(m.Raw, "idem_node_"))
	}
}

// smallFS mounts a tmpfs of size for the test (root only: skipped
// otherwise) and returns its path.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	return mnt
}

// fillFS writes a file into dir's filesystem that leaves about leave bytes
// free, and returns its path.
func fillFS(t *testing.T, dir string, leave int64) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, int64(st.Bavail*uint64(st.Bsize))-leave)); err != nil {
		t.Fatal(err)
	}
	return filler
}

// TestFollowerFullDiskStopsAddingWrites: in a three-node region, one
// node's data dir sits on a small filesystem that fills up. It tells the
// leaders on their clock probes, and they refuse new keys with 429 (the
// follower would fail stop on the next write it is sent) while replays and
// reads go on; once it has room again, writes resume by themselves and the
// follower never exited.
func TestFollowerFullDiskStopsAddingWrites(t *testing.T) {
	mnt := smallFS(t, "96m")
	t.Parallel()
	topo, err := launch.Topology(launch.Spec{Cluster: "fulldisk", NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"), "--disk-reserve-bytes", strconv.Itoa(32<<20))
	if err != nil {
		t.Fatal(err)
	}
	full := topo.Nodes()[2].ID
	fp := c.Nodes[full]
	for i, a := range fp.Args {
		if a == "--data-dir" {
			fp.Args[i+1] = filepath.Join(mnt, "data")
		}
	}
	// The other nodes lead every shard: the full node is the follower.
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	// Every shard led elsewhere: the full node is a follower only.
	testutil.Until(t, 30*time.Second, "the leaderships away from "+full, func() bool {
		leaders, err := c.ShardLeaders(ctx)
		if err != nil || len(leaders) != len(topo.Shards()) {
			return false
		}
		moved := true
		for shard, l := range leaders {
			if l == full {
				moved = false
				transferLeader(t, c, full, shard, "")
			}
		}
		return moved
	})
	api := cluster.NewAPI(c.HTTPAddr(topo.Nodes()[0].ID))
	ok := want(t, 200)
	owner := "owner-token-fdisk-001"
	ok(api.Reserve(ctx, "payments", "done", map[string]any{"owner_token": owner}))
	ok(api.Complete(ctx, "payments", "done", map[string]any{"owner_token": owner,
		"response": map[string]any{"status": 200, "body": base64.StdEncoding.EncodeToString([]byte("ok"))}}))

	filler := fillFS(t, mnt, 20<<20)
	i := 0
	testutil.Until(t, 20*time.Second, "new keys to get 429 while a voter's disk is low", func() bool {
		i++
		r, err := api.Reserve(ctx, "payments", fmt.Sprintf("new-%d", i), nil)
		return err == nil && r.Status == 429 && r.ErrCode() == "RESOURCE_EXHAUSTED"
	})
	if r := ok(api.Reserve(ctx, "payments", "done", nil)); r.Str("outcome") != "COMPLETED" {
		t.Fatalf("replay while a voter's disk is low: %s", r)
	}
	ok(api.Get(ctx, "payments", "done"))
	peerRefusals := regexp.MustCompile(`idem_node_admission_refusals_total\{reason="peer_disk_reserve"\} [1-9]`)
	refusedByLeader := false
	for _, n := range topo.Nodes() {
		if m, err := cluster.NewAPI(n.HTTPAddr).Do(ctx, "GET", "/metrics", nil); err == nil && n.ID != full && peerRefusals.Match(m.Raw) {
			refusedByLeader = true
		}
	}
	if !refusedByLeader {
		t.Fatal("no leader counted a refusal for its follower's disk (peer_disk_reserve)")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testutil.Until(t, 20*time.Second, "writes to resume", func() bool {
		i++
		r, err := api.Reserve(ctx, "payments", fmt.Sprintf("new-%d", i), nil)
		return err == nil && r.Status == 200
	})
	if !fp.Running() {
		t.Fatal("the node whose disk filled exited")
	}
}

// transferLeader asks node from, which leads shard, to hand it to target
// ("" lets Raft pick).
func transferLeader(t *testing.T, c *cluster.Cluster, from, shard, target string) error {
	t.Helper()
	n, _ := c.Topology.NodeByID(from)
	conn, err := grpc.NewClient(n.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = idemv1.NewAdminClient(conn).TransferLeader(ctx, &idemv1.TransferLeaderRequest{Shard: shard, TargetNodeId: target})
	return err
}

// TestClockCheckOffKeepsQuorumTime: --max-clock-offset 0 on every node
// switches off only the leadership/readiness check, never quorum time. A
// node a year ahead is made leader: it leads (nothing stops it with the
// check off), but its clock alone never reaches the state: records completed
// before stay COMPLETED through a sweep it runs, and what it stamps is the
// majority's time. Before, 15 of 20 such completions were swept as expired
// within 15 s and new leases were stamped a year ahead. The setting is
// unsafe and said so: a warning, /readyz's body and idem_node_unsafe_settings.
func TestClockCheckOffKeepsQuorumTime(t *testing.T) {
	t.Parallel()
	topo, err := launch.Topology(launch.Spec{Cluster: "noclock", NodesPerRegion: 3, ShardsPerRegion: 1, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"), "--max-clock-offset", "0")
	if err != nil {
		t.Fatal(err)
	}
	skewed := topo.Nodes()[2].ID
	p := c.Nodes[skewed]
	p.Args = append(p.Args, "--testing-clock-offset", "8760h")
	p.Env = []string{launch.FaultInjectionEnv}
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	good := cluster.NewAPI(c.HTTPAddr(topo.Nodes()[0].ID))
	ok := want(t, 200)
	const keys = 20
	for i := range keys {
		key := fmt.Sprintf("done-%d", i)
		owner := fmt.Sprintf("owner-token-noclock-%04d", i)
		ok(good.Reserve(ctx, "payments", key, map[string]any{"owner_token": owner}))
		ok(good.Complete(ctx, "payments", key, map[string]any{"owner_token": owner, "retention_s": 300,
			"response": map[string]any{"status": 200, "body": base64.StdEncoding.EncodeToString([]byte("ok"))}}))
	}

	shard := topo.Shards()[0].ID
	testutil.Until(t, 30*time.Second, "the year-ahead node to lead the shard", func() bool {
		leaders, err := c.ShardLeaders(ctx)
		if err != nil {
			return false
		}
		if leaders[shard] == skewed {
			return true
		}
		if leaders[shard] != "" {
			transferLeader(t, c, leaders[shard], shard, skewed)
		}
		return false
	})
	sapi := cluster.NewAPI(c.HTTPAddr(skewed))
	held := ok(sapi.Reserve(ctx, "payments", "new-while-skewed", map[string]any{"lease_ms": 60000}))
	g := ok(good.Get(ctx, "payments", "new-while-skewed"))
	if exp, err := time.Parse(time.RFC3339Nano, g.Str("lease_expires_at")); err != nil || exp.After(time.Now().Add(5*time.Minute)) {
		t.Fatalf("a lease reserved through the year-ahead leader ends %s (%v): its clock reached the state (%s)", g.Str("lease_expires_at"), err, held)
	}
	// A sweep runs every 10 s on the leader: give it one, then every
	// completion is still there.
	time.Sleep(node.DefaultSweepInterval + 2*time.Second)
	if leaders, err := c.ShardLeaders(ctx); err != nil || leaders[shard] != skewed {
		t.Logf("leaders after the sweep interval: %v (%v)", leaders, err)
	}
	for i := range keys {
		if r := ok(good.Reserve(ctx, "payments", fmt.Sprintf("done-%d", i), nil)); r.Str("outcome") != "COMPLETED" {
			t.Fatalf("done-%d after the year-ahead node led for a sweep: %s (the work would run twice)", i, r)
		}
	}

	r := ok(sapi.Do(ctx, "GET", "/readyz", nil))
	if !strings.Contains(string(r.Raw), `"unsafe_settings":["--max-clock-offset 0","--testing-`) {
		t.Fatalf("/readyz of a node with the clock check off and fault injection does not name the flags typed: %s", r.Raw)
	}
	m := ok(sapi.Do(ctx, "GET", "/metrics", nil))
	for _, want := range []string{`idem_node_unsafe_settings{setting="clock_check_off"} 1`, `idem_node_unsafe_settings{setting="fault_injection"} 1`,
		`idem_node_unsafe_settings{setting="insecure"} 0`} {
		if !bytes.Contains(m.Raw, []byte(want)) {
			t.Fatalf("metrics lack %s:\n%s", want, grepLines(m.Raw, "idem_node_unsafe"))
		}
	}
	if data, _ := os.ReadFile(p.Log); !regexp.MustCompile(`UNSAFE SETTINGS in force.*settings="--max-clock-offset 0, --testing-`).Match(data) {
		t.Fatalf("the node did not warn of its unsafe settings:\n%s", data)
	}
}

// TestForgottenVoteIsRefused: a node whose Raft log (with the term and vote
// it stored) was deleted while its snapshots stayed must not start: it
// would have forgotten the votes it gave and could vote twice in one term.
// Before, it started ("restarted from existing state") and could lead.
func TestForgottenVoteIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p, api, httpAddr := devProcess(t, dir)
	startReady(t, p, httpAddr)
	ok := want(t, 200)
	for i := range 40 { // every shard of the dev node gets writes
		ok(api.Reserve(t.Context(), "payments", fmt.Sprintf("vote-%d", i), nil))
	}
	grpcAddr := flagValue(p, "--grpc-addr")
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := idemv1.NewAdminClient(conn)
	st, err := admin.Status(t.Context(), &idemv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.GetShards() {
		if _, err := admin.Snapshot(t.Context(), &idemv1.SnapshotRequest{Shard: s.GetShard()}); err != nil {
			t.Fatalf("snapshot of %s: %v", s.GetShard(), err)
		}
	}
	if err := p.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(dir, "data")
	if err := os.RemoveAll(filepath.Join(dataDir, "raft", "raftlog")); err != nil {
		t.Fatal(err)
	}
	line := lastLine(mustRefuse(t, p))
	for _, m := range []string{dataDir, "idemctl replace-node"} {
		if !strings.Contains(line, m) {
			t.Errorf("last line %q does not mention %q", line, m)
		}
	}
}
