package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/console"
	"github.com/idem-dev/idem/forward"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/handoff"
	"github.com/idem-dev/idem/internal/datadir"
	"github.com/idem-dev/idem/internal/serving"
	"github.com/idem-dev/idem/internal/tracing"
	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/statedb"
	"github.com/idem-dev/idem/topology"
)

// New validates cfg and builds the node: its ring, forwarder and API. It
// touches neither the disk nor the network and starts no goroutine; Start
// does, and Run does both and serves.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	self, _ := cfg.Topology.NodeByID(cfg.NodeID)
	rings := &ringCache{}
	v, err := newView(rings, cfg.Topology, nil, nil, nil, false)
	if err != nil {
		return nil, err
	}
	n := &Node{
		cfg:         cfg,
		log:         cfg.Logger.With("node", cfg.NodeID, "region", self.Region),
		self:        self,
		layout:      v.ring.LayoutFingerprint(),
		rings:       rings,
		meta:        newMetaSM(),
		topoMetrics: newTopoMetrics(),
		tracer:      tracing.Tracer(cfg.TracerProvider),
		closed:      make(chan struct{}),
		failed:      make(chan struct{}),
	}
	n.dropFaults.Store(int64(cfg.Testing.FailDrops))
	n.driver = handoff.NewDriver(nodeCluster{n}, func() uint64 { return rand.Uint64() | 1 }, importBytes)
	n.viewp.Store(v)
	n.shardsp.Store(&map[string]*shard{})
	// Forwarded replays carry whole stored responses: allow messages as
	// large as the API accepts, not gRPC's 4 MiB default.
	msgBytes := server.Config{MaxResponseBytes: cfg.MaxResponseBytes}.GRPCMaxMessageBytes()
	if n.fwd, err = forward.NewForwarder(forward.ForwarderConfig{
		Topology: cfg.Topology, Self: cfg.NodeID, AttemptTimeout: cfg.ForwardAttemptTimeout,
		Logger: n.log, Registry: cfg.Registry, TracerProvider: cfg.TracerProvider,
		DialOptions: append(append(forward.DefaultDialOptions(), cfg.Security.DialOptions()...), grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(msgBytes), grpc.MaxCallSendMsgSize(msgBytes))),
	}); err != nil {
		return nil, err
	}
	n.clocks = newClocks(n)
	n.waitRefusals = prometheus.NewCounter(prometheus.CounterOpts{Name: "idem_node_wait_refusals_total",
		Help: "Reserves with a wait answered at once because --max-waiters reserves were already waiting on this node."})
	n.repeats = prometheus.NewCounter(prometheus.CounterOpts{Name: "idem_node_repeated_completes_total",
		Help: "Completes identical to the key's stored completion answered from the state after a read barrier, without a Raft entry."})
	n.unsafeGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_node_unsafe_settings",
		Help: "1 for each setting in force that turns a safety check off (insecure: --insecure; clock_check_off: --max-clock-offset 0; fault_injection: a --testing-* flag), 0 for each that is not."}, []string{"setting"})
	n.clusterVersionGauge = prometheus.NewGauge(prometheus.GaugeOpts{Name: "idem_cluster_version",
		Help: "The cluster version as this node's replica of the meta group holds it: 1 baseline, 2 packed entries, 3 partition handoff, 4 fenced handoff (docs/operations.md, \"Upgrades and the cluster version\")."})
	if n.console, err = n.newConsole(&n.httpHandler); err != nil {
		n.fwd.Close()
		return nil, err
	}
	if n.api, err = server.New(server.Config{
		Backend: n, Logger: n.log, Registry: cfg.Registry, MaxResponseBytes: cfg.MaxResponseBytes, MaxInflightBytes: cfg.MaxInflightBytes, Version: cfg.Version,
		Routing: n.routing, UnsafeSettings: cfg.UnsafeSettings, Topology: n.topologyHTTP(), LeaderAddr: n.httpAddrOf,
		ExtraRoutes:    map[string]http.Handler{"/ui/": n.console.Handler()},
		TracerProvider: cfg.TracerProvider, TraceKeys: cfg.TraceKeys,
	}); err != nil {
		n.fwd.Close()
		return nil, err
	}
	return n, nil
}

// Start is StartContext without a deadline.
func (n *Node) Start() error { return n.StartContext(context.Background()) }

