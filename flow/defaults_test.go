package flow

import (
	"encoding/binary"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/vipkit/vipkit/packet"
)

// The defaults tests pin each number of docs/defaults.md by behaviour, with
// literal values: a test that used the Default constants would pass with
// any value of them.

// TestDefaultCapacity4096: with Options.Capacity zero the table holds 4096
// bindings; the 4097th flow is refused and counted, and nothing is evicted.
func TestDefaultCapacity4096(t *testing.T) {
	f := newFixture(t)
	if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}): %v", err)
	}
	for i := range 4096 {
		r := f.host(udpTo(uint16(1000+i), "q"))
		if r.Verdict != Forward {
			t.Fatalf("flow %d of 4096: r.Verdict = %v, want %v", i+1, r.Verdict, Forward)
		}
	}
	if want, got := (Result{Verdict: Drop, Reason: ReasonCapacity}), f.host(udpTo(1000+4096, "q")); got != want {
		t.Fatalf("the 4097th flow: f.host(udpTo(1000+4096, \"q\")) = %v, want %v", got, want)
	}
	st := f.nat.Stats()
	if st.Capacity != 4096 {
		t.Fatalf("st.Capacity = %v, want %v", st.Capacity, 4096)
	}
	if st.Active != 4096 {
		t.Fatalf("st.Active = %v, want %v", st.Active, 4096)
	}
	if st.Refused != uint64(1) {
		t.Fatalf("st.Refused = %v, want %v", st.Refused, uint64(1))
	}
	if got := f.host(udpTo(1000, "again")).Verdict; got != Forward {
		t.Fatalf("an existing flow still passes: f.host(udpTo(1000, \"again\")).Verdict = %v, want %v", got, Forward)
	}
}

// TestDefaultUDPIdle120s: a UDP binding lasts exactly 120 s after its last
// datagram.
func TestDefaultUDPIdle120s(t *testing.T) {
	f := newFixture(t)
	if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}): %v", err)
	}
	if got := f.host(udpTo(5000, "q")).Verdict; got != Forward {
		t.Fatalf("f.host(udpTo(5000, \"q\")).Verdict = %v, want %v", got, Forward)
	}
	t0 := f.clock.Now()
	if want, got := t0.Add(120*time.Second), f.nat.Bindings()[0].Expires; !reflect.DeepEqual(got, want) {
		t.Fatalf("f.nat.Bindings()[0].Expires = %v, want %v", got, want)
	}
	f.nat.Expire(t0.Add(120*time.Second - 1))
	if got := f.nat.Bindings()[0].State; got != Active {
		t.Fatalf("1 ns before 120 s: f.nat.Bindings()[0].State = %v, want %v", got, Active)
	}
	f.nat.Expire(t0.Add(120 * time.Second))
	if got := f.nat.Bindings()[0].State; got != Quarantined {
		t.Fatalf("at 120 s: f.nat.Bindings()[0].State = %v, want %v", got, Quarantined)
	}
}

// TestDefaultQuarantine120s: a retired shadow port stays quarantined for
// exactly 120 s: late replies are dropped until then, and the port is
// released at 120 s.
func TestDefaultQuarantine120s(t *testing.T) {
	f := newFixture(t)
	if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}, IdleTimeout: 10 * time.Second}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}, IdleTimeout: 10 * time.Second}): %v", err)
	}
	p := udpTo(5000, "q")
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	retired := f.clock.Now().Add(10 * time.Second)
	f.nat.Expire(retired)
	if got := f.nat.Bindings()[0].State; got != Quarantined {
		t.Fatalf("f.nat.Bindings()[0].State = %v, want %v", got, Quarantined)
	}
	if want, got := retired.Add(120*time.Second), f.nat.Bindings()[0].Expires; !reflect.DeepEqual(got, want) {
		t.Fatalf("f.nat.Bindings()[0].Expires = %v, want %v", got, want)
	}

	late := replyTo(p, 0, "late")
	if want, got := (Result{Verdict: Drop, Reason: ReasonQuarantined}), f.nat.FromPeer(late, be1.Peer, retired.Add(120*time.Second-1)); got != want {
		t.Fatalf("f.nat.FromPeer(late, be1.Peer, retired.Add(120*time.Second-1)) = %v, want %v", got, want)
	}
	if got := f.res.InUse(); got != 1 {
		t.Fatalf("1 ns before the end of the quarantine: f.res.InUse() = %v, want %v", got, 1)
	}
	f.nat.Expire(retired.Add(120 * time.Second))
	if got := f.nat.Bindings(); len(got) != 0 {
		t.Fatalf("at 120 s: f.nat.Bindings() = %v, want empty", got)
	}
	if got := f.res.InUse(); got != 0 {
		t.Fatalf("f.res.InUse() = %v, want %v", got, 0)
	}
	late = replyTo(p, 0, "later")
	if got := f.nat.FromPeer(late, be1.Peer, retired.Add(120*time.Second)).Verdict; got != Pass {
		t.Fatalf("f.nat.FromPeer(late, be1.Peer, retired.Add(120*time.Second)).Verdict = %v, want %v", got, Pass)
	}
}

