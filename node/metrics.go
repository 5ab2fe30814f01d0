package node

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem/fsm"
)

// fsmCollector exports each hosted shard's record figures, the age of its
// oldest in-progress key and its waiting reserves.
type fsmCollector struct{ n *Node }

var (
	recordsDesc     = prometheus.NewDesc("idem_fsm_records", "Records held by the shard's state machine on this node, by state.", []string{"shard", "state"}, nil)
	recordBytesDesc = prometheus.NewDesc("idem_fsm_record_bytes", "Approximate memory the shard's records take on this node.", []string{"shard"}, nil)
	oldestDesc      = prometheus.NewDesc("idem_keys_oldest_in_progress_age_seconds",
		"Age of the shard's oldest IN_PROGRESS key (since its current owner reserved it; 0 when none), as this replica sees it. A key stuck for long is a candidate for idemctl keys force-release.",
		[]string{"shard"}, nil)
	waitingDesc = prometheus.NewDesc("idem_keys_waiting_reserves", "Reserves (wait_ms) waiting on this node for an in-progress key of the shard.", []string{"shard"}, nil)
	packedDesc  = prometheus.NewDesc("idem_fsm_packed_token_mode",
		"1 once a packed Raft entry (many commands in one entry) was applied to the shard's state: its fencing tokens are above 2^62 and a release without packing can no longer serve it (no downgrade).",
		[]string{"shard"}, nil)
)

func (c *fsmCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- recordsDesc
	ch <- recordBytesDesc
	ch <- oldestDesc
	ch <- waitingDesc
	ch <- packedDesc
}

func (c *fsmCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.n.now()
	for id, s := range c.n.shardMap() {
		st := s.fsm.Stats()
		ch <- prometheus.MustNewConstMetric(recordsDesc, prometheus.GaugeValue, float64(st.InProgress), id, "in_progress")
		ch <- prometheus.MustNewConstMetric(recordsDesc, prometheus.GaugeValue, float64(st.Completed), id, "completed")
		ch <- prometheus.MustNewConstMetric(recordBytesDesc, prometheus.GaugeValue, float64(st.Bytes), id)
		age := 0.0
		if created, ok, err := s.fsm.OldestInProgress(); err != nil {
			c.n.log.Warn("oldest in-progress key: scan failed", "shard", id, "error", err)
		} else if ok && created < now {
			age = time.Duration(now - created).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, age, id)
		ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(s.waiters.Stats().Waiting), id)
		packed := 0.0
		if s.fsm.PackedTokens() {
			packed = 1
		}
		ch <- prometheus.MustNewConstMetric(packedDesc, prometheus.GaugeValue, packed, id)
	}
}

// keyMetrics count the decisions about keys this node made as the leader
// that proposed them (each decision once, whichever node a client asked).
type keyMetrics struct {
	reclaimed, forceReleased, deleted *prometheus.CounterVec
}

func newKeyMetrics(reg prometheus.Registerer) (*keyMetrics, error) {
	m := &keyMetrics{
		reclaimed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_keys_reclaimed_total",
			Help: "Reserves answered RECLAIMED (an earlier owner's lease ran out, or an operator force-released the key), counted by the leader that proposed them.",
		}, []string{"shard"}),
		forceReleased: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_keys_force_released_total",
			Help: "Keys an operator force-released, counted by the leader that proposed it.",
		}, []string{"shard"}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_keys_deleted_total",
			Help: "Records an operator deleted, counted by the leader that proposed it.",
		}, []string{"shard"}),
	}
	for _, c := range []prometheus.Collector{m.reclaimed, m.forceReleased, m.deleted} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observe counts the decision res of cmd on shard.
func (m *keyMetrics) observe(shard string, cmd *fsm.Command, res fsm.Result) {
	switch {
	case cmd.Op == fsm.OpReserve && res.Outcome == fsm.OutcomeReclaimed:
		m.reclaimed.WithLabelValues(shard).Inc()
	case cmd.Op == fsm.OpForceRelease && res.Outcome == fsm.OutcomeOK:
		m.forceReleased.WithLabelValues(shard).Inc()
	case cmd.Op == fsm.OpDelete && res.Outcome == fsm.OutcomeOK:
		m.deleted.WithLabelValues(shard).Inc()
	}
}
