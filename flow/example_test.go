package flow_test

import (
	"fmt"
	"net/netip"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/packet"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// udpPacket builds an IPv4/UDP packet with correct checksums.
func udpPacket(src, dst netip.AddrPort, payload string) []byte {
	p, err := packet.AppendUDP(nil, packet.IPv4Fields{Src: src.Addr(), Dst: dst.Addr()},
		packet.UDPFields{SrcPort: src.Port(), DstPort: dst.Port()}, []byte(payload))
	if err != nil {
		panic(err)
	}
	return p
}

func show(p []byte) string {
	ip := packet.IPv4(p)
	u := packet.UDP(ip.Payload())
	return fmt.Sprintf("%v:%d → %v:%d", ip.Src(), u.SrcPort(), ip.Dst(), u.DstPort())
}

// A client node translates a datagram to a VIP into one to the backend,
// and the backend's reply back into one from the VIP.
func Example() {
	clock := transporttest.NewManualClock()
	local := netip.MustParseAddr("100.64.0.1")
	vip := netip.MustParseAddr("100.100.0.10")
	backend := flow.Backend{Peer: 2, Addr: netip.MustParseAddr("100.64.0.2"), Port: 5353}

	nat, err := flow.New(flow.Options{
		LocalAddr: local,
		Selector:  flow.SelectorFunc(func(req flow.SelectRequest) int { return 0 }),
		Reserver:  flow.NewMemReserver(flow.MemReserverOptions{Seed: 1}),
		Clock:     clock,
	})
	if err != nil {
		panic(err)
	}
	defer nat.Close()
	dns := flow.Listener{VIP: vip, Proto: flow.ProtoUDP, Port: 53}
	if err := nat.SetListener(dns, flow.ListenerConfig{Backends: []flow.Backend{backend}}); err != nil {
		panic(err)
	}

	q := udpPacket(netip.AddrPortFrom(local, 40000), netip.AddrPortFrom(vip, 53), "query")
	r := nat.FromHost(q, clock.Now())
	fmt.Println(r.Verdict, "to peer", r.Peer, show(q))

	a := udpPacket(netip.AddrPortFrom(backend.Addr, 5353), netip.AddrPortFrom(local, packet.UDP(packet.IPv4(q).Payload()).SrcPort()), "answer")
	r = nat.FromPeer(a, backend.Peer, clock.Now())
	fmt.Println(r.Verdict, show(a))

	// A peer may never claim the VIP.
	spoof := udpPacket(netip.AddrPortFrom(vip, 53), netip.AddrPortFrom(local, 40000), "spoof")
	fmt.Println(nat.FromPeer(spoof, backend.Peer, clock.Now()).Reason)
	// Output:
	// forward to peer 2 100.64.0.1:47659 → 100.64.0.2:5353
	// forward 100.100.0.10:53 → 100.64.0.1:40000
	// vip-source
}

// Bindings retire after their idle timeout and then stay quarantined, so
// late replies to the shadow port are dropped and the port is not reused.
func ExampleNAT_Bindings() {
	clock := transporttest.NewManualClock()
	local := netip.MustParseAddr("100.64.0.1")
	vip := netip.MustParseAddr("100.100.0.10")
	nat, _ := flow.New(flow.Options{
		LocalAddr: local,
		Selector:  flow.SelectorFunc(func(flow.SelectRequest) int { return 0 }),
		Clock:     clock,
	})
	defer nat.Close()
	l := flow.Listener{VIP: vip, Proto: flow.ProtoUDP, Port: 53}
	nat.SetListener(l, flow.ListenerConfig{Backends: []flow.Backend{{Peer: 2, Addr: netip.MustParseAddr("100.64.0.2"), Port: 53}}})
	nat.FromHost(udpPacket(netip.AddrPortFrom(local, 40000), netip.AddrPortFrom(vip, 53), "q"), clock.Now())

	fmt.Println(nat.Bindings()[0].State)
	clock.Advance(flow.DefaultUDPIdleTimeout)
	fmt.Println(nat.Bindings()[0].State)
	clock.Advance(flow.DefaultQuarantine)
	fmt.Println(len(nat.Bindings()))
	// Output:
	// active
	// quarantined
	// 0
}
