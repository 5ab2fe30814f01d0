package node

import "github.com/prometheus/client_golang/prometheus"

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
