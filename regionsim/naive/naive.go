package naive

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Errors of package naive.
var (
	// ErrUnavailable: no answer from the server (down, partitioned, slow).
	ErrUnavailable = errors.New("naive: lock server unavailable")
	// ErrProtocol: the server answered something unexpected.
	ErrProtocol = errors.New("naive: protocol error")
)

type entry struct {
	val     string
	expires time.Time // zero: never
}

// ServerConfig configures a Server.
type ServerConfig struct {
	// PersistEvery is how often the server makes its writes durable (Redis
	// appendfsync everysec); a crash reverts to the last durable state.
	// Zero means every second; negative means never (pure in-memory).
	PersistEvery time.Duration
}

// Server is the single lock server.
type Server struct {
	cfg ServerConfig
	ln  net.Listener

	mu       sync.Mutex
	cond     *sync.Cond
	data     map[string]entry
	durable  map[string]entry
	offset   time.Duration
	down     bool
	paused   bool
	closed   bool
	conns    map[net.Conn]struct{}
	crashes  int
	stopSync chan struct{}
	wg       sync.WaitGroup
}

// NewServer starts a server on a free 127.0.0.1 port.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.PersistEvery == 0 {
		cfg.PersistEvery = time.Second
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, ln: ln, data: map[string]entry{}, durable: map[string]entry{},
		conns: map[net.Conn]struct{}{}, stopSync: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	s.wg.Add(1)
	go s.accept()
	if cfg.PersistEvery > 0 {
		s.wg.Add(1)
		go s.persistLoop()
	}
	return s, nil
}

// Addr is where the server listens.
func (s *Server) Addr() string { return s.ln.Addr().String() }

func (s *Server) persistLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.PersistEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stopSync:
			return
		case <-t.C:
			s.mu.Lock()
			if !s.down && !s.paused {
				s.durable = clone(s.data)
			}
			s.mu.Unlock()
		}
	}
}

func clone(m map[string]entry) map[string]entry {
	out := make(map[string]entry, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Crash kills the server: open connections are reset, new ones refused until
// Restart, and the state falls back to the last durable one.
func (s *Server) Crash() {
	s.mu.Lock()
	s.down = true
	s.paused = false
	s.crashes++
	s.data = clone(s.durable)
	conns := s.conns
	s.conns = map[net.Conn]struct{}{}
	s.cond.Broadcast()
	s.mu.Unlock()
	for c := range conns {
		reset(c)
	}
}

// Restart brings a crashed server back.
func (s *Server) Restart() {
	s.mu.Lock()
	s.down = false
	s.mu.Unlock()
}

// Pause freezes the server (SIGSTOP): connections stay open, nothing is
// answered and no time passes for it... except the wall clock its TTLs use.
func (s *Server) Pause() {
	s.mu.Lock()
	s.paused = true
	s.mu.Unlock()
}

// Resume undoes Pause.
func (s *Server) Resume() {
	s.mu.Lock()
	s.paused = false
	s.cond.Broadcast()
	s.mu.Unlock()
}

// SetClockOffset steps the server's wall clock, as an NTP step or a wrong
// clock would: TTLs are wall-clock deadlines, so a step forward ends locks
// early.
func (s *Server) SetClockOffset(d time.Duration) {
	s.mu.Lock()
	s.offset = d
	s.mu.Unlock()
}

// Crashes returns how often the server crashed.
func (s *Server) Crashes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.crashes
}

// Close stops the server.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	conns := s.conns
	s.conns = map[net.Conn]struct{}{}
	s.cond.Broadcast()
	s.mu.Unlock()
	close(s.stopSync)
	err := s.ln.Close()
	for c := range conns {
		c.Close()
	}
	s.wg.Wait()
	return err
}

func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.down || s.closed {
			s.mu.Unlock()
			reset(c)
			continue
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		reply, ok := s.exec(strings.Fields(line), c)
		if !ok {
			return
		}
		if _, err := c.Write([]byte(reply + "\n")); err != nil {
			return
		}
	}
}

