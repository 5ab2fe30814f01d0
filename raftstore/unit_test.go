package raftstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/idem-dev/idem/internal/testutil"
)

func TestConfigValidate(t *testing.T) {
	valid := DefaultConfig()
	valid.NodeID, valid.RaftListenAddr, valid.DataDir = "n1", "127.0.0.1:0", t.TempDir()
	if err := valid.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}

	// The zero Config reports every problem at once.
	err := Config{}.Validate()
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) {
		t.Fatalf("Validate() = %v, want a joined error", err)
	}
	if n := len(joined.Unwrap()); n < 9 {
		t.Fatalf("zero Config: %d problems reported, want every one (>= 9):\n%v", n, err)
	}

	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"wildcard listen without advertise", func(c *Config) { c.RaftListenAddr = "0.0.0.0:7000" }},
		{"empty host listen without advertise", func(c *Config) { c.RaftListenAddr = ":7000" }},
		{"advertise without port", func(c *Config) { c.RaftAdvertiseAddr = "10.0.0.1:0" }},
		{"lease above heartbeat", func(c *Config) { c.LeaderLeaseTimeout = 2 * c.HeartbeatTimeout }},
		{"election below heartbeat", func(c *Config) { c.ElectionTimeout = c.HeartbeatTimeout / 2 }},
		{"MaxAppendEntries too large", func(c *Config) { c.MaxAppendEntries = 4096 }},
		{"no apply timeout", func(c *Config) { c.ApplyTimeout = 0 }},
	} {
		c := valid
		tc.mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate() = nil, want an error", tc.name)
		}
	}
	c := valid
	c.RaftListenAddr, c.RaftAdvertiseAddr = ":7000", "10.0.0.1:7000"
	if err := c.Validate(); err != nil {
		t.Errorf("wildcard listen with advertise: %v", err)
	}
}

func TestGroupConfigValidate(t *testing.T) {
	self := "n1"
	ok := GroupConfig{ID: "shard-0", Voters: []Peer{{"n1", "10.0.0.1:7000"}, {"n2", "10.0.0.2:7000"}}}
	if err := ok.validate(self); err != nil {
		t.Fatalf("valid: %v", err)
	}
	for _, gc := range []GroupConfig{
		{ID: "", Voters: ok.Voters},
		{ID: "..", Voters: ok.Voters},
		{ID: "a/b", Voters: ok.Voters},
		{ID: strings.Repeat("x", 65), Voters: ok.Voters},
		{ID: "s", Voters: nil},
		{ID: "s", Voters: []Peer{{"n2", "10.0.0.2:7000"}}},                          // self missing
		{ID: "s", Voters: []Peer{{"n1", "10.0.0.1:7000"}, {"n1", "10.0.0.2:7000"}}}, // duplicate id
		{ID: "s", Voters: []Peer{{"n1", "10.0.0.1:7000"}, {"n2", "10.0.0.1:7000"}}}, // duplicate addr
		{ID: "s", Voters: []Peer{{"n1", "0.0.0.0:7000"}}},                           // wildcard
	} {
		if err := gc.validate(self); err == nil {
			t.Errorf("%+v: validate() = nil, want an error", gc)
		}
	}
}

func TestMuxHeader(t *testing.T) {
	for _, id := range []string{"s", "shard-0", "eu_west.3", strings.Repeat("z", 64)} {
		got, err := readMuxHeader(bytes.NewReader(append(encodeMuxHeader(id), "payload"...)))
		if err != nil || got != id {
			t.Errorf("round trip %q: got %q, %v", id, got, err)
		}
	}
	good := encodeMuxHeader("s0")
	for name, b := range map[string][]byte{
		"empty":       nil,
		"short":       good[:3],
		"bad magic":   append([]byte("HTTP"), good[4:]...),
		"bad version": append(append([]byte{}, good[:4]...), 9, 2, 's', '0'),
		"empty id":    append(append([]byte{}, good[:4]...), muxVersion, 0),
		"truncated":   good[:len(good)-1],
		"invalid id":  append(append([]byte{}, good[:4]...), muxVersion, 3, 'a', '/', 'b'),
	} {
		if _, err := readMuxHeader(bytes.NewReader(b)); err == nil {
			t.Errorf("%s: readMuxHeader accepted %q", name, b)
		}
	}
}

