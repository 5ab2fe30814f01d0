package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/fsm"
)

const (
	// DefaultMaxClockOffset is the contract's --max-clock-offset default.
	DefaultMaxClockOffset = 500 * time.Millisecond
	// clockProbeInterval is how often the node reads each peer's clock.
	clockProbeInterval = time.Second
	// clockEstimateTTL is how long one reading of a peer's clock is used.
	clockEstimateTTL = 5 * clockProbeInterval
	// clockGuardInterval is how often a skewed node checks that it leads
	// nothing (it hands over again if it was elected meanwhile).
	clockGuardInterval = 250 * time.Millisecond
)

// peerClock is one reading of a peer's clock: the clock it answered with
// and the local monotonic instant halfway through the call. Estimates of
// the peer's clock later add the monotonic time elapsed since, so they do
// not depend on this node's wall clock (which may be the wrong one, or
// step).
type peerClock struct {
	peerTime int64     // the peer's clock (Unix ns) when it answered
	mid      time.Time // local time halfway through the call (monotonic)
	rtt      time.Duration
	offset   time.Duration // peer's clock minus this node's, at the reading
	// lowDisk: the peer reported its disk below its reserve.
	lowDisk bool
}

// clocks measures this node's clock against its peers' (the voters of the
// shards it hosts) on their Admin.Clock RPC, over the same gRPC connection
// forwarding uses, and answers what the node needs: whether its own clock is
// past the bound, the clock readings a command is stamped with, and the
// offset metric. The same answers carry each peer's disk-reserve state and
// advertised cluster version, so the probes run even with the clock check
// off; the meta group's leader also asks the nodes it shares no shard with
// for their version (askVersions, version.go).
type clocks struct {
	n     *Node
	bound time.Duration // < 0: the leadership/readiness check is off
	// stampBound is how far the voters' clocks a command is stamped with
	// may be apart (fsm.QuorumTime): the bound, or DefaultMaxClockOffset
	// with the check off. Quorum time never depends on the check: with it
	// off a skewed leader still leads, but its clock alone never reaches
	// the state.
	stampBound time.Duration
	peersp     atomic.Pointer[[]string]

	mu       sync.Mutex
	readings map[string]peerClock
	// legacy are peers that do not serve Admin.Clock (an older version,
	// during a rolling upgrade): commands of shards they vote in are
	// stamped the old way, which their state machine can decode.
	legacy map[string]bool
	// advertised is the cluster version each node last advertised, and
	// when (any answer to Admin.Clock; a release without it counts as
	// VersionBaseline).
	advertised map[string]advertisedVersion

	offsetGauge  *prometheus.GaugeVec
	skewedGauge  prometheus.Gauge
	versionGauge *prometheus.GaugeVec
}

// advertisedVersion is one node's answer about its version.
type advertisedVersion struct {
	version int
	at      time.Time
}

func newClocks(n *Node) *clocks {
	stampBound := n.cfg.MaxClockOffset
	if stampBound < 0 {
		stampBound = DefaultMaxClockOffset
	}
	c := &clocks{n: n, bound: n.cfg.MaxClockOffset, stampBound: stampBound, readings: map[string]peerClock{}, legacy: map[string]bool{},
		advertised: map[string]advertisedVersion{},
		offsetGauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_node_clock_offset_seconds",
			Help: "Each peer's clock minus this node's, measured on the Admin.Clock RPC (accurate to half the round trip)."}, []string{"peer"}),
		skewedGauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "idem_node_clock_skewed",
			Help: "1 while this node's clock is off from its peers' by more than --max-clock-offset: it leads no shard and is not ready."}),
		versionGauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_node_peer_version",
			Help: "The cluster version the peer's last Admin.Clock answer advertised (1 for a release before the cluster version without packing); absent until it answered."}, []string{"peer"}),
	}
	c.setPeers(n.view())
	return c
}

// setPeers makes the clock peers the nodes that share a shard with this
// node in v (its seats in the active topology and the target of a running
// change).
func (c *clocks) setPeers(v *view) {
	self := c.n.cfg.NodeID
	seats := v.seats(self)
	seen := map[string]bool{self: true}
	var peers []string
	for _, s := range v.placer.Shards() {
		if !seats[s.ID] {
			continue
		}
		for _, id := range v.forwardShard(s).Voters {
			if !seen[id] {
				seen[id] = true
				peers = append(peers, id)
			}
		}
	}
	slices.Sort(peers)
	if old := c.peersp.Load(); old == nil || !slices.Equal(*old, peers) {
		c.peersp.Store(&peers)
	}
}

// peers returns the nodes whose clocks this node reads.
func (c *clocks) peers() []string { return *c.peersp.Load() }

func (c *clocks) register(r *prometheus.Registry) error {
	for _, m := range []prometheus.Collector{c.offsetGauge, c.skewedGauge, c.versionGauge} {
		if err := r.Register(m); err != nil {
			return fmt.Errorf("node: register clock metrics: %w", err)
		}
	}
	return nil
}

