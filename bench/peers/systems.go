package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

func nopZap() *zap.Logger { return zap.NewNop() }

// system is one started system: its client and its server processes.
type system struct {
	name    string
	tgt     target
	procs   []*proc
	pprof   []string // idem only: the nodes' pprof addresses, when profiling
	http    []string // idem only: the nodes' HTTP addresses (/metrics)
	variant string   // idem only: the cluster it runs on (idem3, idem3pack, ...)
	detail  string   // how it runs, for the header
}

const startTimeout = 90 * time.Second

// lab starts and holds the systems of one run.
type lab struct {
	cfg      config
	dir      string
	ps       procs
	idemnode string
	logf     func(string, ...any)
	maxConns int
	body     []byte
	sink     *traceSink // the @trace systems' OTLP endpoint; nil until one starts
}

func (l *lab) sub(name string) (string, error) {
	d := filepath.Join(l.dir, name)
	return d, os.MkdirAll(d, 0o755)
}

// redisArgs are one Redis server's flags: AOF with appendfsync always,
// and, with primary set, a replica of it (which also writes its own AOF).
func redisArgs(port int, dir, primary string) []string {
	args := []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir, "--daemonize", "no", "--protected-mode", "yes",
		"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--maxclients", "1024"}
	if primary != "" {
		host, port, _ := strings.Cut(primary, ":")
		args = append(args, "--replicaof", host, port)
	}
	return args
}

func (l *lab) startRedis(ctx context.Context) (*system, error) {
	bin, err := lookBin("redis-server")
	if err != nil {
		return nil, err
	}
	dir, err := l.sub("redis")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	addr := loopback(ports[0])
	p, err := l.ps.start("redis", filepath.Join(l.dir, "redis.log"), nil, syscall.SIGTERM, bin, redisArgs(ports[0], dir, "")...)
	if err != nil {
		return nil, err
	}
	t := newRedis(addr, l.body, l.maxConns, l.cfg.RequestTimeout)
	err = poll(ctx, startTimeout, p, "redis", func(ctx context.Context) error { return t.rdb.Ping(ctx).Err() })
	if err != nil {
		t.close()
		return nil, err
	}
	ver, _ := t.rdb.Info(ctx, "server").Result()
	return &system{name: sysRedis, tgt: t, procs: []*proc{p}, detail: "Redis " + infoField(ver, "redis_version") + ", one process, appendonly yes, appendfsync always, two Lua scripts"}, nil
}

// redisReplicas is how many replicas the replicated Redis runs, and how
// many every WAIT asks for.
const redisReplicas = 2

// startRedisWait starts a Redis primary and two replicas, each with its
// own AOF (appendfsync always), and waits until both replicas are in sync.
// Every script the clients run is followed by WAIT 2 (docs/performance.md
// says what WAIT does and does not promise).
func (l *lab) startRedisWait(ctx context.Context) (*system, error) {
	bin, err := lookBin("redis-server")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(1 + redisReplicas)
	if err != nil {
		return nil, err
	}
	primary := loopback(ports[0])
	sys := &system{name: sysRedisWait}
	for i, port := range ports {
		name, of := "redis3-primary", ""
		if i > 0 {
			name, of = fmt.Sprintf("redis3-replica%d", i), primary
		}
		dir, err := l.sub(name)
		if err != nil {
			return nil, err
		}
		p, err := l.ps.start(name, filepath.Join(l.dir, name+".log"), nil, syscall.SIGTERM, bin, redisArgs(port, dir, of)...)
		if err != nil {
			return nil, err
		}
		sys.procs = append(sys.procs, p)
	}
	t := newRedisWait(primary, l.body, l.maxConns, l.cfg.RequestTimeout, redisReplicas)
	err = poll(ctx, startTimeout, sys.procs[0], "redis replicas", func(ctx context.Context) error {
		for _, p := range sys.procs {
			if err := p.alive(); err != nil {
				return err
			}
		}
		info, err := t.rdb.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if n := onlineReplicas(info); n < redisReplicas {
			return fmt.Errorf("%d of %d replicas online", n, redisReplicas)
		}
		if err := t.loadScripts(ctx); err != nil {
			return err
		}
		// One write through the path the clients take: scripts and WAIT.
		_, err = t.reserve(ctx, "ready-"+client.NewKey(), client.NewOwnerToken())
		return err
	})
	if err != nil {
		t.close()
		return nil, err
	}
	ver, _ := t.rdb.Info(ctx, "server").Result()
	sys.tgt = t
	sys.detail = fmt.Sprintf("Redis %s, primary + %d replicas, appendonly yes, appendfsync always on all three, two Lua scripts each followed by WAIT %d %d (ms) on the same connection",
		infoField(ver, "redis_version"), redisReplicas, redisReplicas, t.waitTimeout.Milliseconds())
	return sys, nil
}