// StartContext opens the data dir (refusing one that belongs to another
// cluster, node or ring), starts the Raft groups of every shard this node
// hosts (bootstrapping them on the first start of a new cluster, once every
// other node has said it holds no state: awaitFirstStart, which ctx ends;
// on an empty data dir with a later file, once a node hosting the meta
// group answered without counting this one as a voter: awaitJoin),
// binds the API listeners and starts the background loops. Serve then
// answers. On error everything it opened is closed again.
func (n *Node) StartContext(ctx context.Context) (err error) {
	if !n.started.CompareAndSwap(false, true) {
		return errors.New("node: already started")
	}
	defer func() {
		if err != nil {
			n.closeAll(context.Background())
		}
	}()
	cfg := n.cfg
	// Before the identity file makes the dir look used: a first start
	// interrupted while it waits is a first start again.
	if dataDirEmpty(cfg.DataDir) {
		wait := n.awaitJoin
		if n.bootstraps(true) {
			wait = n.awaitFirstStart
		}
		if err := wait(ctx); err != nil {
			return err
		}
	}
	// The identity pins the cluster, the node and the key layout (the ring
	// parameters that place keys in partitions), not the shard set or the
	// voters: topology changes keep it. Identities of earlier releases
	// (which pinned the shard set, or the voters too) are rewritten once.
	ring := n.view().ring
	id, existed, err := datadir.Check(cfg.DataDir, datadir.Identity{Cluster: cfg.Topology.Cluster, NodeID: cfg.NodeID, RingFingerprint: n.layout},
		ring.Fingerprint(), ring.ShardLayoutFingerprint())
	if err != nil {
		return err
	}
	n.identity = id
	if id.Rejoining {
		n.log.Warn("data dir was emptied by idemctl replace-node: joining every shard as a fresh replica", "data_dir", cfg.DataDir)
	}
	if existed && !id.Rejoining {
		if err := n.checkStateKept(); err != nil {
			return err
		}
	}
	if existed {
		n.markSeatsOfOlderRelease()
	}
	if err := checkClusterVersion(cfg.DataDir, 0); err != nil {
		return err
	}
	n.warnFaultInjection()
	n.warnUnsafeSettings()
	rcfg := cfg.Raft
	switch cfg.PackCommands {
	case PackOff:
		rcfg.Packer, rcfg.PackingGated = nil, false
	case PackOn:
		rcfg.Packer, rcfg.PackingGated = fsm.Packer{}, false
	default: // PackAuto: gatePacking switches each group on with the cluster version
		rcfg.Packer, rcfg.PackingGated = fsm.Packer{}, true
	}
	rcfg.OnStorageFailure = n.storageFailed
	rcfg.ExtraSeats = n.seatedInView
	// A node certificate authorizes a node of the committed topology
	// only (peerauth.go has the control RPCs' finer checks).
	cfg.Security.Authorizer().SetNodeMembership(func(id string) bool {
		_, ok := n.view().node(id)
		return ok
	})
	rcfg.NodeID = cfg.NodeID
	rcfg.RaftListenAddr = cmp.Or(cfg.RaftAddr, n.self.RaftAddr)
	rcfg.RaftAdvertiseAddr = n.self.RaftAddr
	rcfg.DataDir = filepath.Join(cfg.DataDir, "raft")
	if n := cfg.Testing.FailLogCommitsAfter; n > 0 {
		rcfg.TestingFailCommitsAfter = n
	}
	rcfg.Logger = n.log
	rcfg.Registry = cfg.Registry
	if rcfg.TracerProvider == nil {
		rcfg.TracerProvider = cfg.TracerProvider
	}
	if rcfg.TLS == nil {
		rcfg.TLS = cfg.Security.RaftTLS()
	}
	maxState := cfg.MaxStateBytes
	if maxState == 0 {
		if maxState, err = statedb.DefaultMaxStateBytes(cfg.DataDir); err != nil {
			return err
		}
	}
	stateDir := filepath.Join(cfg.DataDir, "state")
	if n.state, err = statedb.Open(statedb.Config{Dir: stateDir, MaxStateBytes: maxState, CacheBytes: cfg.StateCacheBytes, Registry: cfg.Registry,
		PartitionCount: ring.PartitionCount(), TestingRestoreFault: cfg.Testing.RestoreFault}); err != nil {
		return err
	}
	n.log.Info("state engine open", "dir", stateDir, "max_state_bytes", maxState, "state_bytes", n.state.StateBytes())
	if n.host, err = raftstore.NewHost(rcfg); err != nil {
		return n.startError("", err)
	}
	if err := n.openMeta(!existed); err != nil {
		return err
	}
	// The meta state restored from its snapshot may hold a cluster version
	// the data dir's record missed (a crash before it was written).
	if mv, _ := n.meta.read(); mv.clusterVersion > ReleaseVersion {
		return checkClusterVersion(cfg.DataDir, mv.clusterVersion)
	}
	// The node's seats: those its own file gives it, and those of the
	// cluster's active topology (and running change) when the meta group
	// restored one; more open as the cluster's shape changes
	// (refreshView).
	v := n.view()
	if mv, _ := n.meta.read(); mv.active != nil {
		if nv, err := newView(n.rings, mv.active, mv.target, mv.dead, mv.moved, true); err == nil && nv.ring.LayoutFingerprint() == n.layout {
			v = nv
			n.viewp.Store(v)
		}
	}
	fileSeats := map[string]bool{}
	for _, s := range cfg.Topology.ShardsOnNode(cfg.NodeID) {
		fileSeats[s.ID] = true
	}
	seats := v.seats(cfg.NodeID)
	for _, info := range v.placer.Shards() {
		if !seats[info.ID] && !(fileSeats[info.ID] && n.hasSeatMarker(info.ID)) {
			continue
		}
		if !seats[info.ID] && v.fromMeta {
			continue // a seat this node gave up in a change it missed
		}
		if err := n.openShard(v, v.forwardShard(info), n.seatStart(v, info, n.bootstraps(!existed))); err != nil {
			return err
		}
	}
	// Registered once the shards are in place: the collector reads them.
	if err := cfg.Registry.Register(&fsmCollector{n: n}); err != nil {
		return fmt.Errorf("node: register metrics: %w", err)
	}
	if n.keyMetrics, err = newKeyMetrics(cfg.Registry); err != nil {
		return fmt.Errorf("node: register metrics: %w", err)
	}
	if err := n.clocks.register(cfg.Registry); err != nil {
		return err
	}
	if err := cfg.Registry.Register(n.clusterVersionGauge); err != nil {
		return fmt.Errorf("node: register metrics: %w", err)
	}
	if err := cfg.Registry.Register(n.unsafeGauge); err != nil {
		return fmt.Errorf("node: register metrics: %w", err)
	}
	if err := cfg.Registry.Register(n.repeats); err != nil {
		return fmt.Errorf("node: register metrics: %w", err)
	}
	if err := cfg.Registry.Register(n.waitRefusals); err != nil {
		return fmt.Errorf("node: register metrics: %w", err)
	}
	if err := n.topoMetrics.register(cfg.Registry); err != nil {
		return fmt.Errorf("node: register metrics: %w", err)
	}
	disk, err := newDiskSpace(cfg.DataDir, cfg.DiskReserveBytes, cfg.DiskFree)
	if err != nil {
		return err
	}
	n.admit = newAdmission()
	n.disk = disk
	n.admit.addCheck("disk_reserve", disk.check)
	// A follower with a full disk would fail stop on the next write it is
	// sent: as etcd's NOSPACE alarm, any voter low on disk stops the
	// shard's data-adding writes, and they resume when it has room.
	n.admit.addCheck("peer_disk_reserve", func(s *shard, _ *fsm.Command) (string, time.Duration) {
		if low := n.clocks.peersLowOnDisk(n.voters(s.info.ID, true)); len(low) > 0 {
			return fmt.Sprintf("voter(s) %s of shard %s have their data dir's disk below its reserve", strings.Join(low, ", "), s.info.ID), admissionRetryAfter
		}
		return "", 0
	})
	n.admit.addCheck("max_state_bytes", func(s *shard, cmd *fsm.Command) (string, time.Duration) {
		if err := s.sm.Admit(cmd); err != nil {
			return err.Error(), n.cfg.SweepInterval // sweeps free state
		}
		return "", 0
	})
	for _, c := range []prometheus.Collector{n.admit.refused, disk.freeGauge} {
		if err := cfg.Registry.Register(c); err != nil {
			return fmt.Errorf("node: register metrics: %w", err)
		}
	}
	n.log.Info("admission control", "disk_reserve_bytes", disk.reserve)
	n.log.Info("command packing", "raft_pack_commands", cfg.PackCommands.String(), "release_version", ReleaseVersion, "advertised_version", n.advertisedVersion())

	if n.httpLn, err = cfg.Security.ListenAPI(cmp.Or(cfg.HTTPAddr, n.self.HTTPAddr)); err != nil {
		return fmt.Errorf("node: http listener: %w", err)
	}
	n.httpHandler = console.Sessions(cfg.Security.HTTPHandler(n.api.HTTPHandler()))
	n.servers = append(n.servers, serving.HTTPWithTimeouts("node: http", n.httpLn, n.httpHandler, n.log, cfg.Security.HTTPTimeouts()))
	if n.grpcLn, err = cfg.Security.ListenGRPC(cmp.Or(cfg.GRPCAddr, n.self.GRPCAddr)); err != nil {
		return fmt.Errorf("node: grpc listener: %w", err)
	}
	grpcSrv := n.api.NewGRPCServer(cfg.Security.GRPCServerOptions()...)
	idemv1.RegisterAdminServer(grpcSrv, &admin{KeysAdmin: n.api.KeysAdmin(), n: n})
	idemv1.RegisterTopologyServer(grpcSrv, &topologyService{n: n})
	n.servers = append(n.servers, serving.GRPC("node: grpc", n.grpcLn, grpcSrv))
	n.startLoops()
	return nil
}

