package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/router"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/statedb"
)

// Errors of package node.
var (
	// ErrInvalidConfig: Config.Validate failed; the joined errors say why.
	ErrInvalidConfig = errors.New("node: invalid config")
	// ErrDataDirMismatch: the data dir belongs to another cluster, node or ring.
	ErrDataDirMismatch = errors.New("node: data dir does not match this node")
)

// Config configures a storage node.
type Config struct {
	// Topology is the cluster topology; required.
	Topology *router.Topology
	// NodeID is this node's id in Topology; required.
	NodeID string
	// DataDir holds Raft logs, snapshots and the identity file; required.
	DataDir string
	// HTTPAddr, GRPCAddr and RaftAddr are where this process listens; empty
	// means the topology's address. Other processes always dial the
	// topology's addresses.
	HTTPAddr, GRPCAddr, RaftAddr string
	// MaxResponseBytes is the largest stored response body (decoded bytes);
	// 0 means 1 MiB.
	MaxResponseBytes int64
	// MaxStateBytes is the node's stored state (statedb.DB.StateBytes) at
	// which requests that would add data get 429 RESOURCE_EXHAUSTED; 0
	// means 80% of the free space of DataDir's filesystem at start.
	MaxStateBytes int64
	// ClockSkewMargin is how long past a lease's end before another caller
	// may reclaim the key. Zero means no margin (not recommended).
	ClockSkewMargin time.Duration
	// SweepInterval is how often a shard's leader proposes a sweep of
	// expired records; 0 means 10s.
	SweepInterval time.Duration
	// MaxSweep bounds the records one sweep drops; 0 means 10000.
	MaxSweep int
	// AbandonAfter: an in-progress record whose lease ended this long ago
	// and that nobody reclaimed is dropped by the sweep; 0 means 7 days.
	AbandonAfter time.Duration
	// LeaderBalanceInterval is how often the node checks the shards it leads
	// and hands each one whose preferred voter (Voters[0], in the home
	// region) is another node back to it; 0 means 5s, negative disables.
	LeaderBalanceInterval time.Duration
	// ForwardAttemptTimeout bounds one attempt to forward a request to
	// another node; 0 means 2s.
	ForwardAttemptTimeout time.Duration
	// Raft tunes the Raft groups; NodeID, addresses and DataDir are filled
	// in from the fields above. Zero value: raftstore.DefaultConfig().
	Raft raftstore.Config
	// ClockOffset is added to this node's wall clock when it stamps
	// commands. For fault testing (regionsim's clock skew) only.
	ClockOffset time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
	// Registry receives every metric of the node and is what /metrics
	// serves; nil creates a private one.
	Registry *prometheus.Registry
	// Version is reported by status and the start-up line.
	Version string
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.Topology == nil {
		bad("a topology is required")
	} else if _, ok := c.Topology.NodeByID(c.NodeID); !ok {
		bad("node id %q is not in the topology of cluster %q", c.NodeID, c.Topology.Cluster)
	}
	if c.DataDir == "" {
		bad("a data dir is required")
	}
	if c.MaxStateBytes < 0 {
		bad("max state bytes %d is negative", c.MaxStateBytes)
	}
	if c.MaxResponseBytes < 0 {
		bad("max response bytes %d is negative", c.MaxResponseBytes)
	}
	if c.ClockSkewMargin < 0 {
		bad("clock skew margin %s is negative", c.ClockSkewMargin)
	}
	if c.SweepInterval < 0 || c.MaxSweep < 0 || c.AbandonAfter < 0 || c.ForwardAttemptTimeout < 0 {
		bad("sweep interval, max sweep, abandon-after and forward attempt timeout must not be negative")
	}
	return errors.Join(errs...)
}