// exec runs one command; ok is false when the connection must close.
func (s *Server) exec(args []string, c net.Conn) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.paused && !s.closed {
		s.cond.Wait()
	}
	if _, live := s.conns[c]; !live || s.closed {
		return "", false // crashed while we waited
	}
	now := time.Now().Add(s.offset)
	get := func(k string) (entry, bool) {
		e, ok := s.data[k]
		if ok && !e.expires.IsZero() && !now.Before(e.expires) {
			delete(s.data, k)
			return e, false
		}
		return e, ok
	}
	if len(args) == 0 {
		return "ERR empty", true
	}
	switch {
	case args[0] == "GET" && len(args) == 2:
		if e, ok := get(args[1]); ok {
			return "VAL " + e.val, true
		}
		return "NIL", true
	case args[0] == "SETNX" && len(args) == 4:
		ttl, err := strconv.ParseInt(args[3], 10, 64)
		if err != nil || ttl <= 0 {
			return "ERR ttl", true
		}
		if _, ok := get(args[1]); ok {
			return "EXISTS", true
		}
		s.data[args[1]] = entry{val: args[2], expires: now.Add(time.Duration(ttl) * time.Millisecond)}
		return "OK", true
	case args[0] == "SET" && len(args) == 3:
		s.data[args[1]] = entry{val: args[2]}
		return "OK", true
	case args[0] == "DELIF" && len(args) == 3:
		if e, ok := get(args[1]); ok && e.val == args[2] {
			delete(s.data, args[1])
			return "OK", true
		}
		return "NO", true
	}
	return "ERR unknown command", true
}

// Client talks to a Server (usually through a WAN proxy). Safe for
// concurrent use.
type Client struct {
	addr    string
	timeout time.Duration
	mu      sync.Mutex
	idle    []*conn
}

type conn struct {
	c net.Conn
	r *bufio.Reader
}

// NewClient returns a client of the server at addr whose calls give up
// after timeout.
func NewClient(addr string, timeout time.Duration) *Client {
	return &Client{addr: addr, timeout: timeout}
}

// Close closes idle connections.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.idle {
		k.c.Close()
	}
	c.idle = nil
}

func (c *Client) call(ctx context.Context, line string) (string, error) {
	deadline := time.Now().Add(c.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.mu.Lock()
	var k *conn
	if n := len(c.idle); n > 0 {
		k, c.idle = c.idle[n-1], c.idle[:n-1]
	}
	c.mu.Unlock()
	if k == nil {
		d := net.Dialer{Deadline: deadline}
		nc, err := d.DialContext(ctx, "tcp", c.addr)
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		k = &conn{c: nc, r: bufio.NewReader(nc)}
	}
	k.c.SetDeadline(deadline)
	if _, err := k.c.Write([]byte(line + "\n")); err != nil {
		k.c.Close()
		return "", fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	reply, err := k.r.ReadString('\n')
	if err != nil {
		k.c.Close()
		return "", fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	c.mu.Lock()
	c.idle = append(c.idle, k)
	c.mu.Unlock()
	return strings.TrimSpace(reply), nil
}

// enc keeps values free of spaces and newlines.
func enc(v string) string { return base64.RawURLEncoding.EncodeToString([]byte(v)) }

func dec(v string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(v)
	return string(b), err
}

// SetNX sets key to val for ttl unless it exists: the lock. True when set.
func (c *Client) SetNX(ctx context.Context, key, val string, ttl time.Duration) (bool, error) {
	reply, err := c.call(ctx, fmt.Sprintf("SETNX %s %s %d", key, enc(val), ttl.Milliseconds()))
	switch {
	case err != nil:
		return false, err
	case reply == "OK":
		return true, nil
	case reply == "EXISTS":
		return false, nil
	}
	return false, fmt.Errorf("%w: %q", ErrProtocol, reply)
}

// Get reads key.
func (c *Client) Get(ctx context.Context, key string) (string, bool, error) {
	reply, err := c.call(ctx, "GET "+key)
	switch {
	case err != nil:
		return "", false, err
	case reply == "NIL":
		return "", false, nil
	case strings.HasPrefix(reply, "VAL "):
		v, err := dec(strings.TrimPrefix(reply, "VAL "))
		if err != nil {
			return "", false, fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		return v, true, nil
	}
	return "", false, fmt.Errorf("%w: %q", ErrProtocol, reply)
}

// Set stores val at key with no expiry (the result).
func (c *Client) Set(ctx context.Context, key, val string) error {
	reply, err := c.call(ctx, "SET "+key+" "+enc(val))
	if err == nil && reply != "OK" {
		err = fmt.Errorf("%w: %q", ErrProtocol, reply)
	}
	return err
}

// DelIf deletes key if it still holds val (the lock owner's unlock, as the
// usual Lua script does).
func (c *Client) DelIf(ctx context.Context, key, val string) (bool, error) {
	reply, err := c.call(ctx, "DELIF "+key+" "+enc(val))
	switch {
	case err != nil:
		return false, err
	case reply == "OK":
		return true, nil
	case reply == "NO":
		return false, nil
	}
	return false, fmt.Errorf("%w: %q", ErrProtocol, reply)
}