// firstFragment is the first fragment (MF set, offset 0) of a UDP datagram
// from src to dst with IPv4 id.
func firstFragment(src, dst netip.AddrPort, id uint16) []byte {
	p := P{Src: src.Addr(), Dst: dst.Addr(), Proto: ProtoUDP, Sport: src.Port(), Dport: dst.Port(), Payload: make([]byte, 16), ID: id}.Build()
	binary.BigEndian.PutUint16(p[6:], packet.IPv4FlagMF)
	packet.IPv4(p).UpdateChecksum()
	return p
}

// TestDefaultMaxFragDatagrams64: with the defaults the fragment cache holds
// 64 incomplete datagrams in all (at most half of them per sender): 32 from
// the host and 32 from a peer fill it, and the 65th, from a third sender
// with none held, is refused.
func TestDefaultMaxFragDatagrams64(t *testing.T) {
	f := newFixture(t)
	if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}): %v", err)
	}
	if err := f.nat.SetListener(Listener{VIP: vip2Addr, Proto: ProtoUDP, Port: 53}, ListenerConfig{Backends: []Backend{be2}}); err != nil {
		t.Fatalf("f.nat.SetListener(Listener{VIP: vip2Addr, Proto: ProtoUDP, Port: 53}, ListenerConfig{Backends: []Backend{be2}}): %v", err)
	}
	// Bindings to be1 and be2: their fragments are NAT traffic.
	if got := f.host(udpTo(5000, "q")).Verdict; got != Forward {
		t.Fatalf("f.host(udpTo(5000, \"q\")).Verdict = %v, want %v", got, Forward)
	}
	if got := f.host(P{Src: localAddr, Dst: vip2Addr, Proto: ProtoUDP, Sport: 5001, Dport: 53}.Build()).Verdict; got != Forward {
		t.Fatalf("f.host(P{Src: localAddr, Dst: vip2Addr, Proto: ProtoUDP, Sport: 5001, Dport: 53}.Build()).Verdict = %v, want %v", got, Forward)
	}

	client := netip.AddrPortFrom(localAddr, 6000)
	vip := netip.AddrPortFrom(vipAddr, 53)
	for i := range 32 {
		if got := f.host(firstFragment(client, vip, uint16(i+1))).Verdict; got != Consumed {
			t.Fatalf("host datagram %d: f.host(firstFragment(client, vip, uint16(i+1))).Verdict = %v, want %v", i+1, got, Consumed)
		}
	}
	if want, got := (Result{Verdict: Drop, Reason: ReasonFragLimit}), f.host(firstFragment(client, vip, 100)); got != want {
		t.Fatalf("the host's 33rd: f.host(firstFragment(client, vip, 100)) = %v, want %v", got, want)
	}
	from1 := netip.AddrPortFrom(be1.Addr, be1.Port)
	for i := range 32 {
		if got := f.peer(be1.Peer, firstFragment(from1, netip.AddrPortFrom(localAddr, 40000), uint16(i+1))).Verdict; got != Consumed {
			t.Fatalf("peer datagram %d: f.peer(be1.Peer, firstFragment(from1, netip.AddrPortFrom(localAddr, 40000), uint16(i+1))).Verdict = %v, want %v", i+1, got, Consumed)
		}
	}
	if got := f.nat.Stats().FragPending; got != 64 {
		t.Fatalf("f.nat.Stats().FragPending = %v, want %v", got, 64)
	}
	from2 := netip.AddrPortFrom(be2.Addr, be2.Port)
	if want, got := (Result{Verdict: Drop, Reason: ReasonFragLimit}), f.peer(be2.Peer, firstFragment(from2, netip.AddrPortFrom(localAddr, 40001), 1)); got != want {
		t.Fatalf("the 65th: f.peer(be2.Peer, firstFragment(from2, netip.AddrPortFrom(localAddr, 40001), 1)) = %v, want %v", got, want)
	}
	if got := f.nat.Stats().FragPending; got != 64 {
		t.Fatalf("f.nat.Stats().FragPending = %v, want %v", got, 64)
	}
}