func (c *clocks) enabled() bool { return c.bound >= 0 && len(c.peers()) > 0 }

// probe reads every peer's clock once, concurrently.
func (c *clocks) probe(ctx context.Context) {
	var wg sync.WaitGroup
	for _, p := range c.peers() {
		wg.Go(func() {
			start := time.Now()
			local0 := c.n.localNow()
			resp, err := c.ask(ctx, p)
			if err != nil {
				if status.Code(err) == codes.Unimplemented {
					c.mu.Lock()
					c.legacy[p] = true
					c.mu.Unlock()
				}
				return
			}
			rtt := time.Since(start)
			pc := peerClock{peerTime: resp.GetUnixNanos(), mid: start.Add(rtt / 2), rtt: rtt, lowDisk: resp.GetBelowDiskReserve()}
			pc.offset = time.Duration(pc.peerTime - (local0 + int64(rtt/2)))
			c.mu.Lock()
			c.readings[p] = pc
			delete(c.legacy, p)
			c.mu.Unlock()
			c.offsetGauge.WithLabelValues(p).Set(pc.offset.Seconds())
		})
	}
	wg.Wait()
}

// ask calls peer's Admin.Clock and records the version it advertises (a
// release without Admin.Clock: VersionBaseline).
func (c *clocks) ask(ctx context.Context, peer string) (*idemv1.ClockResponse, error) {
	conn, err := c.n.fwd.Conn(peer)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, clockProbeInterval)
	defer cancel()
	resp, err := idemv1.NewAdminClient(conn).Clock(cctx, &idemv1.ClockRequest{})
	switch {
	case err == nil:
		c.noteVersion(peer, peerVersion(resp))
	case status.Code(err) == codes.Unimplemented:
		c.noteVersion(peer, VersionBaseline)
	}
	return resp, err
}

func (c *clocks) noteVersion(peer string, v int) {
	c.mu.Lock()
	c.advertised[peer] = advertisedVersion{version: v, at: time.Now()}
	c.mu.Unlock()
	c.versionGauge.WithLabelValues(peer).Set(float64(v))
}

// versions returns the version each node advertised in a fresh answer
// (younger than clockEstimateTTL): a node silent for longer counts as not
// upgraded, as one never heard from.
func (c *clocks) versions() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return young(c.advertised, func(a advertisedVersion) (time.Time, int) { return a.at, a.version })
}

// young returns what of m was read less than clockEstimateTTL ago: read
// gives an entry's time and the value kept.
func young[V, W any](m map[string]V, read func(V) (time.Time, W)) map[string]W {
	out := make(map[string]W, len(m))
	for p, v := range m {
		if at, w := read(v); time.Since(at) < clockEstimateTTL {
			out[p] = w
		}
	}
	return out
}

// askVersions asks each of nodes (this node aside) without a fresh answer
// for its version, concurrently: the meta group's leader counts nodes it
// shares no shard with.
func (c *clocks) askVersions(ctx context.Context, nodes []string) {
	have := c.versions()
	var wg sync.WaitGroup
	for _, p := range nodes {
		if _, ok := have[p]; ok || p == c.n.cfg.NodeID {
			continue
		}
		wg.Go(func() { _, _ = c.ask(ctx, p) })
	}
	wg.Wait()
}

// reading returns peer's reading if it is young enough to use. The hot
// paths (stamp, once per command) use it rather than fresh, which copies
// every reading into a new map.
func (c *clocks) reading(peer string) (peerClock, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.readings[peer]
	if !ok || time.Since(r.mid) >= clockEstimateTTL {
		return peerClock{}, false
	}
	return r, true
}

// fresh returns the readings young enough to use, by peer.
func (c *clocks) fresh() map[string]peerClock {
	c.mu.Lock()
	defer c.mu.Unlock()
	return young(c.readings, func(r peerClock) (time.Time, peerClock) { return r.mid, r })
}

// offset is how far this node's clock is from its peers': the median of
// its own (zero) and every fresh peer offset, each shrunk towards zero by
// half its round trip (what the reading cannot tell apart). With an even
// count the middle value closer to zero is taken, so a node is called
// skewed only when a majority of the clocks it sees say so. ok is false
// without any fresh reading.
func (c *clocks) offset() (off time.Duration, ok bool) {
	fresh := c.fresh()
	if len(fresh) == 0 {
		return 0, false
	}
	offs := []time.Duration{0}
	for _, r := range fresh {
		o := r.offset
		switch half := r.rtt / 2; {
		case o > half:
			o -= half
		case o < -half:
			o += half
		default:
			o = 0
		}
		offs = append(offs, o)
	}
	return medianTowardZero(offs), true
}

