package raftstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/security/pki"
)

// testPKI is a cluster CA with one certs dir per node, as idemctl cert makes.
type testPKI struct {
	tb    testing.TB
	caDir string
}

func newTestPKI(tb testing.TB) *testPKI {
	tb.Helper()
	p := &testPKI{tb: tb, caDir: tb.TempDir()}
	if err := pki.CreateCA(p.caDir, pki.Options{}); err != nil {
		tb.Fatal(err)
	}
	return p
}

// node issues a node certificate for id in a fresh dir and returns a
// Reloader over it.
func (p *testPKI) node(id string) *pki.Reloader {
	p.tb.Helper()
	r, err := pki.NewReloader(pki.ReloaderConfig{Dir: p.nodeDir(id), NodeID: id, CheckInterval: -1})
	if err != nil {
		p.tb.Fatal(err)
	}
	return r
}

// nodeDir issues a node certificate for id in a fresh certs dir.
func (p *testPKI) nodeDir(id string) string {
	p.tb.Helper()
	dir := p.tb.TempDir()
	ca, err := os.ReadFile(filepath.Join(p.caDir, pki.CACertFile))
	if err != nil {
		p.tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, pki.CACertFile), ca, 0o644); err != nil {
		p.tb.Fatal(err)
	}
	if err := pki.CreateNode(dir, filepath.Join(p.caDir, pki.CAKeyFile), id, []string{"127.0.0.1"}, pki.Options{}); err != nil {
		p.tb.Fatal(err)
	}
	return dir
}

func loadPair(tb testing.TB, dir, certFile, keyFile string) tls.Certificate {
	tb.Helper()
	c, err := tls.LoadX509KeyPair(filepath.Join(dir, certFile), filepath.Join(dir, keyFile))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func (p *testPKI) clientCert(name string) tls.Certificate {
	p.tb.Helper()
	if err := pki.CreateClient(p.caDir, "", name, pki.Options{}); err != nil {
		p.tb.Fatal(err)
	}
	return loadPair(p.tb, p.caDir, pki.ClientCertFile(name), pki.ClientKeyFile(name))
}

func raftTLS(r *pki.Reloader) *TLSConfig {
	return &TLSConfig{Server: r.NodeServerTLS(), Client: func(host string) *tls.Config { return r.NodeClientTLS(host) }}
}

// newTLSCluster starts n hosts whose Raft ports require node certificates of
// one CA. newTestCluster opens node0..node(n-1) in order, so the i-th call of
// the config hook is node i.
func newTLSCluster(t testing.TB, p *testPKI, n int, shards []string) *testCluster {
	var mu sync.Mutex
	opened := 0
	return newTestCluster(t, n, shards, func(cfg *Config) {
		mu.Lock()
		defer mu.Unlock()
		cfg.TLS = raftTLS(p.node(fmt.Sprintf("node%d", opened)))
		opened++
	})
}

// forger speaks hashicorp/raft's wire protocol to a Raft port the way an
// attacker would: through a NetworkTransport over a stream layer that dials
// with tlsCfg (nil: plaintext) and writes the mux header of shard.
type forger struct {
	tlsCfg *tls.Config
	shard  string
	done   chan struct{}
}

func (f *forger) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", string(address), timeout)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(timeout))
	if f.tlsCfg != nil {
		tc := tls.Client(c, f.tlsCfg)
		if err := tc.Handshake(); err != nil {
			c.Close()
			return nil, err
		}
		c = tc
	}
	if _, err := c.Write(encodeMuxHeader(f.shard)); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

func (f *forger) Accept() (net.Conn, error) { <-f.done; return nil, net.ErrClosed }
func (f *forger) Close() error              { return nil }
func (f *forger) Addr() net.Addr            { return muxAddr("127.0.0.1:1") }

// forgeAppendEntries sends target a hand-written AppendEntries claiming
// leadership at term and carrying a forged command: what made an insecure
// node step down and apply it.
func forgeAppendEntries(t *testing.T, tlsCfg *tls.Config, shard, targetID, targetAddr string, term, lastIndex uint64) error {
	t.Helper()
	f := &forger{tlsCfg: tlsCfg, shard: shard, done: make(chan struct{})}
	tr := raft.NewNetworkTransport(f, 1, 2*time.Second, io.Discard)
	defer func() { close(f.done); tr.Close() }()
	req := &raft.AppendEntriesRequest{
		RPCHeader:         raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("mallory"), Addr: []byte("127.0.0.1:1")},
		Term:              term,
		PrevLogEntry:      lastIndex,
		PrevLogTerm:       term - 1,
		Entries:           []*raft.Log{{Index: lastIndex + 1, Term: term, Type: raft.LogCommand, Data: []byte("victim=forged")}},
		LeaderCommitIndex: lastIndex + 1,
	}
	var resp raft.AppendEntriesResponse
	return tr.AppendEntries(raft.ServerID(targetID), raft.ServerAddress(targetAddr), req, &resp)
}

