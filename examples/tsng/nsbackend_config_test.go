package tsng

import (
	"time"

	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/vip"
)

// TestBackendPortsConfig: backend_ports entries are checked with the
// field's path: malformed or repeated entries, tun mode, and every port of
// the agent itself (its probe, metrics, editor, proxy, control, DNS and
// WireGuard ports), which are refused even when listed.
func TestBackendPortsConfig(t *testing.T) {
	p2, _ := testPeer(2)
	where := "networks[0] (home).backend_ports"
	cases := []struct {
		ports []string
		edit  func(*Config)
		want  string // "" accepts
	}{
		{ports: []string{"tcp/8090", "udp/5300"}},
		{ports: []string{"tcp/9469"}, edit: func(c *Config) { c.Metrics = "127.0.0.1:9469" }, want: `[0] "tcp/9469": a port of the agent itself (metrics)`},
		{ports: []string{"tcp/8090", "tcp/8470"}, edit: func(c *Config) { c.UI = "127.0.0.1:8470" }, want: `[1] "tcp/8470": a port of the agent itself (ui)`},
		{ports: []string{"tcp/1080"}, edit: func(c *Config) { c.Networks[0].SOCKS5 = "127.0.0.1:1080" }, want: `[0] "tcp/1080": a port of the agent itself (networks home socks5)`},
		{ports: []string{"tcp/3128"}, edit: func(c *Config) { c.Networks[0].HTTPProxy = "127.0.0.1:3128" }, want: `(networks home http_proxy)`},
		{ports: []string{"tcp/51830"}, want: `(networks home control_port)`},
		{ports: []string{"udp/5353"}, want: `(networks home dns_port)`},
		{ports: []string{"udp/51821"}, edit: func(c *Config) { c.Networks[0].Node.ListenPort = 51821 }, want: `(networks home node.listen_port (WireGuard))`},
		{ports: []string{fmt.Sprintf("tcp/%d", agentProbePort)}, want: `(the agent's probe port)`},
		{ports: []string{fmt.Sprintf("udp/%d", agentProbePort)}, want: `(the agent's probe port)`},
		{ports: []string{"tcp/0"}, want: `[0] "tcp/0": want tcp/PORT or udp/PORT`},
		{ports: []string{"8080"}, want: `[0] "8080": want tcp/PORT or udp/PORT`},
		{ports: []string{"tcp/8090", "tcp/8090"}, want: `[1] "tcp/8090": listed twice`},
		{ports: []string{"tcp/8090"}, edit: func(c *Config) { c.Networks[0].Mode = "tun" }, want: `: only in netstack mode`},
	}
	for _, tc := range cases {
		cfg := oneNodeConfig(t.TempDir(), p2)
		cfg.Networks[0].BackendPorts = tc.ports
		if tc.edit != nil {
			tc.edit(cfg)
		}
		err := cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v; want accepted", tc.ports, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), where+tc.want) && !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v; want %s%s", tc.ports, err, where, tc.want)
		case tc.want != "" && !strings.Contains(err.Error(), where):
			t.Errorf("%v: %v; want the path %s", tc.ports, err, where)
		}
	}
}

// TestBackendRelayAgentPort: a port the agent takes at run time (the
// editor's, chosen at start) is refused even when backend_ports lists it,
// and this node's status says so of a failing backend; an unlisted port is
// shown not allowed. Other nodes' backends, and an eligible one (served by
// a socket of the node's own stack), keep their reasons.
func TestBackendRelayAgentPort(t *testing.T) {
	self := netip.MustParseAddr("100.80.0.1")
	r := newBackendRelay(self, map[vip.PortKey]bool{{Proto: vip.TCP, Port: 8470}: true, {Proto: vip.TCP, Port: 8090}: true},
		func(k vip.PortKey) bool { return k == vip.PortKey{Proto: vip.TCP, Port: 8470} }, nil)
	from := netip.MustParseAddrPort("100.80.0.2:40000")
	for _, c := range []struct {
		proto string
		to    netip.AddrPort
		want  bool
	}{
		{"tcp", netip.AddrPortFrom(self, 8090), true},
		{"udp", netip.AddrPortFrom(self, 8090), false},
		{"tcp", netip.AddrPortFrom(self, 8470), false},
		{"tcp", netip.AddrPortFrom(self, 8091), false},
		{"tcp", netip.MustParseAddrPort("100.80.0.9:8090"), false},
	} {
		if got := r.want(c.proto, c.to, from); got != c.want {
			t.Errorf("want(%s, %v) = %v; want %v", c.proto, c.to, got, c.want)
		}
	}
	ss := vip.ServiceStatus{Listeners: []vip.ListenerStatus{{Listener: "tcp/80", Backends: []vip.BackendStatus{
		{BackendRef: vip.BackendRef{Port: 8090}, Local: true, Reason: "check-failed"},
		{BackendRef: vip.BackendRef{Port: 8470}, Local: true, Reason: "check-failed"},
		{BackendRef: vip.BackendRef{Port: 8091}, Local: true, Reason: "check-failed"},
		{BackendRef: vip.BackendRef{Port: 8092}, Local: true, Reason: "ok", Eligible: true}, // a socket of the node's own stack
		{BackendRef: vip.BackendRef{Port: 8091}, Reason: "check-failed"},                    // another node's
	}}}}
	r.annotate(&ss)
	got := []string{}
	for _, b := range ss.Listeners[0].Backends {
		got = append(got, fmt.Sprintf("%d %s %v", b.Port, b.Reason, b.Eligible))
	}
	if want := "8090 check-failed false|8470 agent-port false|8091 not-allowed false|8092 ok true|8091 check-failed false"; strings.Join(got, "|") != want {
		t.Errorf("annotated: %s; want %s", strings.Join(got, "|"), want)
	}
}

