package console

import (
	"encoding/json"
	"math"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// durationMetric is the server's request latency histogram.
const durationMetric = "idem_api_request_duration_seconds"

// sample is one reading of the registry's counters.
type sample struct {
	at time.Time
	// byNamespace is namespace -> outcome -> requests so far.
	byNamespace map[string]map[string]float64
	// buckets are the latency histogram's cumulative counts by upper bound,
	// summed over APIs and endpoints; count is the total.
	buckets map[float64]float64
	count   float64
}

// sampler keeps the last n samples of the registry, one every `every`,
// from its first start until stop.
type sampler struct {
	reg   prometheus.Gatherer
	every time.Duration
	n     int
	now   func() time.Time

	once    sync.Once
	done    chan struct{}
	stopped sync.Once
	mu      sync.Mutex
	ring    []sample
}

func newSampler(reg prometheus.Gatherer, every time.Duration, n int, now func() time.Time) *sampler {
	return &sampler{reg: reg, every: every, n: n, now: now, done: make(chan struct{})}
}

func (s *sampler) start() {
	if s.reg == nil {
		return
	}
	s.once.Do(func() {
		s.take()
		go func() {
			t := time.NewTicker(s.every)
			defer t.Stop()
			for {
				select {
				case <-s.done:
					return
				case <-t.C:
					s.take()
				}
			}
		}()
	})
}

func (s *sampler) stop() { s.stopped.Do(func() { close(s.done) }) }

// take reads the registry once and appends the sample to the ring.
func (s *sampler) take() {
	mfs, err := s.reg.Gather()
	if err != nil {
		return
	}
	smp := readSample(mfs, s.now())
	s.mu.Lock()
	s.ring = append(s.ring, smp)
	if len(s.ring) > s.n {
		s.ring = append(s.ring[:0:0], s.ring[len(s.ring)-s.n:]...)
	}
	s.mu.Unlock()
}

func readSample(mfs []*dto.MetricFamily, at time.Time) sample {
	smp := sample{at: at, byNamespace: map[string]map[string]float64{}, buckets: map[float64]float64{}}
	for _, mf := range mfs {
		switch mf.GetName() {
		case namespaceMetric:
			for _, m := range mf.GetMetric() {
				var ns, outcome string
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "namespace":
						ns = l.GetValue()
					case "outcome":
						outcome = l.GetValue()
					}
				}
				if smp.byNamespace[ns] == nil {
					smp.byNamespace[ns] = map[string]float64{}
				}
				smp.byNamespace[ns][outcome] += m.GetCounter().GetValue()
			}
		case durationMetric:
			for _, m := range mf.GetMetric() {
				h := m.GetHistogram()
				smp.count += float64(h.GetSampleCount())
				for _, b := range h.GetBucket() {
					smp.buckets[b.GetUpperBound()] += float64(b.GetCumulativeCount())
				}
			}
		}
	}
	return smp
}

func (s *sampler) samples() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample{}, s.ring...)
}

// Traffic is what the traffic page's script draws (/ui/traffic.json):
// per interval between two samples, each namespace's requests per second
// by outcome, and the latency quantiles of all requests.
type Traffic struct {
	IntervalS float64 `json:"interval_s"`
	// Times are the ends of the intervals, RFC 3339.
	Times []string `json:"times"`
	// Namespaces maps namespace -> outcome -> rate per interval.
	Namespaces map[string]map[string][]float64 `json:"namespaces"`
	// Latency maps p50, p90, p99 -> seconds per interval (null: no request).
	Latency map[string][]*float64 `json:"latency"`
}

// traffic computes the rates between consecutive samples for the
// namespaces allowed (a namespace the caller may not read is left out).
func traffic(samples []sample, allowed func(string) bool, every time.Duration) Traffic {
	t := Traffic{IntervalS: every.Seconds(), Times: []string{}, Namespaces: map[string]map[string][]float64{},
		Latency: map[string][]*float64{"p50": {}, "p90": {}, "p99": {}}}
	if len(samples) < 2 {
		return t
	}
	outcomes := map[string]map[string]bool{}
	for _, smp := range samples {
		for ns, byOutcome := range smp.byNamespace {
			if !allowed(ns) {
				continue
			}
			if outcomes[ns] == nil {
				outcomes[ns] = map[string]bool{}
			}
			for o := range byOutcome {
				outcomes[ns][o] = true
			}
		}
	}
	for ns, os := range outcomes {
		t.Namespaces[ns] = map[string][]float64{}
		for o := range os {
			t.Namespaces[ns][o] = []float64{}
		}
	}
	for i := 1; i < len(samples); i++ {
		prev, cur := samples[i-1], samples[i]
		secs := cur.at.Sub(prev.at).Seconds()
		if secs <= 0 {
			continue
		}
		t.Times = append(t.Times, cur.at.UTC().Format(time.RFC3339))
		for ns, byOutcome := range t.Namespaces {
			for o := range byOutcome {
				d := cur.byNamespace[ns][o] - prev.byNamespace[ns][o]
				byOutcome[o] = append(byOutcome[o], math.Max(d, 0)/secs)
			}
		}
		for name, q := range map[string]float64{"p50": 0.5, "p90": 0.9, "p99": 0.99} {
			t.Latency[name] = append(t.Latency[name], quantile(q, prev, cur))
		}
	}
	return t
}

// quantile estimates the q-quantile of the requests served between two
// samples from the histogram's bucket deltas (linear within a bucket, as
// Prometheus's histogram_quantile does); nil when none was served.
func quantile(q float64, prev, cur sample) *float64 {
	total := cur.count - prev.count
	if total <= 0 {
		return nil
	}
	bounds := make([]float64, 0, len(cur.buckets))
	for b := range cur.buckets {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range bounds {
		n := cur.buckets[b] - prev.buckets[b]
		if n >= rank {
			v := b
			if !math.IsInf(b, 1) && n > below {
				v = lower + (b-lower)*(rank-below)/(n-below)
			} else if math.IsInf(b, 1) {
				v = lower
			}
			return &v
		}
		lower, below = b, n
	}
	v := lower
	return &v
}

type trafficPage struct {
	IntervalS float64
	Window    string
}

func (c *Console) serveTraffic(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "traffic", trafficPage{IntervalS: c.cfg.SampleEvery.Seconds(),
		Window: (c.cfg.SampleEvery * time.Duration(c.cfg.Samples)).String()})
}

func (c *Console) serveTrafficJSON(w http.ResponseWriter, r *http.Request) {
	p := principal(r)
	allowed := func(ns string) bool { return ns != "" && p.AllowsNamespace(ns) }
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(traffic(c.traffic.samples(), allowed, c.cfg.SampleEvery))
}