// TestForgedAppendEntriesControl proves the forger works: against a
// plaintext Raft port, the forged AppendEntries makes the leader adopt the
// attacker's term. The TLS tests below assert that the same attack changes
// nothing once the port requires node certificates.
func TestForgedAppendEntriesControl(t *testing.T) {
	c := newTestCluster(t, 1, []string{"s0"}, nil)
	c.leader("s0")
	c.put("s0", "a", "1")
	before := c.group(0, "s0").Stats()
	if err := forgeAppendEntries(t, nil, "s0", "node0", c.nodes[0].addr, before.Term+100, before.LastLogIndex); err != nil {
		t.Fatalf("forged AppendEntries over plaintext: %v", err)
	}
	if after := c.group(0, "s0").Stats(); after.Term < before.Term+100 {
		t.Fatalf("plaintext node kept term %d after a forged term %d: the forger does not work", after.Term, before.Term+100)
	}
}

// TestTLSClusterReplicatesAndRefusesForgedPeers runs a three-node cluster of
// two groups over mutual TLS, then sends the forged AppendEntries from a
// plaintext peer, a TLS peer without a certificate, one with a client
// certificate of the cluster CA and one with a node certificate of another
// CA: each is closed at the handshake (counted as reason "tls"), and no
// node's term, leader or applied index moves.
func TestTLSClusterReplicatesAndRefusesForgedPeers(t *testing.T) {
	p := newTestPKI(t)
	shards := []string{"s0", "s1"}
	c := newTLSCluster(t, p, 3, shards)
	all := []int{0, 1, 2}
	want := map[string]map[string]string{}
	for _, shard := range shards {
		want[shard] = map[string]string{}
		for i := range 5 {
			k, v := fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)
			c.put(shard, k, v)
			want[shard][k] = v
		}
		c.waitReplicated(shard, want[shard], all)
	}
	for _, n := range c.nodes {
		if s := n.host.MuxStats(); s.RejectedTLS != 0 || s.RejectedHeader != 0 {
			t.Fatalf("%s rejected peers of its own cluster: %+v", n.id, s)
		}
	}

	snapshot := func() map[string]GroupStats {
		out := map[string]GroupStats{}
		for _, n := range c.nodes {
			for _, shard := range shards {
				g, _ := n.host.Group(shard)
				out[n.id+"/"+shard] = g.Stats()
			}
		}
		return out
	}
	// Let followers learn the last commit before taking the baseline.
	for _, shard := range shards {
		c.barrier(shard, all)
	}
	before := snapshot()
	leader := c.leader("s0")
	target := c.nodes[leader]
	base := before[target.id+"/s0"]

	presenting := func(cert tls.Certificate) *tls.Config {
		return &tls.Config{InsecureSkipVerify: true, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}
	}
	// A node certificate with the victim's own id, from another CA.
	foreign := loadPair(t, newTestPKI(t).nodeDir(target.id), pki.NodeCertFile, pki.NodeKeyFile)
	attacks := []struct {
		name string
		cfg  *tls.Config
	}{
		{"plaintext", nil},
		{"TLS without a certificate", &tls.Config{InsecureSkipVerify: true}},
		{"client certificate of the cluster CA", presenting(p.clientCert("mallory"))},
		{"node certificate of another CA", presenting(foreign)},
	}
	for _, a := range attacks {
		stats := target.host.MuxStats()
		err := forgeAppendEntries(t, a.cfg, "s0", target.id, target.addr, base.Term+100, base.LastLogIndex)
		if err == nil {
			t.Fatalf("%s: the forged AppendEntries got an answer", a.name)
		}
		deadline := time.Now().Add(10 * time.Second)
		for target.host.MuxStats().RejectedTLS != stats.RejectedTLS+1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: RejectedTLS %d, want %d (stats %+v)", a.name, target.host.MuxStats().RejectedTLS, stats.RejectedTLS+1, target.host.MuxStats())
			}
			time.Sleep(5 * time.Millisecond) // polling interval
		}
		if got := target.host.MuxStats().RejectedHeader; got != stats.RejectedHeader {
			t.Fatalf("%s: a header was read (RejectedHeader %d -> %d)", a.name, stats.RejectedHeader, got)
		}
		t.Logf("%s: refused (%v)", a.name, err)
	}
	after := snapshot()
	for k, b := range before {
		a := after[k]
		if a.Term != b.Term || a.LeaderID != b.LeaderID || a.AppliedIndex != b.AppliedIndex || a.LastLogIndex != b.LastLogIndex {
			t.Errorf("%s moved: term %d->%d, leader %q->%q, applied %d->%d, last log %d->%d", k,
				b.Term, a.Term, b.LeaderID, a.LeaderID, b.AppliedIndex, a.AppliedIndex, b.LastLogIndex, a.LastLogIndex)
		}
	}
	for _, n := range c.nodes {
		if v, ok := n.sms["s0"].get("victim"); ok {
			t.Errorf("%s applied the forged command (victim=%s)", n.id, v)
		}
	}
	// The cluster still works.
	c.put("s0", "after", "1")
	c.waitReplicated("s0", map[string]string{"after": "1"}, all)
}

