package raftstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idem-dev/idem/security/pki"
)

// Connection header written by the dialer on every Raft connection, before
// any hashicorp/raft byte:
//
//	magic "IDRM" | version (1 byte) | len(shard id) (1 byte) | shard id
//
// The acceptor reads exactly the header (no buffering beyond it) and hands
// the raw connection to the group's NetworkTransport.
var muxMagic = [4]byte{'I', 'D', 'R', 'M'}

const (
	muxVersion = 1
	// muxHeaderTimeout bounds how long an accepted connection may take to
	// finish its TLS handshake (in secure mode) and send its header; it stops
	// idle or slow sockets from pinning goroutines.
	muxHeaderTimeout = 5 * time.Second
	// muxRejectLogEvery rate-limits the log line about rejected connections.
	muxRejectLogEvery = 30 * time.Second
)

// encodeMuxHeader returns the header that routes a connection to shard id.
func encodeMuxHeader(id string) []byte {
	h := make([]byte, 0, 6+len(id))
	h = append(h, muxMagic[:]...)
	h = append(h, muxVersion, byte(len(id)))
	return append(h, id...)
}

// readMuxHeader reads the header from r and returns the shard id.
func readMuxHeader(r io.Reader) (string, error) {
	var fixed [6]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return "", fmt.Errorf("reading header: %w", err)
	}
	if [4]byte(fixed[:4]) != muxMagic {
		return "", fmt.Errorf("bad magic %q", fixed[:4])
	}
	if fixed[4] != muxVersion {
		return "", fmt.Errorf("unsupported header version %d", fixed[4])
	}
	n := int(fixed[5])
	if n == 0 {
		return "", errors.New("empty shard id")
	}
	id := make([]byte, n)
	if _, err := io.ReadFull(r, id); err != nil {
		return "", fmt.Errorf("reading shard id: %w", err)
	}
	if !validShardID(string(id)) {
		return "", fmt.Errorf("invalid shard id %q", id)
	}
	return string(id), nil
}

// Why the mux closed an inbound connection (the reason label of
// idem_raft_rejected_connections_total).
const (
	rejectHeader = iota // bad header or unknown shard
	rejectTLS           // failed handshake, or no verified node certificate
	rejectLimit         // over Config.MaxInboundConns
	rejectSeat          // the certificate's node holds no seat in the shard
	numRejectReasons
)

var rejectReasonNames = [numRejectReasons]string{"header", "tls", "limit", "seat"}

// mux owns the host's one TCP listener and demultiplexes accepted
// connections onto per-group virtual listeners by the header's shard id.
//
// In secure mode (tlsCfg set) every accepted connection first completes a
// TLS handshake that must verify a node certificate of the cluster CA,
// within muxHeaderTimeout; only then is the header read from the TLS
// stream. A plaintext peer, one without a certificate, with a client
// certificate or with another CA's is closed there: no byte it sent is
// read as a header or a Raft message.
type mux struct {
	ln        net.Listener
	advertise string
	logger    *slog.Logger
	tlsCfg    *TLSConfig // nil: plaintext (insecure mode)
	maxConns  int64      // inbound connections open at once, handshaking or routed
	inbound   atomic.Int64

	mu     sync.Mutex
	groups map[string]*streamLayer
	conns  map[*trackedConn]struct{} // every live connection, both directions
	closed bool

	// isolated is a test hook simulating a network partition of this node:
	// while set, every connection is refused in both directions.
	isolated atomic.Bool

	// routing counts the route goroutines still running; close waits for
	// them, so nothing the mux logs about a connection comes after it.
	routing sync.WaitGroup
	// closing is closed by close: a route waiting on a group gives up.
	closing chan struct{}

	rejectMu       sync.Mutex
	rejectLastLog  time.Time
	rejectDropped  int
	rejectedTotal  atomic.Uint64
	rejected       [numRejectReasons]atomic.Uint64
	dropped        [numDropReasons]atomic.Uint64
	acceptLoopDone chan struct{}
}