// HTTPAddr and GRPCAddr are the bound listener addresses (after Start).
func (n *Node) HTTPAddr() string { return n.httpLn.Addr().String() }
func (n *Node) GRPCAddr() string { return n.grpcLn.Addr().String() }

// Run starts the node and serves until ctx ends, then drains (see Serve).
func (n *Node) Run(ctx context.Context) error {
	if err := n.StartContext(ctx); err != nil {
		if errors.Is(err, errStoppedBeforeFirstStart) {
			return nil // stopped while waiting: nothing to drain
		}
		return err
	}
	return n.Serve(ctx)
}

// Serve answers API requests on the listeners Start bound until ctx ends,
// then drains: it stops taking requests, lets in-flight ones finish, hands
// over the leadership of the shards it leads, and closes the Raft groups.
// It returns nil after a clean drain.
func (n *Node) Serve(ctx context.Context) error {
	if n.servers == nil || !n.served.CompareAndSwap(false, true) {
		return ErrNotStarted
	}
	n.log.Info("idemnode serving", "cluster", n.cfg.Topology.Cluster, "topology_version", n.view().version(), "http", n.HTTPAddr(), "grpc", n.GRPCAddr(),
		"raft", cmp.Or(n.cfg.RaftAddr, n.self.RaftAddr), "tls", n.cfg.Security.Secure(), "auth_file", n.cfg.Security.Authorizer().Enabled(), "data_dir", n.cfg.DataDir, "shards", len(n.shardMap()), "version", n.cfg.Version, "stop", "SIGTERM or Ctrl-C: drains, then exits 0")
	// Close, from another goroutine, ends serving as ctx does.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-n.closed:
			cancel()
		case <-n.failed:
			cancel()
		case <-ctx.Done():
		}
	}()
	serveErr := serving.Serve(ctx, n.log, n.servers)
	if p := n.failure.Load(); p != nil {
		serveErr = errors.Join(serveErr, fmt.Errorf("node: stopped after a storage failure: %w", *p))
	}
	drainCtx, cancel := context.WithTimeout(context.Background(), serving.DrainTimeout)
	defer cancel()
	n.log.Info("draining")
	return errors.Join(serveErr, n.closeAll(drainCtx))
}

