package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/security/auth"
	"github.com/idem-dev/idem/security/pki"
)

// peerConn dials addr presenting the node or router certificate of the
// certs dir (as a node or router dials a node).
func peerConn(t *testing.T, dir string, router bool, addr string) *grpc.ClientConn {
	t.Helper()
	r, err := pki.NewReloader(pki.ReloaderConfig{Dir: dir, Router: router})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(r.NodeClientTLS("127.0.0.1"))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// peerHTTP is an HTTP client presenting the certs dir's node or router
// certificate.
func peerHTTP(t *testing.T, dir string, router bool) *http.Client {
	t.Helper()
	r, err := pki.NewReloader(pki.ReloaderConfig{Dir: dir, Router: router})
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: r.NodeClientTLS("127.0.0.1")}}
}

func wantCode(t *testing.T, what string, err error, codes ...codes.Code) {
	t.Helper()
	if !slices.Contains(codes, status.Code(err)) {
		t.Fatalf("%s: %v, want one of %v", what, err, codes)
	}
	t.Logf("%s: refused (%v)", what, err)
}

// metaMembers asks node addr, with a member's certificate, for the members
// of shard.
func shardMembers(t *testing.T, ctx context.Context, conn *grpc.ClientConn, shard string) (members []string, leader string) {
	t.Helper()
	st, err := idemv1.NewTopologyClient(conn).ShardState(ctx, &idemv1.ShardStateRequest{Shard: shard})
	if err != nil {
		t.Fatalf("ShardState %s: %v", shard, err)
	}
	for _, m := range st.GetMembers() {
		members = append(members, m.GetId())
	}
	return members, st.GetLeaderId()
}

