package vip

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/internal/testenv"
)

// udpExchange sends one datagram from client to the udp/53 VIP through the
// engine's host path and, when it went to the peer, hands the peer's reply
// to the engine's Write. It returns the backend address the datagram went
// to and the packet sizes out and in (in is 0 for a hairpin).
func (u *unitEngine) udpExchange(t *testing.T, client netip.AddrPort, vip netip.Addr, payload string) (netip.Addr, int, int) {
	t.Helper()
	b := newBatch(1, 2048)
	dgram := ipv4Packet(17, client, netip.AddrPortFrom(vip, 53), 0, []byte(payload))
	if u.hostBatch(b, dgram) != 1 {
		return u.self.Addr, len(dgram), 0 // hairpinned into the host
	}
	out := b.bufs[0][:b.sizes[0]]
	dst := netip.AddrFrom4([4]byte(out[16:20]))
	shadow := binary.BigEndian.Uint16(out[20:])
	bport := binary.BigEndian.Uint16(out[22:])
	reply := ipv4Packet(17, netip.AddrPortFrom(dst, bport), netip.AddrPortFrom(u.self.Addr, shadow), 0, []byte("re:"+payload))
	if _, err := u.e.Write([][]byte{reply}, 0); err != nil {
		t.Fatal(err)
	}
	return dst, len(dgram), len(reply)
}

func trafficOf(s BackendStatus) Traffic { return s.Traffic }

// TestEngineBackendCountersSurviveBindingExpiry: a backend's counters are
// cumulative; they stay as they were once its bindings expired and left
// quarantine.
func TestEngineBackendCountersSurviveBindingExpiry(t *testing.T) {
	checkLeaks(t)
	u := newUnitEngine(t, testenv.Seed(t, 21))
	u.host.onWrite = func([]byte) {}
	ctx := context.Background()
	k := PortKey{UDP, 53}
	if _, err := u.reg.PortAdd(ctx, "api", k, []Backend{{u.peer.ID, 5353}}); err != nil {
		t.Fatal(err)
	}
	client := netip.AddrPortFrom(u.self.Addr, 40000)
	var want Traffic
	for i := range 3 {
		to, out, in := u.udpExchange(t, client, u.svc.Addr, "q")
		if to != u.peer.Addr || in == 0 {
			t.Fatalf("datagram %d went to %v (reply %d bytes), want the peer", i, to, in)
		}
		want.PacketsOut++
		want.BytesOut += uint64(out)
		want.PacketsIn++
		want.BytesIn += uint64(in)
	}
	l, _ := listenerOf1(u.e, "api", "udp/53")
	if got := trafficOf(backendOf1(l, u.peer.ID)); got != want || l.Traffic != want {
		t.Fatalf("with the binding active: backend %+v, listener %+v; want %+v", got, l.Traffic, want)
	}
	// Idle expiry, then the end of the quarantine: no binding is left.
	u.clock.Advance(DefaultUDPIdle + flow.DefaultQuarantine + 2*time.Second)
	if n := len(u.e.NAT().Bindings()); n != 0 {
		t.Fatalf("%d bindings left after idle expiry and quarantine", n)
	}
	l, _ = listenerOf1(u.e, "api", "udp/53")
	if got := trafficOf(backendOf1(l, u.peer.ID)); got != want {
		t.Fatalf("after the bindings expired: backend counters %+v, want them unchanged: %+v", got, want)
	}
	if l.Traffic != want {
		t.Fatalf("after the bindings expired: listener counters %+v, want %+v", l.Traffic, want)
	}
}

