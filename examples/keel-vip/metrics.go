package keelvip

import (
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vipkit/vipkit/claim"
)

// The controller's metrics (docs/keel-vip-metrics.md). Every series has
// the labels vip and node (the mesh file's node id), so that a query can
// join the members of a pair.
var (
	metricRole = prometheus.NewDesc("keel_vip_role",
		"1 for the node's role for the VIP (primary, replica or observer), 0 for the others.", []string{"vip", "node", "role"}, nil)
	metricEpoch = prometheus.NewDesc("keel_vip_epoch",
		"Epoch of the newest claim the node took (0: none).", []string{"vip", "node"}, nil)
	metricFenced = prometheus.NewDesc("keel_vip_fenced",
		"1 while the node is fenced (or unchecked): it claims nothing by itself until a promote.", []string{"vip", "node"}, nil)
	metricUnchecked = prometheus.NewDesc("keel_vip_unchecked",
		"1 while the node has no claim in its state and has not yet learnt whether it held the VIP before.", []string{"vip", "node"}, nil)
	metricCarried = prometheus.NewDesc("keel_vip_carried",
		"1 while the controller has the VIP carried on this node's interface.", []string{"vip", "node"}, nil)
	metricLeaseLeft = prometheus.NewDesc("keel_vip_lease_remaining_seconds",
		"Least time etcd keeps the node's lease: the TTL after the send of the last answered renewal, minus its age (0 once past). Absent without a renewal since start.", []string{"vip", "node"}, nil)
	metricRenewalAge = prometheus.NewDesc("keel_vip_renewal_age_seconds",
		"Seconds since the send of the last renewal etcd answered. Absent without a renewal since start.", []string{"vip", "node"}, nil)
	metricRenewals = prometheus.NewDesc("keel_vip_renewals_total",
		"Lease renewals etcd answered.", []string{"vip", "node"}, nil)
	metricRenewErrors = prometheus.NewDesc("keel_vip_renewal_failures_total",
		"Lease renewals that failed; each counts as no renewal.", []string{"vip", "node"}, nil)
	metricFences = prometheus.NewDesc("keel_vip_fences_total",
		"Times the node fenced itself.", []string{"vip", "node"}, nil)
	metricPromotes = prometheus.NewDesc("keel_vip_promotes_total",
		"Promotes run on this node, by result (ok: it holds the VIP after it; error).", []string{"vip", "node", "result"}, nil)
	metricCertExpiry = prometheus.NewDesc("keel_vip_etcd_cert_expiry_timestamp_seconds",
		"Expiry of the etcd client certificate in use, in Unix seconds. Absent without a client certificate.", []string{"vip", "node"}, nil)
	metricTLSReloads = prometheus.NewDesc("keel_vip_etcd_tls_reloads_total",
		"New etcd TLS files the controller was handed, by result: ok (in use for new connections), refused (the current ones stay).", []string{"vip", "node", "result"}, nil)
	metricCheckPassing = prometheus.NewDesc("keel_vip_check_passing",
		"1 while the service check passes on a fresh result, 0 while it fails, is unknown or stale. Absent without a check.", []string{"vip", "node"}, nil)
	metricCheckRuns = prometheus.NewDesc("keel_vip_check_runs_total",
		"Service check runs, by result: pass, fail. Absent without a check.", []string{"vip", "node", "result"}, nil)
	metricCheckHandOvers = prometheus.NewDesc("keel_vip_check_handovers_total",
		"Hand-overs a failing check asked for, by result: accepted (the other member took the VIP over), refused (its check fails too: the VIP stays), unanswered (the VIP stays), deferred (held for less than min_move_interval_s). Absent without a check.", []string{"vip", "node", "result"}, nil)
	metricHooks = prometheus.NewDesc("keel_vip_hook_runs_total",
		"Role-change hook runs, by result: ok, failed (a non-zero exit or no start), timeout (killed at its timeout), dropped (a role change that a full queue dropped before its run).", []string{"vip", "node", "result"}, nil)
)

// promoteCounts counts the promotes of one controller process.
type promoteCounts struct {
	ok, failed atomic.Uint64
}

