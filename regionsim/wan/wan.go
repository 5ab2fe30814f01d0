package wan

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Errors of package wan.
var (
	// ErrClosed: the Network was closed.
	ErrClosed = errors.New("wan: network closed")
	// ErrUnknownRegion: a region name that was not declared in Config.Regions.
	ErrUnknownRegion = errors.New("wan: unknown region")
)

// Cut says what a directed link does with traffic while it is cut.
type Cut int

const (
	// Up: traffic flows with the link's latency, jitter and loss.
	Up Cut = iota
	// Refuse: new connections are reset at once and open ones are reset
	// when the cut starts: the caller learns quickly that the peer is
	// unreachable.
	Refuse
	// Blackhole: connections are accepted but nothing is delivered in the
	// cut direction; bytes are held (as TCP keeps retransmitting) and flow
	// once the cut heals. The caller learns nothing until its own timeout:
	// the nasty case.
	Blackhole
)

func (c Cut) String() string {
	switch c {
	case Up:
		return "up"
	case Refuse:
		return "refuse"
	case Blackhole:
		return "blackhole"
	}
	return fmt.Sprintf("Cut(%d)", int(c))
}

// Link is one direction of the path between two regions.
type Link struct {
	// Latency is the one-way delay every byte takes.
	Latency time.Duration
	// Jitter widens each chunk's delay by a uniform draw in
	// [-Jitter, +Jitter] (never below zero, never reordering a stream).
	Jitter time.Duration
	// Loss is the probability (0..1) that a chunk is "lost" and
	// retransmitted: TCP never loses bytes, so a loss shows as an extra
	// LossPenalty of delay on that chunk and everything behind it.
	Loss float64
	// LossPenalty is the delay a lost chunk costs (a retransmission
	// timeout); zero means 200ms.
	LossPenalty time.Duration
}

// Config configures a Network.
type Config struct {
	// Regions names every region; links and cuts refer to these names.
	Regions []string
	// Default is the link used between two distinct regions unless SetLink
	// says otherwise.
	Default Link
	// Seed seeds the jitter and loss draws (0 picks 1).
	Seed uint64
	// MaxBuffered bounds the bytes one direction of one connection holds
	// while delayed or blackholed; past it the proxy stops reading (TCP's
	// window). Zero means 4 MiB.
	MaxBuffered int
	// Logger; nil discards.
	Logger *slog.Logger
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if len(c.Regions) == 0 {
		errs = append(errs, errors.New("wan: config: Regions is empty"))
	}
	seen := map[string]bool{}
	for _, r := range c.Regions {
		if r == "" || seen[r] {
			errs = append(errs, fmt.Errorf("wan: config: region %q is empty or repeated", r))
		}
		seen[r] = true
	}
	errs = append(errs, c.Default.validate())
	if c.MaxBuffered < 0 {
		errs = append(errs, fmt.Errorf("wan: config: MaxBuffered %d is negative", c.MaxBuffered))
	}
	return errors.Join(errs...)
}

func (l Link) validate() error {
	var errs []error
	if l.Latency < 0 || l.Jitter < 0 || l.LossPenalty < 0 {
		errs = append(errs, fmt.Errorf("wan: link %+v: durations must not be negative", l))
	}
	if l.Loss < 0 || l.Loss > 1 {
		errs = append(errs, fmt.Errorf("wan: link loss %v is outside 0..1", l.Loss))
	}
	return errors.Join(errs...)
}

type pair struct{ src, dst string }

// Network simulates the WAN between regions with TCP proxies on loopback.
// Each proxy stands for one destination address as seen from one source
// region: whoever dials the proxy is taken to be in the source region.
// Bytes from the dialer travel the src->dst link; answers travel dst->src,
// so cuts can be asymmetric.
type Network struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	rng     *rand.Rand
	links   map[pair]Link
	cuts    map[pair]Cut
	proxies []*proxy
	changed chan struct{} // closed and replaced whenever a cut changes
	closed  bool

	stats Stats
}

// Stats counts what the network did.
type Stats struct {
	Accepted  atomic.Int64 // connections accepted by proxies
	Refused   atomic.Int64 // connections reset because of a Refuse cut
	BytesUp   atomic.Int64 // bytes delivered dialer -> target
	BytesDown atomic.Int64 // bytes delivered target -> dialer
	Held      atomic.Int64 // chunks that waited for a blackhole to heal
	Lost      atomic.Int64 // chunks that paid the loss penalty
}

