package main

// The dragonboat peer: a three-node Raft KV on github.com/lni/dragonboat/v4
// (its default log store, fsync on), the "how close to a tuned multi-group
// engine" row. dragonboat steps every Raft group of a node together: one
// step worker batches the groups' proposals, one log write (and sync)
// covers every ready group, and one connection per peer carries every
// group's messages. The benchmark runs it in idem's default shape (three
// nodes, four groups, leaders spread over the nodes) and with one group,
// so its own multi-group cost on this box is measured beside idem's.
//
// Each node is this binary started as `peers dragonboat-node`; clients
// speak a small framed protocol over TCP with many requests in flight per
// connection (as gRPC does), and send each key to its group's leader (as
// idem's Go client does).

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lni/dragonboat/v4"
	dbconfig "github.com/lni/dragonboat/v4/config"
	dblogger "github.com/lni/dragonboat/v4/logger"
	sm "github.com/lni/dragonboat/v4/statemachine"
)

// The protocol's operations.
const (
	dbOpReserve  byte = 'R' // claim key for owner: yes, or no (held or done)
	dbOpComplete byte = 'C' // store the body if owner holds key in progress: yes or no
	dbOpLeaders  byte = 'L' // the leader's replica id of every group (0: unknown)
	dbOpTransfer byte = 'T' // ask for the leadership of the frame's group for this node
)

// Answers: the first byte of a response's payload.
const (
	dbNo  byte = 0
	dbYes byte = 1
	dbErr byte = 2 // the rest is the error's text
)

// dbMaxFrame bounds a frame either way (a response body is --body-bytes).
const dbMaxFrame = 16 << 20

// dbShardOf is key's Raft group, 1..shards (dragonboat's shard ids start at 1).
func dbShardOf(key string, shards int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64()%uint64(shards) + 1
}

// --- the state machine ---

// dbRecord is one key's state: in progress (owner holds it until expires)
// or done (the body, kept until expires).
type dbRecord struct {
	owner   string
	done    bool
	token   uint64 // the entry index that reserved it: a fencing token
	expires int64  // unix nanoseconds, from the proposer's clock
	body    []byte
}

// dbKV is the replicated map. Commands carry the proposer's clock, so every
// replica decides the same.
type dbKV struct{ recs map[string]*dbRecord }

func newDBKV(uint64, uint64) sm.IStateMachine { return &dbKV{recs: map[string]*dbRecord{}} }

// dbCommand is op | now (8) | key length (2) | key | owner length (2) |
// owner | body.
func dbCommand(op byte, now int64, key, owner string, body []byte) []byte {
	b := make([]byte, 0, 13+len(key)+len(owner)+len(body))
	b = append(b, op)
	b = binary.BigEndian.AppendUint64(b, uint64(now))
	return append(appendPrefixed(appendPrefixed(b, key), owner), body...)
}

// appendPrefixed appends s's 2-byte length and s (cutPrefixed's inverse).
func appendPrefixed(b []byte, s string) []byte {
	return append(binary.BigEndian.AppendUint16(b, uint16(len(s))), s...)
}

func parseDBCommand(b []byte) (op byte, now int64, key, owner string, body []byte, err error) {
	if len(b) < 11 {
		return 0, 0, "", "", nil, errors.New("short command")
	}
	op, now = b[0], int64(binary.BigEndian.Uint64(b[1:9]))
	b = b[9:]
	var k, o []byte
	if k, b, err = cutPrefixed(b); err == nil {
		o, b, err = cutPrefixed(b)
	}
	return op, now, string(k), string(o), b, err
}

// cutPrefixed splits a 2-byte length and that many bytes off b.
func cutPrefixed(b []byte) (field, rest []byte, err error) {
	if len(b) < 2 {
		return nil, nil, errors.New("short field")
	}
	n := int(binary.BigEndian.Uint16(b))
	if len(b) < 2+n {
		return nil, nil, errors.New("short field")
	}
	return b[2 : 2+n], b[2+n:], nil
}

