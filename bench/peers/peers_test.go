package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func TestParseFlagsReplicatedPeers(t *testing.T) {
	cfg, err := parseFlags([]string{"--systems", "postgres,postgres2-sync,idem3-grpc,redis3-wait,etcd,idem3s1-grpc"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	// Canonical order: idem rows, the replicated peers, the single-copy ones.
	want := []string{sysIdem3GRPC, sysIdem3S1GRPC, sysRedisWait, sysPostgresSyn, sysEtcd, sysPostgres}
	if !slices.Equal(cfg.Systems, want) {
		t.Errorf("systems = %v, want %v", cfg.Systems, want)
	}
	// A region of another shard count goes after the idem rows, before the peers.
	cfg, err = parseFlags([]string{"--systems", "redis3-wait,idem3s3pack-grpc,idem1-grpc"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{sysIdem1GRPC, "idem3s3pack-grpc", sysRedisWait}; !slices.Equal(cfg.Systems, want) {
		t.Errorf("systems = %v, want %v", cfg.Systems, want)
	}
	for _, p := range append(slices.Clone(replicatedPeers), singleCopyPeers...) {
		if !slices.Contains(allSystems, p) || isIdem(p) {
			t.Errorf("peer %q is not a known non-idem system", p)
		}
	}
}

func TestRatioGroups(t *testing.T) {
	gs := ratioGroups(map[string]bool{sysIdem3GRPC: true, sysPostgres: true, sysEtcd: true, sysRedisWait: true})
	if len(gs) != 2 || gs[0].title != "replicated peers" || !slices.Equal(gs[0].peers, []string{sysRedisWait, sysEtcd}) ||
		gs[1].title != "single-copy peers" || !slices.Equal(gs[1].peers, []string{sysPostgres}) {
		t.Errorf("groups = %+v", gs)
	}
	if gs := ratioGroups(map[string]bool{sysIdem3GRPC: true, sysRedis: true}); len(gs) != 1 || gs[0].title != "single-copy peers" {
		t.Errorf("only single-copy peers ran: groups = %+v", gs)
	}
	if gs := ratioGroups(map[string]bool{sysIdem3GRPC: true}); len(gs) != 0 {
		t.Errorf("no peer ran: groups = %+v", gs)
	}
}

func TestReplicatedTableOrder(t *testing.T) {
	rs := []row{
		{System: sysIdem3GRPC, Clients: 64, Rounds: 1, Rate: 3000},
		{System: sysRedisWait, Clients: 64, Rounds: 1, Rate: 2000},
		{System: sysPostgresSyn, Clients: 64, Rounds: 1, Rate: 1500},
		{System: sysEtcd, Clients: 64, Rounds: 1, Rate: 1000},
		{System: sysRedis, Clients: 64, Rounds: 1, Rate: 6000},
	}
	var b bytes.Buffer
	writeTable(&b, rs, 1)
	out := b.String()
	rep := strings.Index(out, "| idem / replicated peers (median cycles/s) | clients | / redis3-wait | / postgres2-sync | / etcd |")
	single := strings.Index(out, "| idem / single-copy peers (median cycles/s) | clients | / redis |")
	if rep < 0 || single < 0 || single < rep {
		t.Fatalf("want the replicated ratio table, then the single-copy one:\n%s", out)
	}
	if !strings.Contains(out[rep:single], "| idem3-grpc | 64 | 1.50 | 2.00 | 3.00 |") || !strings.Contains(out[single:], "| idem3-grpc | 64 | 0.50 |") {
		t.Errorf("ratios:\n%s", out)
	}
}

func TestRedisArgs(t *testing.T) {
	primary := redisArgs(7000, "/d/p", "")
	if slices.Contains(primary, "--replicaof") {
		t.Errorf("primary args = %v", primary)
	}
	replica := strings.Join(redisArgs(7001, "/d/r", "127.0.0.1:7000"), " ")
	for _, want := range []string{"--port 7001", "--dir /d/r", "--appendonly yes", "--appendfsync always", "--replicaof 127.0.0.1 7000"} {
		if !strings.Contains(replica, want) {
			t.Errorf("replica args %q lack %q", replica, want)
		}
	}
}

func TestOnlineReplicas(t *testing.T) {
	info := "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n" +
		"slave0:ip=127.0.0.1,port=7001,state=online,offset=100,lag=0\r\n" +
		"slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=0\r\nmaster_failover_state:no-failover\r\n"
	if n := onlineReplicas(info); n != 1 {
		t.Errorf("onlineReplicas = %d, want 1", n)
	}
	if n := onlineReplicas("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"); n != 0 {
		t.Errorf("onlineReplicas of none = %d", n)
	}
}

func TestWaitAcked(t *testing.T) {
	if err := waitAcked(2, 2); err != nil {
		t.Errorf("both acknowledged: %v", err)
	}
	if err := waitAcked(1, 2); err == nil || !strings.Contains(err.Error(), "only 1 replicas") {
		t.Errorf("one of two acknowledged: %v", err)
	}
}

func TestPgArgs(t *testing.T) {
	primary := strings.Join(pgArgs("/d/data", 5432, "/d", 256), " ")
	for _, want := range []string{"-D /d/data", "-p 5432", "-c fsync=on", "-c synchronous_commit=on", "-c max_connections=276", "-c unix_socket_directories=/d"} {
		if !strings.Contains(primary, want) {
			t.Errorf("primary args %q lack %q", primary, want)
		}
	}
	standby := strings.Join(pgArgs("/s/data", 5433, "/s", 256, pgStandbyArgs()...), " ")
	if !strings.Contains(standby, "-c cluster_name="+pgStandbyName) || !strings.Contains(standby, "-c hot_standby=on") {
		t.Errorf("standby args %q", standby)
	}
	if !strings.Contains(pgSyncStandbySQL, "synchronous_standby_names = '"+pgStandbyName+"'") {
		t.Errorf("sync SQL %q does not name the standby", pgSyncStandbySQL)
	}
}

func TestPackagesForPeers(t *testing.T) {
	var names []string
	for _, p := range packages {
		names = append(names, p.pkg+":"+p.bin)
	}
	for _, want := range []string{"redis-server:redis-server", "postgresql:initdb", "postgresql:pg_basebackup", "etcd-server:etcd"} {
		if !slices.Contains(names, want) {
			t.Errorf("packages %v lack %s", names, want)
		}
	}
}