func newMux(ln net.Listener, advertise string, logger *slog.Logger, tlsCfg *TLSConfig, maxConns int) *mux {
	m := &mux{
		ln:             ln,
		advertise:      advertise,
		logger:         logger,
		tlsCfg:         tlsCfg,
		maxConns:       int64(maxConns),
		groups:         map[string]*streamLayer{},
		conns:          map[*trackedConn]struct{}{},
		acceptLoopDone: make(chan struct{}),
		closing:        make(chan struct{}),
	}
	go m.acceptLoop()
	return m
}

func (m *mux) acceptLoop() {
	defer close(m.acceptLoopDone)
	var delay time.Duration
	for {
		c, err := m.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient (EMFILE, ...): back off rather than spin.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			m.logger.Warn("raft listener accept failed", "error", err, "retry_in", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		// The cap counts every inbound connection from accept to close, so
		// a flood of idle or handshaking sockets cannot pin unbounded
		// goroutines and file descriptors.
		if m.inbound.Add(1) > m.maxConns {
			m.inbound.Add(-1)
			m.reject(c, rejectLimit, fmt.Errorf("%d inbound connections open (the cap)", m.maxConns))
			continue
		}
		// Tracked from the accept on: close severs a connection still in
		// its handshake or header as well as a routed one.
		tc := m.track(&countedConn{Conn: c, n: &m.inbound})
		if tc == nil {
			continue
		}
		m.routing.Add(1)
		go func() {
			defer m.routing.Done()
			m.route(tc)
		}()
	}
}

// route authenticates an accepted connection (secure mode), reads its header
// and queues it for its group, or closes it.
func (m *mux) route(tc *trackedConn) {
	var c net.Conn = tc
	if m.isolated.Load() {
		c.Close()
		return
	}
	deadline := time.Now().Add(muxHeaderTimeout)
	_ = c.SetDeadline(deadline)
	var node string // the peer certificate's node id (secure mode)
	if m.tlsCfg != nil {
		tc, err := m.handshake(c)
		if err != nil {
			m.reject(c, rejectTLS, err)
			return
		}
		if node, err = peerNode(tc); err != nil {
			m.reject(c, rejectTLS, err)
			return
		}
		c = tc
	}
	id, err := readMuxHeader(c)
	if err != nil {
		m.reject(c, rejectHeader, err)
		return
	}
	m.mu.Lock()
	sl := m.groups[id]
	m.mu.Unlock()
	if sl == nil {
		m.reject(c, rejectHeader, fmt.Errorf("unknown shard %q", id))
		return
	}
	if m.tlsCfg != nil {
		// A group registers before its raft exists; wait for it within
		// the header deadline.
		select {
		case <-sl.seatReady:
		case <-sl.done:
		case <-m.closing:
		case <-time.After(time.Until(deadline)):
		}
		if !sl.admits(node) {
			m.reject(c, rejectSeat, fmt.Errorf("node %q holds no seat in shard %s", node, id))
			return
		}
	}
	_ = c.SetDeadline(time.Time{})
	if m.tlsCfg != nil {
		c = newCheckedConn(c, node, sl)
	}
	select {
	case sl.accepted <- c:
	case <-sl.done:
		c.Close()
	case <-m.closing:
		c.Close()
	}
}

// handshake runs the server side of TLS on c and requires a verified peer
// certificate. The node-certificate rule itself is the tls.Config's
// (pki.Reloader.NodeServerTLS); requiring verified chains here means a
// config that forgot to ask for client certificates fails closed.
//
// The deadline is c's (route sets it), not a context's: HandshakeContext
// closes the connection itself when its context ends, before the caller
// can count the rejection, so a peer (or a test) could see the close before
// the count.
func (m *mux) handshake(c net.Conn) (*tls.Conn, error) {
	tc := tls.Server(c, m.tlsCfg.Server)
	if err := tc.Handshake(); err != nil {
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	if len(tc.ConnectionState().VerifiedChains) == 0 {
		return nil, errors.New("tls: peer presented no verified certificate")
	}
	return tc, nil
}

// peerNode is the node id of the verified certificate of tc: a router's or
// client's certificate is refused here too, whatever the tls.Config says.
func peerNode(tc *tls.Conn) (string, error) {
	id, err := pki.IdentifyNode(tc.ConnectionState().VerifiedChains[0][0])
	if err != nil {
		return "", err
	}
	return id.Name, nil
}

// reject closes c and logs why, at most once per muxRejectLogEvery (a
// misconfigured or hostile peer could otherwise flood the log).
//
// A connection that failed because close severed it is neither counted nor
// logged: the peer did nothing wrong.
func (m *mux) reject(c net.Conn, reason int, why error) {
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		c.Close()
		return
	}
	remote := c.RemoteAddr().String()
	// Counted before the close, so a peer that sees the close also sees
	// the count.
	m.rejectedTotal.Add(1)
	m.rejected[reason].Add(1)
	c.Close()
	m.rejectMu.Lock()
	defer m.rejectMu.Unlock()
	now := time.Now()
	if !m.rejectLastLog.IsZero() && now.Sub(m.rejectLastLog) < muxRejectLogEvery {
		m.rejectDropped++
		return
	}
	m.logger.Warn("rejected raft connection", "remote", remote, "reason", rejectReasonNames[reason], "error", why.Error(),
		"suppressed_since_last", m.rejectDropped)
	m.rejectLastLog = now
	m.rejectDropped = 0
}

// track registers c as live; it returns nil (and closes c) if the mux is
// closed or isolated.
func (m *mux) track(c net.Conn) *trackedConn {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.isolated.Load() {
		c.Close()
		return nil
	}
	tc := &trackedConn{Conn: c, m: m}
	m.conns[tc] = struct{}{}
	return tc
}

// register creates the virtual listener for shard id.
func (m *mux) register(id string) (*streamLayer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrShutdown
	}
	if m.groups[id] != nil {
		return nil, shardErr(id, "%w", ErrGroupExists)
	}
	sl := &streamLayer{
		m:         m,
		id:        id,
		header:    encodeMuxHeader(id),
		accepted:  make(chan net.Conn, 16),
		done:      make(chan struct{}),
		seatReady: make(chan struct{}),
	}
	m.groups[id] = sl
	return sl, nil
}