// onlineReplicas counts the replicas INFO replication of a primary lists
// as online (slaveN:ip=...,state=online,...).
func onlineReplicas(info string) int {
	n := 0
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "slave") && strings.Contains(line, "state=online") {
			n++
		}
	}
	return n
}

func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return "?"
}

// pgCredential runs PostgreSQL as the postgres user when the benchmark runs
// as root (it refuses to run as root), and makes dir theirs.
func pgCredential(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL needs the postgres user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	// The work directory's parents must be traversable by that user.
	for d := filepath.Dir(dir); d != "/" && d != "."; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			os.Chmod(d, fi.Mode().Perm()|0o011)
		}
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// pgArgs are one PostgreSQL server's flags: fsync and synchronous_commit
// on, listening on 127.0.0.1:port with its socket in sockDir; extra adds
// settings (name=value).
func pgArgs(data string, port int, sockDir string, maxConns int, extra ...string) []string {
	args := []string{"-D", data, "-p", strconv.Itoa(port), "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + sockDir,
		"-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "full_page_writes=on",
		"-c", fmt.Sprintf("max_connections=%d", maxConns+20), "-c", "shared_buffers=256MB"}
	for _, e := range extra {
		args = append(args, "-c", e)
	}
	return args
}

// pgStandbyName is the synchronous standby's application_name (its
// cluster_name, which its WAL receiver reports to the primary).
const pgStandbyName = "standby1"

// pgStandbyArgs are the standby's extra settings; pg_basebackup -R wrote
// standby.signal and primary_conninfo into its data directory.
func pgStandbyArgs() []string {
	return []string{"cluster_name=" + pgStandbyName, "hot_standby=on"}
}

// pgSyncStandbySQL makes the standby synchronous: with synchronous_commit
// on, a commit returns once the standby has flushed its WAL to disk.
const pgSyncStandbySQL = `ALTER SYSTEM SET synchronous_standby_names = '` + pgStandbyName + `'`

// pgInit creates a PostgreSQL data directory in a new directory name.
func (l *lab) pgInit(ctx context.Context, name string) (dir, data string, cred *syscall.Credential, err error) {
	initdb, err := lookBin("initdb")
	if err != nil {
		return "", "", nil, err
	}
	if dir, err = l.sub(name); err != nil {
		return "", "", nil, err
	}
	if cred, err = pgCredential(dir); err != nil {
		return "", "", nil, err
	}
	data = filepath.Join(dir, "data")
	ictx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// initdb's pg_hba.conf trusts local and loopback connections,
	// replication ones included (pg_basebackup and the standby use them).
	cmd := exec.CommandContext(ictx, initdb, "-D", data, "-U", "bench", "--auth=trust", "-E", "UTF8", "--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	return dir, data, cred, nil
}

// pgStart starts a PostgreSQL server and waits until it answers and holds
// the schema (a standby answers read-only: it checks the table instead).
func (l *lab) pgStart(ctx context.Context, name string, cred *syscall.Credential, port int, args []string, standby bool) (*proc, string, error) {
	postgres, err := lookBin("postgres")
	if err != nil {
		return nil, "", err
	}
	// SIGINT is PostgreSQL's fast shutdown.
	p, err := l.ps.start(name, filepath.Join(l.dir, name+".log"), cred, syscall.SIGINT, postgres, args...)
	if err != nil {
		return nil, "", err
	}
	dsn := fmt.Sprintf("postgres://bench@127.0.0.1:%d/postgres?sslmode=disable", port)
	err = poll(ctx, startTimeout, p, name, func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		if standby {
			_, err = conn.Exec(ctx, "SELECT 1 FROM idem LIMIT 1")
		} else {
			_, err = conn.Exec(ctx, pgSchema)
		}
		return err
	})
	return p, dsn, err
}

