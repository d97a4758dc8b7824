package vipmetrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipkit/vipkit/vip"
	"github.com/vipkit/vipkit/vip/vipmetrics"
)

// fixture is one network's observation: a VIP with a TCP listener and two
// backends (one named, one known only by id, with an awkward name for the
// label escaping), and NAT drops.
func fixture() []vip.Status {
	var anon vip.NodeID
	for i := range anon {
		anon[i] = 0xab
	}
	return []vip.Status{{
		Network: "home",
		Probe:   vip.ProbeTraffic{BytesOut: 640, BytesIn: 600, Expired: 2, Rejected: 3, HostDropped: 4},
		Flow:    vip.FlowStatus{Capacity: 4096, Active: 3, Quarantined: 1, Refused: 5, Drops: map[string]uint64{"no-binding": 7}},
		Services: []vip.ServiceStatus{{
			Name: "api", Routable: true,
			Listeners: []vip.ListenerStatus{{
				Listener: "tcp/443", Active: 3, Failovers: 0,
				Traffic: vip.Traffic{PacketsOut: 10, BytesOut: 1000, PacketsIn: 8, BytesIn: 4000},
				Backends: []vip.BackendStatus{
					{BackendRef: vip.BackendRef{NodeName: "server1", Port: 6443}, Reason: "ok", Eligible: true, RTTKnown: true, RTTMillis: 1.5, Active: 2,
						Traffic: vip.Traffic{PacketsOut: 6, BytesOut: 600, PacketsIn: 5, BytesIn: 2500}},
					{BackendRef: vip.BackendRef{Node: anon, Port: 7443}, Reason: `check-failed "x"\n`, Active: 1,
						Traffic: vip.Traffic{PacketsOut: 4, BytesOut: 400, PacketsIn: 3, BytesIn: 1500}},
				},
			}},
		}, {
			// A name conflict: the second "api" is not exported twice.
			Name: "api", Listeners: []vip.ListenerStatus{{Listener: "tcp/443"}},
		}},
	}, {Network: "home"}} // a duplicate network is exported once
}

func collector() *vipmetrics.Collector {
	return vipmetrics.New(vipmetrics.Options{Namespace: "tsng", Statuses: fixture})
}