// countingHandler counts log records whose message matches.
type countingHandler struct {
	slog.Handler
	mu    sync.Mutex
	msg   string
	count int
}

func (h *countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.mu.Lock()
		h.count++
		h.mu.Unlock()
	}
	return h.Handler.Handle(ctx, r)
}

func (h *countingHandler) WithAttrs(as []slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler         { return h }

// rejectCountingHost starts a host on a free loopback port whose logger
// counts the mux's "rejected raft connection" lines.
func rejectCountingHost(t *testing.T) (*Host, *countingHandler) {
	t.Helper()
	counter := &countingHandler{Handler: testutil.Logger(t, slog.LevelInfo).Handler(), msg: "rejected raft connection"}
	cfg := testConfig()
	cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir = "n1", "127.0.0.1:0", t.TempDir()
	cfg.Logger = slog.New(counter)
	h, err := NewHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h, counter
}

func TestMuxRejectsBadConnections(t *testing.T) {
	h, counter := rejectCountingHost(t)
	t.Cleanup(func() { h.Close() })
	g, err := h.AddGroup(GroupConfig{ID: "s0", Voters: []Peer{{"n1", h.Addr()}}}, newKV())
	if err != nil {
		t.Fatal(err)
	}

	closedByPeer := func(payload []byte) bool {
		t.Helper()
		c, err := net.Dial("tcp", h.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(payload)
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err = c.Read(make([]byte, 1))
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}
	bad := [][]byte{
		[]byte("GET / HTTP/1.1\r\n\r\n"),
		encodeMuxHeader("unknown-shard"),
		append(append([]byte{}, muxMagic[:]...), 7, 2, 's', '0'),
		encodeMuxHeader("nope"),
		[]byte("IDRM\x01\x00"),
	}
	for _, b := range bad {
		if !closedByPeer(b) {
			t.Errorf("connection with header %q stayed open", b)
		}
	}
	// A well-formed header for a hosted shard is handed to raft, which waits
	// for an RPC: the connection stays open.
	if closedByPeer(encodeMuxHeader("s0")) {
		t.Errorf("connection for hosted shard s0 was closed")
	}
	if got := h.mux.rejectedTotal.Load(); got != uint64(len(bad)) {
		t.Errorf("rejected %d connections, want %d", got, len(bad))
	}
	counter.mu.Lock()
	logged := counter.count
	counter.mu.Unlock()
	if logged != 1 {
		t.Errorf("logged %d rejection lines for %d rejections, want 1 (rate-limited)", logged, len(bad))
	}

	// The single-voter group still works over the same port.
	if _, _, err := g.WaitLeader(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := h.WaitReady(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	res, err := g.Apply(t.Context(), []byte("a=1"))
	if err != nil || res.(kvResult).Key != "a" {
		t.Fatalf("Apply on single-voter group: %v, %v", res, err)
	}
	if _, err := h.AddGroup(GroupConfig{ID: "s0", Voters: []Peer{{"n1", h.Addr()}}}, newKV()); !errors.Is(err, ErrGroupExists) {
		t.Fatalf("duplicate AddGroup: %v, want ErrGroupExists", err)
	}
}

// TestMuxCloseEndsConnectionsBeingRouted: a host that closes while a peer's
// connection is still in its header (a node refusing to start while its
// peers dial it) severs that connection before Close returns and logs
// nothing about it afterwards: the process's last line stays its own.
func TestMuxCloseEndsConnectionsBeingRouted(t *testing.T) {
	h, counter := rejectCountingHost(t)
	c, err := net.Dial("tcp", h.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(muxMagic[:]); err != nil { // half a header
		t.Fatal(err)
	}
	testutil.Until(t, 10*time.Second, "the connection accepted", func() bool { return h.mux.inbound.Load() == 1 })
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if n := h.mux.inbound.Load(); n != 0 {
		t.Fatalf("%d connection(s) still being routed after Close", n)
	}
	counter.mu.Lock()
	logged := counter.count
	counter.mu.Unlock()
	if logged != 0 || h.mux.rejectedTotal.Load() != 0 {
		t.Fatalf("logged %d rejection line(s), counted %d, for a connection the host's own close ended", logged, h.mux.rejectedTotal.Load())
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the peer's connection is still open after Close")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the peer's connection is still open after Close")
	}
}

func TestHostRejectsDoubleOpenOfDataDir(t *testing.T) {
	dir := t.TempDir()
	open := func(id string) (*Host, *Group, error) {
		cfg := testConfig()
		cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir = id, "127.0.0.1:0", dir
		h, err := NewHost(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		g, err := h.AddGroup(GroupConfig{ID: "s0", Voters: []Peer{{id, h.Addr()}}}, newKV())
		return h, g, err
	}
	if _, _, err := open("a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := open("b"); err == nil {
		t.Fatalf("a second host opened a data dir whose log store is in use")
	}
}

func TestErrorTranslation(t *testing.T) {
	cfg := testConfig()
	cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir = "n1", "127.0.0.1:0", t.TempDir()
	h, err := NewHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	// A group whose other voter never answers: n1 stays a follower with no
	// known leader.
	g, err := h.AddGroup(GroupConfig{ID: "s0", Voters: []Peer{{"n1", h.Addr()}, {"n2", "127.0.0.1:1"}}}, newKV())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		in              error
		p               phase
		want            []error
		notApplied, amb bool
	}{
		{raft.ErrNotLeader, phaseAfterEnqueue, []error{ErrNotLeader}, true, false},
		{raft.ErrLeadershipTransferInProgress, phaseAfterEnqueue, []error{ErrNotLeader}, true, false},
		{raft.ErrEnqueueTimeout, phaseAfterEnqueue, []error{ErrEnqueueTimeout, context.DeadlineExceeded}, true, false},
		{raft.ErrLeadershipLost, phaseAfterEnqueue, []error{ErrUnknownOutcome}, false, true},
		{raft.ErrAbortedByRestore, phaseAfterEnqueue, []error{ErrUnknownOutcome}, false, true},
		{raft.ErrRaftShutdown, phaseAfterEnqueue, []error{ErrShutdown, ErrUnknownOutcome}, false, true},
		{raft.ErrRaftShutdown, phaseBeforeEnqueue, []error{ErrShutdown}, true, false},
		{context.DeadlineExceeded, phaseAfterEnqueue, []error{ErrUnknownOutcome, context.DeadlineExceeded}, false, true},
		{context.Canceled, phaseBeforeEnqueue, []error{context.Canceled}, true, false},
		{errors.New("disk on fire"), phaseAfterEnqueue, []error{ErrUnknownOutcome}, false, true},
	} {
		got := g.translate(tc.in, tc.p)
		for _, w := range tc.want {
			if !errors.Is(got, w) {
				t.Errorf("translate(%v, %v) = %v, want it to wrap %v", tc.in, tc.p, got, w)
			}
		}
		if errors.Is(got, ErrUnknownOutcome) != tc.amb {
			t.Errorf("translate(%v, %v) = %v: ambiguous=%v, want %v", tc.in, tc.p, got, !tc.amb, tc.amb)
		}
		if !strings.HasPrefix(got.Error(), "raftstore: ") {
			t.Errorf("translate(%v) = %q, want the package prefix", tc.in, got)
		}
	}
	var nle *NotLeaderError
	if err := g.translate(raft.ErrNotLeader, phaseAfterEnqueue); !errors.As(err, &nle) || nle.LeaderID != "" || nle.Shard != "s0" {
		t.Fatalf("NotLeaderError without a known leader: %#v", err)
	}
	if _, err := g.Apply(t.Context(), []byte("a=1")); !errors.As(err, &nle) {
		t.Fatalf("Apply without a leader: %v, want *NotLeaderError", err)
	}
	if err := h.Ready(); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Ready without a leader: %v, want ErrNotReady", err)
	}
	if _, _, err := g.Snapshot(); !errors.Is(err, ErrNothingToSnapshot) {
		t.Fatalf("Snapshot of an empty group: %v, want ErrNothingToSnapshot", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := h.WaitReady(ctx); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrNotReady) {
		t.Fatalf("WaitReady without a leader: %v", err)
	}
}

func TestHclogAdapter(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	a := newHclogAdapter(l.With("shard", "s1")).Named("raft")
	a.Info("entering leader state", "term", 3) // raft chatter: below info
	a.Debug("dbg")
	a.Warn("failed to contact", "server-id", "n2")
	a.With("peer", "n3").Error("boom", "error", io.EOF)
	out := buf.String()
	if strings.Contains(out, "entering leader state") || strings.Contains(out, "dbg") {
		t.Errorf("raft INFO/DEBUG leaked at info level:\n%s", out)
	}
	for _, want := range []string{
		`level=WARN msg="failed to contact" shard=s1 component=raft server-id=n2`,
		`level=ERROR msg=boom shard=s1 component=raft peer=n3 error=EOF`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	if a.IsInfo() || a.IsDebug() || !a.IsWarn() || a.GetLevel() != hclog.Warn {
		t.Errorf("levels: info=%v debug=%v warn=%v level=%v", a.IsInfo(), a.IsDebug(), a.IsWarn(), a.GetLevel())
	}
	buf.Reset()
	a.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Error}).Print("from std")
	if !strings.Contains(buf.String(), "level=ERROR") || !strings.Contains(buf.String(), "from std") {
		t.Errorf("standard logger output: %q", buf.String())
	}
}

func TestFSMAdapterSnapshotHeader(t *testing.T) {
	m, err := newHostMetrics(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := newKV()
	a := newFSMAdapter(src, m.forGroup("s0"))
	logs := []*raft.Log{
		{Index: 5, Type: raft.LogCommand, Data: []byte("a=1")},
		{Index: 6, Type: raft.LogConfiguration},
		{Index: 7, Type: raft.LogCommand, Data: []byte("b=2")},
	}
	res := a.ApplyBatch(logs)
	if len(res) != 3 || res[0].(kvResult).Index != 5 || res[1] != nil || res[2].(kvResult).Key != "b" {
		t.Fatalf("ApplyBatch results %v", res)
	}
	if a.applied.Load() != 7 || a.commands.Load() != 2 || a.batches.Load() != 1 {
		t.Fatalf("applied=%d commands=%d batches=%d", a.applied.Load(), a.commands.Load(), a.batches.Load())
	}
	snap, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil || !sink.closed {
		t.Fatalf("Persist: %v (closed=%v)", err, sink.closed)
	}
	snap.Release()

	dst := newKV()
	b := newFSMAdapter(dst, m.forGroup("s0"))
	if err := b.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if b.applied.Load() != 7 {
		t.Fatalf("restored applied index %d, want 7", b.applied.Load())
	}
	if v, _ := dst.get("b"); v != "2" {
		t.Fatalf("restored state lacks b=2")
	}
	if err := b.Restore(io.NopCloser(strings.NewReader("not a snapshot"))); err == nil {
		t.Fatalf("Restore accepted a stream without our header")
	}
}

type memSink struct {
	bytes.Buffer
	closed, canceled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.canceled = true; return nil }
func (s *memSink) Close() error  { s.closed = true; return nil }