// TestEngineCountersCumulativeAcrossRemoval: a backend's UDP failovers
// count per backend; a removed backend's counts stay in its listener's and
// its VIP's totals after it is gone, a removed listener's in its VIP's;
// the totals never fall, and a new engine (an agent restart) starts at 0.
func TestEngineCountersCumulativeAcrossRemoval(t *testing.T) {
	checkLeaks(t)
	u := newUnitEngine(t, testenv.Seed(t, 22))
	u.host.onWrite = func([]byte) {}
	ctx := context.Background()
	k := PortKey{UDP, 53}
	if _, err := u.reg.PortAdd(ctx, "api", k, []Backend{{u.peer.ID, 5353}}); err != nil {
		t.Fatal(err)
	}
	client := netip.AddrPortFrom(u.self.Addr, 40000)
	status := func() (ServiceStatus, ListenerStatus) {
		t.Helper()
		s, err := u.e.ServiceStatus("api")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range s.Listeners {
			if l.Listener == "udp/53" {
				return s, l
			}
		}
		return s, ListenerStatus{}
	}
	var prev Totals
	monotonic := func(when string) Totals {
		t.Helper()
		s, _ := status()
		c := s.Totals
		if c.PacketsOut < prev.PacketsOut || c.BytesOut < prev.BytesOut || c.PacketsIn < prev.PacketsIn ||
			c.BytesIn < prev.BytesIn || c.Created < prev.Created || c.Failovers < prev.Failovers {
			t.Fatalf("%s: VIP totals fell from %+v to %+v", when, prev, c)
		}
		prev = c
		return c
	}

	to, out, in := u.udpExchange(t, client, u.svc.Addr, "q")
	if to != u.peer.Addr {
		t.Fatalf("first datagram went to %v, want the peer", to)
	}
	peerTraffic := Traffic{PacketsOut: 1, BytesOut: uint64(out), PacketsIn: 1, BytesIn: uint64(in)}
	if tot := monotonic("one exchange"); tot.Traffic != peerTraffic || tot.Created != 1 {
		t.Fatalf("VIP totals %+v, want %+v and 1 binding", tot, peerTraffic)
	}
	// A local backend joins; the peer's probes go unanswered, so after two
	// expire it is excluded and the binding fails over to the local one.
	if _, err := u.reg.BackendAdd(ctx, "api", k, Backend{u.self.ID, 5353}); err != nil {
		t.Fatal(err)
	}
	u.clock.Advance(5 * time.Second)
	monotonic("the peer excluded")
	if to, _, _ := u.udpExchange(t, client, u.svc.Addr, "q"); to != u.self.Addr {
		t.Fatalf("after the peer was excluded the datagram went to %v, want the local backend", to)
	}
	_, l := status()
	peer, local := backendOf1(l, u.peer.ID), backendOf1(l, u.self.ID)
	if peer.Failovers != 1 || local.Failovers != 0 || l.Failovers != 1 {
		t.Fatalf("udp failovers: peer %d, local %d, listener %d; want 1, 0, 1", peer.Failovers, local.Failovers, l.Failovers)
	}
	if peer.Traffic != peerTraffic || peer.Created != 1 || local.Created != 1 || local.PacketsOut != 1 {
		t.Fatalf("per-backend counters: peer %+v, local %+v", peer, local)
	}
	if tot := monotonic("after the failover"); tot.Failovers != 1 || tot.Created != 2 || tot.PacketsOut != 2 {
		t.Fatalf("VIP totals %+v, want 1 failover, 2 bindings, 2 packets out", tot)
	}

	// The peer is removed: its quarantined binding keeps it listed as
	// draining until the quarantine ends; then it is gone, and its counts
	// stay in the listener's and the VIP's.
	if _, err := u.reg.BackendRemove(ctx, "api", k, Backend{u.peer.ID, 5353}); err != nil {
		t.Fatal(err)
	}
	_, l = status()
	if len(l.DrainingBackends) != 1 || l.DrainingBackends[0].Node != u.peer.ID || !l.DrainingBackends[0].Draining ||
		l.DrainingBackends[0].Traffic != peerTraffic || l.DrainingBackends[0].Failovers != 1 {
		t.Fatalf("draining backends %+v, want the removed peer with its counters", l.DrainingBackends)
	}
	before := l.Traffic
	u.clock.Advance(flow.DefaultQuarantine + time.Second)
	_, l = status()
	if len(l.DrainingBackends) != 0 || len(l.Backends) != 1 {
		t.Fatalf("the removed peer is still listed: backends %+v, draining %+v", l.Backends, l.DrainingBackends)
	}
	if l.Traffic != before || l.Failovers != 1 || l.Created != 2 {
		t.Fatalf("listener counters changed when the removed backend went: %+v, were %+v", l, before)
	}
	monotonic("the removed backend gone")

	// The listener is removed: it drains (the local binding) and then the
	// NAT forgets it; the VIP's totals keep its counts.
	if _, err := u.reg.PortRemove(ctx, "api", k); err != nil {
		t.Fatal(err)
	}
	monotonic("the listener removed")
	u.clock.Advance(DefaultUDPIdle + flow.DefaultQuarantine + 2*time.Second)
	if st := u.e.Status(); len(st.Draining) != 0 {
		t.Fatalf("the removed listener still drains: %+v", st.Draining)
	}
	if tot := monotonic("the listener gone"); tot.Failovers != 1 || tot.Created != 2 || tot.PacketsOut != 2 || tot.PacketsIn != 1 {
		t.Fatalf("VIP totals after the listener went: %+v", tot)
	}
	if !json.Valid(u.e.Status().JSON()) {
		t.Fatal("status JSON is not valid")
	}
	// An agent restart: a new engine on the same Registry starts at 0.
	u.e.Close()
	e2, err := NewEngine(EngineOptions{Registry: u.reg, Self: u.self.ID, Host: &recHost{done: make(chan struct{})}, Clock: u.clock})
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	s, err := e2.ServiceStatus("api")
	if err != nil {
		t.Fatal(err)
	}
	if s.Totals.Traffic != (Traffic{}) || s.Totals.Created != 0 || s.Totals.Failovers != 0 {
		t.Fatalf("a restarted engine's totals: %+v, want 0", s.Totals)
	}
}

