package raftstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem/internal/testutil"
)

// kvSM is the tiny state machine the tests replicate: commands are "key=value"
// and set a key; Apply returns a kvResult.
type kvSM struct {
	mu        sync.Mutex
	data      map[string]string
	lastIndex uint64
	applies   int // commands applied since this instance was created
	packed    int // packed entries applied
	restores  int
}

type kvResult struct {
	Index uint64
	Pos   int // position in a packed entry
	Key   string
}

func newKV() *kvSM { return &kvSM{data: map[string]string{}} }

func (s *kvSM) Apply(index uint64, data []byte) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	if index <= s.lastIndex {
		panic(fmt.Sprintf("kvSM: index went backwards: %d after %d", index, s.lastIndex))
	}
	s.lastIndex = index
	if len(data) > 0 && data[0] == kvPackedMark {
		// A packed entry (testPacker): one result per command, in order.
		var out []any
		for i, cmd := range strings.Split(string(data[1:]), "\n") {
			out = append(out, s.set(index, i, cmd))
		}
		s.packed++
		return out
	}
	return s.set(index, 0, string(data))
}

func (s *kvSM) set(index uint64, pos int, cmd string) kvResult {
	k, v, _ := strings.Cut(cmd, "=")
	s.data[k] = v
	s.applies++
	return kvResult{Index: index, Pos: pos, Key: k}
}

// kvPackedMark starts a packed kvSM entry: commands joined by newlines.
const kvPackedMark = 0

// testPacker packs kvSM commands for the proposal buffer.
type testPacker struct{}

func (testPacker) PackCommands(cmds [][]byte) []byte {
	b := []byte{kvPackedMark}
	for i, c := range cmds {
		if i > 0 {
			b = append(b, '\n')
		}
		b = append(b, c...)
	}
	return b
}

type kvSnapshot struct {
	Data      map[string]string
	LastIndex uint64
}

func (s *kvSnapshot) WriteTo(w io.Writer) (int64, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return 0, err
	}
	n, err := w.Write(b)
	return int64(n), err
}

func (s *kvSnapshot) Release() {}

func (s *kvSM) Snapshot() (SnapshotWriter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &kvSnapshot{Data: maps.Clone(s.data), LastIndex: s.lastIndex}, nil
}

func (s *kvSM) Restore(r io.Reader) error {
	var snap kvSnapshot
	if err := json.NewDecoder(r).Decode(&snap); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data = snap.Data
	if s.data == nil {
		s.data = map[string]string{}
	}
	s.lastIndex = snap.LastIndex
	s.restores++
	return nil
}

func (s *kvSM) get(k string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.data[k]
	return v, ok
}

func (s *kvSM) counts() (applies, restores int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applies, s.restores
}

// missing returns the keys of want that s lacks or holds with another value.
func (s *kvSM) missing(want map[string]string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, v := range want {
		if s.data[k] != v {
			out = append(out, k)
		}
	}
	return out
}

// testConfig returns the production timeouts: the whole repo's suite runs
// its packages in parallel on a 2-core box under -race, and shorter ones
// (300 ms heartbeat, 150 ms lease) made leaders step down there mid-test
// (see DESIGN.md for the measurements). Only the commit timeout is short, so
// followers learn commits quickly.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.CommitTimeout = 10 * time.Millisecond
	cfg.ApplyTimeout = 5 * time.Second
	cfg.NoFsync = true
	return cfg
}

type testNode struct {
	id   string
	dir  string
	addr string
	reg  *prometheus.Registry
	host *Host
	sms  map[string]*kvSM
	up   bool
}

type testCluster struct {
	tb     testing.TB
	shards []string
	nodes  []*testNode
	mod    func(*Config)
	logger *slog.Logger
}

// newTestCluster starts n hosts on loopback, each hosting every shard.
func newTestCluster(tb testing.TB, n int, shards []string, mod func(*Config)) *testCluster {
	tb.Helper()
	c := &testCluster{tb: tb, shards: shards, mod: mod}
	if _, isBench := tb.(*testing.B); isBench {
		c.logger = slog.New(slog.DiscardHandler)
	} else {
		c.logger = testutil.Logger(tb, slog.LevelInfo)
	}
	for i := range n {
		node := &testNode{id: fmt.Sprintf("node%d", i), dir: tb.TempDir(), addr: "127.0.0.1:0"}
		c.nodes = append(c.nodes, node)
		c.openHost(node)
		node.addr = node.host.Addr()
	}
	tb.Cleanup(func() {
		for _, n := range c.nodes {
			if n.up {
				n.host.Close()
			}
		}
	})
	for _, node := range c.nodes {
		c.addGroups(node)
	}
	return c
}

func (c *testCluster) config(n *testNode) Config {
	cfg := testConfig()
	if c.mod != nil {
		c.mod(&cfg)
	}
	cfg.NodeID = n.id
	cfg.RaftListenAddr = n.addr
	cfg.DataDir = n.dir
	cfg.Logger = c.logger.With("node", n.id)
	n.reg = prometheus.NewRegistry()
	cfg.Registry = n.reg
	return cfg
}

func (c *testCluster) openHost(n *testNode) {
	c.tb.Helper()
	h, err := NewHost(c.config(n))
	// A restarted node binds its old port again, which another test's
	// process may hold for a moment as the source port of an outgoing
	// connection (the ports came from the ephemeral range): retry a while.
	for deadline := time.Now().Add(20 * time.Second); errors.Is(err, syscall.EADDRINUSE) && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		h, err = NewHost(c.config(n))
	}
	if err != nil {
		c.tb.Fatalf("NewHost(%s): %v", n.id, err)
	}
	n.host, n.up, n.sms = h, true, map[string]*kvSM{}
}