func (l *lab) startPostgres(ctx context.Context) (*system, error) {
	dir, data, cred, err := l.pgInit(ctx, "postgres")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	p, dsn, err := l.pgStart(ctx, "postgres", cred, ports[0], pgArgs(data, ports[0], dir, l.maxConns), false)
	if err != nil {
		return nil, err
	}
	t, err := newPostgres(ctx, dsn, l.body, l.maxConns)
	if err != nil {
		return nil, err
	}
	var ver string
	t.pool.QueryRow(ctx, "SHOW server_version").Scan(&ver)
	return &system{name: sysPostgres, tgt: t, procs: []*proc{p}, detail: "PostgreSQL " + ver + ", one server, fsync on, synchronous_commit on, INSERT ON CONFLICT DO NOTHING + owner-checked UPDATE"}, nil
}

// startPostgresSync starts a PostgreSQL primary, copies it with
// pg_basebackup into a streaming standby, then makes that standby
// synchronous (synchronous_standby_names, synchronous_commit = on: a
// commit waits for the standby's WAL flush) and waits until the primary
// reports it as sync.
func (l *lab) startPostgresSync(ctx context.Context) (*system, error) {
	basebackup, err := lookBin("pg_basebackup")
	if err != nil {
		return nil, err
	}
	dir, data, cred, err := l.pgInit(ctx, "postgres2-primary")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	pp, dsn, err := l.pgStart(ctx, "postgres2-primary", cred, ports[0], pgArgs(data, ports[0], dir, l.maxConns), false)
	if err != nil {
		return nil, err
	}
	sdir, err := l.sub("postgres2-standby")
	if err != nil {
		return nil, err
	}
	if _, err := pgCredential(sdir); err != nil {
		return nil, err
	}
	sdata := filepath.Join(sdir, "data")
	bctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(bctx, basebackup, "-h", "127.0.0.1", "-p", strconv.Itoa(ports[0]), "-U", "bench", "-D", sdata, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pg_basebackup: %v\n%s", err, out)
	}
	sp, _, err := l.pgStart(ctx, "postgres2-standby", cred, ports[1], pgArgs(sdata, ports[1], sdir, l.maxConns, pgStandbyArgs()...), true)
	if err != nil {
		return nil, err
	}
	t, err := newPostgres(ctx, dsn, l.body, l.maxConns)
	if err != nil {
		return nil, err
	}
	if _, err = t.pool.Exec(ctx, pgSyncStandbySQL); err == nil {
		_, err = t.pool.Exec(ctx, "SELECT pg_reload_conf()")
	}
	if err != nil {
		t.close()
		return nil, fmt.Errorf("making the standby synchronous: %w", err)
	}
	err = poll(ctx, startTimeout, sp, "postgres2 synchronous standby", func(ctx context.Context) error {
		if err := pp.alive(); err != nil {
			return err
		}
		var state string
		err := t.pool.QueryRow(ctx, "SELECT coalesce(max(sync_state), '') FROM pg_stat_replication WHERE application_name = $1", pgStandbyName).Scan(&state)
		if err == nil && state != "sync" {
			err = fmt.Errorf("standby %s: sync_state %q, want sync", pgStandbyName, state)
		}
		return err
	})
	if err != nil {
		t.close()
		return nil, err
	}
	var ver string
	t.pool.QueryRow(ctx, "SHOW server_version").Scan(&ver)
	return &system{name: sysPostgresSyn, tgt: t, procs: []*proc{pp, sp}, detail: "PostgreSQL " + ver + ", primary + one synchronous standby (pg_basebackup, streaming; synchronous_standby_names, synchronous_commit on), fsync on both, the same statements"}, nil
}