// TestEngineTotalsGoWithTheService: a deleted service's carried totals
// and listener entries go once nothing of it is left in the NAT, so the
// totals' memory stays bounded by what is configured.
func TestEngineTotalsGoWithTheService(t *testing.T) {
	checkLeaks(t)
	u := newUnitEngine(t, testenv.Seed(t, 23))
	u.host.onWrite = func([]byte) {}
	ctx := context.Background()
	if _, err := u.reg.PortAdd(ctx, "api", PortKey{UDP, 53}, []Backend{{u.peer.ID, 5353}}); err != nil {
		t.Fatal(err)
	}
	u.udpExchange(t, netip.AddrPortFrom(u.self.Addr, 40000), u.svc.Addr, "q")
	sizes := func() (int, int) {
		u.e.cfgMu.Lock()
		defer u.e.cfgMu.Unlock()
		u.e.totalsMu.Lock()
		defer u.e.totalsMu.Unlock()
		return len(u.e.carried), len(u.e.listenerService)
	}
	if c, l := sizes(); c != 0 || l != 2 {
		t.Fatalf("with two listeners: %d carried, %d listener entries", c, l)
	}
	sv, err := u.e.ServiceStatus("api")
	if err != nil {
		t.Fatal(err)
	}
	if err := u.reg.Remove(ctx, "api", sv.Revision); err != nil {
		t.Fatal(err)
	}
	// tcp/443 had no binding: forgotten at once; udp/53 drains.
	if c, l := sizes(); c != 1 || l != 1 {
		t.Fatalf("udp/53 draining: %d carried, %d listener entries; want 1 and 1", c, l)
	}
	u.clock.Advance(DefaultUDPIdle + flow.DefaultQuarantine + 2*time.Second)
	if c, l := sizes(); c != 0 || l != 0 {
		t.Fatalf("after the drain: %d carried, %d listener entries; want none", c, l)
	}
}
