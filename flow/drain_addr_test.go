package flow

import (
	"bytes"
	"testing"

	"github.com/vipkit/vipkit/packet"
)

// ownerPeer is the node that holds vipAddr once the VIP has moved away
// from it (its address won the collision).
const ownerPeer PeerID = 9

// movedFixture: a TCP binding to be1 (client port 40000, established) and
// a hairpinned UDP binding to the local backend (client port 5000), then
// every listener of vipAddr removed, as the engine does when the VIP
// moves: vipAddr only drains. It returns the fixture, the hairpinned
// datagram as the local backend saw it, and the TCP reply tuple's shadow.
func movedFixture(t *testing.T) (*fixture, []byte) {
	t.Helper()
	f := newFixture(t)
	setTCP(t, f, be1)
	openTCP(t, f, 40000)
	if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{beLocal}}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, beLocal): %v", err)
	}
	hp := udpTo(5000, "q")
	if got := f.host(hp).Verdict; got != Reflect {
		t.Fatalf("hairpin: f.host(hp).Verdict = %v, want %v", got, Reflect)
	}
	if got := f.nat.RemoveVIP(vipAddr); got != 2 {
		t.Fatalf("f.nat.RemoveVIP(vipAddr) = %v, want 2", got)
	}
	if !f.nat.IsVIP(vipAddr) {
		t.Fatal("a draining VIP address is no longer the NAT's")
	}
	f.takeOut()
	return f, hp
}

// TestMovedVIPReachesNewOwner: while the old VIP address drains, traffic
// to and from the node that now holds the address passes untouched, in
// both directions, and the draining bindings go on being translated.
func TestMovedVIPReachesNewOwner(t *testing.T) {
	f, _ := movedFixture(t)
	// From the host to the new owner: new TCP flows (to the old
	// listener's port and to others), UDP, ICMP echo.
	for _, c := range []struct {
		name string
		pkt  []byte
	}{
		{"SYN to the old listener's port", syn(40001, 7)},
		{"SYN to another port", P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40002, Dport: 22, Flags: packet.TCPFlagSYN, Seq: 1}.Build()},
		{"ACK without a binding", P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40003, Dport: 22, Flags: packet.TCPFlagACK, Seq: 1}.Build()},
		{"UDP to the old listener's port", udpTo(5001, "x")},
		{"ICMP echo", P{Src: localAddr, Dst: vipAddr, Proto: ProtoICMP, ICMPType: 8}.Build()},
	} {
		cp := bytes.Clone(c.pkt)
		if got := f.host(c.pkt); got != (Result{}) {
			t.Errorf("host %s: f.host(pkt) = %v, want Pass", c.name, got)
		}
		if !bytes.Equal(c.pkt, cp) {
			t.Errorf("host %s: the packet was rewritten", c.name)
		}
	}
	// From the new owner to this node.
	for _, c := range []struct {
		name string
		pkt  []byte
	}{
		{"SYN", P{Src: vipAddr, Dst: localAddr, Proto: ProtoTCP, Sport: 5555, Dport: 22, Flags: packet.TCPFlagSYN, Seq: 1}.Build()},
		{"SYN-ACK to the host's new flow", P{Src: vipAddr, Dst: localAddr, Proto: ProtoTCP, Sport: 443, Dport: 40001, Flags: packet.TCPFlagSYN | packet.TCPFlagACK, Seq: 1, Ack: 8}.Build()},
		{"UDP", P{Src: vipAddr, Dst: localAddr, Proto: ProtoUDP, Sport: 53, Dport: 5001, Payload: []byte("a")}.Build()},
		{"ICMP echo reply", P{Src: vipAddr, Dst: localAddr, Proto: ProtoICMP}.Build()},
	} {
		cp := bytes.Clone(c.pkt)
		if got := f.peer(ownerPeer, c.pkt); got != (Result{}) {
			t.Errorf("from the new owner, %s: f.peer(pkt) = %v, want Pass", c.name, got)
		}
		if !bytes.Equal(c.pkt, cp) {
			t.Errorf("from the new owner, %s: the packet was rewritten", c.name)
		}
	}
	// The draining TCP binding still goes to be1 and back.
	ack := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40000, Dport: 443, Flags: packet.TCPFlagACK, Seq: 1001}.Build()
	if got := f.host(ack); got.Verdict != Forward || packet.IPv4(ack).Dst() != be1.Addr {
		t.Fatalf("draining flow: f.host(ack) = %v to %v, want Forward to %v", got, packet.IPv4(ack).Dst(), be1.Addr)
	}
	rep := replyTo(ack, packet.TCPFlagACK, "r")
	if got := f.peer(be1.Peer, rep); got.Verdict != Forward || packet.IPv4(rep).Src() != vipAddr {
		t.Fatalf("draining flow's reply: f.peer = %v from %v, want Forward from the VIP", got, packet.IPv4(rep).Src())
	}
	if d := f.nat.Stats().Drops; d[ReasonVIPSource]+d[ReasonVIPDestination]+d[ReasonRefused]+d[ReasonUnsupported]+d[ReasonNoListener] != 0 {
		t.Errorf("drops %v, want none", d)
	}
	// The address is routed again (the VIP moves back): all its traffic is
	// the NAT's once more.
	setTCP(t, f, be1)
	if got := f.host(syn(40009, 1)); got.Verdict != Forward {
		t.Errorf("routed again: f.host(syn) = %v, want Forward", got)
	}
	if got := f.peer(ownerPeer, P{Src: vipAddr, Dst: localAddr, Proto: ProtoTCP, Sport: 5555, Dport: 22, Flags: packet.TCPFlagSYN}.Build()); got.Reason != ReasonVIPSource {
		t.Errorf("routed again: a packet from the VIP = %v, want %v", got, ReasonVIPSource)
	}
}