func medianTowardZero(v []time.Duration) time.Duration {
	slices.Sort(v)
	lo, hi := v[(len(v)-1)/2], v[len(v)/2]
	if abs(lo) <= abs(hi) {
		return lo
	}
	return hi
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// skewed returns why this node's clock is past the bound, or nil.
func (c *clocks) skewed() error {
	if !c.enabled() {
		return nil
	}
	off, ok := c.offset()
	if !ok || abs(off) <= c.bound {
		return nil
	}
	return fmt.Errorf("%w: this node's clock is %s off from the median of its peers' (bound --max-clock-offset %s); it leads no shard until the clock is fixed",
		ErrClockSkewed, (-off).Round(time.Millisecond), c.bound)
}

// peerSkewed reports whether this node sees peer's clock past the bound
// (leader balancing does not hand a shard back to it).
func (c *clocks) peerSkewed(peer string) bool {
	if !c.enabled() {
		return false
	}
	r, ok := c.reading(peer)
	return ok && abs(r.offset)-r.rtt/2 > c.bound
}

// stamp fills cmd's time for the shard with voters: this node's clock and
// its estimate of each voter's it has a fresh reading of, a majority of
// them required to agree (fsm.QuorumTime). ok is false when they do not
// (or too few are known): the command must not be proposed.
func (c *clocks) stamp(cmd *fsm.Command, voters []string) error {
	local := c.n.localNow()
	if len(c.peers()) == 0 || len(voters) <= 1 {
		cmd.Now, cmd.ClockReadings, cmd.ClockQuorum, cmd.ClockBound = local, []int64{local}, 1, 0
		return nil
	}
	if c.anyLegacy(voters) {
		// An older voter cannot decode clock readings: stamp this node's
		// clock corrected by its offset to its peers, as before readings.
		cmd.Now, cmd.ClockReadings, cmd.ClockQuorum, cmd.ClockBound = c.now(), nil, 0, 0
		return nil
	}
	readings := make([]int64, 1, len(voters))
	readings[0] = local
	var worstRTT time.Duration
	for _, v := range voters {
		if v == c.n.cfg.NodeID {
			continue
		}
		r, ok := c.reading(v)
		if !ok {
			continue
		}
		readings = append(readings, r.peerTime+int64(time.Since(r.mid)))
		worstRTT = max(worstRTT, r.rtt)
	}
	quorum := len(voters)/2 + 1
	// A reading is accurate to half its round trip; two readings to the sum.
	bound := int64(c.stampBound + worstRTT)
	now, ok := fsm.QuorumTime(readings, quorum, bound)
	if !ok {
		return fmt.Errorf("%w: %d of %d voters' clocks read, a majority (%d) must agree within %s",
			ErrClockSkewed, len(readings), len(voters), quorum, time.Duration(bound))
	}
	cmd.Now, cmd.ClockReadings, cmd.ClockQuorum, cmd.ClockBound = now, readings, quorum, bound
	return nil
}

// peersLowOnDisk returns the voters (other than this node) whose last fresh
// answer reported their disk below its reserve.
func (c *clocks) peersLowOnDisk(voters []string) []string {
	var low []string
	for _, v := range voters {
		if v == c.n.cfg.NodeID {
			continue
		}
		if r, ok := c.reading(v); ok && r.lowDisk {
			low = append(low, v)
		}
	}
	return low
}

func (c *clocks) anyLegacy(voters []string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range voters {
		if c.legacy[v] {
			return true
		}
	}
	return false
}

// now is this node's clock corrected by its measured offset to the median
// of its peers' (reads judge expiry with it), whether or not the check is on.
func (c *clocks) now() int64 {
	local := c.n.localNow()
	if len(c.peers()) == 0 {
		return local
	}
	off, _ := c.offset()
	return local + int64(off)
}

// run probes the peers every clockProbeInterval and, with the clock check on and while this node's clock is past
// the bound, hands over every leadership it holds (again whenever it is
// elected).
func (c *clocks) run(ctx context.Context) {
	// Peers come and go with topology changes (setPeers): a node with none
	// now keeps the loop, and probes whoever it shares a shard with later.
	if len(c.peers()) > 0 {
		c.probe(ctx)
	}
	probe := time.NewTicker(clockProbeInterval)
	defer probe.Stop()
	var guardC <-chan time.Time // nil, never fires, with the check off
	if c.bound >= 0 {
		guard := time.NewTicker(clockGuardInterval)
		defer guard.Stop()
		guardC = guard.C
	}
	wasSkewed := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-probe.C:
			c.probe(ctx)
		case <-guardC:
		}
		if !c.enabled() {
			continue
		}
		err := c.skewed()
		switch {
		case err != nil && !wasSkewed:
			c.n.log.Error("clock past the bound: handing over every leadership and reporting not ready", "error", err)
			c.skewedGauge.Set(1)
		case err == nil && wasSkewed:
			c.n.log.Info("clock back within the bound of its peers'")
			c.skewedGauge.Set(0)
		}
		wasSkewed = err != nil
		if err == nil {
			continue
		}
		for _, s := range c.n.hosted() {
			id := s.id
			if s.group.IsLeader() {
				if terr := s.group.TransferLeadership(""); terr != nil {
					c.n.log.Debug("hand-over of a skewed leader failed", "shard", id, "error", terr)
				} else {
					c.n.log.Info("handed leadership over: this node's clock is past the bound", "shard", id)
				}
			}
		}
	}
}