// New returns a Network with every link Up.
func New(cfg Config) (*Network, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxBuffered == 0 {
		cfg.MaxBuffered = 4 << 20
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	if cfg.Default.LossPenalty == 0 {
		cfg.Default.LossPenalty = 200 * time.Millisecond
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Network{
		cfg:     cfg,
		log:     log,
		rng:     rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		links:   map[pair]Link{},
		cuts:    map[pair]Cut{},
		changed: make(chan struct{}),
	}, nil
}

func (n *Network) known(regions ...string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, r := range regions {
		if !slices.Contains(n.cfg.Regions, r) {
			return fmt.Errorf("%w %q", ErrUnknownRegion, r)
		}
	}
	return nil
}

// AddRegion declares one more region, for a region added to the cluster
// while it runs; its links to every other region are Config.Default until
// SetLink says otherwise.
func (n *Network) AddRegion(region string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if region == "" || slices.Contains(n.cfg.Regions, region) {
		return fmt.Errorf("wan: region %q is empty or already known", region)
	}
	n.cfg.Regions = append(slices.Clone(n.cfg.Regions), region)
	return nil
}

// regions returns every declared region.
func (n *Network) regions() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.cfg.Regions)
}

// SetLink sets the src->dst direction of a link.
func (n *Network) SetLink(src, dst string, l Link) error {
	if err := errors.Join(n.known(src, dst), l.validate()); err != nil {
		return err
	}
	if l.LossPenalty == 0 {
		l.LossPenalty = 200 * time.Millisecond
	}
	n.mu.Lock()
	n.links[pair{src, dst}] = l
	n.mu.Unlock()
	return nil
}

// Link returns the src->dst link in force.
func (n *Network) Link(src, dst string) Link {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.linkLocked(src, dst)
}

func (n *Network) linkLocked(src, dst string) Link {
	if src == dst {
		return Link{}
	}
	if l, ok := n.links[pair{src, dst}]; ok {
		return l
	}
	return n.cfg.Default
}

// SetCut cuts (or, with Up, heals) the src->dst direction.
func (n *Network) SetCut(src, dst string, c Cut) error {
	if err := n.known(src, dst); err != nil {
		return err
	}
	if src == dst {
		return fmt.Errorf("wan: cannot cut region %q from itself", src)
	}
	n.mu.Lock()
	if c == Up {
		delete(n.cuts, pair{src, dst})
	} else {
		n.cuts[pair{src, dst}] = c
	}
	close(n.changed)
	n.changed = make(chan struct{})
	proxies := append([]*proxy(nil), n.proxies...)
	n.mu.Unlock()
	n.log.Info("wan cut", "src", src, "dst", dst, "cut", c.String())
	if c == Refuse {
		for _, p := range proxies {
			if (p.src == src && p.dst == dst) || (p.src == dst && p.dst == src) {
				p.resetAll()
			}
		}
	}
	return nil
}

// Isolate cuts region off from every other region, both directions.
func (n *Network) Isolate(region string, c Cut) error {
	var errs []error
	for _, r := range n.regions() {
		if r != region {
			errs = append(errs, n.SetCut(region, r, c), n.SetCut(r, region, c))
		}
	}
	return errors.Join(errs...)
}

// HealAll sets every direction back to Up.
func (n *Network) HealAll() {
	n.mu.Lock()
	n.cuts = map[pair]Cut{}
	close(n.changed)
	n.changed = make(chan struct{})
	n.mu.Unlock()
	n.log.Info("wan healed")
}

// CutOf returns the cut in force on src->dst.
func (n *Network) CutOf(src, dst string) Cut {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cuts[pair{src, dst}]
}

// ActiveCuts returns a description of every cut direction, "a->b blackhole".
func (n *Network) ActiveCuts() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, a := range n.cfg.Regions {
		for _, b := range n.cfg.Regions {
			if c, ok := n.cuts[pair{a, b}]; ok {
				out = append(out, a+"->"+b+" "+c.String())
			}
		}
	}
	return out
}

// Stats returns the counters.
func (n *Network) Stats() *Stats { return &n.stats }

// state returns the cut of src->dst and a channel closed on the next change.
func (n *Network) state(src, dst string) (Cut, <-chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cuts[pair{src, dst}], n.changed
}

// delay draws the delay of one chunk on src->dst.
func (n *Network) delay(src, dst string) time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.linkLocked(src, dst)
	d := l.Latency
	if l.Jitter > 0 {
		d += time.Duration(n.rng.Int64N(int64(2*l.Jitter)+1)) - l.Jitter
	}
	if l.Loss > 0 && n.rng.Float64() < l.Loss {
		d += l.LossPenalty
		n.stats.Lost.Add(1)
	}
	return max(d, 0)
}

// Listen starts a proxy on a free 127.0.0.1 port that forwards to target
// (an address in region dst) as seen from region src, and returns its
// address. With src == dst the proxy adds no delay and is never cut.
func (n *Network) Listen(src, dst, target string) (string, error) {
	if err := n.known(src, dst); err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("wan: listen: %w", err)
	}
	p := &proxy{n: n, src: src, dst: dst, target: target, ln: ln, conns: map[*session]struct{}{}}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		ln.Close()
		return "", ErrClosed
	}
	n.proxies = append(n.proxies, p)
	n.mu.Unlock()
	p.wg.Add(1)
	go p.serve()
	return ln.Addr().String(), nil
}

