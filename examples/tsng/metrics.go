package tsng

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	"github.com/vipkit/vipkit/vip"
)

// serveMetrics writes Prometheus' text exposition format: per network,
// VIP, listener and backend the traffic counters, bindings, failovers,
// health and RTT, and the probe and flow counters.
func (d *Daemon) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	var statuses []vip.Status
	for _, n := range d.nets {
		if eng := n.Engine(); eng != nil {
			statuses = append(statuses, eng.Status())
		}
	}
	WriteMetrics(w, statuses)
}

type metric struct {
	name, help, kind string
	lines            []string
}

// WriteMetrics renders statuses in Prometheus' text format.
func WriteMetrics(w io.Writer, statuses []vip.Status) {
	ms := map[string]*metric{}
	add := func(name, kind, help string, labels map[string]string, v float64) {
		m := ms[name]
		if m == nil {
			m = &metric{name: name, help: help, kind: kind}
			ms[name] = m
		}
		keys := make([]string, 0, len(labels))
		for k := range labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = fmt.Sprintf("%s=%q", k, labels[k])
		}
		m.lines = append(m.lines, fmt.Sprintf("%s{%s} %g", name, strings.Join(parts, ","), v))
	}
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	traffic := func(prefix string, labels map[string]string, t vip.Traffic) {
		add(prefix+"_packets_total", "counter", "IP packets forwarded, by direction (out: toward the backend).", with(labels, "direction", "out"), float64(t.PacketsOut))
		add(prefix+"_packets_total", "counter", "", with(labels, "direction", "in"), float64(t.PacketsIn))
		add(prefix+"_bytes_total", "counter", "IP bytes forwarded, by direction (out: toward the backend).", with(labels, "direction", "out"), float64(t.BytesOut))
		add(prefix+"_bytes_total", "counter", "", with(labels, "direction", "in"), float64(t.BytesIn))
	}
	for _, st := range statuses {
		nl := map[string]string{"network": st.Network}
		add("tsng_probe_bytes_total", "counter", "Data-plane probe bytes, apart from user traffic.", with(nl, "direction", "out"), float64(st.Probe.BytesOut))
		add("tsng_probe_bytes_total", "counter", "", with(nl, "direction", "in"), float64(st.Probe.BytesIn))
		add("tsng_probe_expired_total", "counter", "Probes that expired unanswered.", nl, float64(st.Probe.Expired))
		add("tsng_flow_bindings", "gauge", "NAT bindings by state.", with(nl, "state", "active"), float64(st.Flow.Active))
		add("tsng_flow_bindings", "gauge", "", with(nl, "state", "quarantined"), float64(st.Flow.Quarantined))
		add("tsng_flow_capacity", "gauge", "NAT binding capacity (active and quarantined).", nl, float64(st.Flow.Capacity))
		add("tsng_flow_refused_total", "counter", "New flows refused for capacity.", nl, float64(st.Flow.Refused))
		for reason, v := range st.Flow.Drops {
			add("tsng_flow_drops_total", "counter", "Packets the NAT dropped, by reason.", with(nl, "reason", reason), float64(v))
		}
		for _, s := range st.Services {
			sl := with(nl, "vip", s.Name)
			add("tsng_vip_routable", "gauge", "1 when the VIP is routed.", sl, b2f(s.Routable))
			for _, l := range s.Listeners {
				ll := with(sl, "listener", l.Listener)
				traffic("tsng_listener", ll, l.Traffic)
				add("tsng_listener_bindings", "gauge", "Active bindings of a listener.", ll, float64(l.Active))
				add("tsng_listener_udp_failovers_total", "counter", "UDP bindings moved to another backend.", ll, float64(l.Failovers))
				for _, b := range l.Backends {
					bl := with(ll, "backend", fmt.Sprintf("%s:%d", nameOr(b.BackendRef), b.Port))
					add("tsng_backend_eligible", "gauge", "1 when the backend is eligible; the reason label says why not.", with(bl, "reason", b.Reason), b2f(b.Eligible))
					if b.RTTKnown {
						add("tsng_backend_rtt_seconds", "gauge", "Smoothed path RTT to the backend's node.", bl, b.RTTMillis/1000)
					}
					add("tsng_backend_bindings", "gauge", "Active bindings to a backend.", bl, float64(b.Active))
					traffic("tsng_backend", bl, b.Traffic)
				}
			}
		}
	}
	names := make([]string, 0, len(ms))
	for n := range ms {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		m := ms[n]
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", m.name, m.help, m.name, m.kind)
		for _, l := range m.lines {
			fmt.Fprintln(w, l)
		}
	}
}

func nameOr(b vip.BackendRef) string {
	if b.NodeName != "" {
		return b.NodeName
	}
	return b.Node.String()[:12]
}

func with(m map[string]string, k, v string) map[string]string {
	out := make(map[string]string, len(m)+1)
	for a, b := range m {
		out[a] = b
	}
	out[k] = v
	return out
}