func (l *lab) startEtcd(ctx context.Context) (*system, error) {
	bin, err := lookBin("etcd")
	if err != nil {
		return nil, err
	}
	dir, err := l.sub("etcd")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	var cluster, endpoints []string
	for i := range 3 {
		cluster = append(cluster, fmt.Sprintf("e%d=http://%s", i+1, loopback(ports[3+i])))
		endpoints = append(endpoints, loopback(ports[i]))
	}
	sys := &system{name: sysEtcd, detail: "etcd, three members, create-if-absent and compare-and-swap transactions"}
	for i := range 3 {
		name := fmt.Sprintf("e%d", i+1)
		cu, pu := "http://"+loopback(ports[i]), "http://"+loopback(ports[3+i])
		p, err := l.ps.start("etcd-"+name, filepath.Join(l.dir, "etcd-"+name+".log"), nil, syscall.SIGTERM, bin,
			"--name", name, "--data-dir", filepath.Join(dir, name),
			"--listen-client-urls", cu, "--advertise-client-urls", cu,
			"--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu,
			"--initial-cluster", strings.Join(cluster, ","), "--initial-cluster-token", "bench", "--initial-cluster-state", "new",
			"--logger", "zap", "--log-level", "warn")
		if err != nil {
			return nil, err
		}
		sys.procs = append(sys.procs, p)
	}
	t, err := newEtcd(endpoints, l.body, l.cfg.RequestTimeout)
	if err != nil {
		return nil, err
	}
	err = poll(ctx, startTimeout, sys.procs[0], "etcd", func(ctx context.Context) error {
		for _, p := range sys.procs {
			if err := p.alive(); err != nil {
				return err
			}
		}
		_, err := t.cli.Put(ctx, "ready", "1")
		return err
	})
	if err != nil {
		t.close()
		return nil, err
	}
	if st, err := t.cli.Status(ctx, endpoints[0]); err == nil {
		sys.detail = "etcd " + st.Version + ", three members, create-if-absent and compare-and-swap transactions"
	}
	sys.tgt = t
	return sys, nil
}

// idemNodes is a started idem cluster: its processes and addresses.
type idemNodes struct {
	procs       []*proc
	grpc, http  []string
	pprof       []string
	shards      int
	description string
}

// startIdem3 starts a three-node region in deploy/examples/three-node.yaml's
// shape (three replicas; four shards there, shards here) on free loopback
// ports, and waits until the nodes' leader balancing has spread the shards'
// leaders.
func (l *lab) startIdem3(ctx context.Context, name, bin string, shards int, extra ...string) (*idemNodes, error) {
	dir, err := l.sub(name)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(12)
	if err != nil {
		return nil, err
	}
	var topo strings.Builder
	fmt.Fprintf(&topo, "cluster: bench\nshards_per_region: %d\nreplicas: 3\nsurvival: zone\nregions:\n  - name: us-east\n    nodes:\n", shards)
	n := &idemNodes{shards: shards, description: fmt.Sprintf("idem, three-node region (%d %s x 3 replicas, fsync)", shards, plural(shards, "shard", "shards")) + variant(extra)}
	for i := range 3 {
		fmt.Fprintf(&topo, "      - id: us-east-%d\n        raft_addr: %s\n        grpc_addr: %s\n        http_addr: %s\n",
			i+1, loopback(ports[3*i]), loopback(ports[3*i+1]), loopback(ports[3*i+2]))
		n.grpc = append(n.grpc, loopback(ports[3*i+1]))
		n.http = append(n.http, loopback(ports[3*i+2]))
	}
	topoPath := filepath.Join(dir, "topology.yaml")
	if err := os.WriteFile(topoPath, []byte(topo.String()), 0o644); err != nil {
		return nil, err
	}
	for i := range 3 {
		id := fmt.Sprintf("us-east-%d", i+1)
		args := append([]string{"--config", topoPath, "--id", id, "--data-dir", filepath.Join(dir, id), "--log-level", "warn"}, extra...)
		if l.cfg.ProfileDir != "" {
			n.pprof = append(n.pprof, loopback(ports[9+i]))
			args = append(args, "--pprof-addr", n.pprof[i])
		}
		p, err := l.ps.start("idemnode "+name+" "+id, filepath.Join(l.dir, name+"-"+id+".log"), nil, syscall.SIGTERM, bin, args...)
		if err != nil {
			return nil, err
		}
		n.procs = append(n.procs, p)
	}
	return n, l.waitIdem(ctx, n)
}

