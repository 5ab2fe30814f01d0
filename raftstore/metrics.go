package raftstore

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// hostMetrics are the per-shard Prometheus metrics of one Host. raft's own
// go-metrics are deliberately not used: they are process-global and would
// merge every group's figures into one series.
type hostMetrics struct {
	applyDuration    *prometheus.HistogramVec
	batchSize        *prometheus.HistogramVec
	packSize         *prometheus.HistogramVec
	logStoreBatch    *prometheus.HistogramVec
	logCommit        *prometheus.HistogramVec
	leaderChanges    *prometheus.CounterVec
	snapshots        *prometheus.CounterVec
	snapshotDuration *prometheus.HistogramVec
	restores         *prometheus.CounterVec
	rejectedConns    collectors // one counter per reject reason

	// The pebble log's (LogStorePebble): unlabelled, one per host.
	storageFailures      prometheus.Counter
	pebbleCommits        prometheus.Counter
	pebbleCommitDuration prometheus.Histogram
	pebbleWALSyncs       prometheus.Counter

	stateDesc, leaderDesc, termDesc, commitDesc, appliedDesc, lastLogDesc, contactDesc, packingDesc *prometheus.Desc

	host *Host
}

// groupMetrics are one group's children of the host's vectors.
type groupMetrics struct {
	applyDuration    prometheus.Observer
	batchSize        prometheus.Observer
	packSize         prometheus.Observer
	logStoreBatch    prometheus.Observer
	logCommit        prometheus.Observer
	leaderChanges    prometheus.Counter
	snapshots        prometheus.Counter
	snapshotDuration prometheus.Observer
	restores         prometheus.Counter
}

func newHostMetrics(h *Host, reg *prometheus.Registry) (*hostMetrics, error) {
	shard := []string{"shard"}
	m := &hostMetrics{
		host: h,
		applyDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_raft_apply_duration_seconds",
			Help:    "Time from proposing a command on the leader to its result being applied (commit latency).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 15), // 0.5 ms .. 8 s
		}, shard),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_raft_apply_batch_commands",
			Help:    "Commands applied to the state machine per ApplyBatch call.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11), // 1 .. 1024
		}, shard),
		packSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_raft_proposal_entry_commands",
			Help:    "Commands per Raft entry proposed through the proposal buffer (Config.Packer); absent without it.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11), // 1 .. 1024
		}, shard),
		logStoreBatch: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_raft_log_append_entries",
			Help:    "Log entries written per log store write of the group (its own fsync'd bolt transaction, or a synced pebble log batch).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}, shard),
		logCommit: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_raft_log_commit_duration_seconds",
			Help:    "Time per log store write of the group (until its bolt transaction or pebble log batch is committed and fsync'd), leader and follower alike.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16), // 0.1 ms .. 3.3 s
		}, shard),
		leaderChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_raft_leader_changes_total",
			Help: "Times this node saw the group's leader change to a new known leader.",
		}, shard),
		snapshots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_raft_snapshots_total",
			Help: "Snapshots persisted by this node.",
		}, shard),
		snapshotDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_raft_snapshot_duration_seconds",
			Help:    "Time to write a snapshot out.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10), // 1 ms .. 4 min
		}, shard),
		restores: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_raft_snapshot_restores_total",
			Help: "Snapshots restored into the state machine (startup or install from leader).",
		}, shard),
		stateDesc: prometheus.NewDesc("idem_raft_state",
			"Raft state of this replica: 0 follower, 1 candidate, 2 leader, 3 shutdown.", shard, nil),
		leaderDesc: prometheus.NewDesc("idem_raft_leader",
			"1 if this replica is the group's leader, else 0.", shard, nil),
		termDesc: prometheus.NewDesc("idem_raft_term",
			"Current Raft term.", shard, nil),
		commitDesc: prometheus.NewDesc("idem_raft_commit_index",
			"Highest log index known to be committed.", shard, nil),
		appliedDesc: prometheus.NewDesc("idem_raft_applied_index",
			"Index of the last command or configuration entry applied to the state machine.", shard, nil),
		lastLogDesc: prometheus.NewDesc("idem_raft_last_log_index",
			"Last index in stable storage (log or snapshot).", shard, nil),
		contactDesc: prometheus.NewDesc("idem_raft_last_contact_seconds",
			"Seconds since this follower last heard from its leader (0 on the leader, -1 never).", shard, nil),
		packingDesc: prometheus.NewDesc("idem_raft_proposal_packing",
			"1 once the group packs commands queued behind in-flight entries into one Raft entry when this replica leads (Config.Packer; gated: from Group.EnablePacking on), else 0.", shard, nil),
	}
	m.pebbleCommits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idem_raft_pebble_log_commits_total",
		Help: "Synced batches committed by the node's pebble log (one per group write: StoreLogs, DeleteRange, stable-store set).",
	})
	m.pebbleCommitDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "idem_raft_pebble_log_commit_duration_seconds",
		Help:    "Time per pebble log commit, until its batch is in the WAL and the WAL fdatasync'd.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	})
	m.pebbleWALSyncs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idem_raft_pebble_log_wal_syncs_total",
		Help: "WAL fdatasyncs of the node's pebble log; concurrent commits share one, so commits/syncs is the merge factor.",
	})
	m.storageFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idem_raft_storage_failures_total",
		Help: "Failed writes or fsyncs of the node's Raft log; after one the log takes no more writes (fail-stop) until the node restarts.",
	})
	for reason, name := range rejectReasonNames {
		m.rejectedConns = append(m.rejectedConns, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "idem_raft_rejected_connections_total",
			Help:        "Inbound Raft connections closed before routing: reason header (bad header, unknown shard), tls (failed handshake, no node certificate of the CA), limit (over the connection cap), seat (the certificate's node holds no seat in the shard's current configuration).",
			ConstLabels: prometheus.Labels{"reason": name},
		}, func() float64 { return float64(h.mux.rejected[reason].Load()) }))
	}
	for reason, name := range dropReasonNames {
		m.rejectedConns = append(m.rejectedConns, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "idem_raft_dropped_messages_total",
			Help:        "Inbound Raft messages dropped, their connection closed: reason source (the message claims another node than the connection's certificate), seat (the node lost its seat in the shard), decode (not a Raft request).",
			ConstLabels: prometheus.Labels{"reason": name},
		}, func() float64 { return float64(h.mux.dropped[reason].Load()) }))
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.applyDuration, m.batchSize, m.packSize, m.logStoreBatch, m.logCommit,
		m.leaderChanges, m.snapshots, m.snapshotDuration, m.restores, m.rejectedConns,
		m.storageFailures,
		m.pebbleCommits, m.pebbleCommitDuration, m.pebbleWALSyncs, m} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		m.unregister(reg)
		return nil, fmt.Errorf("raftstore: registering metrics (one Host per registry): %w", err)
	}
	return m, nil
}