// Update applies one command: reserve wins when the key is absent or its
// record has expired; complete wins when owner holds the key in progress.
func (kv *dbKV) Update(e sm.Entry) (sm.Result, error) {
	op, now, key, owner, body, err := parseDBCommand(e.Cmd)
	if err != nil {
		return sm.Result{}, fmt.Errorf("entry %d: %w", e.Index, err)
	}
	r := kv.recs[key]
	live := r != nil && r.expires > now
	switch op {
	case dbOpReserve:
		if live {
			return sm.Result{Value: uint64(dbNo)}, nil
		}
		kv.recs[key] = &dbRecord{owner: owner, token: e.Index, expires: now + int64(leaseTTL)}
		return sm.Result{Value: uint64(dbYes)}, nil
	case dbOpComplete:
		if !live || r.done || r.owner != owner {
			return sm.Result{Value: uint64(dbNo)}, nil
		}
		r.done, r.body, r.expires = true, append([]byte(nil), body...), now+int64(retention)
		return sm.Result{Value: uint64(dbYes)}, nil
	}
	return sm.Result{}, fmt.Errorf("entry %d: unknown operation %q", e.Index, op)
}

// Lookup is not used: every read of the benchmark is a proposal (a
// reserve), as in the other systems.
func (kv *dbKV) Lookup(any) (any, error) {
	return nil, errors.New("dbKV: no lookups; reserve and complete are proposals")
}