// controllerCollector exports one controller's Status and Stats. It reads
// them at every scrape, so its values are never older than the scrape.
type controllerCollector struct {
	vip, node string
	observer  bool
	ttl       time.Duration // the lease TTL in use
	status    func() claim.Status
	stats     func() claim.Stats
	promotes  *promoteCounts
	hooks     *hookRunner // nil: no hook configured, no series
	checks    *checkAgent // nil: no check configured, no series
	// tls is the etcd TLS in use (nil: plain http, no series) and
	// tlsReloads counts its updates.
	tls        *etcdTLSRotator
	tlsReloads *tlsReloads
}

var _ prometheus.Collector = controllerCollector{}

// Describe implements prometheus.Collector.
func (c controllerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{metricRole, metricEpoch, metricFenced, metricUnchecked, metricCarried,
		metricLeaseLeft, metricRenewalAge, metricRenewals, metricRenewErrors, metricFences, metricPromotes, metricHooks, metricCheckPassing, metricCheckRuns, metricCheckHandOvers, metricCertExpiry, metricTLSReloads} {
		ch <- d
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Collect implements prometheus.Collector.
func (c controllerCollector) Collect(ch chan<- prometheus.Metric) {
	s, st := c.status(), c.stats()
	gauge := func(d *prometheus.Desc, v float64, extra ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{c.vip, c.node}, extra...)...)
	}
	counter := func(d *prometheus.Desc, v uint64, extra ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{c.vip, c.node}, extra...)...)
	}
	role := s.Role.String()
	if c.observer {
		role = "observer"
	}
	for _, r := range []string{claim.RoleHolder.String(), claim.RoleReplica.String(), "observer"} {
		gauge(metricRole, b2f(r == role), r)
	}
	gauge(metricEpoch, float64(s.Epoch))
	gauge(metricFenced, b2f(s.Fenced))
	gauge(metricUnchecked, b2f(s.Unchecked))
	gauge(metricCarried, b2f(s.Carried))
	if s.RenewalAge >= 0 {
		gauge(metricRenewalAge, s.RenewalAge.Seconds())
		if s.Lease != 0 {
			gauge(metricLeaseLeft, max(c.ttl-s.RenewalAge, 0).Seconds())
		}
	}
	counter(metricRenewals, st.Renewals)
	counter(metricRenewErrors, st.RenewErrors)
	counter(metricFences, st.Fences)
	counter(metricPromotes, c.promotes.ok.Load(), "ok")
	counter(metricPromotes, c.promotes.failed.Load(), "error")
	if c.tls != nil {
		if _, na := c.tls.current(); !na.IsZero() {
			gauge(metricCertExpiry, float64(na.Unix()))
		}
		if c.tlsReloads != nil {
			counter(metricTLSReloads, c.tlsReloads.ok.Load(), "ok")
			counter(metricTLSReloads, c.tlsReloads.refused.Load(), "refused")
		}
	}
	if c.hooks != nil {
		hs := c.hooks.Stats()
		counter(metricHooks, hs.OK, "ok")
		counter(metricHooks, hs.Failed, "failed")
		counter(metricHooks, hs.TimedOut, "timeout")
		counter(metricHooks, hs.Dropped, "dropped")
	}
	if c.checks != nil {
		r, cs := c.checks.runner.Result(), c.checks.Stats()
		gauge(metricCheckPassing, b2f(r.Passing()))
		counter(metricCheckRuns, r.Runs-r.Failed, "pass")
		counter(metricCheckRuns, r.Failed, "fail")
		counter(metricCheckHandOvers, cs.Accepted, "accepted")
		counter(metricCheckHandOvers, cs.Refused, "refused")
		counter(metricCheckHandOvers, cs.Unanswered, "unanswered")
		counter(metricCheckHandOvers, cs.Deferred, "deferred")
	}
}

// metricsHandler serves reg's metrics. It answers only a Host that is a
// loopback IP address or localhost: any other name is a web page that
// rebound its own name to the loopback address (DNS rebinding).
func metricsHandler(reg *prometheus.Registry) http.Handler {
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host) {
			http.Error(w, "keel-vip metrics: loopback only", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// loopbackHost reports whether a request's Host names the loopback: a
// loopback IP address or localhost, with or without a port.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// metricsServer is the controller's metrics listener's HTTP server.
func metricsServer(reg *prometheus.Registry) *http.Server {
	return &http.Server{Handler: metricsHandler(reg), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: 60 * time.Second, MaxHeaderBytes: 16 << 10}
}