// TestMuxConnectionCap: past MaxInboundConns an accepted connection is
// closed at once and counted; a slot frees when a connection closes.
func TestMuxConnectionCap(t *testing.T) {
	cfg := testConfig()
	cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir = "n1", "127.0.0.1:0", t.TempDir()
	cfg.Logger = testutil.Logger(t, slog.LevelInfo)
	cfg.MaxInboundConns = 2
	h, err := NewHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	waitStats := func(what string, ok func(MuxStats) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok(h.MuxStats()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: stats %+v", what, h.MuxStats())
			}
			time.Sleep(5 * time.Millisecond) // polling interval
		}
	}
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", h.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	closedByPeer := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}
	// Two silent connections hold both slots (they sit in the header read).
	first, _ := dial(), dial()
	waitStats("two connections open", func(s MuxStats) bool { return s.Inbound == 2 })
	third := dial()
	waitStats("third rejected", func(s MuxStats) bool { return s.RejectedLimit == 1 })
	if !closedByPeer(third) {
		t.Fatal("the connection over the cap stayed open")
	}
	first.Close()
	waitStats("slot freed", func(s MuxStats) bool { return s.Inbound == 1 })
	fourth := dial()
	waitStats("fourth admitted", func(s MuxStats) bool { return s.Inbound == 2 })
	if closedByPeer(fourth) {
		t.Fatal("a connection within the cap was closed")
	}
	if s := h.MuxStats(); s.RejectedLimit != 1 {
		t.Fatalf("RejectedLimit %d, want 1", s.RejectedLimit)
	}
}

// TestConfigValidatesTLS: a half-configured TLS is refused.
func TestConfigValidatesTLS(t *testing.T) {
	cfg := testConfig()
	cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir = "n1", "127.0.0.1:0", t.TempDir()
	cfg.TLS = &TLSConfig{Server: &tls.Config{}}
	cfg.MaxInboundConns = -1
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "TLS needs both Server and Client") || !strings.Contains(err.Error(), "MaxInboundConns") {
		t.Fatalf("Validate: %v", err)
	}
}