// startIdem1 starts a one-node dev node.
func (l *lab) startIdem1(ctx context.Context, name, bin string, extra ...string) (*idemNodes, error) {
	dir, err := l.sub(name)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	n := &idemNodes{shards: 1, grpc: []string{loopback(ports[1])}, http: []string{loopback(ports[2])}, description: "idem, one-node dev node (1 replica, fsync)" + variant(extra)}
	args := append([]string{"--dev", "--data-dir", dir, "--raft-addr", loopback(ports[0]), "--grpc-addr", n.grpc[0], "--http-addr", n.http[0], "--log-level", "warn"}, extra...)
	if l.cfg.ProfileDir != "" {
		n.pprof = []string{loopback(ports[3])}
		args = append(args, "--pprof-addr", n.pprof[0])
	}
	p, err := l.ps.start("idemnode "+name, filepath.Join(l.dir, name+".log"), nil, syscall.SIGTERM, bin, args...)
	if err != nil {
		return nil, err
	}
	n.procs = []*proc{p}
	return n, l.waitIdem(ctx, n)
}

// waitIdem waits for /readyz of every node, then for cycles to succeed on
// keys of every shard (a few dozen fresh keys through every node).
func (l *lab) waitIdem(ctx context.Context, n *idemNodes) error {
	for i, addr := range n.http {
		err := poll(ctx, startTimeout, n.procs[i], "idemnode "+addr, func(ctx context.Context) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("/readyz: %s", resp.Status)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	g, err := newIdemGRPC(n.grpc, l.body, l.cfg.RequestTimeout)
	if err != nil {
		return err
	}
	defer g.close()
	err = poll(ctx, startTimeout, n.procs[0], "idem cycles", func(ctx context.Context) error {
		for range 32 {
			key, owner := client.NewKey(), client.NewOwnerToken()
			if won, err := g.reserve(ctx, key, owner); err != nil || !won {
				return fmt.Errorf("probe reserve: won=%v, %v", won, err)
			}
			if ok, err := g.complete(ctx, key, owner); err != nil || !ok {
				return fmt.Errorf("probe complete: ok=%v, %v", ok, err)
			}
		}
		return nil
	})
	if err != nil || len(n.http) < 2 {
		return err
	}
	// Wait for the leader balancing (a hand-back every few seconds) to
	// spread the leaders: a cell measured while they move, or with every
	// leader on one node, measures the placement, not the system.
	fair := (n.shards + len(n.http) - 1) / len(n.http)
	err = poll(ctx, balanceTimeout, n.procs[0], "idem leader balance", func(ctx context.Context) error {
		total, most := 0, 0
		for _, addr := range n.http {
			text, err := fetchMetrics(ctx, addr)
			if err != nil {
				return err
			}
			led, err := shardsLed(text)
			if err != nil {
				return err
			}
			total, most = total+led, max(most, led)
		}
		if total != n.shards || most > fair {
			return fmt.Errorf("%d of %d shards have a leader, at most %d on one node (want at most %d)", total, n.shards, most, fair)
		}
		return nil
	})
	if err != nil && ctx.Err() == nil && allAlive(n.procs) {
		// Measure anyway (a node may be held back from leading, e.g. by
		// its clock check), but say so: the cells show the placement too.
		l.logf("warning: %v; measuring anyway", err)
		return nil
	}
	return err
}

func allAlive(ps []*proc) bool {
	for _, p := range ps {
		if p.alive() != nil {
			return false
		}
	}
	return true
}

// balanceTimeout bounds the wait for spread leaders: the nodes hand a
// leadership back every 5 s at most, after holding it for two ticks.
const balanceTimeout = 60 * time.Second

// idemShape reads an idem variant's name, idem<nodes>[s<shards>][pack]: its
// node count and shards per region (4 unless given).
func idemShape(variant string) (nodes, shards int) {
	rest := strings.TrimSuffix(strings.TrimPrefix(variant, "idem"), "pack")
	n, s, ok := strings.Cut(rest, "s")
	nodes, _ = strconv.Atoi(n)
	shards = 4
	if ok {
		shards, _ = strconv.Atoi(s)
	}
	return nodes, shards
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func variant(extra []string) string {
	if len(extra) == 0 {
		return ""
	}
	return ", " + strings.Join(extra, " ")
}

// idemSystem is one client of a started idem cluster.
func (l *lab) idemSystem(name string, n *idemNodes, useGRPC bool) (*system, error) {
	base, twin := twinOf(name)
	variant, _, _ := strings.Cut(base, "-")
	variant += twin
	s := &system{name: name, procs: n.procs, pprof: n.pprof, http: n.http, variant: variant}
	if useGRPC {
		t, err := newIdemGRPC(n.grpc, l.body, l.cfg.RequestTimeout)
		if err != nil {
			return nil, err
		}
		s.tgt, s.detail = t, n.description+", Go client over gRPC to every node"
	} else {
		routing := ", JSON over HTTP/1.1 round-robin over the nodes"
		if l.cfg.JSONLeader {
			routing = ", JSON over HTTP/1.1: reserves round-robin over the nodes, completes to the Idem-Leader the reserve named"
		}
		s.tgt, s.detail = newIdemJSON(n.http, l.body, l.maxConns, l.cfg.RequestTimeout, l.cfg.JSONLeader), n.description+routing
	}
	return s, nil
}

// startAll starts every system of cfg; on error the caller stops what began.
func (l *lab) startAll(ctx context.Context) ([]*system, error) {
	var out []*system
	clusters := map[string]*idemNodes{} // idem clusters by variant, each started once
	for _, name := range l.cfg.Systems {
		l.logf("starting %s", name)
		var s *system
		var err error
		switch name {
		case sysRedis:
			s, err = l.startRedis(ctx)
		case sysRedisWait:
			s, err = l.startRedisWait(ctx)
		case sysPostgresSyn:
			s, err = l.startPostgresSync(ctx)
		case sysPostgres:
			s, err = l.startPostgres(ctx)
		case sysEtcd:
			s, err = l.startEtcd(ctx)
		case sysDragonboat:
			s, err = l.startDragonboat(ctx, name, 4)
		case sysDragonboatS1:
			s, err = l.startDragonboat(ctx, name, 1)
		default: // idem<nodes>[s<shards>][pack]-<api>[@b|@trace<R>]
			base, twin := twinOf(name)
			variant, api, _ := strings.Cut(base, "-")
			bin, cluster := l.idemnode, variant
			extra := packArgs(variant)
			switch {
			case twin == bSuffix:
				bin, cluster = l.cfg.IdemNodeB, variant+"-b"
			case strings.HasPrefix(twin, traceSuffix):
				cluster = variant + "-" + twin[1:]
				var sink string
				if sink, err = l.traceSink(); err != nil {
					break
				}
				extra = append(extra, "--otlp-endpoint", sink, "--trace-sample-ratio", strings.TrimPrefix(twin, traceSuffix))
			}
			if err != nil {
				break
			}
			n := clusters[cluster]
			if n == nil {
				if nodes, shards := idemShape(variant); nodes == 3 {
					n, err = l.startIdem3(ctx, cluster, bin, shards, extra...)
				} else {
					n, err = l.startIdem1(ctx, cluster, bin, extra...)
				}
				if err != nil {
					break
				}
				if twin == bSuffix {
					n.description += ", " + bin
				}
				clusters[cluster] = n
			}
			s, err = l.idemSystem(name, n, api == "grpc")
		}
		if err != nil {
			for _, s := range out {
				s.tgt.close()
			}
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out = append(out, s)
	}
	return out, nil
}
