package raftstore

import (
	"bufio"
	"errors"
	"fmt"
	"net"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
)

// Raft admission by seat (secure mode). A node certificate opens a Raft
// connection to a group only while its node holds a seat (voter or
// non-voter) in the group's latest configuration, the live one raft keeps,
// not the topology file's: members join and leave online. A replica whose
// group has no configuration yet (started to join, waiting for its leader
// to send the log or a snapshot) admits any node certificate, as it has no
// state to protect and learns its configuration from the leader.
//
// Every inbound request is also checked for the node it claims to come
// from (the ID of its RPC header): a message claiming another node than the
// connection's certificate is dropped, counted and its connection closed,
// as is one from a node that lost its seat while connected.

// Why a message was dropped (the reason label of
// idem_raft_dropped_messages_total).
const (
	dropSource = iota // the header's ID is not the certificate's node
	dropSeat          // the certificate's node holds no seat (any more)
	dropDecode        // not a Raft request this transport understands
	numDropReasons
)

var dropReasonNames = [numDropReasons]string{"source", "seat", "decode"}

// seatCheck answers whether node holds a seat in a group's latest
// configuration; known is false while the group has none (see above).
type seatCheck func(node string) (seated, known bool)

// raftSeat is a group's seatCheck over its raft instance.
func raftSeat(r *raft.Raft) seatCheck {
	return func(node string) (bool, bool) {
		cf := r.GetConfiguration()
		if cf.Error() != nil {
			return false, true
		}
		servers := cf.Configuration().Servers
		if len(servers) == 0 {
			return false, false
		}
		for _, s := range servers {
			if string(s.ID) == node {
				return true, true
			}
		}
		return false, true
	}
}

// seatCheck widens base with Config.ExtraSeats.
func (h *Host) seatCheck(group string, base seatCheck) seatCheck {
	extra := h.cfg.ExtraSeats
	if extra == nil {
		return base
	}
	return func(node string) (bool, bool) {
		seated, known := base(node)
		if !seated && extra(group, node) {
			return true, true
		}
		return seated, known
	}
}

// admits reports whether the group takes connections and messages from
// node. Before the group's raft exists there is nothing to ask yet: the
// mux waits for it (route's deadline bounds the wait).
func (s *streamLayer) admits(node string) bool {
	check := s.seat.Load()
	if check == nil {
		return false
	}
	seated, known := (*check)(node)
	return seated || !known
}

// setSeat installs the group's seat check and releases connections waiting
// for it.
func (s *streamLayer) setSeat(c seatCheck) {
	s.seat.Store(&c)
	s.seatOnce.Do(func() { close(s.seatReady) })
}

// Raft's wire: one byte of RPC type, then the msgpack request (and, for
// InstallSnapshot, Size bytes of snapshot). The values are hashicorp/raft's
// (net_transport.go), which pins them for compatibility.
const (
	rpcAppendEntries uint8 = iota
	rpcRequestVote
	rpcInstallSnapshot
	rpcTimeoutNow
	rpcRequestPreVote
)

// rpcClaim is what the check decodes of a request: the header (inlined, as
// raft's requests embed it) and InstallSnapshot's Size; every other field
// is skipped.
type rpcClaim struct {
	raft.RPCHeader
	Size int64
}

// errDropped ends a connection whose message was dropped.
var errDropped = errors.New("raftstore: raft message dropped")

// checkedConn is an inbound Raft connection whose requests are read one at a
// time, checked, and only then handed to the transport unchanged.
type checkedConn struct {
	net.Conn
	node   string
	sl     *streamLayer
	br     *bufio.Reader
	rec    recorder
	dec    *codec.Decoder
	out    []byte // the checked message not yet read by the transport
	body   int64  // snapshot bytes still to pass through
	failed error
}

func newCheckedConn(c net.Conn, node string, sl *streamLayer) *checkedConn {
	cc := &checkedConn{Conn: c, node: node, sl: sl, br: bufio.NewReaderSize(c, 64<<10)}
	cc.rec.r = cc.br
	cc.dec = codec.NewDecoder(&cc.rec, &codec.MsgpackHandle{})
	return cc
}

// Read is called by the transport's one reading goroutine.
func (c *checkedConn) Read(p []byte) (int, error) {
	if len(c.out) == 0 && c.body == 0 {
		if c.failed != nil {
			return 0, c.failed
		}
		if err := c.next(); err != nil {
			c.failed = err
			return 0, err
		}
	}
	if len(c.out) > 0 {
		n := copy(p, c.out)
		c.out = c.out[n:]
		return n, nil
	}
	n, err := c.br.Read(p[:min(int64(len(p)), c.body)])
	c.body -= int64(n)
	return n, err
}

// next reads, decodes and checks one request into c.out.
func (c *checkedConn) next() error {
	c.rec.buf = c.rec.buf[:0]
	t, err := c.rec.ReadByte()
	if err != nil {
		return err
	}
	var claim rpcClaim
	switch t {
	case rpcAppendEntries, rpcRequestVote, rpcInstallSnapshot, rpcTimeoutNow, rpcRequestPreVote:
		if err := c.dec.Decode(&claim); err != nil {
			return c.drop(dropDecode, fmt.Errorf("decoding a request of type %d: %w", t, err))
		}
	default:
		return c.drop(dropDecode, fmt.Errorf("unknown request type %d", t))
	}
	if string(claim.ID) != c.node {
		return c.drop(dropSource, fmt.Errorf("a request of type %d claims node %q over node %q's certificate", t, claim.ID, c.node))
	}
	if !c.sl.admits(c.node) {
		return c.drop(dropSeat, fmt.Errorf("node %q holds no seat in shard %s", c.node, c.sl.id))
	}
	if t == rpcInstallSnapshot {
		if claim.Size < 0 {
			return c.drop(dropDecode, fmt.Errorf("snapshot size %d", claim.Size))
		}
		c.body = claim.Size
	}
	c.out = c.rec.buf
	return nil
}

// drop counts and logs a dropped message and closes the connection.
func (c *checkedConn) drop(reason int, why error) error {
	c.sl.m.dropped[reason].Add(1)
	c.sl.m.logger.Warn("dropped raft message", "shard", c.sl.id, "remote", c.RemoteAddr().String(),
		"reason", dropReasonNames[reason], "error", why.Error())
	c.Conn.Close()
	return fmt.Errorf("%w: %w", errDropped, why)
}

// recorder reads from r and keeps every byte it hands out (an unread
// byte is taken back), so the checked message is passed on exactly as
// received. It is an io.ByteScanner, so the decoder reads no further than
// the message, as raft's own decoder on its bufio.Reader does.
type recorder struct {
	r   *bufio.Reader
	buf []byte
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf = append(r.buf, p[:n]...)
	return n, err
}

func (r *recorder) ReadByte() (byte, error) {
	b, err := r.r.ReadByte()
	if err == nil {
		r.buf = append(r.buf, b)
	}
	return b, err
}

func (r *recorder) UnreadByte() error {
	if err := r.r.UnreadByte(); err != nil {
		return err
	}
	r.buf = r.buf[:len(r.buf)-1]
	return nil
}