// TestTLSHandshakeDeadline: a peer that connects to a secure Raft port and
// never finishes a handshake is closed after muxHeaderTimeout and counted.
func TestTLSHandshakeDeadline(t *testing.T) {
	p := newTestPKI(t)
	cfg := testConfig()
	cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir = "n1", "127.0.0.1:0", t.TempDir()
	cfg.Logger = testutil.Logger(t, slog.LevelInfo)
	cfg.TLS = raftTLS(p.node("n1"))
	h, err := NewHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	c, err := net.Dial("tcp", h.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(muxHeaderTimeout + 10*time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the server sent bytes to a silent peer")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("a silent peer was still open after %v", time.Since(start))
	}
	if s := h.MuxStats(); s.RejectedTLS != 1 || s.Inbound != 0 {
		t.Fatalf("stats %+v, want one TLS rejection and no open connection", s)
	}
}

// BenchmarkApplyTLS compares replicated Apply throughput over a plaintext
// and a mutual-TLS Raft port (3 nodes on loopback, one group, 32x
// GOMAXPROCS concurrent proposers, NoFsync so the transport's share shows).
//
//	go test -run '^$' -bench ApplyTLS -benchtime 3s ./raftstore
func BenchmarkApplyTLS(b *testing.B) {
	for _, mode := range []string{"plaintext", "tls"} {
		b.Run("raft="+mode, func(b *testing.B) {
			var c *testCluster
			if mode == "tls" {
				c = newTLSCluster(b, newTestPKI(b), 3, []string{"s0"})
			} else {
				c = newTestCluster(b, 3, []string{"s0"}, nil)
			}
			g := c.group(c.leader("s0"), "s0")
			cmd := []byte("k=" + strings.Repeat("v", 100))
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := g.Apply(context.Background(), cmd); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// TestRaftAdmissionBySeat: a node certificate of the cluster CA opens a Raft
// connection to a group only for a node that holds a seat in the group's
// current configuration (a certificate for node9, which holds none, is
// closed after the header and counted as reason "seat"), and a message that
// claims another node than its connection's certificate (node1's
// certificate, an AppendEntries claiming "mallory") is dropped and counted
// as reason "source". No node's term, leader or log moves.
func TestRaftAdmissionBySeat(t *testing.T) {
	p := newTestPKI(t)
	c := newTLSCluster(t, p, 3, []string{"s0"})
	c.put("s0", "a", "1")
	leader := c.leader("s0")
	target := c.nodes[leader]
	base := c.group(leader, "s0").Stats()
	presenting := func(cert tls.Certificate) *tls.Config {
		return &tls.Config{InsecureSkipVerify: true, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}
	}
	seated := c.nodes[(leader+1)%3].id
	for _, a := range []struct {
		name string
		cert tls.Certificate
		stat func(MuxStats) uint64
	}{
		{"node certificate without a seat", loadPair(t, p.nodeDir("node9"), pki.NodeCertFile, pki.NodeKeyFile), func(s MuxStats) uint64 { return s.RejectedSeat }},
		{"seated node claiming another node", loadPair(t, p.nodeDir(seated), pki.NodeCertFile, pki.NodeKeyFile), func(s MuxStats) uint64 { return s.DroppedSource }},
	} {
		before := a.stat(target.host.MuxStats())
		if err := forgeAppendEntries(t, presenting(a.cert), "s0", target.id, target.addr, base.Term+100, base.LastLogIndex); err == nil {
			t.Fatalf("%s: the forged AppendEntries got an answer", a.name)
		}
		deadline := time.Now().Add(10 * time.Second)
		for a.stat(target.host.MuxStats()) != before+1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: counter %d, want %d (stats %+v)", a.name, a.stat(target.host.MuxStats()), before+1, target.host.MuxStats())
			}
			time.Sleep(5 * time.Millisecond) // polling interval
		}
	}
	if after := c.group(leader, "s0").Stats(); after.Term != base.Term || after.LastLogIndex != base.LastLogIndex {
		t.Fatalf("the leader moved: term %d->%d, last log %d->%d", base.Term, after.Term, base.LastLogIndex, after.LastLogIndex)
	}
	c.put("s0", "b", "2")
	for _, n := range c.nodes {
		if s := n.host.MuxStats(); s.DroppedSource+s.DroppedSeat+s.DroppedDecode != 0 && n != target {
			t.Fatalf("%s dropped messages of its own cluster: %+v", n.id, s)
		}
	}
}

// A replica that rejoins from an old configuration admits a node the
// cluster's topology seats in the group (Config.ExtraSeats), which its
// own configuration does not list yet; nobody else.
func TestExtraSeatsWidenTheConfiguration(t *testing.T) {
	base := func(node string) (bool, bool) { return node == "a", true }
	h := &Host{cfg: Config{ExtraSeats: func(group, node string) bool { return group == "s0" && node == "b" }}}
	for _, tc := range []struct {
		group, node string
		want        bool
	}{{"s0", "a", true}, {"s0", "b", true}, {"s0", "c", false}, {"s1", "b", false}} {
		if got, known := h.seatCheck(tc.group, base)(tc.node); got != tc.want || !known {
			t.Errorf("%s in %s: seated %v known %v, want %v", tc.node, tc.group, got, known, tc.want)
		}
	}
	if got, _ := (&Host{}).seatCheck("s0", base)("b"); got {
		t.Error("without ExtraSeats a node outside the configuration was admitted")
	}
}