func (m *hostMetrics) unregister(reg *prometheus.Registry) {
	if reg == nil {
		return
	}
	for _, c := range []prometheus.Collector{m.applyDuration, m.batchSize, m.packSize, m.logStoreBatch, m.logCommit,
		m.leaderChanges, m.snapshots, m.snapshotDuration, m.restores, m.rejectedConns,
		m.storageFailures,
		m.pebbleCommits, m.pebbleCommitDuration, m.pebbleWALSyncs, m} {
		reg.Unregister(c)
	}
}

func (m *hostMetrics) forGroup(id string) *groupMetrics {
	return &groupMetrics{
		applyDuration:    m.applyDuration.WithLabelValues(id),
		batchSize:        m.batchSize.WithLabelValues(id),
		packSize:         m.packSize.WithLabelValues(id),
		logStoreBatch:    m.logStoreBatch.WithLabelValues(id),
		logCommit:        m.logCommit.WithLabelValues(id),
		leaderChanges:    m.leaderChanges.WithLabelValues(id),
		snapshots:        m.snapshots.WithLabelValues(id),
		snapshotDuration: m.snapshotDuration.WithLabelValues(id),
		restores:         m.restores.WithLabelValues(id),
	}
}

// forgetGroup drops the series of a group that failed to start.
func (m *hostMetrics) forgetGroup(id string) {
	for _, v := range []interface{ DeleteLabelValues(...string) bool }{m.applyDuration, m.batchSize, m.packSize,
		m.logStoreBatch, m.logCommit, m.leaderChanges, m.snapshots, m.snapshotDuration, m.restores} {
		v.DeleteLabelValues(id)
	}
}

// Describe and Collect export the gauges, read from raft at scrape time
// rather than polled.
func (m *hostMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.stateDesc, m.leaderDesc, m.termDesc, m.commitDesc,
		m.appliedDesc, m.lastLogDesc, m.contactDesc, m.packingDesc} {
		ch <- d
	}
}

func (m *hostMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, g := range m.host.Groups() {
		s := g.Stats()
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, g.id)
		}
		state := g.raft.State()
		gauge(m.stateDesc, float64(state))
		leader := 0.0
		if state == raft.Leader {
			leader = 1
		}
		gauge(m.leaderDesc, leader)
		gauge(m.termDesc, float64(s.Term))
		gauge(m.commitDesc, float64(s.CommitIndex))
		gauge(m.appliedDesc, float64(s.AppliedIndex))
		gauge(m.lastLogDesc, float64(s.LastLogIndex))
		contact := -1.0
		switch {
		case state == raft.Leader:
			contact = 0
		case !s.LastContact.IsZero():
			contact = time.Since(s.LastContact).Seconds()
		}
		gauge(m.contactDesc, contact)
		packing := 0.0
		if s.Packing {
			packing = 1
		}
		gauge(m.packingDesc, packing)
	}
}

// countingLogStore wraps the group's log store to count its log writes:
// with its own bolt file each StoreLogs is one fsync'd transaction, so
// entries per call is "commands per fsync"; in the pebble log several
// groups' writes may share one WAL fdatasync (see PebbleLogStats).
type countingLogStore struct {
	raft.LogStore
	metrics     *groupMetrics
	commits     atomic.Uint64
	entries     atomic.Uint64
	bytes       atomic.Uint64 // the entries' Data
	commitNanos atomic.Int64
}

func (s *countingLogStore) StoreLog(l *raft.Log) error {
	return s.StoreLogs([]*raft.Log{l})
}

func (s *countingLogStore) StoreLogs(logs []*raft.Log) error {
	start := time.Now()
	if err := s.LogStore.StoreLogs(logs); err != nil {
		return err
	}
	took := time.Since(start)
	s.commits.Add(1)
	s.entries.Add(uint64(len(logs)))
	var n uint64
	for _, l := range logs {
		n += uint64(len(l.Data))
	}
	s.bytes.Add(n)
	s.commitNanos.Add(int64(took))
	s.metrics.logStoreBatch.Observe(float64(len(logs)))
	s.metrics.logCommit.Observe(took.Seconds())
	return nil
}

// collectors registers as one Collector.
type collectors []prometheus.Collector

func (cs collectors) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range cs {
		c.Describe(ch)
	}
}

func (cs collectors) Collect(ch chan<- prometheus.Metric) {
	for _, c := range cs {
		c.Collect(ch)
	}
}
