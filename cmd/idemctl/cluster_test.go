package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/node"
	"github.com/idem-dev/idem/topology"
)

// Tests in this file run idemctl against real idemnode and idemrouter
// processes on loopback: two regions of three nodes, one shard homed per
// region, three replicas, and a router.

var binaries cluster.Binaries

func TestMain(m *testing.M) { cluster.RunTests(m, &binaries, "idemnode", "idemrouter", "idemctl") }

// startWithRouter starts c's nodes and a router named router-REGION in
// region, stopped when the test ends, and waits until all are ready.
func startWithRouter(t *testing.T, c *cluster.Cluster, region string) *cluster.Router {
	t.Helper()
	rt, err := c.NewRouter(binaries.Path(t, "idemrouter"), "router-"+region, region)
	if err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rt.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return rt
}

// ctl runs idemctl in-process with args and returns its stdout.
func ctl(t testing.TB, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), args, &stdout, &stderr)
	return stdout.String(), err
}

func mustCtl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := ctl(t, args...)
	if err != nil {
		t.Fatalf("idemctl %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func decode[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("--json output does not parse: %v\n%s", err, out)
	}
	return v
}

func TestIdemctlAgainstCluster(t *testing.T) {
	topo, err := launch.Topology(launch.Spec{Cluster: "ctl", Regions: []string{"east", "west"}, NodesPerRegion: 3, ShardsPerRegion: 1, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	rt := startWithRouter(t, c, "east")
	cfg := c.TopologyPath
	ring, err := topology.NewRing(topo)
	if err != nil {
		t.Fatal(err)
	}

	// Leaders move to their preferred voters in the first seconds (the
	// nodes hand leadership back): let them settle, so that what status
	// and locate say below is one stable view.
	settled := func(want func(v clusterView) string) clusterView {
		t.Helper()
		var v clusterView
		testutil.Eventually(t, 60*time.Second, "a settled cluster view", func() (bool, string) {
			out, err := ctl(t, "--config", cfg, "status", "--json")
			if err != nil {
				return false, err.Error()
			}
			v = decode[clusterView](t, out)
			why := want(v)
			return why == "", why
		})
		return v
	}
	settled(func(v clusterView) string {
		for _, s := range v.Shards {
			if len(s.Voters) == 0 || s.Leader != s.Voters[0] {
				return fmt.Sprintf("shard %s led by %q, preferred %v", s.ID, s.Leader, s.Voters)
			}
		}
		return ""
	})

	// A completed key and a reservation, through the router, each retried
	// with the same owner token while the answer is 503 (as the contract
	// tells clients to).
	api := rt.API()
	const ns = "payments"
	done, held := "order:42/a", "order:43"
	decided := func(what string, call func() (cluster.Reply, error)) cluster.Reply {
		t.Helper()
		var r cluster.Reply
		testutil.Eventually(t, 30*time.Second, what+" decided", func() (bool, string) {
			var err error
			if r, err = call(); err != nil {
				return false, err.Error()
			}
			return r.Status != http.StatusServiceUnavailable, r.String()
		})
		if r.Status != 200 {
			t.Fatalf("%s: %s", what, r)
		}
		return r
	}
	r := decided("reserve", func() (cluster.Reply, error) {
		return api.Reserve(t.Context(), ns, done, map[string]any{"owner_token": "owner-token-000001", "fingerprint": "sha256:9f2c"})
	})
	fencing := r.Str("fencing_token")
	decided("complete", func() (cluster.Reply, error) {
		return api.Complete(t.Context(), ns, done, map[string]any{"owner_token": "owner-token-000001", "response": map[string]any{
			"status": 201, "headers": map[string]string{"Content-Type": "application/json"}, "body": base64.StdEncoding.EncodeToString([]byte(`{"id":1}`))}})
	})
	decided("reserve", func() (cluster.Reply, error) {
		return api.Reserve(t.Context(), ns, held, map[string]any{"owner_token": "owner-token-000002"})
	})
	// Followers learn the commit index with the leader's next append.
	settled(func(v clusterView) string {
		for _, s := range v.Shards {
			for _, rep := range s.Replicas {
				if rep.CommitIndex == 0 || rep.AppliedIndex == 0 {
					return fmt.Sprintf("replica %s of %s: commit %d applied %d", rep.Node, s.ID, rep.CommitIndex, rep.AppliedIndex)
				}
			}
		}
		return ""
	})

	var leaders map[string]string // shard -> leader, from status --json
	t.Run("status", func(t *testing.T) {
		v := decode[clusterView](t, mustCtl(t, "--config", cfg, "status", "--json"))
		if v.Cluster != "ctl" || len(v.Regions) != 2 || len(v.Nodes) != 6 || len(v.Shards) != 2 {
			t.Fatalf("status --json: %+v", v)
		}
		leaders = map[string]string{}
		for _, n := range v.Nodes {
			if n.Health != healthReady || n.Version == "" || n.Shards != 1 || n.AdvertisedVersion != node.ReleaseVersion || n.ClusterVersion == 0 {
				t.Fatalf("node %+v: want ready, with a version, advertising %d, with a cluster version, hosting 1 shard", n, node.ReleaseVersion)
			}
		}
		if v.ClusterVersion == 0 {
			t.Fatalf("status --json: no cluster version: %+v", v)
		}
		for _, s := range v.Shards {
			if s.Leader == "" || s.Term == 0 || len(s.Replicas) != 3 {
				t.Fatalf("shard %+v: want a leader, a term and 3 replicas", s)
			}
			leaders[s.ID] = s.Leader
			for _, rep := range s.Replicas {
				if !rep.Reachable || rep.CommitIndex == 0 || rep.AppliedIndex == 0 || rep.LastIndex < rep.CommitIndex {
					t.Fatalf("replica %+v of %s", rep, s.ID)
				}
			}
		}
		text := mustCtl(t, "status", "--config", cfg)
		for _, want := range []string{"cluster ctl: 2 regions, 6 nodes (6 reachable, 6 ready), 2 shards (2 with a leader)",
			"cluster version ", "ADVERTISES", "REGION", "HEALTH", "east-0", "west-0", "leader", "follower", "APPLIED", "PACKING"} {
			if !strings.Contains(text, want) {
				t.Fatalf("status table lacks %q:\n%s", want, text)
			}
		}
		t.Logf("idemctl status:\n%s", text)
	})

	t.Run("locate", func(t *testing.T) {
		v := decode[locateView](t, mustCtl(t, "--config", cfg, "locate", ns, done, "--json"))
		want := ring.Locate(ns, done)
		if v.Shard != want.ID || v.HomeRegion != want.HomeRegion || strings.Join(v.Voters, ",") != strings.Join(want.Voters, ",") {
			t.Fatalf("locate: %+v, want shard %+v", v, want)
		}
		if v.Leader != leaders[v.Shard] || len(v.Unreachable) != 0 {
			t.Fatalf("locate leader %q (unreachable %v), status says %q", v.Leader, v.Unreachable, leaders[v.Shard])
		}
		text := mustCtl(t, "--config", cfg, "locate", ns, done)
		if !strings.Contains(text, "home region  "+want.HomeRegion) || !strings.Contains(text, "leader       "+v.Leader) {
			t.Fatalf("locate table:\n%s", text)
		}
	})

	t.Run("get", func(t *testing.T) {
		for _, via := range [][]string{{"--config", cfg}, {"--addr", rt.GRPCAddr}, {"--addr", topo.Nodes()[4].GRPCAddr}} {
			v := decode[recordView](t, mustCtl(t, append([]string{"get", "--json", ns, done}, via...)...))
			if v.State != "COMPLETED" || v.FencingToken != fencing || v.Fingerprint != "sha256:9f2c" || v.Response == nil ||
				v.Response.Status != 201 || string(v.Response.Body) != `{"id":1}` || v.Response.Headers["Content-Type"] != "application/json" || v.CompletedAt == "" {
				t.Fatalf("get via %v: %+v", via, v)
			}
		}
		// The JSON is the JSON API's GET body.
		jr, err := api.Get(t.Context(), ns, done)
		if err != nil {
			t.Fatal(err)
		}
		var fromAPI, fromCtl map[string]any
		json.Unmarshal(jr.Raw, &fromAPI)
		json.Unmarshal([]byte(mustCtl(t, "--config", cfg, "get", "--json", ns, done)), &fromCtl)
		if a, b := fmt.Sprint(fromAPI), fmt.Sprint(fromCtl); a != b {
			t.Fatalf("get --json differs from the JSON API:\n%s\n%s", b, a)
		}
		v := decode[recordView](t, mustCtl(t, "--config", cfg, "get", ns, held, "--json"))
		if v.State != "IN_PROGRESS" || v.LeaseExpiresAt == "" || v.Response != nil {
			t.Fatalf("get of a reservation: %+v", v)
		}
		text := mustCtl(t, "--config", cfg, "get", ns, done)
		for _, want := range []string{"COMPLETED", "fencing token    " + fencing, `{"id":1}`, "Content-Type: application/json"} {
			if !strings.Contains(text, want) {
				t.Fatalf("get table lacks %q:\n%s", want, text)
			}
		}
		if _, err := ctl(t, "--config", cfg, "get", ns, "never-reserved"); err == nil || !strings.Contains(err.Error(), "no record") {
			t.Fatalf("get of an absent key: %v", err)
		}
	})

	t.Run("transfer-leader", func(t *testing.T) {
		shard := ring.Shards()[0]
		var target string
		for _, v := range shard.Voters {
			if v != leaders[shard.ID] {
				target = v
				break
			}
		}
		v := decode[transferView](t, mustCtl(t, "--config", cfg, "--json", "transfer-leader", shard.ID, target))
		if v.PreviousLeader != leaders[shard.ID] || v.Leader != target {
			t.Fatalf("transfer-leader: %+v, want %s -> %s", v, leaders[shard.ID], target)
		}
		st := decode[clusterView](t, mustCtl(t, "--config", cfg, "status", "--json"))
		for _, s := range st.Shards {
			if s.ID == shard.ID && s.Leader != target {
				t.Fatalf("status after the transfer: leader %s, want %s", s.Leader, target)
			}
		}
		out := mustCtl(t, "--config", cfg, "transfer-leader", shard.ID, target)
		if !strings.Contains(out, "already leads") {
			t.Fatalf("transfer to the leader: %q", out)
		}
		// Without a target Raft picks one.
		out = mustCtl(t, "--config", cfg, "transfer-leader", shard.ID)
		if !strings.Contains(out, "leadership moved from "+target+" to ") {
			t.Fatalf("transfer without a target: %q", out)
		}
		// The data is unaffected.
		if r, err := api.Get(t.Context(), ns, done); err != nil || r.Str("state") != "COMPLETED" {
			t.Fatalf("get after the transfers: %v %v", r, err)
		}
	})

	t.Run("snapshot", func(t *testing.T) {
		shard := ring.Locate(ns, done)
		v := decode[snapshotView](t, mustCtl(t, "--config", cfg, "snapshot", shard.ID, "--json"))
		if v.Index == 0 || v.Term == 0 || !shard.HasVoter(v.Node) {
			t.Fatalf("snapshot on the leader: %+v", v)
		}
		follower := ""
		for _, id := range shard.Voters {
			if id != v.Node {
				follower = id
			}
		}
		out := mustCtl(t, "--config", cfg, "snapshot", shard.ID, "--node", follower)
		if !strings.Contains(out, "snapshot on "+follower+" covers the log up to index") {
			t.Fatalf("snapshot on a follower: %q", out)
		}
	})

	t.Run("unreachable node and exit codes", func(t *testing.T) {
		victim := topo.Nodes()[5].ID
		c.Nodes[victim].Kill()
		// The real binary: status still works (exit 0) and says so.
		cmd := exec.Command(binaries.Path(t, "idemctl"), "--config", cfg, "status", "--json")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("idemctl status with a node down: %v\n%s", err, stderr.String())
		}
		v := decode[clusterView](t, stdout.String())
		for _, n := range v.Nodes {
			if (n.ID == victim) != (n.Health == healthUnreachable) {
				t.Fatalf("node %s: health %q (error %q); only %s is down", n.ID, n.Health, n.Error, victim)
			}
		}
		text := mustCtl(t, "--config", cfg, "status")
		if !strings.Contains(text, "(5 reachable") || !strings.Contains(text, "unreachable (connection refused)") {
			t.Fatalf("status table with a node down:\n%s", text)
		}
		// A failure exits 1 with one line on stderr.
		cmd = exec.Command(binaries.Path(t, "idemctl"), "--config", cfg, "get", ns, "never-reserved")
		stderr.Reset()
		cmd.Stderr = &stderr
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Fatalf("get of an absent key: %v, want exit status 1", err)
		}
		if msg := stderr.String(); !strings.HasPrefix(msg, "idemctl: no record") || strings.Count(msg, "\n") != 1 {
			t.Fatalf("stderr %q, want one line", msg)
		}
	})
}