// SaveSnapshot writes every record: key, owner, done, token, expires, body.
func (kv *dbKV) SaveSnapshot(w io.Writer, _ sm.ISnapshotFileCollection, _ <-chan struct{}) error {
	bw := bufio.NewWriter(w)
	var b []byte
	b = binary.BigEndian.AppendUint64(b, uint64(len(kv.recs)))
	bw.Write(b)
	for k, r := range kv.recs {
		b = b[:0]
		b = binary.BigEndian.AppendUint32(b, uint32(len(k)))
		b = append(b, k...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(r.owner)))
		b = append(b, r.owner...)
		done := byte(0)
		if r.done {
			done = 1
		}
		b = append(b, done)
		b = binary.BigEndian.AppendUint64(b, r.token)
		b = binary.BigEndian.AppendUint64(b, uint64(r.expires))
		b = binary.BigEndian.AppendUint32(b, uint32(len(r.body)))
		b = append(b, r.body...)
		if _, err := bw.Write(b); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// RecoverFromSnapshot replaces the records with a snapshot's.
func (kv *dbKV) RecoverFromSnapshot(r io.Reader, _ []sm.SnapshotFile, _ <-chan struct{}) error {
	br := bufio.NewReader(r)
	var n uint64
	if err := binary.Read(br, binary.BigEndian, &n); err != nil {
		return err
	}
	recs := make(map[string]*dbRecord, n)
	str := func() (string, error) {
		var l uint32
		if err := binary.Read(br, binary.BigEndian, &l); err != nil {
			return "", err
		}
		s := make([]byte, l)
		_, err := io.ReadFull(br, s)
		return string(s), err
	}
	for range n {
		key, err := str()
		if err != nil {
			return err
		}
		owner, err := str()
		if err != nil {
			return err
		}
		var fixed [17]byte
		if _, err := io.ReadFull(br, fixed[:]); err != nil {
			return err
		}
		body, err := str()
		if err != nil {
			return err
		}
		recs[key] = &dbRecord{owner: owner, done: fixed[0] == 1, token: binary.BigEndian.Uint64(fixed[1:9]),
			expires: int64(binary.BigEndian.Uint64(fixed[9:17])), body: []byte(body)}
	}
	kv.recs = recs
	return nil
}

func (kv *dbKV) Close() error { return nil }

// --- framing, both ways: length (4) | request id (8) | payload ---

func writeDBFrame(w *bufio.Writer, id uint64, payload ...[]byte) error {
	n := 8
	for _, p := range payload {
		n += len(p)
	}
	var h [12]byte
	binary.BigEndian.PutUint32(h[:4], uint32(n))
	binary.BigEndian.PutUint64(h[4:], id)
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	for _, p := range payload {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
}

func readDBFrame(r *bufio.Reader) (id uint64, payload []byte, err error) {
	var h [12]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[:4])
	if n < 8 || n > dbMaxFrame {
		return 0, nil, fmt.Errorf("frame of %d bytes", n)
	}
	payload = make([]byte, n-8)
	_, err = io.ReadFull(r, payload)
	return binary.BigEndian.Uint64(h[4:]), payload, err
}

// dbRequest is op | shard (2) | key length (2) | key | owner length (2) |
// owner | body.
func dbRequest(op byte, shard uint64, key, owner string, body []byte) []byte {
	b := make([]byte, 0, 7+len(key)+len(owner))
	b = append(b, op)
	b = binary.BigEndian.AppendUint16(b, uint16(shard))
	return append(appendPrefixed(appendPrefixed(b, key), owner), body...)
}

// --- one node: `peers dragonboat-node` ---

// dbNodeCmd is the subcommand that runs one dragonboat member.
const dbNodeCmd = "dragonboat-node"

// runDBNode runs one member until SIGTERM: its NodeHost, every group's
// replica, and the client listener.
func runDBNode(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(dbNodeCmd, flag.ContinueOnError)
	id := fs.Uint64("id", 0, "this member's replica id, 1..3")
	raft := fs.String("raft-addrs", "", "every member's Raft address, comma-separated, in replica id order")
	listen := fs.String("listen", "", "the client address")
	dir := fs.String("dir", "", "the data directory")
	shards := fs.Int("shards", 4, "Raft groups")
	if err := fs.Parse(args); err != nil {
		return err
	}
	addrs := strings.Split(*raft, ",")
	if *id < 1 || int(*id) > len(addrs) || *listen == "" || *dir == "" || *shards < 1 || *shards > 256 {
		return fmt.Errorf("%s: need --id 1..%d, --listen, --dir and --shards 1..256", dbNodeCmd, len(addrs))
	}
	// dragonboat logs every election at WARNING: keep errors only.
	for _, name := range []string{"raft", "rsm", "transport", "dragonboat", "logdb", "raftpb", "config", "grpc"} {
		dblogger.GetLogger(name).SetLevel(dblogger.ERROR)
	}
	// A 10 ms tick; heartbeats every tick, elections after 100 (1 s), as
	// idem's nodes run theirs.
	nh, err := dragonboat.NewNodeHost(dbconfig.NodeHostConfig{NodeHostDir: filepath.Join(*dir, "nodehost"), RTTMillisecond: 10, RaftAddress: addrs[*id-1]})
	if err != nil {
		return err
	}
	defer nh.Close()
	members := map[uint64]dragonboat.Target{}
	for i, a := range addrs {
		members[uint64(i+1)] = a
	}
	for s := 1; s <= *shards; s++ {
		cfg := dbconfig.Config{ReplicaID: *id, ShardID: uint64(s), ElectionRTT: 100, HeartbeatRTT: 10, CheckQuorum: true}
		if err := nh.StartReplica(members, false, newDBKV, cfg); err != nil {
			return fmt.Errorf("group %d: %w", s, err)
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); ln.Close() }()
	srv := &dbServer{nh: nh, id: *id, shards: *shards}
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go srv.serve(ctx, conn)
	}
}

type dbServer struct {
	nh     *dragonboat.NodeHost
	id     uint64
	shards int
}

// dbResp is one answer for a connection's writer.
type dbResp struct {
	id      uint64
	payload []byte
}

// serve reads requests off conn and answers each from its own goroutine;
// one writer sends every answer ready since its last flush in one write.
func (s *dbServer) serve(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	out := make(chan dbResp, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w := bufio.NewWriterSize(conn, 64<<10)
		for r := range out {
			err := writeDBFrame(w, r.id, r.payload)
			for more := true; more && err == nil; {
				select {
				case r, ok := <-out:
					if !ok {
						more = false
						break
					}
					err = writeDBFrame(w, r.id, r.payload)
				default:
					more = false
				}
			}
			if err == nil {
				err = w.Flush()
			}
			if err != nil {
				conn.Close()
				for range out { // let the handlers finish
				}
				return
			}
		}
	}()
	var wg sync.WaitGroup
	r := bufio.NewReaderSize(conn, 64<<10)
	for {
		id, req, err := readDBFrame(r)
		if err != nil {
			break
		}
		wg.Go(func() { out <- dbResp{id, s.handle(ctx, req)} })
	}
	wg.Wait()
	close(out)
	<-done
}

