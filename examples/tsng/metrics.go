package tsng

import (
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vipkit/vipkit/vip"
	"github.com/vipkit/vipkit/vip/vipmetrics"
)

// metricsHandler serves the agent's Prometheus metrics: the engines'
// observations through vipmetrics (names prefixed tsng_), the control
// channels' counters and the local HTTP servers' connections. It answers
// only a Host that is an IP address (a loopback one unless
// metrics_any_address) or localhost, as the editor does: any other name is
// a page that rebound its own name to this address (DNS rebinding), and
// the metrics name every VIP.
func (d *Daemon) metricsHandler() http.Handler {
	h := promhttp.HandlerFor(d.metricsRegistry(), promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	anyIP := d.cfg.MetricsAnyAddress
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !localHost(r, anyIP) {
			msg := "tsng metrics: Host must be this agent's IP address or localhost"
			if !anyIP {
				msg = "tsng metrics: loopback only"
			}
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (d *Daemon) metricsRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(vipmetrics.New(vipmetrics.Options{Namespace: "tsng", Statuses: d.statuses}), controlCollector{d}, httpCollector{d})
	return reg
}

// nameOr is a backend's node as tsng prints it: its name, or its id's
// first 12 hex digits.
func nameOr(b vip.BackendRef) string { return vipmetrics.BackendName(b) }

// statuses returns the observation of every running network.
func (d *Daemon) statuses() []vip.Status {
	var out []vip.Status
	for _, n := range d.nets {
		if eng := n.Engine(); eng != nil {
			out = append(out, eng.Status())
		}
	}
	return out
}

var (
	controlFrames = prometheus.NewDesc("tsng_control_frames_total",
		"Control channel frames, by direction (sent, received).", []string{"network", "direction"}, nil)
	controlDropped = prometheus.NewDesc("tsng_control_dropped_total",
		"Control frames dropped on send (full queue, no connection); the periodic rotation repairs them.", []string{"network"}, nil)
	controlConns = prometheus.NewDesc("tsng_control_connections_total",
		"Control connections, in and out, by authentication: key (the key handshake), legacy (without it), refused (for want of it; also in tsng_control_refused_total).", []string{"network", "auth"}, nil)
	controlRefused = prometheus.NewDesc("tsng_control_refused_total",
		"Control connections and frames refused: non-members, a member's connections over the limit, frames over the size limit or past the frame timeout.", []string{"network"}, nil)
	crdtRefused = prometheus.NewDesc("tsng_crdt_refused_total",
		"Signed fields that merges refused, by reason: encoding, wrong_network, reserved_key, clock_range, not_member, former (a former member's signature past its last counter), signature, schema, limit.", []string{"network", "reason"}, nil)
	relayOpen = prometheus.NewDesc("tsng_backend_relay_open",
		"Connections (tcp) and flows (udp) a netstack node relays to its loopback backend ports now; at most 1024 TCP and 256 UDP per network.", []string{"network", "proto"}, nil)
	relayTotal = prometheus.NewDesc("tsng_backend_relay_total",
		"Backend relay outcomes of a netstack node: accepted_tcp, accepted_udp, not_allowed (a port backend_ports does not allow, answered as closed), dial_failed (no application on the loopback: refused), over_limit (refused at the open limits), pending_dropped (SYNs dropped beyond 128 waiting for their loopback connection).", []string{"network", "outcome"}, nil)
	dnsLimited = prometheus.NewDesc("tsng_dns_limited_total",
		"DNS queries that met a limit: REFUSED as a forwarding loop (loop) or over a client's forwards in flight (client), SERVFAIL over all forwards in flight (total), or waiting while every UDP handler was busy (handlers).", []string{"network", "limit"}, nil)
)

// controlCollector exports each running network's ControlStats and DNS
// limit counts.
type controlCollector struct{ d *Daemon }

// Describe implements prometheus.Collector.
func (c controlCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- controlFrames
	ch <- controlDropped
	ch <- controlConns
	ch <- controlRefused
	ch <- crdtRefused
	ch <- dnsLimited
	ch <- relayOpen
	ch <- relayTotal
}

// Collect implements prometheus.Collector.
func (c controlCollector) Collect(ch chan<- prometheus.Metric) {
	for _, n := range c.d.nets {
		r := n.replica.Refused()
		for _, x := range []struct {
			reason string
			v      uint64
		}{{"encoding", r.Encoding}, {"wrong_network", r.WrongNetwork}, {"reserved_key", r.ReservedKey}, {"clock_range", r.ClockRange},
			{"not_member", r.NotMember}, {"former", r.Former}, {"signature", r.Signature}, {"schema", r.Schema}, {"limit", r.Limit}} {
			ch <- prometheus.MustNewConstMetric(crdtRefused, prometheus.CounterValue, float64(x.v), n.cfg.Name, x.reason)
		}
		n.mu.Lock()
		ctl, dnss, relay, host := n.control, n.dns, n.relay, n.host
		n.mu.Unlock()
		if relay != nil {
			s := relay.Stats()
			ch <- prometheus.MustNewConstMetric(relayOpen, prometheus.GaugeValue, float64(s.TCPActive), n.cfg.Name, "tcp")
			ch <- prometheus.MustNewConstMetric(relayOpen, prometheus.GaugeValue, float64(s.UDPFlows), n.cfg.Name, "udp")
			for _, x := range []struct {
				outcome string
				v       uint64
			}{{"accepted_tcp", s.TCPAccepted}, {"accepted_udp", s.UDPAccepted}, {"not_allowed", s.NotAllowed},
				{"dial_failed", s.DialFailed}, {"over_limit", s.OverLimit}, {"pending_dropped", host.Stats().InboundPendingDropped}} {
				ch <- prometheus.MustNewConstMetric(relayTotal, prometheus.CounterValue, float64(x.v), n.cfg.Name, x.outcome)
			}
		}
		if dnss != nil {
			s := dnss.Stats()
			ch <- prometheus.MustNewConstMetric(dnsLimited, prometheus.CounterValue, float64(s.Loops), n.cfg.Name, "loop")
			ch <- prometheus.MustNewConstMetric(dnsLimited, prometheus.CounterValue, float64(s.ClientLimit), n.cfg.Name, "client")
			ch <- prometheus.MustNewConstMetric(dnsLimited, prometheus.CounterValue, float64(s.Busy), n.cfg.Name, "total")
			ch <- prometheus.MustNewConstMetric(dnsLimited, prometheus.CounterValue, float64(s.HandlerWaits), n.cfg.Name, "handlers")
		}
		if ctl == nil {
			continue
		}
		s := ctl.Stats()
		ch <- prometheus.MustNewConstMetric(controlFrames, prometheus.CounterValue, float64(s.Sent), n.cfg.Name, "sent")
		ch <- prometheus.MustNewConstMetric(controlFrames, prometheus.CounterValue, float64(s.Received), n.cfg.Name, "received")
		ch <- prometheus.MustNewConstMetric(controlDropped, prometheus.CounterValue, float64(s.Dropped), n.cfg.Name)
		ch <- prometheus.MustNewConstMetric(controlRefused, prometheus.CounterValue, float64(s.Refused), n.cfg.Name)
		ch <- prometheus.MustNewConstMetric(controlConns, prometheus.CounterValue, float64(s.Authenticated), n.cfg.Name, "key")
		ch <- prometheus.MustNewConstMetric(controlConns, prometheus.CounterValue, float64(s.Legacy), n.cfg.Name, "legacy")
		ch <- prometheus.MustNewConstMetric(controlConns, prometheus.CounterValue, float64(s.AuthRefused), n.cfg.Name, "refused")
	}
}

var (
	httpConnsDesc = prometheus.NewDesc("tsng_http_connections",
		"Connections open to a local HTTP server (server: api, ui, metrics, http-proxy; network: the HTTP proxy's).", []string{"server", "network"}, nil)
	httpRefusedDesc = prometheus.NewDesc("tsng_http_connections_refused_total",
		"Connections to a local HTTP server closed at once because it had its limit of connections open.", []string{"server", "network"}, nil)
	httpProxyIdleDesc = prometheus.NewDesc("tsng_http_proxy_idle_closed_total",
		"CONNECT tunnels and forwarded requests of the HTTP proxy closed because no byte flowed either way for the idle limit.", []string{"network"}, nil)
)

// httpCollector exports the local HTTP servers' connection counts.
type httpCollector struct{ d *Daemon }

// Describe implements prometheus.Collector.
func (c httpCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- httpConnsDesc
	ch <- httpRefusedDesc
	ch <- httpProxyIdleDesc
}

// Collect implements prometheus.Collector.
func (c httpCollector) Collect(ch chan<- prometheus.Metric) {
	emit := func(ln any, network string) {
		l, ok := ln.(*connLimiter)
		if !ok {
			return
		}
		ch <- prometheus.MustNewConstMetric(httpConnsDesc, prometheus.GaugeValue, float64(l.open.Load()), l.server, network)
		ch <- prometheus.MustNewConstMetric(httpRefusedDesc, prometheus.CounterValue, float64(l.refused.Load()), l.server, network)
	}
	emit(c.d.apiLn, "")
	emit(c.d.metricsLn, "")
	if c.d.ui != nil {
		emit(c.d.ui.ln, "")
	}
	for _, n := range c.d.nets {
		n.mu.Lock()
		proxies := slices.Clone(n.proxies)
		n.mu.Unlock()
		for _, p := range proxies {
			if hp, ok := p.(*httpProxy); ok {
				emit(hp.ln, n.cfg.Name)
				ch <- prometheus.MustNewConstMetric(httpProxyIdleDesc, prometheus.CounterValue, float64(hp.idleClosed.Load()), n.cfg.Name)
			}
		}
	}
}