func (c *testCluster) voters() []Peer {
	var ps []Peer
	for _, n := range c.nodes {
		ps = append(ps, Peer{ID: n.id, Addr: n.addr})
	}
	return ps
}

func (c *testCluster) addGroups(n *testNode) {
	c.tb.Helper()
	c.addGroupsWith(n, StartBootstrap)
}

// addGroupsWith adds every shard to n with the given StartMode.
func (c *testCluster) addGroupsWith(n *testNode, start StartMode) {
	c.tb.Helper()
	for _, shard := range c.shards {
		sm := newKV()
		if _, err := n.host.AddGroup(GroupConfig{ID: shard, Voters: c.voters(), Start: start}, sm); err != nil {
			c.tb.Fatalf("AddGroup(%s on %s): %v", shard, n.id, err)
		}
		n.sms[shard] = sm
	}
}

// crash stops node i abruptly (no leadership hand-over).
func (c *testCluster) crash(i int) {
	c.tb.Helper()
	n := c.nodes[i]
	if err := n.host.Close(); err != nil {
		c.tb.Errorf("Close(%s): %v", n.id, err)
	}
	n.up = false
}

// restart starts node i again on its data dir and address with fresh state
// machines.
func (c *testCluster) restart(i int) {
	c.tb.Helper()
	c.openHost(c.nodes[i])
	c.addGroups(c.nodes[i])
}

func (c *testCluster) group(i int, shard string) *Group {
	c.tb.Helper()
	g, ok := c.nodes[i].host.Group(shard)
	if !ok {
		c.tb.Fatalf("%s does not host %s", c.nodes[i].id, shard)
	}
	return g
}

func (c *testCluster) index(nodeID string) int {
	for i, n := range c.nodes {
		if n.id == nodeID {
			return i
		}
	}
	return -1
}

// leaderAmong polls until one of the given nodes leads shard and every one
// of them agrees on it, and returns its index.
func (c *testCluster) leaderAmong(shard string, idxs []int, timeout time.Duration) int {
	c.tb.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		leader := -1
		agree := true
		var seen []string
		for _, i := range idxs {
			g := c.group(i, shard)
			id, _ := g.Leader()
			seen = append(seen, fmt.Sprintf("%s:%s/%s", c.nodes[i].id, g.Stats().State, id))
			if g.IsLeader() {
				leader = i
			}
			if id == "" {
				agree = false
			}
		}
		if leader >= 0 && agree {
			for _, i := range idxs {
				if id, _ := c.group(i, shard).Leader(); id != c.nodes[leader].id {
					agree = false
				}
			}
			if agree {
				return leader
			}
		}
		last = strings.Join(seen, " ")
		time.Sleep(10 * time.Millisecond) // polling interval, not a wait for a condition
	}
	c.tb.Fatalf("no agreed leader for %s among %v within %v; last seen: %s", shard, idxs, timeout, last)
	return -1
}

func (c *testCluster) upNodes() []int {
	var out []int
	for i, n := range c.nodes {
		if n.up {
			out = append(out, i)
		}
	}
	return out
}

func (c *testCluster) leader(shard string) int {
	c.tb.Helper()
	return c.leaderAmong(shard, c.upNodes(), 15*time.Second)
}

// put applies key=val on shard through whichever node leads it, following
// NotLeaderError redirects and retrying ambiguous outcomes (a set is
// idempotent), until it is acknowledged.
func (c *testCluster) put(shard, key, val string) kvResult {
	c.tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var lastErr error
	for time.Now().Before(deadline) {
		i := c.leader(shard)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		res, err := c.group(i, shard).Apply(ctx, []byte(key+"="+val))
		cancel()
		if err == nil {
			return res.(kvResult)
		}
		lastErr = err
		if !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrUnknownOutcome) {
			c.tb.Fatalf("Apply(%s, %s): unexpected error %v", shard, key, err)
		}
	}
	c.tb.Fatalf("Apply(%s, %s) not acknowledged within deadline; last error: %v", shard, key, lastErr)
	return kvResult{}
}

// barrier runs ReadBarrier on the leader of shard among idxs, following
// leader changes, and returns the node it succeeded on.
func (c *testCluster) barrier(shard string, idxs []int) int {
	c.tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var lastErr error
	for time.Now().Before(deadline) {
		i := c.leaderAmong(shard, idxs, 15*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err := c.group(i, shard).ReadBarrier(ctx)
		cancel()
		if err == nil {
			return i
		}
		if !errors.Is(err, ErrNotLeader) {
			c.tb.Fatalf("ReadBarrier(%s) on %s: %v", shard, c.nodes[i].id, err)
		}
		lastErr = err
	}
	c.tb.Fatalf("ReadBarrier(%s) did not succeed within deadline; last error: %v", shard, lastErr)
	return -1
}

// waitReplicated polls until every node in idxs holds want for shard.
func (c *testCluster) waitReplicated(shard string, want map[string]string, idxs []int) {
	c.tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var lagging []string
		for _, i := range idxs {
			if miss := c.nodes[i].sms[shard].missing(want); len(miss) > 0 {
				lagging = append(lagging, fmt.Sprintf("%s misses %d keys (e.g. %s)", c.nodes[i].id, len(miss), miss[0]))
			}
		}
		if len(lagging) == 0 {
			return
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("shard %s not replicated: %s", shard, strings.Join(lagging, "; "))
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
}

func ctxTimeout(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}