// handle runs one request and returns its answer.
func (s *dbServer) handle(ctx context.Context, req []byte) []byte {
	fail := func(err error) []byte { return append([]byte{dbErr}, err.Error()...) }
	if len(req) < 3 {
		return fail(errors.New("short request"))
	}
	op, shard := req[0], uint64(binary.BigEndian.Uint16(req[1:3]))
	switch op {
	case dbOpLeaders:
		ans := []byte{dbYes}
		for g := 1; g <= s.shards; g++ {
			leader, _, ok, err := s.nh.GetLeaderID(uint64(g))
			if err != nil || !ok {
				leader = 0
			}
			ans = append(ans, byte(leader))
		}
		return ans
	case dbOpTransfer:
		if err := s.nh.RequestLeaderTransfer(shard, s.id); err != nil {
			return fail(err)
		}
		return []byte{dbYes}
	case dbOpReserve, dbOpComplete:
	default:
		return fail(fmt.Errorf("unknown operation %q", op))
	}
	if shard < 1 || int(shard) > s.shards {
		return fail(fmt.Errorf("no group %d", shard))
	}
	key, rest, err := cutPrefixed(req[3:])
	if err != nil {
		return fail(err)
	}
	owner, body, err := cutPrefixed(rest)
	if err != nil {
		return fail(err)
	}
	cmd := dbCommand(op, time.Now().UnixNano(), string(key), string(owner), body)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		res, err := s.nh.SyncPropose(pctx, s.nh.GetNoOPSession(shard), cmd)
		if err == nil {
			return []byte{byte(res.Value)}
		}
		// A group without a leader yet, or a full proposal queue: try
		// again until the deadline, as a client of the others would.
		if !errors.Is(err, dragonboat.ErrShardNotReady) && !errors.Is(err, dragonboat.ErrSystemBusy) {
			return fail(err)
		}
		select {
		case <-pctx.Done():
			return fail(err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// --- the client ---

// dbConn is one client connection with many requests in flight.
type dbConn struct {
	conn    net.Conn
	out     chan []byte   // whole frames
	done    chan struct{} // closed by close: the writer stops
	mu      sync.Mutex
	pending map[uint64]chan []byte
	err     error // set once the connection failed
	nextID  atomic.Uint64

	closeOnce sync.Once
}

func dialDB(addr string) (*dbConn, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := &dbConn{conn: conn, out: make(chan []byte, 1024), done: make(chan struct{}), pending: map[uint64]chan []byte{}}
	go c.writeLoop()
	go c.readLoop()
	return c, nil
}

func (c *dbConn) writeLoop() {
	w := bufio.NewWriterSize(c.conn, 64<<10)
	for {
		var f []byte
		select {
		case f = <-c.out:
		case <-c.done:
			return
		}
		_, err := w.Write(f)
		for more := true; more && err == nil; {
			select {
			case f := <-c.out:
				_, err = w.Write(f)
			default:
				more = false
			}
		}
		if err == nil {
			err = w.Flush()
		}
		if err != nil {
			c.fail(err)
			return
		}
	}
}

func (c *dbConn) readLoop() {
	r := bufio.NewReaderSize(c.conn, 64<<10)
	for {
		id, payload, err := readDBFrame(r)
		if err != nil {
			c.fail(err)
			return
		}
		c.mu.Lock()
		ch := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if ch != nil {
			ch <- payload
		}
	}
}

// fail ends every request in flight with err.
func (c *dbConn) fail(err error) {
	c.conn.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
	for id, ch := range c.pending {
		delete(c.pending, id)
		ch <- append([]byte{dbErr}, ("connection: " + err.Error())...)
	}
}

// call sends one request and waits for its answer.
func (c *dbConn) call(ctx context.Context, req []byte) ([]byte, error) {
	id := c.nextID.Add(1)
	ch := make(chan []byte, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	c.pending[id] = ch
	c.mu.Unlock()
	frame := make([]byte, 12, 12+len(req))
	binary.BigEndian.PutUint32(frame[:4], uint32(8+len(req)))
	binary.BigEndian.PutUint64(frame[4:], id)
	frame = append(frame, req...)
	select {
	case c.out <- frame:
	case <-ctx.Done():
		c.forget(id)
		return nil, ctx.Err()
	}
	select {
	case ans := <-ch:
		if len(ans) == 0 {
			return nil, errors.New("empty answer")
		}
		if ans[0] == dbErr {
			return nil, errors.New(string(ans[1:]))
		}
		return ans, nil
	case <-ctx.Done():
		c.forget(id)
		return nil, ctx.Err()
	}
}

func (c *dbConn) forget(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

func (c *dbConn) close() {
	c.mu.Lock()
	if c.err == nil {
		c.err = errors.New("closed")
	}
	c.mu.Unlock()
	c.closeOnce.Do(func() { close(c.done) })
	c.conn.Close()
}

// dbTarget sends each key to its group's leader, from a leader table it
// refreshes every 200 ms (and at once after an error).
type dbTarget struct {
	conns   []*dbConn // one per node, in replica id order
	shards  int
	body    []byte
	timeout time.Duration
	leaders atomic.Pointer[[]byte] // replica id per group (index group-1); 0: unknown
	refresh chan struct{}
	stop    chan struct{}
}

func newDBTarget(addrs []string, shards int, body []byte, timeout time.Duration) (*dbTarget, error) {
	t := &dbTarget{shards: shards, body: body, timeout: timeout, refresh: make(chan struct{}, 1), stop: make(chan struct{})}
	for _, a := range addrs {
		c, err := dialDB(a)
		if err != nil {
			t.close()
			return nil, err
		}
		t.conns = append(t.conns, c)
	}
	t.leaders.Store(new([]byte))
	go t.refreshLoop()
	return t, nil
}

// readLeaders asks every node for the leader table and keeps the first
// complete answer.
func (t *dbTarget) readLeaders(ctx context.Context) ([]byte, error) {
	var lastErr error
	for _, c := range t.conns {
		ans, err := c.call(ctx, dbRequest(dbOpLeaders, 0, "", "", nil))
		if err != nil {
			lastErr = err
			continue
		}
		ls := ans[1:]
		if len(ls) == t.shards && !slices.Contains(ls, 0) {
			t.leaders.Store(&ls)
			return ls, nil
		}
		lastErr = fmt.Errorf("leaders %v", ls)
	}
	return nil, lastErr
}

func (t *dbTarget) refreshLoop() {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		case <-t.refresh:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		t.readLeaders(ctx)
		cancel()
	}
}

// conn is the connection to shard's leader, or to a node chosen by the
// shard while the leader is unknown (dragonboat forwards the proposal).
func (t *dbTarget) conn(shard uint64) *dbConn {
	if ls := *t.leaders.Load(); int(shard) <= len(ls) && ls[shard-1] != 0 && int(ls[shard-1]) <= len(t.conns) {
		return t.conns[ls[shard-1]-1]
	}
	return t.conns[int(shard-1)%len(t.conns)]
}

func (t *dbTarget) call(ctx context.Context, op byte, key, owner string, body []byte) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	shard := dbShardOf(key, t.shards)
	ans, err := t.conn(shard).call(ctx, dbRequest(op, shard, key, owner, body))
	if err != nil {
		select {
		case t.refresh <- struct{}{}:
		default:
		}
		return false, err
	}
	return ans[0] == dbYes, nil
}

func (t *dbTarget) reserve(ctx context.Context, key, owner string) (bool, error) {
	return t.call(ctx, dbOpReserve, key, owner, nil)
}

func (t *dbTarget) complete(ctx context.Context, key, owner string) (bool, error) {
	return t.call(ctx, dbOpComplete, key, owner, t.body)
}

func (t *dbTarget) close() {
	select {
	case <-t.stop:
	default:
		close(t.stop)
	}
	for _, c := range t.conns {
		c.close()
	}
}

// spread asks for group g's leadership on replica (g-1)%3+1 until every
// group is led where asked (the placement idem's leader balancing reaches
// with four groups on three nodes: 2/1/1), or returns what is still off.
func (t *dbTarget) spread(ctx context.Context) error {
	ls, err := t.readLeaders(ctx)
	if err != nil {
		return err
	}
	var off []string
	for g := 1; g <= t.shards; g++ {
		want := (g-1)%len(t.conns) + 1
		if int(ls[g-1]) == want {
			continue
		}
		off = append(off, fmt.Sprintf("group %d led by %d, want %d", g, ls[g-1], want))
		if _, err := t.conns[want-1].call(ctx, dbRequest(dbOpTransfer, uint64(g), "", "", nil)); err != nil {
			return err
		}
	}
	if len(off) > 0 {
		return errors.New(strings.Join(off, "; "))
	}
	return nil
}

// --- starting it ---

// startDragonboat starts three members with shards groups each and waits
// until every group has its leader where spread puts it and a cycle
// succeeds on keys of every group.
func (l *lab) startDragonboat(ctx context.Context, name string, shards int) (*system, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := l.sub(name)
	if err != nil {
		return nil, err
	}
	raftAddrs, clientAddrs, err := dbAddrs()
	if err != nil {
		return nil, err
	}
	sys := &system{name: name}
	for i := range 3 {
		p, err := l.ps.start(fmt.Sprintf("%s-%d", name, i+1), filepath.Join(l.dir, fmt.Sprintf("%s-%d.log", name, i+1)), nil, syscall.SIGTERM, self,
			dbNodeCmd, "--id", strconv.Itoa(i+1), "--raft-addrs", strings.Join(raftAddrs, ","), "--listen", clientAddrs[i],
			"--dir", filepath.Join(dir, strconv.Itoa(i+1)), "--shards", strconv.Itoa(shards))
		if err != nil {
			return nil, err
		}
		sys.procs = append(sys.procs, p)
	}
	var t *dbTarget
	err = poll(ctx, startTimeout, sys.procs[0], name, func(ctx context.Context) error {
		for _, p := range sys.procs {
			if err := p.alive(); err != nil {
				return err
			}
		}
		if t == nil {
			var derr error
			if t, derr = newDBTarget(clientAddrs, shards, l.body, l.cfg.RequestTimeout); derr != nil {
				return derr
			}
		}
		return t.spread(ctx)
	})
	if err == nil {
		err = poll(ctx, startTimeout, sys.procs[0], name+" cycles", func(ctx context.Context) error {
			for i := range 8 * shards {
				key, owner := fmt.Sprintf("ready-%d-%d", time.Now().UnixNano(), i), "ready-owner"
				if won, err := t.reserve(ctx, key, owner); err != nil || !won {
					return fmt.Errorf("probe reserve: won=%v, %v", won, err)
				}
				if ok, err := t.complete(ctx, key, owner); err != nil || !ok {
					return fmt.Errorf("probe complete: ok=%v, %v", ok, err)
				}
			}
			return nil
		})
	}
	if err != nil {
		if t != nil {
			t.close()
		}
		return nil, err
	}
	sys.tgt = t
	placement := "leaders spread over the members"
	if shards == 1 {
		placement = "its leader on member 1"
	}
	sys.detail = fmt.Sprintf("dragonboat v4 (%s), three members, %d Raft %s (%s), its default log store (fsync), an in-memory map; a framed TCP protocol, each key sent to its group's leader",
		dragonboatVersion(), shards, plural(shards, "group", "groups"), placement)
	return sys, nil
}

// dbAddrs picks free loopback ports for three members: their Raft and
// client addresses, in replica id order.
func dbAddrs() (raft, client []string, err error) {
	ports, err := freePorts(6)
	if err != nil {
		return nil, nil, err
	}
	for i := range 3 {
		raft = append(raft, loopback(ports[i]))
		client = append(client, loopback(ports[3+i]))
	}
	return raft, client, nil
}

// dragonboatVersion is the dragonboat module this binary was built with.
func dragonboatVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "github.com/lni/dragonboat/v4" {
				return m.Version
			}
		}
	}
	return "?"
}