func TestCollectorLint(t *testing.T) {
	problems, err := testutil.CollectAndLint(collector())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestCollectorOutput: the exposition, byte for byte; names and labels are
// tsng's (backend as NODE:PORT, the node's name or its id's first 12 hex
// digits; direction out toward the backend).
func TestCollectorOutput(t *testing.T) {
	if err := testutil.CollectAndCompare(collector(), strings.NewReader(expected)); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(collector()); n != 30 {
		t.Fatalf("%d series, want 30", n)
	}
}

func TestCollectorNamespace(t *testing.T) {
	c := vipmetrics.New(vipmetrics.Options{Statuses: fixture})
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP vip_flow_capacity NAT binding capacity (active and quarantined).
# TYPE vip_flow_capacity gauge
vip_flow_capacity{network="home"} 4096
`), "vip_flow_capacity"); err != nil {
		t.Fatal(err)
	}
}

const expected = `
# HELP tsng_backend_bindings Active bindings to a backend.
# TYPE tsng_backend_bindings gauge
tsng_backend_bindings{backend="abababababab:7443",listener="tcp/443",network="home",vip="api"} 1
tsng_backend_bindings{backend="server1:6443",listener="tcp/443",network="home",vip="api"} 2
# HELP tsng_backend_bytes_total IP bytes forwarded, by direction (out: toward the backend).
# TYPE tsng_backend_bytes_total counter
tsng_backend_bytes_total{backend="abababababab:7443",direction="in",listener="tcp/443",network="home",vip="api"} 1500
tsng_backend_bytes_total{backend="abababababab:7443",direction="out",listener="tcp/443",network="home",vip="api"} 400
tsng_backend_bytes_total{backend="server1:6443",direction="in",listener="tcp/443",network="home",vip="api"} 2500
tsng_backend_bytes_total{backend="server1:6443",direction="out",listener="tcp/443",network="home",vip="api"} 600
# HELP tsng_backend_eligible 1 when the backend is eligible; the reason label says why not.
# TYPE tsng_backend_eligible gauge
tsng_backend_eligible{backend="abababababab:7443",listener="tcp/443",network="home",reason="check-failed \"x\"\\n",vip="api"} 0
tsng_backend_eligible{backend="server1:6443",listener="tcp/443",network="home",reason="ok",vip="api"} 1
# HELP tsng_backend_packets_total IP packets forwarded, by direction (out: toward the backend).
# TYPE tsng_backend_packets_total counter
tsng_backend_packets_total{backend="abababababab:7443",direction="in",listener="tcp/443",network="home",vip="api"} 3
tsng_backend_packets_total{backend="abababababab:7443",direction="out",listener="tcp/443",network="home",vip="api"} 4
tsng_backend_packets_total{backend="server1:6443",direction="in",listener="tcp/443",network="home",vip="api"} 5
tsng_backend_packets_total{backend="server1:6443",direction="out",listener="tcp/443",network="home",vip="api"} 6
# HELP tsng_backend_rtt_seconds Smoothed path RTT to the backend's node.
# TYPE tsng_backend_rtt_seconds gauge
tsng_backend_rtt_seconds{backend="server1:6443",listener="tcp/443",network="home",vip="api"} 0.0015
# HELP tsng_flow_bindings NAT bindings by state.
# TYPE tsng_flow_bindings gauge
tsng_flow_bindings{network="home",state="active"} 3
tsng_flow_bindings{network="home",state="quarantined"} 1
# HELP tsng_flow_capacity NAT binding capacity (active and quarantined).
# TYPE tsng_flow_capacity gauge
tsng_flow_capacity{network="home"} 4096
# HELP tsng_flow_drops_total Packets the NAT dropped, by reason.
# TYPE tsng_flow_drops_total counter
tsng_flow_drops_total{network="home",reason="no-binding"} 7
# HELP tsng_flow_refused_total New flows refused for capacity.
# TYPE tsng_flow_refused_total counter
tsng_flow_refused_total{network="home"} 5
# HELP tsng_listener_bindings Active bindings of a listener.
# TYPE tsng_listener_bindings gauge
tsng_listener_bindings{listener="tcp/443",network="home",vip="api"} 3
# HELP tsng_listener_bytes_total IP bytes forwarded, by direction (out: toward the backend).
# TYPE tsng_listener_bytes_total counter
tsng_listener_bytes_total{direction="in",listener="tcp/443",network="home",vip="api"} 4000
tsng_listener_bytes_total{direction="out",listener="tcp/443",network="home",vip="api"} 1000
# HELP tsng_listener_packets_total IP packets forwarded, by direction (out: toward the backend).
# TYPE tsng_listener_packets_total counter
tsng_listener_packets_total{direction="in",listener="tcp/443",network="home",vip="api"} 8
tsng_listener_packets_total{direction="out",listener="tcp/443",network="home",vip="api"} 10
# HELP tsng_listener_udp_failovers_total UDP bindings moved to another backend.
# TYPE tsng_listener_udp_failovers_total counter
tsng_listener_udp_failovers_total{listener="tcp/443",network="home",vip="api"} 0
# HELP tsng_probe_bytes_total Data-plane probe bytes, apart from user traffic.
# TYPE tsng_probe_bytes_total counter
tsng_probe_bytes_total{direction="in",network="home"} 600
tsng_probe_bytes_total{direction="out",network="home"} 640
# HELP tsng_probe_expired_total Probes that expired unanswered.
# TYPE tsng_probe_expired_total counter
tsng_probe_expired_total{network="home"} 2
# HELP tsng_probe_host_dropped_total Host packets to an overlay address's probe port, dropped: only the agent speaks there.
# TYPE tsng_probe_host_dropped_total counter
tsng_probe_host_dropped_total{network="home"} 4
# HELP tsng_probe_rejected_total Probe packets refused: malformed, late, from an unknown peer or over a peer's reply rate.
# TYPE tsng_probe_rejected_total counter
tsng_probe_rejected_total{network="home"} 3
# HELP tsng_vip_routable 1 when the VIP is routed.
# TYPE tsng_vip_routable gauge
tsng_vip_routable{network="home",vip="api"} 1
`