// TestMovedVIPDrainingFlowsProtected: while the old VIP address drains,
// a peer (the new owner of the address, or anyone) cannot pose as a
// draining binding's VIP side or client side: such packets, their ICMP
// errors and their fragments are dropped as before the move. When the
// last binding is gone, the address is no VIP at all.
func TestMovedVIPDrainingFlowsProtected(t *testing.T) {
	f, hp := movedFixture(t)
	shadow, _ := ports(hp) // the hairpinned flow's source port at the local backend
	cases := []struct {
		name string
		from PeerID
		pkt  []byte
		want DropReason
	}{
		{"into the TCP client's flow", ownerPeer,
			P{Src: vipAddr, Dst: localAddr, Proto: ProtoTCP, Sport: 443, Dport: 40000, Flags: packet.TCPFlagACK, Seq: 5}.Build(), ReasonVIPSource},
		{"RST into the TCP client's flow", ownerPeer,
			P{Src: vipAddr, Dst: localAddr, Proto: ProtoTCP, Sport: 443, Dport: 40000, Flags: packet.TCPFlagRST, Seq: 5}.Build(), ReasonVIPSource},
		{"into the hairpinned flow's client", ownerPeer,
			P{Src: vipAddr, Dst: localAddr, Proto: ProtoUDP, Sport: 53, Dport: 5000, Payload: []byte("x")}.Build(), ReasonVIPSource},
		{"into the hairpinned flow's local backend", ownerPeer,
			P{Src: vipAddr, Dst: localAddr, Proto: ProtoUDP, Sport: shadow, Dport: beLocal.Port, Payload: []byte("x")}.Build(), ReasonVIPSource},
		{"the TCP client's tuple, toward the address", be1.Peer,
			P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40000, Dport: 443, Flags: packet.TCPFlagACK, Seq: 5}.Build(), ReasonVIPDestination},
		{"ICMP error about the TCP client's packet", ownerPeer,
			P{Src: vipAddr, Dst: localAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: packet.ICMPCodePortUnreach,
				Payload: syn(40000, 1000)[:packet.IPv4MinHeaderLen+8]}.Build(), ReasonVIPSource},
	}
	for _, c := range cases {
		if got, want := f.peer(c.from, c.pkt), (Result{Verdict: Drop, Reason: c.want}); got != want {
			t.Errorf("%s: f.peer = %v, want %v", c.name, got, want)
		}
	}
	// A fragmented datagram posing as the hairpinned flow's VIP side is
	// reassembled and dropped; a fragmented one of the new owner's own
	// traffic is reassembled and goes to the host whole.
	spoof := P{Src: vipAddr, Dst: localAddr, Proto: ProtoUDP, Sport: 53, Dport: 5000, Payload: make([]byte, 64), ID: 3}.Build()
	a, b := fragmentAt(t, spoof, 32)
	if got := f.peer(ownerPeer, a).Verdict; got != Consumed {
		t.Fatalf("first fragment of a spoof: %v, want %v", got, Consumed)
	}
	if got, want := f.peer(ownerPeer, b), (Result{Verdict: Drop, Reason: ReasonVIPSource}); got != want {
		t.Fatalf("fragmented spoof: %v, want %v", got, want)
	}
	own := P{Src: vipAddr, Dst: localAddr, Proto: ProtoUDP, Sport: 53, Dport: 6000, Payload: make([]byte, 64), ID: 4}.Build()
	a, b = fragmentAt(t, own, 32)
	f.peer(ownerPeer, a)
	if got := f.peer(ownerPeer, b).Verdict; got != Consumed {
		t.Fatalf("the new owner's fragmented datagram: %v, want %v", got, Consumed)
	}
	if out := f.takeOut(); len(out) != 1 || out[0].dir != ToHost || !bytes.Equal(out[0].pkt[20:], own[20:]) {
		t.Fatalf("the new owner's datagram: emitted %v, want it whole toward the host", out)
	}
	st := f.nat.Stats()
	if st.Drops[ReasonVIPSource] != 6 || st.Drops[ReasonVIPDestination] != 1 {
		t.Errorf("drops %v, want 6 vip-source and 1 vip-destination", st.Drops)
	}
	// Once the bindings are gone the address is not the NAT's any more.
	f.clock.Advance(DefaultTCPIdleTimeout + DefaultQuarantine)
	if f.nat.IsVIP(vipAddr) {
		t.Fatal("the address is still a VIP with no binding left")
	}
	if got := f.peer(ownerPeer, cases[0].pkt); got != (Result{}) {
		t.Errorf("after the drain: %v, want Pass", got)
	}
}
