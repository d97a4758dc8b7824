// Package hostingmetrics exposes share hosts' observations as Prometheus
// metrics (docs/hosting-metrics.md): API requests by route and code with
// their latency, shares per hosting state, the outbox's lag and
// dead-lettered messages, Ziti call errors and reconciler repairs. It
// lives apart from package hosting so that hosting does not depend on
// client_golang; it is wired through hosting's hooks:
//
//	m := hostingmetrics.New(hostingmetrics.Options{Outbox: store, Consumer: consumer.Stats})
//	reg.MustRegister(m)
//	zc, _ := ziti.New(url, ziti.Options{OnError: m.ZitiError, ...})
//	rec, _ := hosting.NewReconciler(hosting.ReconcilerOptions{OnDrift: m.Drift, OnPass: m.Pass, WatchStates: true, ...})
//	h, _ := api.New(api.Options{Observe: m.Request, ...})
package hostingmetrics

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/transport"
)

// Namespace prefixes every metric name.
const Namespace = "hosting"

// OutboxTimeout bounds the outbox read of one scrape.
const OutboxTimeout = 2 * time.Second

// States are the hosting states the shares gauge always reports (0 when
// no share is in one), in this order.
var States = []hosting.State{hosting.Healthy, hosting.Degraded, hosting.FailedOver, hosting.Down, hosting.Misconfigured, hosting.StateUnknown}

// Options configure the metrics.
type Options struct {
	// Outbox, when set, is read on each scrape for the outbox lag: the
	// age of the oldest unpublished entry.
	Outbox hosting.Outbox
	// DeadLettered, when set, returns the messages the consumer sent to
	// the dead-letter exchange (events.Consumer.Stats().DeadLettered).
	DeadLettered func() int64
	// Clock tells the outbox lag; nil means the real clock.
	Clock transport.Clock
}

// Metrics is a prometheus.Collector of share hosts' metrics, and the hooks
// that feed it. It is safe for concurrent use.
type Metrics struct {
	o         Options
	clk       transport.Clock
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	shares    *prometheus.GaugeVec
	zitiErrs  *prometheus.CounterVec
	repairs   *prometheus.CounterVec
	passes    prometheus.Counter
	lag       *prometheus.Desc
	pending   *prometheus.Desc
	deadDesc  *prometheus.Desc
	lagErrors prometheus.Counter
}

var _ prometheus.Collector = (*Metrics)(nil)

// New returns the metrics.
func New(o Options) *Metrics {
	m := &Metrics{o: o, clk: transport.Or(o.Clock),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "api_requests_total",
			Help: "API requests answered, by route (the pattern matched) and status code."}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "api_request_duration_seconds",
			Help: "Latency of the API's answers, by route.", Buckets: prometheus.DefBuckets}, []string{"route"}),
		shares: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "shares",
			Help: "Live shares by hosting state, as the last reconciler pass read them."}, []string{"state"}),
		zitiErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "ziti_errors_total",
			Help: "Ziti controller calls that failed, by operation."}, []string{"operation"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "reconciler_repairs_total",
			Help: "Drift the reconciler repaired, by kind."}, []string{"kind"}),
		passes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "reconciler_passes_total",
			Help: "Reconciler passes made (dry runs and passes that found the lock held elsewhere not counted)."}),
		lagErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "outbox_read_errors_total",
			Help: "Scrapes whose outbox read failed."}),
		lag:      prometheus.NewDesc(Namespace+"_outbox_lag_seconds", "Age of the oldest unpublished outbox entry; 0 when none.", nil, nil),
		pending:  prometheus.NewDesc(Namespace+"_outbox_pending", "Unpublished outbox entries, up to 1000.", nil, nil),
		deadDesc: prometheus.NewDesc(Namespace+"_events_dead_lettered_total", "Agent DELETED messages sent to the dead-letter exchange.", nil, nil),
	}
	for _, s := range States {
		m.shares.WithLabelValues(string(s))
	}
	return m
}

// Request is api.Options.Observe.
func (m *Metrics) Request(route string, code int, d time.Duration) {
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	m.latency.WithLabelValues(route).Observe(d.Seconds())
}

// ZitiError is ziti.Options.OnError.
func (m *Metrics) ZitiError(op string, _ error) {
	m.zitiErrs.WithLabelValues(op).Inc()
}

// Drift is hosting.ReconcilerOptions.OnDrift: it counts the repaired
// drift.
func (m *Metrics) Drift(d hosting.Drift) {
	if d.Repaired {
		m.repairs.WithLabelValues(string(d.Kind)).Inc()
	}
}

// Pass is hosting.ReconcilerOptions.OnPass: it sets the shares per state
// (with WatchStates) and counts the pass.
func (m *Metrics) Pass(r hosting.Report) {
	if !r.Locked {
		return
	}
	m.passes.Inc()
	if r.States == nil {
		return
	}
	for _, s := range States {
		m.shares.WithLabelValues(string(s)).Set(float64(r.States[s]))
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.requests.Describe(ch)
	m.latency.Describe(ch)
	m.shares.Describe(ch)
	m.zitiErrs.Describe(ch)
	m.repairs.Describe(ch)
	m.passes.Describe(ch)
	m.lagErrors.Describe(ch)
	ch <- m.lag
	ch <- m.pending
	ch <- m.deadDesc
}

// Collect implements prometheus.Collector. It reads the outbox, within
// OutboxTimeout.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	if m.o.Outbox != nil {
		ctx, cancel := context.WithTimeout(context.Background(), OutboxTimeout)
		es, err := m.o.Outbox.Pending(ctx, 1000)
		cancel()
		if err != nil {
			m.lagErrors.Inc()
		} else {
			lag := 0.0
			if len(es) > 0 {
				lag = max(0, m.clk.Now().Sub(es[0].OccurredAt).Seconds())
			}
			ch <- prometheus.MustNewConstMetric(m.lag, prometheus.GaugeValue, lag)
			ch <- prometheus.MustNewConstMetric(m.pending, prometheus.GaugeValue, float64(len(es)))
		}
	}
	if m.o.DeadLettered != nil {
		ch <- prometheus.MustNewConstMetric(m.deadDesc, prometheus.CounterValue, float64(m.o.DeadLettered()))
	}
	m.requests.Collect(ch)
	m.latency.Collect(ch)
	m.shares.Collect(ch)
	m.zitiErrs.Collect(ch)
	m.repairs.Collect(ch)
	m.passes.Collect(ch)
	m.lagErrors.Collect(ch)
}
