package flow

import (
	"encoding/binary"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/faketime"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/vipkit/vipkit/packet"
)

// gvisorNAT is gVisor netstack's own NAT: a forwarding stack with two
// channel NICs (client side, backend side) and an iptables DNAT rule in
// the NAT table's PREROUTING chain, with conntrack.
type gvisorNAT struct {
	s       *stack.Stack
	in, out *channel.Endpoint
}

func newGVisorNAT(tb testing.TB, vip, backend [4]byte, vport, bport uint16) *gvisorNAT {
	// A manual clock: the conntrack reaper is scheduled on it and so never
	// runs (nor leaks a goroutine) during or after the benchmark.
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol}, // Prerouting drops everything without them
		Clock:              faketime.NewManualClock(),
	})
	g := &gvisorNAT{s: s, in: channel.New(256, 1500, ""), out: channel.New(256, 1500, "")}
	must := func(err tcpip.Error) {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
	}
	must(s.CreateNIC(1, g.in))
	must(s.CreateNIC(2, g.out))
	must(s.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddrFrom4([4]byte{100, 80, 0, 254}).WithPrefix()}, stack.AddressProperties{}))
	must(s.AddProtocolAddress(2, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddrFrom4(localAddr.As4()).WithPrefix()}, stack.AddressProperties{}))
	backendNet, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{backend[0], backend[1], 0, 0}), tcpip.MaskFromBytes([]byte{255, 255, 0, 0}))
	clientNet, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{100, 80, 0, 0}), tcpip.MaskFromBytes([]byte{255, 255, 0, 0}))
	s.SetRouteTable([]tcpip.Route{{Destination: backendNet, NIC: 2}, {Destination: clientNet, NIC: 1}})
	must(s.SetForwardingDefaultAndAllNICs(ipv4.ProtocolNumber, true))

	filter := stack.EmptyFilter4()
	filter.Protocol, filter.CheckProtocol = udp.ProtocolNumber, true
	filter.Dst = tcpip.AddrFrom4(vip)
	filter.DstMask = tcpip.AddrFrom4([4]byte{255, 255, 255, 255})
	accept := func() stack.Rule {
		return stack.Rule{Filter: stack.EmptyFilter4(), Target: &stack.AcceptTarget{NetworkProtocol: header.IPv4ProtocolNumber}}
	}
	table := stack.Table{
		Rules: []stack.Rule{
			{Filter: filter, Target: &stack.DNATTarget{Addr: tcpip.AddrFrom4(backend), Port: bport, NetworkProtocol: header.IPv4ProtocolNumber, ChangeAddress: true, ChangePort: true}},
			accept(), // PREROUTING underflow
			accept(), // INPUT
			accept(), // OUTPUT
			accept(), // POSTROUTING
			{Filter: stack.EmptyFilter4(), Target: &stack.ErrorTarget{NetworkProtocol: header.IPv4ProtocolNumber}},
		},
		BuiltinChains: [stack.NumHooks]int{stack.Prerouting: 0, stack.Input: 2, stack.Forward: stack.HookUnset, stack.Output: 3, stack.Postrouting: 4},
		Underflows:    [stack.NumHooks]int{stack.Prerouting: 1, stack.Input: 2, stack.Forward: stack.HookUnset, stack.Output: 3, stack.Postrouting: 4},
	}
	s.IPTables().ReplaceTable(stack.NATID, table, false)
	return g
}

// forward pushes one packet in and returns the forwarded packet's bytes
// (into dst), or nil.
func (g *gvisorNAT) forward(pkt, dst []byte) []byte {
	pb := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(pkt)})
	g.in.InjectInbound(ipv4.ProtocolNumber, pb)
	pb.DecRef()
	out := g.out.Read()
	if out == nil {
		return nil
	}
	v := out.ToView()
	n := copy(dst, v.AsSlice())
	v.Release()
	out.DecRef()
	return dst[:n]
}

func (g *gvisorNAT) close() {
	g.s.Close()
	g.s.Wait()
	g.s.Destroy()
}

// BenchmarkVsGVisorNAT runs the same stream of 64-byte UDP packets (256
// flows to one VIP) through gVisor netstack's forwarding path with an
// iptables DNAT rule and conntrack, and through this package's FromHost,
// each measured from packet in to packet out. It reports both per-packet
// costs and their ratio (goal: ≥ 30×).
func BenchmarkVsGVisorNAT(b *testing.B) {
	const flows = 256
	vip, backend := vipAddr.As4(), be1.Addr.As4()
	g := newGVisorNAT(b, vip, backend, 53, be1.Port)
	defer g.close()
	n, err := New(Options{LocalAddr: localAddr, Selector: SelectorFunc(func(SelectRequest) int { return 0 }), MTU: 1500})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	if err := n.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}); err != nil {
		b.Fatal(err)
	}
	stream := make([][]byte, flows)
	for i := range stream {
		stream[i] = P{Src: netipFrom([4]byte{100, 80, 0, byte(i)}), Dst: vipAddr, Proto: ProtoUDP,
			Sport: uint16(1000 + i), Dport: 53, Payload: make([]byte, 64-28)}.Build()
	}
	// Both really translate: check once.
	out := make([]byte, 1500)
	got := g.forward(stream[0], out)
	if got == nil || packet.IPv4(got).Dst() != be1.Addr || binary.BigEndian.Uint16(got[22:]) != be1.Port {
		st := g.s.Stats().IP
		b.Fatalf("gVisor did not DNAT: %x (received %d, prerouting dropped %d, invalid dst %d, forward errs %d/%d/%d, malformed %d)", got,
			st.PacketsReceived.Value(), st.IPTablesPreroutingDropped.Value(), st.InvalidDestinationAddressesReceived.Value(),
			st.Forwarding.Errors.Value(), st.Forwarding.Unrouteable.Value(), st.Forwarding.ExhaustedTTL.Value(), st.MalformedPacketsReceived.Value())
	}
	pkt := make([]byte, 64)
	copy(pkt, stream[0])
	if r := n.FromHost(pkt, time.Now()); r.Verdict != Forward || packet.IPv4(pkt).Dst() != be1.Addr {
		b.Fatalf("flow: %v", r)
	}

	b.ReportAllocs()
	b.SetBytes(64)
	b.ResetTimer()
	t0, c0 := time.Now(), cpuTime()
	for i := range b.N {
		if g.forward(stream[i%flows], out) == nil {
			b.Fatal("gVisor dropped a packet")
		}
	}
	tg, cg := time.Since(t0), cpuTime()-c0
	t1, c1 := time.Now(), cpuTime()
	for i := range b.N {
		copy(pkt, stream[i%flows])
		if r := n.FromHost(pkt, t1); r.Verdict != Forward {
			b.Fatal(r)
		}
	}
	tf, cf := time.Since(t1), cpuTime()-c1
	b.StopTimer()
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	b.ReportMetric(per(tg), "gvisor-ns/pkt")
	b.ReportMetric(per(tf), "flow-ns/pkt")
	b.ReportMetric(per(tg)/per(tf), "speedup")
	if cf > 0 {
		b.ReportMetric(float64(cg)/float64(cf), "cpu-speedup")
	}
}