// Close stops every proxy and closes every connection through them.
func (n *Network) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	proxies := n.proxies
	close(n.changed)
	n.changed = make(chan struct{})
	n.mu.Unlock()
	for _, p := range proxies {
		p.close()
	}
	return nil
}

// proxy is one listener standing for target as seen from src.
type proxy struct {
	n        *Network
	src, dst string
	target   string
	ln       net.Listener
	wg       sync.WaitGroup

	mu     sync.Mutex
	conns  map[*session]struct{}
	closed bool
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.n.stats.Accepted.Add(1)
		up, _ := p.n.state(p.src, p.dst)
		down, _ := p.n.state(p.dst, p.src)
		if up == Refuse || down == Refuse {
			p.n.stats.Refused.Add(1)
			reset(c)
			continue
		}
		s := &session{p: p, client: c, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.conns[s] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go s.run()
	}
}

func (p *proxy) forget(s *session) {
	p.mu.Lock()
	delete(p.conns, s)
	p.mu.Unlock()
}

// resetAll resets every open connection (a Refuse cut started).
func (p *proxy) resetAll() {
	p.mu.Lock()
	sessions := make([]*session, 0, len(p.conns))
	for s := range p.conns {
		sessions = append(sessions, s)
	}
	p.mu.Unlock()
	for _, s := range sessions {
		p.n.stats.Refused.Add(1)
		s.abort()
	}
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.resetAll()
	p.wg.Wait()
}

// reset closes c with an RST rather than a FIN, as a refused peer does.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// session is one proxied connection.
type session struct {
	p      *proxy
	client net.Conn
	server net.Conn
	once   sync.Once
	done   chan struct{}
	mu     sync.Mutex
}

func (s *session) abort() {
	s.once.Do(func() {
		close(s.done)
		reset(s.client)
		s.mu.Lock()
		if s.server != nil {
			reset(s.server)
		}
		s.mu.Unlock()
	})
}

func (s *session) run() {
	defer s.p.wg.Done()
	defer s.p.forget(s)
	defer s.abort()
	server, err := net.DialTimeout("tcp", s.p.target, 5*time.Second)
	if err != nil {
		return
	}
	s.mu.Lock()
	select {
	case <-s.done:
		s.mu.Unlock()
		server.Close()
		return
	default:
	}
	s.server = server
	s.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.pump(s.client, server, s.p.src, s.p.dst, &s.p.n.stats.BytesUp) }()
	go func() { defer wg.Done(); s.pump(server, s.client, s.p.dst, s.p.src, &s.p.n.stats.BytesDown) }()
	wg.Wait()
}

type chunk struct {
	data []byte
	at   time.Time // when it may be delivered
	eof  bool
}

// pump copies from -> to over the src->dst link: a reader stamps each chunk
// with its delivery time and a writer delivers chunks in order once their
// time has come and the link is not blackholed.
func (s *session) pump(from, to net.Conn, src, dst string, counter *atomic.Int64) {
	n := s.p.n
	maxChunks := max(n.cfg.MaxBuffered/(32<<10), 4)
	queue := make(chan chunk, maxChunks)
	go func() {
		defer close(queue)
		var last time.Time
		buf := make([]byte, 32<<10)
		for {
			k, err := from.Read(buf)
			if k > 0 {
				at := time.Now().Add(n.delay(src, dst))
				if at.Before(last) {
					at = last // a stream never reorders
				}
				last = at
				select {
				case queue <- chunk{data: append([]byte(nil), buf[:k]...), at: at}:
				case <-s.done:
					return
				}
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					s.abort() // a reset or a local close: tear both directions down
					return
				}
				at := time.Now()
				if at.Before(last) {
					at = last
				}
				select {
				case queue <- chunk{eof: true, at: at}:
				case <-s.done:
				}
				return
			}
		}
	}()
	for c := range queue {
		if !s.waitUntil(c.at) {
			return
		}
		// Held while blackholed; after the heal the chunk still crosses
		// the link (the retransmission that finally gets through).
		held := false
		for {
			cut, changed := n.state(src, dst)
			if cut != Blackhole {
				break
			}
			if !held {
				n.stats.Held.Add(1)
				held = true
			}
			select {
			case <-changed:
			case <-s.done:
				return
			}
		}
		if held && !s.waitUntil(time.Now().Add(n.delay(src, dst))) {
			return
		}
		if c.eof {
			// Half-close: the other direction may still be answering.
			if tc, ok := to.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			continue
		}
		if _, err := to.Write(c.data); err != nil {
			s.abort()
			return
		}
		counter.Add(int64(len(c.data)))
	}
}

// waitUntil sleeps until t or until the session ends (false).
func (s *session) waitUntil(t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		select {
		case <-s.done:
			return false
		default:
			return true
		}
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-s.done:
		return false
	}
}