// TestBackendRelayLimits: the relay holds at most backendTCPConns TCP
// connections and backendUDPFlows UDP flows; one more of either is
// refused and counted, and a released slot is taken again.
func TestBackendRelayLimits(t *testing.T) {
	r := newBackendRelay(netip.Addr{}, map[vip.PortKey]bool{}, func(vip.PortKey) bool { return false }, nil)
	for _, c := range []struct {
		udp   bool
		limit int
	}{{false, backendTCPConns}, {true, backendUDPFlows}} {
		for i := range c.limit {
			if !r.reserve(c.udp) {
				t.Fatalf("udp %v: slot %d refused", c.udp, i)
			}
		}
		before := r.overLimit.Load()
		if r.reserve(c.udp) {
			t.Fatalf("udp %v: slot %d taken beyond the limit", c.udp, c.limit)
		}
		if r.overLimit.Load() != before+1 {
			t.Errorf("udp %v: over_limit %d, want %d", c.udp, r.overLimit.Load(), before+1)
		}
		r.unreserve(c.udp)
		if !r.reserve(c.udp) {
			t.Fatalf("udp %v: a released slot is refused", c.udp)
		}
	}
	if st := r.Stats(); st.TCPActive != backendTCPConns || st.UDPFlows != backendUDPFlows || st.OverLimit != 2 {
		t.Errorf("stats %+v", st)
	}
	for range backendTCPConns {
		r.unreserve(false)
	}
	for range backendUDPFlows {
		r.unreserve(true)
	}
	r.Close()
	if r.reserve(false) {
		t.Error("a closed relay took a connection")
	}
}

// TestBackendRelayRefusesForwards: a `vip forward` listener's host port is
// the agent's while it is open, so the relay refuses it even when listed.
func TestBackendRelayRefusesForwards(t *testing.T) {
	d := &Daemon{agentPorts: map[vip.PortKey]string{}}
	k := vip.PortKey{Proto: vip.UDP, Port: 8090}
	d.holdPort(k, "vip forward", true)
	d.holdPort(k, "vip forward", true)
	d.holdPort(k, "vip forward", false)
	if !d.agentPortNow(k) {
		t.Error("an open forward's port is not the agent's")
	}
	if d.agentPortNow(vip.PortKey{Proto: vip.TCP, Port: 8090}) {
		t.Error("tcp/8090 taken by a udp forward")
	}
	d.holdPort(k, "vip forward", false)
	if d.agentPortNow(k) {
		t.Error("a closed forward's port is still the agent's")
	}
}

// TestBackendRelayCloseDoesNotWait: Close, which the network's stop calls
// under its lock, returns while an attempt is still in the netstack
// handshake (a reserve not yet matched); Wait, called once the host is
// closed, is what waits for it.
func TestBackendRelayCloseDoesNotWait(t *testing.T) {
	r := newBackendRelay(netip.Addr{}, map[vip.PortKey]bool{}, func(vip.PortKey) bool { return false }, nil)
	if !r.reserve(false) {
		t.Fatal("reserve refused on an open relay")
	}
	closed := make(chan struct{})
	go func() { r.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for an attempt still in its handshake")
	}
	if r.reserve(true) {
		t.Fatal("a closed relay took a new flow")
	}
	waited := make(chan struct{})
	go func() { r.Wait(); close(waited) }()
	select {
	case <-waited:
		t.Fatal("Wait returned with an attempt outstanding")
	default:
	}
	r.unreserve(false)
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return once the attempt ended")
	}
}
