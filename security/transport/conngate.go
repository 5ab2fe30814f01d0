package transport

import (
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultUnauthenticatedIdle is how long a connection to the JSON API or
// gRPC listener may stay idle without having authenticated a request before
// it is closed (the contract's trust boundary: an idle connection that
// never authenticated holds no slot for more than 10 s).
const DefaultUnauthenticatedIdle = 10 * time.Second

// connGate closes the connections of a listener that stay idle for its
// timeout without ever having carried an authenticated request, so that a
// client without credentials cannot hold --max-conns slots with silent TCP
// connections or idle keep-alives. A connection is marked authenticated by
// the first request the Authorizer admits with a principal on it (markAddr,
// by its remote address: the HTTP request's RemoteAddr or the gRPC peer's
// address); from then on only the servers' own idle timeouts apply. An HTTP
// connection busy with a request is never cut: its timer runs again once it
// is idle (connState).
type connGate struct {
	timeout time.Duration
	closed  prometheus.Counter

	mu    sync.RWMutex // markAddr, on every admitted request, only reads
	conns map[string]*gateConn
}

func newConnGate(timeout time.Duration, closed prometheus.Counter) *connGate {
	return &connGate{timeout: timeout, closed: closed, conns: map[string]*gateConn{}}
}

// listener wraps ln (inside any TLS listener, outside the connection cap, so
// closing a connection frees its slot).
func (g *connGate) listener(ln net.Listener) net.Listener { return &gateListener{Listener: ln, g: g} }

type gateListener struct {
	net.Listener
	g *connGate
}

func (l *gateListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	gc := &gateConn{Conn: c, g: l.g, key: c.RemoteAddr().String()}
	gc.mu.Lock()
	gc.timer = time.AfterFunc(l.g.timeout, gc.expire)
	gc.mu.Unlock()
	l.g.mu.Lock()
	l.g.conns[gc.key] = gc
	l.g.mu.Unlock()
	return gc, nil
}

type gateConn struct {
	net.Conn
	g      *connGate
	key    string
	mu     sync.Mutex // guards timer (set after it is armed)
	timer  *time.Timer
	authed atomic.Bool
	active atomic.Bool // an HTTP request is in progress on it
	done   atomic.Bool // closed
	once   sync.Once
}

// expire closes the connection unless it authenticated; a connection busy
// with a request gets another period once it is idle.
func (c *gateConn) expire() {
	if c.authed.Load() || c.done.Load() {
		return
	}
	if c.active.Load() {
		c.resetTimer()
		return
	}
	c.g.closed.Inc()
	c.Close()
}

func (c *gateConn) Close() error {
	c.once.Do(func() {
		c.done.Store(true)
		c.stopTimer()
		c.g.mu.Lock()
		if c.g.conns[c.key] == c {
			delete(c.g.conns, c.key)
		}
		c.g.mu.Unlock()
	})
	return c.Conn.Close()
}

// markAddr marks the connection from remote address addr as authenticated.
func (g *connGate) markAddr(addr string) {
	g.mu.RLock()
	c := g.conns[addr]
	g.mu.RUnlock()
	if c != nil && !c.authed.Swap(true) {
		c.stopTimer()
	}
}

// connState is an http.Server's ConnState hook: it tells the gate when an
// HTTP connection is busy with a request, and restarts its timer when it
// goes idle unauthenticated.
func (g *connGate) connState(nc net.Conn, st http.ConnState) {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	c, ok := nc.(*gateConn)
	if !ok {
		return
	}
	switch st {
	case http.StateActive:
		c.active.Store(true)
	case http.StateIdle:
		c.active.Store(false)
		if !c.authed.Load() {
			c.resetTimer()
		}
	}
}

func (c *gateConn) resetTimer() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer.Reset(c.g.timeout)
}

func (c *gateConn) stopTimer() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer.Stop()
}