func (m *mux) unregister(sl *streamLayer) {
	m.mu.Lock()
	if m.groups[sl.id] == sl {
		delete(m.groups, sl.id)
	}
	m.mu.Unlock()
}

// setIsolated is the test hook that partitions this node: it severs every
// live connection and refuses new ones in both directions until cleared.
func (m *mux) setIsolated(on bool) {
	m.isolated.Store(on)
	if on {
		m.closeConns()
	}
}

func (m *mux) closeConns() {
	m.mu.Lock()
	conns := make([]*trackedConn, 0, len(m.conns))
	for c := range m.conns {
		conns = append(conns, c)
	}
	m.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// close stops accepting and severs every connection.
// It returns once every connection being routed has been handed over or
// closed, so no line about one is logged after it.
func (m *mux) close() error {
	m.mu.Lock()
	first := !m.closed
	m.closed = true
	m.mu.Unlock()
	if first {
		close(m.closing)
	}
	err := m.ln.Close()
	<-m.acceptLoopDone
	m.closeConns()
	m.routing.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// countedConn gives back its slot of the inbound cap when closed.
type countedConn struct {
	net.Conn
	n    *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.n.Add(-1) })
	return c.Conn.Close()
}

// MuxStats are the Raft port's connection figures.
type MuxStats struct {
	// Inbound is how many accepted connections are open now (handshaking,
	// reading the header, or routed to a group).
	Inbound int64
	// RejectedHeader, RejectedTLS, RejectedLimit and RejectedSeat count
	// inbound connections closed for a bad header or unknown shard, for a
	// failed TLS handshake or a missing node certificate, for exceeding
	// Config.MaxInboundConns, and for a node without a seat in the shard.
	RejectedHeader, RejectedTLS, RejectedLimit, RejectedSeat uint64
	// DroppedSource, DroppedSeat and DroppedDecode count inbound Raft
	// messages dropped (and their connections closed) for claiming another
	// node than the certificate's, for a node that lost its seat, and for
	// not decoding as a Raft request.
	DroppedSource, DroppedSeat, DroppedDecode uint64
}

