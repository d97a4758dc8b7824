// Package vipmetrics exposes a vip.Engine's observations as Prometheus
// metrics: a prometheus.Collector that an importer registers in its own
// registry. It lives apart from package vip so that vip itself does not
// depend on client_golang.
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(vipmetrics.New(vipmetrics.Options{
//		Namespace: "myapp",
//		Statuses:  func() []vip.Status { return []vip.Status{engine.Status()} },
//	}))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// Per network it reports the probe and NAT counters; per VIP whether it is
// routed; per listener and backend the IP packet and byte counters (by
// direction: out is toward the backend), bindings, UDP failovers, health
// and smoothed RTT. Counters are the engine's cumulative ones and reset
// when the engine restarts.
package vipmetrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipkit/vipkit/vip"
)

// Options configures a Collector.
type Options struct {
	// Namespace prefixes every metric name ("vip" when empty); tsng uses
	// "tsng".
	Namespace string
	// Statuses returns the observations to export, one per network; it is
	// called on every scrape.
	Statuses func() []vip.Status
}

// Collector is a prometheus.Collector over engine observations.
type Collector struct {
	statuses func() []vip.Status

	probeBytes, probeExpired, probeRejected     *prometheus.Desc
	probeHostDropped                            *prometheus.Desc
	flowBindings, flowCapacity, flowRefused     *prometheus.Desc
	flowDrops, vipRoutable                      *prometheus.Desc
	lnPackets, lnBytes, lnBindings, lnFailovers *prometheus.Desc
	beEligible, beRTT, beBindings               *prometheus.Desc
	bePackets, beBytes                          *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// New returns a Collector; o.Statuses is required.
func New(o Options) *Collector {
	ns := o.Namespace
	if ns == "" {
		ns = "vip"
	}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(ns+"_"+name, help, labels, nil)
	}
	net := []string{"network"}
	ln := []string{"network", "vip", "listener"}
	be := []string{"network", "vip", "listener", "backend"}
	traffic := "IP %s forwarded, by direction (out: toward the backend)."
	return &Collector{
		statuses:         o.Statuses,
		probeBytes:       d("probe_bytes_total", "Data-plane probe bytes, apart from user traffic.", append(net, "direction")...),
		probeExpired:     d("probe_expired_total", "Probes that expired unanswered.", net...),
		probeRejected:    d("probe_rejected_total", "Probe packets refused: malformed, late, from an unknown peer or over a peer's reply rate.", net...),
		probeHostDropped: d("probe_host_dropped_total", "Host packets to an overlay address's probe port, dropped: only the agent speaks there.", net...),
		flowBindings:     d("flow_bindings", "NAT bindings by state.", append(net, "state")...),
		flowCapacity:     d("flow_capacity", "NAT binding capacity (active and quarantined).", net...),
		flowRefused:      d("flow_refused_total", "New flows refused for capacity.", net...),
		flowDrops:        d("flow_drops_total", "Packets the NAT dropped, by reason.", append(net, "reason")...),
		vipRoutable:      d("vip_routable", "1 when the VIP is routed.", "network", "vip"),
		lnPackets:        d("listener_packets_total", fmt.Sprintf(traffic, "packets"), append(ln, "direction")...),
		lnBytes:          d("listener_bytes_total", fmt.Sprintf(traffic, "bytes"), append(ln, "direction")...),
		lnBindings:       d("listener_bindings", "Active bindings of a listener.", ln...),
		lnFailovers:      d("listener_udp_failovers_total", "UDP bindings moved to another backend.", ln...),
		beEligible:       d("backend_eligible", "1 when the backend is eligible; the reason label says why not.", append(be, "reason")...),
		beRTT:            d("backend_rtt_seconds", "Smoothed path RTT to the backend's node.", be...),
		beBindings:       d("backend_bindings", "Active bindings to a backend.", be...),
		bePackets:        d("backend_packets_total", fmt.Sprintf(traffic, "packets"), append(be, "direction")...),
		beBytes:          d("backend_bytes_total", fmt.Sprintf(traffic, "bytes"), append(be, "direction")...),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.probeBytes, c.probeExpired, c.probeRejected, c.probeHostDropped, c.flowBindings, c.flowCapacity, c.flowRefused,
		c.flowDrops, c.vipRoutable, c.lnPackets, c.lnBytes, c.lnBindings, c.lnFailovers,
		c.beEligible, c.beRTT, c.beBindings, c.bePackets, c.beBytes} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. Two VIPs of one network that
// share a name (a conflict the status reports) export the first one in
// the status's order only, so a scrape never fails on duplicate series.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	traffic := func(packets, bytes *prometheus.Desc, t vip.Traffic, labels ...string) {
		out, in := append(labels[:len(labels):len(labels)], "out"), append(labels[:len(labels):len(labels)], "in")
		counter(packets, t.PacketsOut, out...)
		counter(packets, t.PacketsIn, in...)
		counter(bytes, t.BytesOut, out...)
		counter(bytes, t.BytesIn, in...)
	}
	seenNet := map[string]bool{}
	for _, st := range c.statuses() {
		if seenNet[st.Network] {
			continue
		}
		seenNet[st.Network] = true
		n := st.Network
		counter(c.probeBytes, st.Probe.BytesOut, n, "out")
		counter(c.probeBytes, st.Probe.BytesIn, n, "in")
		counter(c.probeExpired, st.Probe.Expired, n)
		counter(c.probeRejected, st.Probe.Rejected, n)
		counter(c.probeHostDropped, st.Probe.HostDropped, n)
		gauge(c.flowBindings, float64(st.Flow.Active), n, "active")
		gauge(c.flowBindings, float64(st.Flow.Quarantined), n, "quarantined")
		gauge(c.flowCapacity, float64(st.Flow.Capacity), n)
		counter(c.flowRefused, st.Flow.Refused, n)
		for reason, v := range st.Flow.Drops {
			counter(c.flowDrops, v, n, reason)
		}
		seenVIP := map[string]bool{}
		for _, s := range st.Services {
			if seenVIP[s.Name] {
				continue
			}
			seenVIP[s.Name] = true
			gauge(c.vipRoutable, b2f(s.Routable), n, s.Name)
			for _, l := range s.Listeners {
				ll := []string{n, s.Name, l.Listener}
				traffic(c.lnPackets, c.lnBytes, l.Traffic, ll...)
				gauge(c.lnBindings, float64(l.Active), ll...)
				counter(c.lnFailovers, l.Failovers, ll...)
				for _, b := range l.Backends {
					bl := append(ll[:3:3], fmt.Sprintf("%s:%d", BackendName(b.BackendRef), b.Port))
					gauge(c.beEligible, b2f(b.Eligible), append(bl[:4:4], b.Reason)...)
					if b.RTTKnown {
						gauge(c.beRTT, b.RTTMillis/1000, bl...)
					}
					gauge(c.beBindings, float64(b.Active), bl...)
					traffic(c.bePackets, c.beBytes, b.Traffic, bl...)
				}
			}
		}
	}
}

// BackendName is a backend's node as the backend label shows it: its
// name, or the first 12 hex digits of its id when it has none.
func BackendName(b vip.BackendRef) string {
	if b.NodeName != "" {
		return b.NodeName
	}
	return b.Node.String()[:12]
}