func (c *Config) fillDefaults() {
	if c.SweepInterval == 0 {
		c.SweepInterval = 10 * time.Second
	}
	if c.LeaderBalanceInterval == 0 {
		c.LeaderBalanceInterval = 5 * time.Second
	}
	if c.MaxSweep == 0 {
		c.MaxSweep = 10000
	}
	if c.AbandonAfter == 0 {
		c.AbandonAfter = 7 * 24 * time.Hour
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
}

// shard is one Raft group hosted here with its state machine.
type shard struct {
	info  router.Shard
	group *raftstore.Group
	sm    *statedb.StateMachine
	fsm   *fsm.FSM
}

// Node is one idemnode: the Raft groups of the shards it hosts, the public
// API over them, and forwarding for every key it does not lead.
type Node struct {
	cfg    Config
	log    *slog.Logger
	self   router.Node
	ring   *router.Ring
	host   *raftstore.Host
	state  *statedb.DB // every hosted shard's records, on disk
	shards map[string]*shard
	fwd    *router.Forwarder
	api    *server.Server

	httpLn, grpcLn net.Listener
	httpSrv        *http.Server
	grpcSrv        *grpc.Server

	stopSweep chan struct{}
	sweepWG   sync.WaitGroup
	// ringErr is set when a peer reports another cluster or ring: this
	// node's topology file is not the one the cluster was created with.
	ringErr   atomic.Pointer[error]
	closeOnce sync.Once
}

// New opens the data dir (refusing one that belongs to another cluster, node
// or ring), starts the Raft groups of every shard this node hosts
// (bootstrapping them on first start), and binds the API listeners. Serve
// starts answering.
func New(cfg Config) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.fillDefaults()
	self, _ := cfg.Topology.NodeByID(cfg.NodeID)
	ring, err := router.NewRing(cfg.Topology)
	if err != nil {
		return nil, err
	}
	if err := checkIdentity(cfg.DataDir, identity{Cluster: cfg.Topology.Cluster, NodeID: cfg.NodeID, RingFingerprint: ring.Fingerprint()}); err != nil {
		return nil, err
	}
	n := &Node{
		cfg:       cfg,
		log:       cfg.Logger.With("node", cfg.NodeID, "region", self.Region),
		self:      self,
		ring:      ring,
		shards:    map[string]*shard{},
		stopSweep: make(chan struct{}),
	}
	defer func() {
		if err != nil {
			n.closeAll(context.Background())
		}
	}()

	rcfg := cfg.Raft
	if rcfg == (raftstore.Config{}) {
		rcfg = raftstore.DefaultConfig()
	}
	rcfg.NodeID = cfg.NodeID
	rcfg.RaftListenAddr = cmp(cfg.RaftAddr, self.RaftAddr)
	rcfg.RaftAdvertiseAddr = self.RaftAddr
	rcfg.DataDir = filepath.Join(cfg.DataDir, "raft")
	rcfg.Logger = n.log
	rcfg.Registry = cfg.Registry
	maxState := cfg.MaxStateBytes
	if maxState == 0 {
		if maxState, err = statedb.DefaultMaxStateBytes(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	if n.state, err = statedb.Open(statedb.Config{Dir: filepath.Join(cfg.DataDir, "state"), MaxStateBytes: maxState, Registry: cfg.Registry}); err != nil {
		return nil, err
	}
	n.log.Info("state engine open", "dir", filepath.Join(cfg.DataDir, "state"), "max_state_bytes", maxState, "state_bytes", n.state.StateBytes())
	if n.host, err = raftstore.NewHost(rcfg); err != nil {
		return nil, err
	}
	for _, info := range cfg.Topology.ShardsOnNode(cfg.NodeID) {
		peers := make([]raftstore.Peer, 0, len(info.Voters))
		for _, v := range info.Voters {
			vn, _ := cfg.Topology.NodeByID(v)
			peers = append(peers, raftstore.Peer{ID: v, Addr: vn.RaftAddr})
		}
		gc := raftstore.GroupConfig{ID: info.ID, Voters: peers}
		if spansRegions(cfg.Topology, info) && cfg.Topology.WANRTTMs > 0 {
			gc.Timing = raftstore.WANTiming(rcfg, time.Duration(cfg.Topology.WANRTTMs)*time.Millisecond)
		}
		sm, err := n.state.Shard(info.ID)
		if err != nil {
			return nil, err
		}
		s := &shard{info: info, sm: sm, fsm: sm.FSM()}
		if s.group, err = n.host.AddGroup(gc, sm); err != nil {
			return nil, err
		}
		n.shards[info.ID] = s
	}

	// Forwarded replays carry whole stored responses: allow messages as
	// large as the API accepts, not gRPC's 4 MiB default.
	msgBytes := server.Config{MaxResponseBytes: cfg.MaxResponseBytes}.GRPCMaxMessageBytes()
	if n.fwd, err = router.NewForwarder(router.ForwarderConfig{
		Topology: cfg.Topology, Self: cfg.NodeID, AttemptTimeout: cfg.ForwardAttemptTimeout,
		Logger: n.log, Registry: cfg.Registry,
		DialOptions: append(router.DefaultDialOptions(), grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(msgBytes), grpc.MaxCallSendMsgSize(msgBytes))),
	}); err != nil {
		return nil, err
	}
	if n.api, err = server.New(server.Config{
		Backend: n, Logger: n.log, Registry: cfg.Registry, MaxResponseBytes: cfg.MaxResponseBytes, Version: cfg.Version,
	}); err != nil {
		return nil, err
	}
	if err := cfg.Registry.Register(&fsmCollector{n: n}); err != nil {
		return nil, fmt.Errorf("node: register metrics: %w", err)
	}

	if n.httpLn, err = net.Listen("tcp", cmp(cfg.HTTPAddr, self.HTTPAddr)); err != nil {
		return nil, fmt.Errorf("node: http listener: %w", err)
	}
	if n.grpcLn, err = net.Listen("tcp", cmp(cfg.GRPCAddr, self.GRPCAddr)); err != nil {
		return nil, fmt.Errorf("node: grpc listener: %w", err)
	}
	n.httpSrv = &http.Server{Handler: n.api.HTTPHandler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(n.log.Handler(), slog.LevelWarn)}
	n.grpcSrv = n.api.NewGRPCServer()
	idemv1.RegisterAdminServer(n.grpcSrv, &admin{n: n})

	n.sweepWG.Add(1)
	go n.sweepLoop()
	n.sweepWG.Add(1)
	go func() {
		defer n.sweepWG.Done()
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-n.stopSweep; cancel() }()
		router.NewRingCheck(cfg.Topology, ring, cfg.NodeID, n.fwd.Conn).Watch(ctx, 2*time.Second, func(err error) {
			if err != nil {
				n.ringErr.Store(&err)
				n.log.Error("a peer was created with another ring: this node's topology file differs from the cluster's", "error", err)
			}
		})
	}()
	if cfg.LeaderBalanceInterval > 0 {
		n.sweepWG.Add(1)
		go n.balanceLoop()
	}
	return n, nil
}