// MuxStats returns the Raft port's connection figures.
func (h *Host) MuxStats() MuxStats {
	return MuxStats{
		Inbound:        h.mux.inbound.Load(),
		RejectedHeader: h.mux.rejected[rejectHeader].Load(),
		RejectedTLS:    h.mux.rejected[rejectTLS].Load(),
		RejectedLimit:  h.mux.rejected[rejectLimit].Load(),
		RejectedSeat:   h.mux.rejected[rejectSeat].Load(),
		DroppedSource:  h.mux.dropped[dropSource].Load(),
		DroppedSeat:    h.mux.dropped[dropSeat].Load(),
		DroppedDecode:  h.mux.dropped[dropDecode].Load(),
	}
}

// trackedConn removes itself from the mux's live set when closed.
type trackedConn struct {
	net.Conn
	m    *mux
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.m.mu.Lock()
		delete(c.m.conns, c)
		c.m.mu.Unlock()
	})
	return c.Conn.Close()
}

// streamLayer is one group's virtual raft.StreamLayer over the shared port:
// Accept yields the connections whose header named this shard, Dial writes
// this shard's header.
type streamLayer struct {
	m        *mux
	id       string
	header   []byte
	accepted chan net.Conn
	done     chan struct{}
	once     sync.Once

	// seat is the group's seat check (admit.go), set once its raft exists;
	// seatReady is closed then.
	seat      atomic.Pointer[seatCheck]
	seatReady chan struct{}
	seatOnce  sync.Once
}

var _ raft.StreamLayer = (*streamLayer)(nil)

func (s *streamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-s.accepted:
		return c, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

// Close stops this group's Accept; the shared listener stays open.
func (s *streamLayer) Close() error {
	s.once.Do(func() {
		close(s.done)
		s.m.unregister(s)
		// Drop connections that were routed but never accepted.
		for {
			select {
			case c := <-s.accepted:
				c.Close()
			default:
				return
			}
		}
	})
	return nil
}

// Addr is the address peers dial; NetworkTransport advertises it as this
// node's address in every RPC header.
func (s *streamLayer) Addr() net.Addr { return muxAddr(s.m.advertise) }

func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if s.m.isolated.Load() {
		return nil, fmt.Errorf("raftstore: dial %s: node isolated (test hook)", address)
	}
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("tcp", string(address))
	if err != nil {
		return nil, err
	}
	if timeout > 0 {
		_ = c.SetDeadline(time.Now().Add(timeout))
	}
	if s.m.tlsCfg != nil {
		host, _, _ := net.SplitHostPort(string(address))
		tc := tls.Client(c, s.m.tlsCfg.Client(host))
		if err := tc.Handshake(); err != nil {
			c.Close()
			return nil, fmt.Errorf("raftstore: dial %s: tls handshake: %w", address, err)
		}
		c = tc
	}
	if _, err := c.Write(s.header); err != nil {
		c.Close()
		return nil, fmt.Errorf("raftstore: dial %s: writing header: %w", address, err)
	}
	_ = c.SetDeadline(time.Time{})
	tc := s.m.track(c)
	if tc == nil {
		return nil, fmt.Errorf("raftstore: dial %s: %w", address, ErrShutdown)
	}
	return tc, nil
}

type muxAddr string

func (a muxAddr) Network() string { return "tcp" }
func (a muxAddr) String() string  { return string(a) }
