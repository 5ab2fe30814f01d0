package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
)

// adminClient is an Admin client of node id; closed when the test ends.
func adminClient(t *testing.T, c *cluster.Cluster, id string) idemv1.AdminClient {
	t.Helper()
	n, _ := c.Topology.NodeByID(id)
	conn, err := grpc.NewClient(n.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return idemv1.NewAdminClient(conn)
}

// shardState is one "shard state open" or "shard state closed" log line.
type shardState struct {
	applied, records, droppedKeys int64
	line                          string
}

// shardStates finds the log lines msg ("shard state open" or "closed") of
// shard in log, in order.
func shardStates(t *testing.T, log []byte, msg, shard string) []shardState {
	t.Helper()
	var out []shardState
	num := func(line, key string) int64 {
		m := regexp.MustCompile(` ` + key + `=(\d+)`).FindStringSubmatch(line)
		if m == nil {
			return -1
		}
		v, _ := strconv.ParseInt(m[1], 10, 64)
		return v
	}
	for _, line := range strings.Split(string(log), "\n") {
		if !strings.Contains(line, `msg="`+msg+`"`) || !strings.Contains(line, " shard="+shard+" ") {
			continue
		}
		s := shardState{applied: num(line, "applied_index"), records: num(line, "records"), droppedKeys: num(line, "stale_generation_keys_dropped"), line: line}
		if s.applied < 0 || s.records < 0 {
			t.Fatalf("log line without applied_index or records: %s", line)
		}
		out = append(out, s)
	}
	return out
}

// TestCrashDuringSnapshotInstallKeepsOldState: a follower that was down
// while the leader compacted its log past it is sent a snapshot; a crash in
// the middle of installing it (fault injection: the process exits after
// the first records were written, synced, into the new state generation)
// leaves the state it had before: restarted, it opens exactly the applied
// index and records it closed with (set A, not a partial set B), drops what
// the install had written, catches up, and serves every record of A and B
// itself as leader.
func TestCrashDuringSnapshotInstallKeepsOldState(t *testing.T) {
	topo, err := launch.Topology(launch.Spec{Cluster: "restorecrash", ShardsPerRegion: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Small trailing logs: after a snapshot the leader's log no longer
	// reaches back to where the stopped follower is.
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"), "--raft-trailing-logs", "8")
	if err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	shard := topo.Shards()[0].ID
	leaders, err := c.ShardLeaders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := leaders[shard]
	var follower string
	for _, id := range nodeIDs(c) {
		if id != leader {
			follower = id
		}
	}
	api := cluster.NewAPI(c.HTTPAddr(leader))
	api.RetryUnavailable = 30 * time.Second
	bodies := map[string]string{}
	write := func(set string, n int) {
		for i := range n {
			key := fmt.Sprintf("%s-%03d", set, i)
			owner := fmt.Sprintf("owner-token-%s-%03d", set, i)
			body := base64.StdEncoding.EncodeToString([]byte("paid " + key))
			want(t, 200)(api.Reserve(ctx, "payments", key, map[string]any{"owner_token": owner}))
			want(t, 200)(api.Complete(ctx, "payments", key, map[string]any{"owner_token": owner,
				"response": map[string]any{"status": 200, "body": body}}))
			bodies[key] = body
		}
	}

	// Set A, on every replica; then the follower stops.
	const setA, setB, crashAfter = 20, 20, 5
	write("a", setA)
	fadmin := adminClient(t, c, follower)
	testutil.Until(t, 30*time.Second, "the follower to hold set A", func() bool {
		st, err := fadmin.Status(ctx, &idemv1.StatusRequest{})
		return err == nil && len(st.Shards) == 1 && st.Shards[0].Records == setA
	})
	fp := c.Nodes[follower]
	if err := fp.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	logData, _ := os.ReadFile(fp.Log)
	closed := shardStates(t, logData, "shard state closed", shard)
	if len(closed) != 1 || closed[0].records != setA {
		t.Fatalf("the follower's state at stop: %+v, want one line with %d records", closed, setA)
	}
	before := closed[0]
	t.Logf("follower %s stopped with: %s", follower, before.line)

	// Set B; the leader snapshots and compacts its log past the follower.
	write("b", setB)
	if _, err := adminClient(t, c, leader).Snapshot(ctx, &idemv1.SnapshotRequest{Shard: shard}); err != nil {
		t.Fatal(err)
	}

	// Restarted with the fault, the follower is sent the snapshot and
	// crashes part-way through installing it.
	plainArgs := fp.Args
	fp.Args = append(append([]string(nil), plainArgs...), "--testing-crash-during-restore", strconv.Itoa(crashAfter))
	fp.Env = []string{launch.FaultInjectionEnv}
	offset := len(logData)
	if err := fp.Start(); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	err = fp.Wait(wctx)
	wcancel()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != restoreCrashExitStatus {
		t.Fatalf("the follower with --testing-crash-during-restore: %v, want exit status %d", err, restoreCrashExitStatus)
	}
	logData, _ = os.ReadFile(fp.Log)
	run := logData[offset:]
	crash := grepLines(run, "crashing during a snapshot restore")
	if !strings.Contains(crash, "shard="+shard) || !strings.Contains(crash, fmt.Sprintf("records_written=%d", crashAfter)) {
		t.Fatalf("no crash line for shard %s after %d records in the follower's log:\n%s", shard, crashAfter, run)
	}
	if !strings.Contains(string(run), "copied to local snapshot") {
		t.Fatalf("the follower crashed, but not while installing a snapshot from its leader:\n%s", run)
	}
	if opened := shardStates(t, run, "shard state open", shard); len(opened) != 1 || opened[0].applied != before.applied || opened[0].records != before.records {
		t.Fatalf("the crash run opened %+v, want the state it stopped with: %+v", opened, before)
	}
	if strings.Contains(string(run), "shard state closed") {
		t.Fatal("the crash ran the node's shutdown")
	}
	t.Logf("crash: %s", crash)

	// Restarted without the fault, it opens exactly the state it had
	// before (set A, nothing of B) and drops what the install had written:
	// the crashAfter records and their index keys.
	fp.Args, fp.Env = plainArgs, nil
	offset = len(logData)
	if err := fp.Start(); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
	defer rcancel()
	if err := launch.WaitHTTP(rctx, "http://"+c.HTTPAddr(follower)+"/readyz"); err != nil {
		t.Fatal(err)
	}
	logData, _ = os.ReadFile(fp.Log)
	run = logData[offset:]
	opened := shardStates(t, run, "shard state open", shard)
	if len(opened) != 1 {
		t.Fatalf("%d shard state open lines after the crash", len(opened))
	}
	// Each record the interrupted install wrote left three keys: the
	// record, its expiry or lease index key, and its partition index key.
	if o := opened[0]; o.applied != before.applied || o.records != before.records || o.droppedKeys != 3*crashAfter {
		t.Fatalf("after the crash the follower opened %s\nwant applied_index=%d records=%d (its state before the install) and %d stale keys dropped",
			o.line, before.applied, before.records, 3*crashAfter)
	}
	t.Logf("reopened after the crash: %s", opened[0].line)

	// It catches up and serves every record of A and B itself.
	testutil.Until(t, 30*time.Second, "the follower to hold sets A and B", func() bool {
		st, err := fadmin.Status(ctx, &idemv1.StatusRequest{})
		return err == nil && len(st.Shards) == 1 && st.Shards[0].Records == setA+setB
	})
	testutil.Until(t, 30*time.Second, "the leadership moved to the follower", func() bool {
		leaders, err := c.ShardLeaders(ctx)
		if err != nil || leaders[shard] == "" {
			return false
		}
		return leaders[shard] == follower || transferLeader(t, c, leaders[shard], shard, follower) == nil
	})
	fapi := cluster.NewAPI(c.HTTPAddr(follower))
	for key, body := range bodies {
		r := want(t, 200)(fapi.Get(ctx, "payments", key))
		resp, _ := r.Body["response"].(map[string]any)
		if r.Str("state") != "COMPLETED" || resp["body"] != body {
			t.Fatalf("%s through the restarted follower: %s", key, r)
		}
	}
	if leaders, err := c.ShardLeaders(ctx); err != nil || leaders[shard] != follower {
		t.Fatalf("shard %s led by %v (%v) after the reads, want %s: the reads must have been its own", shard, leaders, err, follower)
	}
	t.Logf("%d records of sets A and B read through %s as leader; restores: %s", len(bodies), follower,
		grepLines(run, "restored it")+grepLines(run, "Installed remote snapshot"))
}
