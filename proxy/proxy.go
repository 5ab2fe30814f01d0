package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/httpidem"
	"github.com/prometheus/client_golang/prometheus"
)

// Proxy is the transparent idempotency proxy: an http.Handler that forwards
// requests to the upstream and makes keyed POST and PATCH requests
// idempotent. It is safe for concurrent use.
type Proxy struct {
	cfg     Config
	log     *slog.Logger
	handler http.Handler
	rp      *httputil.ReverseProxy
	metrics *metrics
	counts  [8]atomic.Uint64 // by resultIndex
}

// New validates cfg and returns a Proxy.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	target, _ := cfg.upstreamURL() // validated
	p := &Proxy{cfg: cfg, log: cfg.Logger}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	registry := cfg.Registry
	if registry == nil {
		registry = prometheus.NewRegistry()
	}
	m, err := newMetrics(registry)
	if err != nil {
		return nil, err
	}
	p.metrics = m

	transport := cfg.Transport
	if transport == nil {
		transport = http.DefaultTransport.(*http.Transport).Clone()
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// ReverseProxy has removed the hop-by-hop headers, including any a
			// client named in Connection, before this runs: the fencing
			// token is set here, after them, so no Connection header can
			// strip it, and no variant of its name survives beside it.
			httpidem.StripFencingHeaders(pr.Out.Header)
			if lease, ok := httpidem.LeaseFromContext(pr.In.Context()); ok {
				pr.Out.Header.Set(httpidem.HeaderFencingToken, strconv.FormatUint(lease.FencingToken, 10))
			}
			pr.SetURL(target)
			if cfg.PreserveHost {
				pr.Out.Host = pr.In.Host
			}
			if cfg.XForwarded {
				pr.SetXForwarded() // replaces what the caller sent: the proxy is the edge
			} else {
				// ReverseProxy strips them; without XForwarded they pass untouched.
				for _, h := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
					if v, ok := pr.In.Header[h]; ok {
						pr.Out.Header[h] = v
					}
				}
			}
		},
		Transport:    transport,
		ErrorHandler: p.upstreamError,
		ErrorLog:     slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
	}

	ecfg := cfg.engineConfig()
	ecfg.Logger = p.log
	ecfg.Observe = p.observe
	engine, err := httpidem.New(ecfg)
	if err != nil {
		return nil, err
	}
	p.handler = engine.Handler(http.HandlerFunc(p.forward))
	return p, nil
}

// ServeHTTP serves one proxied request.
//
// A client-sent Idempotency-Fencing-Token (or a variant of its name) never
// reaches the upstream, keyed or not: the engine removes it from every
// request, and the request sent upstream gets the proxy's own (on keyed
// requests) after hop-by-hop processing, so a caller can neither poison the
// upstream's fencing guard nor strip it with a Connection header.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.handler.ServeHTTP(w, r)
}

// forward sends r upstream and copies the answer to w.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	defer func() { p.metrics.upstream.Observe(time.Since(start).Seconds()) }()
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		// The upstream's body broke off (or stalled past the deadline) after
		// its status came. While the response is still held, the caller can
		// get a clean 502 or 504 instead of a cut connection.
		if v == http.ErrAbortHandler && httpidem.ResetResponse(w) {
			err := r.Context().Err()
			if err == nil {
				err = errors.New("the upstream's response body broke off")
			}
			p.upstreamError(w, r, err)
			return
		}
		panic(v)
	}()
	p.rp.ServeHTTP(w, r)
}

// upstreamError answers a failed upstream request: 504 past the deadline,
// 503 when the reservation was lost, 502 otherwise. For a keyed request the
// key is released, so that a retry runs again.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	httpidem.ForceRelease(r.Context())
	ctx := r.Context()
	var prob httpidem.Problem
	switch {
	case errors.Is(context.Cause(ctx), httpidem.ErrLeaseLost):
		prob = httpidem.NewProblem(http.StatusServiceUnavailable, httpidem.ProblemLeaseLost,
			"the reservation of this Idempotency-Key was lost while the upstream worked (the idempotency store was unreachable for longer than the lease), so the request was abandoned: retry it with the same key")
		prob.RetryAfter = time.Second
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		prob = httpidem.NewProblem(http.StatusGatewayTimeout, httpidem.ProblemUpstreamTimeout,
			"the upstream did not answer within the proxy's deadline; the request may or may not have taken effect upstream, and a retry with the same Idempotency-Key runs it again")
	default:
		prob = httpidem.NewProblem(http.StatusBadGateway, httpidem.ProblemUpstreamUnreachable,
			"the upstream could not be reached or its answer broke off; a retry with the same Idempotency-Key runs the request again")
	}
	p.log.Warn("upstream request failed", "method", r.Method, "path", r.URL.Path, "status", prob.Status, "err", err)
	httpidem.WriteProblem(w, prob)
}

func (p *Proxy) observe(ev httpidem.Event) {
	p.counts[resultIndex[ev.Result]].Add(1)
	p.metrics.requests.WithLabelValues(string(ev.Result)).Inc()
	if ev.StoredBodyBytes >= 0 {
		p.metrics.stored.Observe(float64(ev.StoredBodyBytes))
	}
}

// Stats are the proxy's request counts by outcome, the figures of
// idem_proxy_requests_total.
type Stats struct {
	Forwarded, Replayed, Conflict, Mismatch, MissingKey, Released, Passthrough, Error uint64
}

// Stats returns the request counts so far.
func (p *Proxy) Stats() Stats {
	c := func(r httpidem.Result) uint64 { return p.counts[resultIndex[r]].Load() }
	return Stats{
		Forwarded:   c(httpidem.ResultForwarded),
		Replayed:    c(httpidem.ResultReplayed),
		Conflict:    c(httpidem.ResultConflict),
		Mismatch:    c(httpidem.ResultMismatch),
		MissingKey:  c(httpidem.ResultMissingKey),
		Released:    c(httpidem.ResultReleased),
		Passthrough: c(httpidem.ResultPassthrough),
		Error:       c(httpidem.ResultError),
	}
}

var resultIndex = map[httpidem.Result]int{
	httpidem.ResultForwarded:   0,
	httpidem.ResultReplayed:    1,
	httpidem.ResultConflict:    2,
	httpidem.ResultMismatch:    3,
	httpidem.ResultMissingKey:  4,
	httpidem.ResultReleased:    5,
	httpidem.ResultPassthrough: 6,
	httpidem.ResultError:       7,
}

type metrics struct {
	requests *prometheus.CounterVec
	upstream prometheus.Histogram
	stored   prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_proxy_requests_total",
			Help: "Requests to the idempotency proxy by outcome: forwarded (ran upstream, answer stored), replayed, conflict (409), mismatch (422), missing_key (400), released (ran upstream, answer not final, key released), passthrough (not keyed), error (proxy-generated error).",
		}, []string{"outcome"}),
		upstream: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idem_proxy_upstream_duration_seconds",
			Help:    "Time from sending a request upstream to the end of its response.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14), // 1ms .. ~150s
		}),
		stored: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idem_proxy_stored_response_bytes",
			Help:    "Size of the response bodies the proxy stored (0 when the body was over the limit and omitted).",
			Buckets: prometheus.ExponentialBuckets(64, 4, 10), // 64 B .. 16 MiB
		}),
	}
	for _, r := range httpidem.Results {
		m.requests.WithLabelValues(string(r))
	}
	for _, c := range []prometheus.Collector{m.requests, m.upstream, m.stored} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