// spansRegions reports whether the shard's voters live in more than one
// region (region survival): its Raft timeouts must allow for WAN round trips.
func spansRegions(t *router.Topology, s router.Shard) bool {
	for _, v := range s.Voters {
		if r, _ := t.RegionOf(v); r != s.HomeRegion {
			return true
		}
	}
	return false
}

func cmp(override, fallback string) string {
	if override != "" {
		return override
	}
	return fallback
}

// HTTPAddr and GRPCAddr are the bound listener addresses.
func (n *Node) HTTPAddr() string { return n.httpLn.Addr().String() }
func (n *Node) GRPCAddr() string { return n.grpcLn.Addr().String() }

// Serve answers API requests until ctx ends, then drains: it stops taking
// requests, lets in-flight ones finish, hands over the leadership of the
// shards it leads, and closes the Raft groups. It returns nil after a clean
// drain.
func (n *Node) Serve(ctx context.Context) error {
	errc := make(chan error, 2)
	go func() {
		if err := n.httpSrv.Serve(n.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("node: http: %w", err)
		}
	}()
	go func() {
		if err := n.grpcSrv.Serve(n.grpcLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			errc <- fmt.Errorf("node: grpc: %w", err)
		}
	}()
	n.log.Info("idemnode serving", "cluster", n.cfg.Topology.Cluster, "http", n.HTTPAddr(), "grpc", n.GRPCAddr(),
		"raft", cmp(n.cfg.RaftAddr, n.self.RaftAddr), "data_dir", n.cfg.DataDir, "shards", len(n.shards), "version", n.cfg.Version)
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	drainCtx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer cancel()
	n.log.Info("draining")
	return errors.Join(serveErr, n.closeAll(drainCtx))
}

// Close stops the node at once, as Serve does on its way out.
func (n *Node) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer cancel()
	return n.closeAll(ctx)
}

