package server

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the request metrics of both APIs. Labels are bounded: api is
// http or grpc; endpoint is reserve, heartbeat, complete, release, get,
// unknown (HTTP paths that match no endpoint) or routing, batch,
// admin_<method>/other (gRPC); outcome is a reserve outcome, OK, or an
// error code. Each operation of a Batch RPC counts as its unary RPC
// (endpoint reserve, ...), and the Batch RPC once more as endpoint batch:
// sum the other endpoints for operations served.
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	// byNamespace counts requests that name a namespace by namespace and
	// outcome, for the console's traffic view. Its namespace label takes
	// the first MaxNamespaceLabels namespaces this process served; later
	// ones count as OtherNamespace, so a caller inventing names cannot grow
	// the series without bound.
	byNamespace *prometheus.CounterVec
	nsMu        sync.Mutex
	nsSeen      map[string]bool

	// The children by label values, so a request does not hash its labels
	// into the vectors' maps (GetMetricWithLabelValues showed in profiles);
	// the label sets are bounded (above).
	counters  sync.Map // requestLabels -> prometheus.Counter
	observers sync.Map // requestLabels (outcome "") -> prometheus.Observer
}

type requestLabels struct{ api, endpoint, outcome string }

func newMetrics(reg *prometheus.Registry) (*metrics, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_api_requests_total",
		Help: "API requests served, by api (http, grpc), endpoint and outcome (reserve outcome, OK, or error code).",
	}, []string{"api", "endpoint", "outcome"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "idem_api_request_duration_seconds",
		Help:    "Time to serve an API request, by api and endpoint.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"api", "endpoint"})
	byNamespace := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_api_namespace_requests_total",
		Help: "API requests that name a namespace, by namespace (the first 32 this process served; later ones as \"_other\") and outcome (reserve outcome, OK, or error code).",
	}, []string{"namespace", "outcome"})
	var err error
	if requests, err = register(reg, requests); err != nil {
		return nil, err
	}
	if duration, err = register(reg, duration); err != nil {
		return nil, err
	}
	if byNamespace, err = register(reg, byNamespace); err != nil {
		return nil, err
	}
	return &metrics{requests: requests, duration: duration, byNamespace: byNamespace, nsSeen: map[string]bool{}}, nil
}

// register registers c on reg, or returns the identical collector already
// there (the HTTP handler and the gRPC service may be built from one Config).
func register[C prometheus.Collector](reg *prometheus.Registry, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, fmt.Errorf("server: register metrics: %w", err)
	}
	return c, nil
}

// MaxNamespaceLabels bounds the namespace label of
// idem_api_namespace_requests_total; OtherNamespace stands for the rest.
const (
	MaxNamespaceLabels = 32
	OtherNamespace     = "_other"
)

// observeNamespace counts a request of namespace ns (validated: an invalid
// name is never a label) with outcome.
func (m *metrics) observeNamespace(ns, outcome string) {
	if ns == "" || outcome == "" {
		return
	}
	m.nsMu.Lock()
	if !m.nsSeen[ns] {
		if len(m.nsSeen) < MaxNamespaceLabels {
			m.nsSeen[ns] = true
		} else {
			ns = OtherNamespace
		}
	}
	m.nsMu.Unlock()
	m.byNamespace.WithLabelValues(ns, outcome).Inc()
}

func (m *metrics) observe(api, endpoint, outcome string, elapsed time.Duration) {
	k := requestLabels{api, endpoint, outcome}
	c, ok := m.counters.Load(k)
	if !ok {
		c, _ = m.counters.LoadOrStore(k, m.requests.WithLabelValues(api, endpoint, outcome))
	}
	c.(prometheus.Counter).Inc()
	k.outcome = ""
	o, ok := m.observers.Load(k)
	if !ok {
		o, _ = m.observers.LoadOrStore(k, m.duration.WithLabelValues(api, endpoint))
	}
	o.(prometheus.Observer).Observe(elapsed.Seconds())
}