// TestNodeAndRouterIdentitiesAuthorizeTheirRole performs, on a secure
// region, the attacks of a node certificate for an id outside the topology
// (every control RPC, admin actions, a Raft seat through ChangeMember; its
// own identity is a router's), of a member that does not drive the
// change, of the driver asking to seat a foreign node, and of a router
// certificate without a forwarded principal (every admin action; it may
// still route and read records, as its proxy mode does): each is refused, the groups' members do not change, and a router forwarding its
// caller's principal is audited under that principal on every hop.
func TestNodeAndRouterIdentitiesAuthorizeTheirRole(t *testing.T) {
	c := startSecureCluster(t, launch.Spec{Cluster: "peers", Regions: []string{"east"}, NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3},
		"principals:\n  - {name: root, namespaces: [\"*\"], role: admin}\n", "root")
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	nodes := c.Topology.Nodes()
	api, err := c.API(nodes[0].HTTPAddr, "root")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := api.Reserve(ctx, "pay", "order-1", nil); err != nil || r.Str("outcome") != "ACQUIRED" {
		t.Fatalf("reserve: %v %v", r, err)
	}
	member := func(id string) *grpc.ClientConn {
		dir, err := c.NodeCertsDir(id)
		if err != nil {
			t.Fatal(err)
		}
		nd, _ := c.Topology.NodeByID(id)
		return peerConn(t, dir, false, nd.GRPCAddr)
	}
	shards := c.Topology.Shards()
	var metaLeader string
	testutil.Until(t, 20*time.Second, "a meta group leader", func() bool {
		_, metaLeader = shardMembers(t, ctx, member(nodes[0].ID), "meta")
		return metaLeader != ""
	})
	before := map[string][]string{}
	shardLeader := map[string]string{}
	for _, s := range append([]string{"meta"}, shards[0].ID, shards[1].ID) {
		before[s], shardLeader[s] = shardMembers(t, ctx, member(nodes[0].ID), s)
	}
	evilDir, err := c.NodeCertsDir("evil-9")
	if err != nil {
		t.Fatal(err)
	}
	target := shards[0].ID
	leaderNode, _ := c.Topology.NodeByID(shardLeader[target])

	t.Run("ForeignNodeCertificate", func(t *testing.T) {
		conn := peerConn(t, evilDir, false, leaderNode.GRPCAddr)
		topo := idemv1.NewTopologyClient(conn)
		_, err := topo.ChangeMember(ctx, &idemv1.ChangeMemberRequest{Shard: target, Op: "add_learner", Node: "evil-9", Addr: "127.0.0.1:1"})
		wantCode(t, "ChangeMember add_learner evil-9", err, codes.PermissionDenied)
		_, err = topo.Handoff(ctx, &idemv1.HandoffRequest{Shard: target, Op: "adopt", PartitionCount: 16})
		wantCode(t, "Handoff adopt", err, codes.PermissionDenied)
		_, err = topo.Handoff(ctx, &idemv1.HandoffRequest{Shard: target, Op: "freeze", PartitionCount: 16, Partitions: []uint32{0}})
		wantCode(t, "Handoff freeze", err, codes.PermissionDenied)
		stream, err := topo.ExportPartitions(ctx, &idemv1.ExportPartitionsRequest{Shard: target, PartitionCount: 16, Partitions: []uint32{0}})
		if err == nil {
			_, err = stream.Recv()
		}
		wantCode(t, "ExportPartitions", err, codes.PermissionDenied)
		_, err = topo.ShardState(ctx, &idemv1.ShardStateRequest{Shard: target})
		wantCode(t, "ShardState", err, codes.PermissionDenied)
		_, err = topo.SetTarget(ctx, &idemv1.SetTargetRequest{Topology: []byte("{}")})
		wantCode(t, "SetTarget", err, codes.PermissionDenied)
		admin := idemv1.NewAdminClient(conn)
		_, err = admin.ForceRelease(ctx, &idemv1.ForceReleaseRequest{Namespace: "pay", Key: "order-1", Reason: "evil"})
		wantCode(t, "ForceRelease", err, codes.PermissionDenied)
		_, err = admin.TransferLeader(ctx, &idemv1.TransferLeaderRequest{Shard: target})
		wantCode(t, "TransferLeader", err, codes.PermissionDenied)
		_, err = admin.DeleteKey(ctx, &idemv1.DeleteKeyRequest{Namespace: "pay", Key: "order-1"})
		wantCode(t, "DeleteKey", err, codes.PermissionDenied)
		// Past the authorizer (an insecure-looking or misclassified
		// call), the control RPCs check the caller again themselves:
		// tested by the member cases below.
	})

	t.Run("ForeignNodeRaftSeat", func(t *testing.T) {
		// The foreign certificate on the Raft port of the shard's leader,
		// for the shard and for the meta group: it holds no seat in
		// either, so the connection is closed after the header, before
		// any Raft message is read, and counted.
		cert, err := tls.LoadX509KeyPair(filepath.Join(evilDir, pki.NodeCertFile), filepath.Join(evilDir, pki.NodeKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		nodeAPI, err := c.API(leaderNode.HTTPAddr, "root")
		if err != nil {
			t.Fatal(err)
		}
		seatRefusals := func() float64 {
			m, err := nodeAPI.Do(ctx, "GET", "/metrics", nil)
			if err != nil {
				t.Fatal(err)
			}
			v := regexp.MustCompile(`(?m)^idem_raft_rejected_connections_total\{reason="seat"\} (\S+)$`).FindSubmatch(m.Raw)
			if v == nil {
				return 0
			}
			f, _ := strconv.ParseFloat(string(v[1]), 64)
			return f
		}
		before := seatRefusals()
		for _, group := range []string{target, "meta"} {
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", leaderNode.RaftAddr,
				&tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}})
			if err != nil {
				t.Fatalf("handshake with a node certificate of the CA: %v", err)
			}
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			conn.Write(append(append([]byte("IDRM\x01"), byte(len(group))), group...))
			conn.Write(bytes.Repeat([]byte{0}, 64)) // what a forged AppendEntries would start with
			if n, err := conn.Read(make([]byte, 1)); err == nil || n > 0 {
				t.Fatalf("%s: the Raft port answered a node outside the topology (%d bytes, %v)", group, n, err)
			}
			conn.Close()
		}
		testutil.Until(t, 10*time.Second, "two connections refused for want of a seat", func() bool { return seatRefusals() >= before+2 })
	})

	t.Run("MemberThatDoesNotDrive", func(t *testing.T) {
		var other string
		for _, n := range nodes {
			if n.ID != metaLeader {
				other = n.ID
				break
			}
		}
		dir, err := c.NodeCertsDir(other)
		if err != nil {
			t.Fatal(err)
		}
		conn := peerConn(t, dir, false, leaderNode.GRPCAddr)
		topo := idemv1.NewTopologyClient(conn)
		_, err = topo.ChangeMember(ctx, &idemv1.ChangeMemberRequest{Shard: target, Op: "remove", Node: other})
		wantCode(t, "ChangeMember from "+other+" (not the meta leader)", err, codes.Unavailable)
		_, err = topo.Handoff(ctx, &idemv1.HandoffRequest{Shard: target, Op: "adopt", PartitionCount: 16})
		wantCode(t, "Handoff from "+other, err, codes.Unavailable)
		stream, err := topo.ExportPartitions(ctx, &idemv1.ExportPartitionsRequest{Shard: target, PartitionCount: 16, Partitions: []uint32{0}})
		if err == nil {
			_, err = stream.Recv()
		}
		wantCode(t, "ExportPartitions from "+other, err, codes.Unavailable)
		if _, err := topo.ShardState(ctx, &idemv1.ShardStateRequest{Shard: target}); err != nil {
			t.Fatalf("ShardState from a member: %v", err)
		}
	})

	t.Run("DriverSeatsNoForeignNode", func(t *testing.T) {
		conn := member(metaLeader)
		if metaLeader != leaderNode.ID {
			dir, err := c.NodeCertsDir(metaLeader)
			if err != nil {
				t.Fatal(err)
			}
			conn = peerConn(t, dir, false, leaderNode.GRPCAddr)
		}
		topo := idemv1.NewTopologyClient(conn)
		_, err := topo.ChangeMember(ctx, &idemv1.ChangeMemberRequest{Shard: target, Op: "add_learner", Node: "evil-9", Addr: "127.0.0.1:1"})
		wantCode(t, "ChangeMember add_learner evil-9 from the driver", err, codes.PermissionDenied)
		other := nodes[0]
		_, err = topo.ChangeMember(ctx, &idemv1.ChangeMemberRequest{Shard: target, Op: "add_learner", Node: other.ID, Addr: "127.0.0.1:1"})
		wantCode(t, "ChangeMember add_learner of a member at another address", err, codes.PermissionDenied, codes.FailedPrecondition)
	})

	t.Run("RouterCertificateIsNoAdmin", func(t *testing.T) {
		dir, err := c.RouterCertsDir("edge-1")
		if err != nil {
			t.Fatal(err)
		}
		conn := peerConn(t, dir, true, leaderNode.GRPCAddr)
		if _, err := idemv1.NewIdempotencyClient(conn).Routing(ctx, &idemv1.RoutingRequest{}); err != nil {
			t.Fatalf("Routing with the router's own identity: %v", err)
		}
		if _, err := idemv1.NewTopologyClient(conn).Get(ctx, &idemv1.GetTopologyRequest{}); err != nil {
			t.Fatalf("Topology.Get with the router's own identity: %v", err)
		}
		admin := idemv1.NewAdminClient(conn)
		_, err = admin.ForceRelease(ctx, &idemv1.ForceReleaseRequest{Namespace: "pay", Key: "order-1", Reason: "router"})
		wantCode(t, "ForceRelease", err, codes.PermissionDenied)
		_, err = admin.DeleteKey(ctx, &idemv1.DeleteKeyRequest{Namespace: "pay", Key: "order-1"})
		wantCode(t, "DeleteKey", err, codes.PermissionDenied)
		_, err = admin.SetPolicy(ctx, &idemv1.SetPolicyRequest{Namespace: "pay"})
		wantCode(t, "SetPolicy", err, codes.PermissionDenied)
		_, err = admin.Snapshot(ctx, &idemv1.SnapshotRequest{})
		wantCode(t, "Snapshot", err, codes.PermissionDenied)
		_, err = admin.TransferLeader(ctx, &idemv1.TransferLeaderRequest{Shard: target})
		wantCode(t, "TransferLeader", err, codes.PermissionDenied)
		_, err = idemv1.NewTopologyClient(conn).SetTarget(ctx, &idemv1.SetTargetRequest{Topology: []byte("{}")})
		wantCode(t, "SetTarget", err, codes.PermissionDenied)
		// Records are a router's to read and write for its proxy mode's
		// callers, who are no idem principals.
		if _, err := idemv1.NewIdempotencyClient(conn).Get(ctx, &idemv1.GetRequest{Namespace: "pay", Key: "order-1"}); err != nil {
			t.Fatalf("Get with the router's own identity: %v", err)
		}

		hc := peerHTTP(t, dir, true)
		for _, call := range []struct{ method, path, body string }{
			{"PUT", "/v1/topology", `{"topology":{}}`},
			{"PUT", "/v1/namespaces/pay/policy", `{}`},
			{"DELETE", "/v1/namespaces/pay/keys/order-1", ``},
			{"POST", "/v1/namespaces/pay/keys/order-1:force-release", `{"reason":"router"}`},
		} {
			req, _ := http.NewRequestWithContext(ctx, call.method, "https://"+leaderNode.HTTPAddr+call.path, strings.NewReader(call.body))
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Fatalf("%s %s with the router's certificate: %d, want 403", call.method, call.path, resp.StatusCode)
			}
		}

		// What a router forwards for its caller runs as that caller, and
		// is audited under its name on every node it reaches (a node that
		// does not lead the key's shard forwards it to the leader).
		var via string
		for _, n := range nodes {
			if n.ID != leaderNode.ID {
				via = n.HTTPAddr
				break
			}
		}
		req, _ := http.NewRequestWithContext(ctx, "POST", "https://"+via+"/v1/namespaces/pay/keys/order-1:force-release", strings.NewReader(`{"reason":"through-router"}`))
		req.Header.Set(auth.ForwardedPrincipalHeader, "root")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("force-release forwarded by the router for root: %d", resp.StatusCode)
		}
		audit := regexp.MustCompile(`(?m)^.*msg="operator action" .*reason=through-router.*$`)
		var lines [][]byte
		for _, n := range nodes {
			data, _ := os.ReadFile(c.Nodes[n.ID].Log)
			lines = append(lines, audit.FindAll(data, -1)...)
		}
		if len(lines) == 0 {
			t.Fatal("no node logged the forwarded force-release")
		}
		for _, l := range lines {
			if !bytes.Contains(l, []byte("principal=root")) {
				t.Fatalf("an audit line does not name the principal that asked: %s", l)
			}
		}
	})

	t.Run("RefusedTopologyNeverReachesTheMetaLog", func(t *testing.T) {
		metaCommit := func() uint64 {
			st, err := idemv1.NewTopologyClient(member(metaLeader)).ShardState(ctx, &idemv1.ShardStateRequest{Shard: "meta"})
			if err != nil {
				t.Fatal(err)
			}
			return st.GetCommitIndex()
		}
		giant := c.Topology.Clone()
		giant.Version = 2
		giant.ShardsPerRegion = 256
		renamed := c.Topology.Clone()
		renamed.Version = 2
		renamed.Cluster = "another"
		// The meta log settles after the start (the cluster version is
		// raised in a step or two); then nothing else appends to it.
		before := metaCommit()
		stable := 0
		testutil.Until(t, 30*time.Second, "the meta log to settle", func() bool {
			time.Sleep(300 * time.Millisecond) // the interval between two reads of the index
			now := metaCommit()
			if now == before {
				stable++
			} else {
				before, stable = now, 0
			}
			return stable >= 3
		})
		for _, tc := range []struct {
			name string
			body map[string]any
		}{
			{"256 shards naming a dead node that does not exist", map[string]any{"topology": giant, "dead": []string{"ghost"}}},
			{"a dead node the target still lists", map[string]any{"topology": giant, "dead": []string{nodes[0].ID}}},
			{"a plan refuses it (another cluster name)", map[string]any{"topology": renamed}},
		} {
			start := time.Now()
			r, err := api.Do(ctx, "PUT", "/v1/topology", tc.body)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != http.StatusBadRequest || r.ErrCode() != "INVALID_ARGUMENT" {
				t.Fatalf("%s: %s, want 400 INVALID_ARGUMENT", tc.name, r)
			}
			t.Logf("%s: 400 after %v: %s", tc.name, time.Since(start).Round(time.Millisecond), r.Raw)
		}
		if after := metaCommit(); after != before {
			t.Fatalf("the meta log grew from %d to %d entries: a refused target was proposed", before, after)
		}
	})

	// A node without unsafe settings says so: 0 for each.
	m, err := api.Do(ctx, "GET", "/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, setting := range []string{"insecure", "clock_check_off", "fault_injection"} {
		if want := `idem_node_unsafe_settings{setting="` + setting + `"} 0`; !bytes.Contains(m.Raw, []byte(want+"\n")) {
			t.Errorf("a node without unsafe settings lacks %s", want)
		}
	}

	// No group seated anyone: the members are those of the start.
	for s, want := range before {
		got, _ := shardMembers(t, ctx, member(nodes[1].ID), s)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s members %v, were %v", s, got, want)
		}
	}
}