func (n *Node) closeAll(ctx context.Context) error {
	var errs []error
	n.closeOnce.Do(func() {
		close(n.stopSweep)
		n.sweepWG.Wait()
		if n.httpSrv != nil {
			errs = append(errs, ignoreClosed(n.httpSrv.Shutdown(ctx)))
		} else if n.httpLn != nil {
			n.httpLn.Close()
		}
		if n.grpcSrv != nil {
			stopped := make(chan struct{})
			go func() { n.grpcSrv.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-ctx.Done():
				n.grpcSrv.Stop()
			}
		} else if n.grpcLn != nil {
			n.grpcLn.Close()
		}
		if n.host != nil {
			errs = append(errs, n.host.Shutdown(ctx))
		}
		if n.state != nil { // after every Raft group has stopped applying
			errs = append(errs, n.state.Close())
		}
		if n.fwd != nil {
			n.fwd.Close()
		}
		n.log.Info("stopped")
	})
	return errors.Join(errs...)
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// now is the clock this node stamps commands with.
func (n *Node) now() int64 { return time.Now().Add(n.cfg.ClockOffset).UnixNano() }

// Apply implements server.Backend: it proposes cmd to the shard's Raft group
// when this node leads it, and forwards it to the leader otherwise.
func (n *Node) Apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, error) {
	info := n.ring.Locate(cmd.Namespace, cmd.Key)
	prefer := ""
	if s := n.shards[info.ID]; s != nil {
		stamped := *cmd
		stamped.Now = n.now()
		stamped.SkewMargin = int64(n.cfg.ClockSkewMargin)
		if s.group.IsLeader() {
			if err := s.sm.Admit(&stamped); err != nil {
				return fsm.Result{}, &server.Error{Code: server.CodeResourceExhausted, Message: err.Error(), RetryAfter: n.cfg.SweepInterval}
			}
		}
		v, err := s.group.Apply(ctx, fsm.EncodeCommand(&stamped))
		if err == nil {
			setLeaderHeader(ctx, n.cfg.NodeID)
			res, ok := v.(fsm.Result)
			if !ok {
				return fsm.Result{}, fmt.Errorf("node: shard %s returned %T", info.ID, v)
			}
			return res, nil
		}
		var nle *raftstore.NotLeaderError
		if !errors.As(err, &nle) {
			return fsm.Result{}, unavailable(info, err)
		}
		prefer = nle.LeaderID
		setLeaderHeader(ctx, prefer)
	}
	res, err := n.fwd.Apply(ctx, info, cmd, prefer, router.HopsFromContext(ctx))
	if err == nil {
		if id, ok := n.fwd.Leader(info.ID); ok {
			setLeaderHeader(ctx, id)
		}
	}
	return res, err
}

// Get implements server.Backend with a linearizable read: on the leader
// after a read barrier, otherwise forwarded to the leader.
func (n *Node) Get(ctx context.Context, namespace, key string) (fsm.Record, bool, error) {
	info := n.ring.Locate(namespace, key)
	prefer := ""
	if s := n.shards[info.ID]; s != nil {
		err := s.group.ReadBarrier(ctx)
		if err == nil {
			setLeaderHeader(ctx, n.cfg.NodeID)
			rec, ok := s.fsm.Get(namespace, key, n.now())
			return rec, ok, nil
		}
		var nle *raftstore.NotLeaderError
		if !errors.As(err, &nle) {
			return fsm.Record{}, false, unavailable(info, err)
		}
		prefer = nle.LeaderID
	}
	return n.fwd.Get(ctx, info, namespace, key, prefer, router.HopsFromContext(ctx))
}

// setLeaderHeader tells a gRPC caller which node leads the shard (the
// forwarders of other nodes and routers learn leaders from it). Outside a
// gRPC handler (the JSON API) there is nobody to tell: the check skips
// grpc.SetHeader's error, which formats the whole context, on every request.
func setLeaderHeader(ctx context.Context, nodeID string) {
	if grpc.ServerTransportStreamFromContext(ctx) != nil {
		router.SetLeaderHeader(ctx, nodeID)
	}
}

func unavailable(info router.Shard, err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	return &server.UnavailableError{Reason: fmt.Sprintf("shard %s: %v", info.ID, err)}
}