// Close stops the node at once, as Serve does on its way out. It is safe to
// call more than once, and after a failed Start.
func (n *Node) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), serving.DrainTimeout)
	defer cancel()
	return n.closeAll(ctx)
}

// closeAll stops the loops, drains the API servers (or releases listeners
// that never served), shuts the Raft groups down and closes the forwarder,
// once.
func (n *Node) closeAll(ctx context.Context) error {
	n.closeOnce.Do(func() {
		var errs []error
		n.stopLoops()
		n.console.Close()
		if n.served.Load() {
			errs = append(errs, serving.Drain(ctx, n.servers))
		} else {
			serving.Close(n.servers)
		}
		if n.host != nil {
			errs = append(errs, n.host.Shutdown(ctx))
		}
		if n.state != nil { // after every Raft group has stopped applying
			for _, s := range n.hosted() {
				logShardState(n.log, "shard state closed", s.id, s.sm.Store(), false)
			}
			errs = append(errs, n.state.Close())
		}
		n.fwd.Close()
		if n.started.Load() {
			n.log.Info("stopped")
		}
		n.closeErr = errors.Join(errs...)
		close(n.closed)
	})
	return n.closeErr
}

// spansRegions reports whether the shard's voters live in more than one
// region (region survival): its Raft timeouts must allow for WAN round trips.
func spansRegions(t *topology.Topology, s topology.Shard) bool {
	for _, v := range s.Voters {
		if r, _ := t.RegionOf(v); r != s.HomeRegion {
			return true
		}
	}
	return false
}

// logShardState logs what a shard's state engine holds: the Raft index it
// covers and its records. At open it also says what was dropped of other
// generations, the leftovers of a snapshot install a crash interrupted.
func logShardState(log *slog.Logger, msg, id string, st *statedb.ShardStore, open bool) {
	m := st.Meta()
	attrs := []any{"shard", id, "applied_index", st.Applied(), "records", m.InProgress + m.Completed, "record_bytes", m.Bytes}
	if keys, bytes := st.DroppedAtOpen(); open {
		attrs = append(attrs, "stale_generation_keys_dropped", keys, "stale_generation_bytes_dropped", bytes)
	}
	log.Info(msg, attrs...)
}