// Ready implements server.Backend: every hosted shard has a leader and this
// node has applied what it knows to be committed.
func (n *Node) Ready(ctx context.Context) error {
	if p := n.ringErr.Load(); p != nil {
		return *p
	}
	return n.host.Ready()
}

// WaitReady blocks until Ready is nil or ctx ends.
func (n *Node) WaitReady(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		err := n.Ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node: not ready: %w (last: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// sweepLoop has the leader of each shard propose a sweep now and then, so
// records past retention free their memory on every replica.
func (n *Node) sweepLoop() {
	defer n.sweepWG.Done()
	t := time.NewTicker(n.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-n.stopSweep:
			return
		case <-t.C:
		}
		for _, id := range n.shardIDs() {
			s := n.shards[id]
			if !s.group.IsLeader() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			v, err := s.group.Apply(ctx, fsm.EncodeCommand(&fsm.Command{
				Op: fsm.OpSweep, Now: n.now(), AbandonAfter: int64(n.cfg.AbandonAfter), MaxSweep: n.cfg.MaxSweep,
			}))
			cancel()
			if err != nil {
				n.log.Debug("sweep failed", "shard", id, "error", err)
				continue
			}
			if res, _ := v.(fsm.Result); res.Swept > 0 {
				n.log.Debug("swept expired records", "shard", id, "records", res.Swept)
			}
		}
	}
}

// balanceLoop hands the leadership of each shard this node leads to the
// shard's preferred voter when that is another node: it keeps leaders spread
// over the nodes (placement rotates preferred voters) and, under region
// survival, brings leadership home after the home region recovers. A shard
// is only handed over once its leadership has been stable for a while, and
// at most once per few intervals, so a preferred voter that is down or
// lagging costs a failed attempt now and then, never a flapping leader.
func (n *Node) balanceLoop() {
	defer n.sweepWG.Done()
	t := time.NewTicker(n.cfg.LeaderBalanceInterval)
	defer t.Stop()
	leadingSince := map[string]time.Time{}
	lastTry := map[string]time.Time{}
	for {
		select {
		case <-n.stopSweep:
			return
		case <-t.C:
		}
		now := time.Now()
		for _, id := range n.shardIDs() {
			s := n.shards[id]
			preferred := s.info.Voters[0]
			if !s.group.IsLeader() || preferred == n.cfg.NodeID {
				delete(leadingSince, id)
				continue
			}
			if _, ok := leadingSince[id]; !ok {
				leadingSince[id] = now
			}
			if now.Sub(leadingSince[id]) < 2*n.cfg.LeaderBalanceInterval || now.Sub(lastTry[id]) < 3*n.cfg.LeaderBalanceInterval {
				continue
			}
			lastTry[id] = now
			if err := s.group.TransferLeadership(preferred); err != nil {
				n.log.Debug("leadership hand-back failed", "shard", id, "to", preferred, "error", err)
				continue
			}
			delete(leadingSince, id)
			n.log.Info("handed leadership to the preferred voter", "shard", id, "to", preferred)
		}
	}
}

func (n *Node) shardIDs() []string {
	ids := make([]string, 0, len(n.shards))
	for id := range n.shards {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// fsmCollector exports each hosted shard's record figures.
type fsmCollector struct{ n *Node }

var (
	recordsDesc     = prometheus.NewDesc("idem_fsm_records", "Records held by the shard's state machine on this node, by state.", []string{"shard", "state"}, nil)
	recordBytesDesc = prometheus.NewDesc("idem_fsm_record_bytes", "Approximate memory the shard's records take on this node.", []string{"shard"}, nil)
)

func (c *fsmCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- recordsDesc
	ch <- recordBytesDesc
}

func (c *fsmCollector) Collect(ch chan<- prometheus.Metric) {
	for id, s := range c.n.shards {
		st := s.fsm.Stats()
		ch <- prometheus.MustNewConstMetric(recordsDesc, prometheus.GaugeValue, float64(st.InProgress), id, "in_progress")
		ch <- prometheus.MustNewConstMetric(recordsDesc, prometheus.GaugeValue, float64(st.Completed), id, "completed")
		ch <- prometheus.MustNewConstMetric(recordBytesDesc, prometheus.GaugeValue, float64(st.Bytes), id)
	}
}
