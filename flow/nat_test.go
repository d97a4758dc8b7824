package flow

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vipkit/vipkit/packet"
)

func setTCP(t testing.TB, f *fixture, bs ...Backend) {
	t.Helper()
	require.NoError(t, f.nat.SetListener(lTCP, ListenerConfig{Backends: bs}))
}

func setUDP(t testing.TB, f *fixture, bs ...Backend) {
	t.Helper()
	require.NoError(t, f.nat.SetListener(lUDP, ListenerConfig{Backends: bs}))
}

// openTCP sends a SYN from sport and the backend's SYN-ACK; it returns the
// translated SYN.
func openTCP(t testing.TB, f *fixture, sport uint16) []byte {
	t.Helper()
	p := syn(sport, 1000)
	r := f.host(p)
	require.Equal(t, Forward, r.Verdict, "SYN: %v", r.Reason)
	sa := replyTo(p, packet.TCPFlagSYN|packet.TCPFlagACK, "")
	require.Equal(t, Forward, f.peer(r.Peer, sa).Verdict)
	return p
}

func TestTCPForwardAndReverse(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1)
	orig := syn(40000, 1000)
	p := append([]byte(nil), orig...)
	r := f.host(p)
	require.Equal(t, Result{Verdict: Forward, Peer: be1.Peer}, r)
	ip := packet.IPv4(p)
	require.Equal(t, localAddr, ip.Src())
	require.Equal(t, be1.Addr, ip.Dst())
	sp, dp := ports(p)
	require.Equal(t, be1.Port, dp)
	require.NotEqual(t, uint16(40000), sp)
	requireSums(t, p)
	// Only the NAT's fields changed.
	require.Equal(t, orig[20+4:20+16], p[20+4:20+16])

	reply := replyTo(p, packet.TCPFlagSYN|packet.TCPFlagACK, "hello")
	r = f.peer(be1.Peer, reply)
	require.Equal(t, Forward, r.Verdict)
	require.Equal(t, vipAddr, packet.IPv4(reply).Src())
	require.Equal(t, localAddr, packet.IPv4(reply).Dst())
	sp, dp = ports(reply)
	require.Equal(t, uint16(443), sp)
	require.Equal(t, uint16(40000), dp)
	requireSums(t, reply)

	bs := f.nat.Bindings()
	require.Len(t, bs, 1)
	b := bs[0]
	require.Equal(t, lTCP, b.Listener)
	require.Equal(t, be1, b.Backend)
	require.Equal(t, netip.AddrPortFrom(localAddr, 40000), b.Client)
	require.Equal(t, Active, b.State)
	require.Equal(t, uint64(1), b.PacketsOut)
	require.Equal(t, uint64(1), b.PacketsIn)
	require.Equal(t, uint64(len(p)), b.BytesOut)
	require.Equal(t, uint64(len(reply)), b.BytesIn)
	ls, ok := f.nat.ListenerStats(lTCP)
	require.True(t, ok)
	require.Equal(t, 1, ls.Active)
	require.Equal(t, uint64(1), ls.PacketsIn)
}

func TestSourceAddressIsSNATed(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	p := P{Src: clientAlt, Dst: vipAddr, Proto: ProtoUDP, Sport: 5000, Dport: 53, Payload: []byte("q")}.Build()
	require.Equal(t, Forward, f.host(p).Verdict)
	require.Equal(t, localAddr, packet.IPv4(p).Src())
	requireSums(t, p)
	rep := replyTo(p, 0, "a")
	require.Equal(t, Forward, f.peer(be1.Peer, rep).Verdict)
	require.Equal(t, clientAlt, packet.IPv4(rep).Dst())
	requireSums(t, rep)
}

func TestPassAndAdmission(t *testing.T) {
	var admitted []netip.Addr
	f := newFixture(t, func(o *Options) {
		o.Admit = func(p PeerID, src, dst netip.Addr) bool {
			admitted = append(admitted, src)
			return src != netip.MustParseAddr("100.64.0.66")
		}
	})
	setUDP(t, f, be1)
	other := P{Src: localAddr, Dst: be1.Addr, Proto: ProtoUDP, Sport: 1, Dport: 2}.Build()
	cp := append([]byte(nil), other...)
	require.Equal(t, Pass, f.host(other).Verdict)
	require.Equal(t, cp, other)
	require.Equal(t, Pass, f.host([]byte{0x60, 0, 0}).Verdict, "IPv6 passes")
	require.Equal(t, Pass, f.peer(2, P{Src: be1.Addr, Dst: localAddr, Proto: ProtoUDP, Sport: 9, Dport: 9}.Build()).Verdict)

	// A peer never claims a VIP.
	r := f.peer(2, P{Src: vipAddr, Dst: localAddr, Proto: ProtoUDP, Sport: 53, Dport: 4000}.Build())
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonVIPSource}, r)
	r = f.peer(2, P{Src: be1.Addr, Dst: vipAddr, Proto: ProtoUDP, Sport: 53, Dport: 4000}.Build())
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonVIPDestination}, r)
	r = f.peer(2, P{Src: netip.MustParseAddr("100.64.0.66"), Dst: localAddr, Proto: ProtoUDP, Sport: 53, Dport: 4000}.Build())
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonAdmission}, r)
	// Traffic that is not NAT traffic (probes, node-to-node) never enters
	// user counters.
	ls, ok := f.nat.ListenerStats(lUDP)
	require.True(t, ok)
	require.Equal(t, Counters{}, ls.Counters)
	st := f.nat.Stats()
	require.Equal(t, uint64(1), st.Drops[ReasonVIPSource])
	require.Equal(t, uint64(1), st.Drops[ReasonVIPDestination])
	require.Equal(t, uint64(1), st.Drops[ReasonAdmission])
	require.Contains(t, admitted, be1.Addr)
}

func TestReplyFromWrongPeerDropped(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	p := udpTo(5000, "q")
	require.Equal(t, Forward, f.host(p).Verdict)
	rep := replyTo(p, 0, "a")
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonPeerMismatch}, f.peer(be2.Peer, rep))
	require.Equal(t, uint64(1), f.nat.Bindings()[0].Drops[ReasonPeerMismatch])
	ls, _ := f.nat.ListenerStats(lUDP)
	require.Equal(t, uint64(1), ls.Drops[ReasonPeerMismatch])
}

func TestBadInputDropped(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	good := udpTo(5000, "payload")
	mut := func(m func([]byte) []byte) []byte { return m(append([]byte(nil), good...)) }
	cases := []struct {
		name string
		pkt  []byte
		want DropReason
	}{
		{"truncated", good[:10], ReasonTruncated},
		{"ihl<5", mut(func(b []byte) []byte { b[0] = 0x44; return b }), ReasonBadIHL},
		{"ihl beyond", mut(func(b []byte) []byte { b[0] = 0x4f; return b[:40] }), ReasonBadIHL},
		{"total length", mut(func(b []byte) []byte { binary.BigEndian.PutUint16(b[2:], 9999); return b }), ReasonBadLength},
		{"padding", mut(func(b []byte) []byte { return append(b, 0) }), ReasonBadLength},
		{"header checksum", mut(func(b []byte) []byte { b[10] ^= 1; return b }), ReasonBadChecksum},
		{"udp length", mut(func(b []byte) []byte {
			binary.BigEndian.PutUint16(b[24:], 200)
			return b
		}), ReasonBadLength},
		{"udp truncated", mut(func(b []byte) []byte {
			b = b[:24]
			binary.BigEndian.PutUint16(b[2:], 24)
			packet.IPv4(b).UpdateChecksum()
			return b
		}), ReasonTruncated},
		{"tcp data offset", func() []byte {
			b := syn(1, 1)
			b[20+12] = 0xf0
			return b
		}(), ReasonBadLength},
		{"no listener (answered)", P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 1, Dport: 54}.Build(), ReasonPortUnreachable},
		{"echo to vip", P{Src: localAddr, Dst: vipAddr, Proto: ProtoICMP, ICMPType: packet.ICMPEchoRequest}.Build(), ReasonUnsupported},
		{"gre to vip", P{Src: localAddr, Dst: vipAddr, Proto: 47, Payload: []byte{1, 2, 3, 4}}.Build(), ReasonUnsupported},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := f.nat.Stats().Drops[c.want]
			r := f.host(c.pkt)
			require.Equal(t, Result{Verdict: Drop, Reason: c.want}, r)
			require.Equal(t, before+1, f.nat.Stats().Drops[c.want])
		})
	}
	require.Empty(t, f.nat.Bindings())
}

func TestL4ChecksumNotVerified(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	p := udpTo(5000, "x")
	p[27] ^= 0x55 // corrupt the UDP checksum
	bad := append([]byte(nil), p...)
	require.Equal(t, Forward, f.host(p).Verdict)
	// Still bad after NAT: differs from a recompute by the same amount.
	fixed := append([]byte(nil), p...)
	fixL4(fixed, false)
	require.NotEqual(t, fixed[26:28], p[26:28])
	fixL4(bad, false)
	require.NotEqual(t, bad[26:28], p[26:28])
}

func TestUDPZeroChecksumStaysZero(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	p := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 5000, Dport: 53, Payload: []byte("q"), NoUDPCsum: true}.Build()
	require.Equal(t, Forward, f.host(p).Verdict)
	require.Equal(t, uint16(0), packet.UDP(p[20:]).Checksum())
	requireSums(t, p)
}

func TestTCPPinnedAndRetarget(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1, be2)
	p := openTCP(t, f, 40000)
	require.Equal(t, be1.Addr, packet.IPv4(p).Dst())
	// A "faster" backend does not move an established flow.
	f.sel.pick = func(req SelectRequest) int { return 1 }
	ack := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40000, Dport: 443, Flags: packet.TCPFlagACK, Seq: 1001}.Build()
	require.Equal(t, Forward, f.host(ack).Verdict)
	require.Equal(t, be1.Addr, packet.IPv4(ack).Dst())
	// Even a retransmitted SYN after the SYN-ACK stays.
	s := syn(40000, 1000)
	require.Equal(t, Forward, f.host(s).Verdict)
	require.Equal(t, be1.Addr, packet.IPv4(s).Dst())

	// Before any SYN-ACK, a retransmitted empty SYN may move.
	f.sel.pick = nil
	s1 := syn(40001, 5000)
	require.Equal(t, Forward, f.host(s1).Verdict)
	require.Equal(t, be1.Addr, packet.IPv4(s1).Dst())
	shadow1, _ := ports(s1)
	f.sel.pick = func(req SelectRequest) int {
		if req.Reason == SelectSYNRetry {
			require.Equal(t, be1, req.Prev)
		}
		return 1
	}
	s2 := syn(40001, 5000)
	r := f.host(s2)
	require.Equal(t, Result{Verdict: Forward, Peer: be2.Peer}, r)
	require.Equal(t, be2.Addr, packet.IPv4(s2).Dst())
	shadow2, _ := ports(s2)
	require.NotEqual(t, shadow1, shadow2)
	ls, _ := f.nat.ListenerStats(lTCP)
	require.Equal(t, uint64(1), ls.Retargets)
	require.Equal(t, 1, ls.Quarantined)
	// The old backend's late SYN-ACK hits the quarantine.
	late := replyTo(s1, packet.TCPFlagSYN|packet.TCPFlagACK, "")
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonQuarantined}, f.peer(be1.Peer, late))

	// A SYN carrying data is never retargeted.
	f.sel.pick = nil
	d1 := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40002, Dport: 443, Flags: packet.TCPFlagSYN, Seq: 7, Payload: []byte("GET")}.Build()
	require.Equal(t, Forward, f.host(d1).Verdict)
	f.sel.pick = func(SelectRequest) int { return 1 }
	d2 := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40002, Dport: 443, Flags: packet.TCPFlagSYN, Seq: 7}.Build()
	require.Equal(t, Forward, f.host(d2).Verdict)
	require.Equal(t, be1.Addr, packet.IPv4(d2).Dst())
}

func TestTCPNewSYNSequenceNewBinding(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1)
	p := openTCP(t, f, 40000)
	sh1, _ := ports(p)
	q := syn(40000, 99999)
	require.Equal(t, Forward, f.host(q).Verdict)
	sh2, _ := ports(q)
	require.NotEqual(t, sh1, sh2)
	st := f.nat.Stats()
	require.Equal(t, 1, st.Active)
	require.Equal(t, 1, st.Quarantined)
	require.Equal(t, uint64(2), st.Created)
}

func TestTCPNonSYNWithoutBindingDropped(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1)
	ack := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 1, Dport: 443, Flags: packet.TCPFlagACK}.Build()
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonNoFlow}, f.host(ack))
}

func TestTCPRetention(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1)
	openTCP(t, f, 40000)
	bs := f.nat.Bindings()
	require.Equal(t, f.clock.Now().Add(7200*time.Second), bs[0].Expires)

	// RST shortens retention.
	rst := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40000, Dport: 443, Flags: packet.TCPFlagRST, Seq: 1001}.Build()
	require.Equal(t, Forward, f.host(rst).Verdict)
	require.Equal(t, f.clock.Now().Add(DefaultTCPClosedTimeout), f.nat.Bindings()[0].Expires)
	f.clock.Advance(DefaultTCPClosedTimeout)
	bs = f.nat.Bindings()
	require.Len(t, bs, 1)
	require.Equal(t, Quarantined, bs[0].State)
	f.clock.Advance(DefaultQuarantine)
	require.Empty(t, f.nat.Bindings())
	require.Equal(t, 0, f.res.InUse())

	// FIN in both directions: 120 s.
	p := openTCP(t, f, 40001)
	fin := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40001, Dport: 443, Flags: packet.TCPFlagFIN | packet.TCPFlagACK, Seq: 1001}.Build()
	require.Equal(t, Forward, f.host(fin).Verdict)
	require.Equal(t, f.clock.Now().Add(7200*time.Second), f.nat.Bindings()[0].Expires)
	rfin := replyTo(p, packet.TCPFlagFIN|packet.TCPFlagACK, "")
	require.Equal(t, Forward, f.peer(be1.Peer, rfin).Verdict)
	require.Equal(t, f.clock.Now().Add(DefaultTCPFinTimeout), f.nat.Bindings()[0].Expires)
}

func TestIdleExpiryAndQuarantine(t *testing.T) {
	f := newFixture(t)
	require.NoError(t, f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}, IdleTimeout: 30 * time.Second}))
	p := udpTo(5000, "q")
	require.Equal(t, Forward, f.host(p).Verdict)
	sh, _ := ports(p)
	f.clock.Advance(29 * time.Second)
	rep := replyTo(p, 0, "a")
	require.Equal(t, Forward, f.peer(be1.Peer, rep).Verdict) // extends to 59 s
	f.clock.Advance(29 * time.Second)
	require.Equal(t, Active, f.nat.Bindings()[0].State)
	f.clock.Advance(1 * time.Second) // 59 s: idle expiry, on the clock, without traffic
	bs := f.nat.Bindings()
	require.Len(t, bs, 1)
	require.Equal(t, Quarantined, bs[0].State)
	require.Equal(t, 1, f.res.InUse())

	// Late replies are dropped; a new datagram gets a new shadow port.
	rep = replyTo(p, 0, "late")
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonQuarantined}, f.peer(be1.Peer, rep))
	p2 := udpTo(5000, "again")
	require.Equal(t, Forward, f.host(p2).Verdict)
	sh2, _ := ports(p2)
	require.NotEqual(t, sh, sh2)

	f.clock.Advance(DefaultQuarantine) // 179 s: the first leaves quarantine, the second (idle since 89 s) is in it
	bs = f.nat.Bindings()
	require.Len(t, bs, 1)
	require.Equal(t, sh2, bs[0].Shadow.Port())
	require.Equal(t, Quarantined, bs[0].State)
	f.clock.Advance(30 * time.Second)
	require.Empty(t, f.nat.Bindings())
	require.Equal(t, 0, f.res.InUse())
}

func TestCapacitySharedAndNeverEvicts(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Capacity = 4 })
	setUDP(t, f, be1)
	for i := range 4 {
		require.Equal(t, Forward, f.host(udpTo(uint16(1000+i), "x")).Verdict)
	}
	r := f.host(udpTo(2000, "x"))
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonCapacity}, r)
	require.Equal(t, uint64(1), f.nat.Stats().Refused)
	// Existing flows still work.
	require.Equal(t, Forward, f.host(udpTo(1000, "y")).Verdict)
	// Expiry moves them into quarantine, which still counts.
	f.clock.Advance(DefaultUDPIdleTimeout)
	st := f.nat.Stats()
	require.Equal(t, 4, st.Quarantined)
	require.Equal(t, Drop, f.host(udpTo(2000, "x")).Verdict)
	f.clock.Advance(DefaultQuarantine)
	require.Equal(t, Forward, f.host(udpTo(2000, "x")).Verdict)
	ls, _ := f.nat.ListenerStats(lUDP)
	require.Equal(t, uint64(2), ls.Drops[ReasonCapacity])
}

func TestUDPFailover(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1, be2)
	p := udpTo(5000, "1")
	require.Equal(t, Forward, f.host(p).Verdict)
	require.Equal(t, be1.Addr, packet.IPv4(p).Dst())
	// Unavailability is noticed after HealthChanged, not per packet.
	f.sel.setDown(be1, true)
	p = udpTo(5000, "2")
	require.Equal(t, Forward, f.host(p).Verdict)
	require.Equal(t, be1.Addr, packet.IPv4(p).Dst())
	f.nat.HealthChanged()
	p = udpTo(5000, "3")
	require.Equal(t, Result{Verdict: Forward, Peer: be2.Peer}, f.host(p))
	require.Equal(t, be2.Addr, packet.IPv4(p).Dst())
	ls, _ := f.nat.ListenerStats(lUDP)
	require.Equal(t, uint64(1), ls.Failovers)
	require.Equal(t, uint64(1), f.nat.Stats().Failovers)
	// Nothing is replayed: exactly the datagrams given were forwarded.
	require.Empty(t, f.out)
	require.Equal(t, uint64(1), f.nat.Bindings()[0].PacketsOut+f.nat.Bindings()[1].PacketsOut-2)
}

func TestPortUnreachableReportAndFailover(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1, be2)
	f.nat.o.OnPortUnreachable = func(l Listener, b Backend) {
		f.reports = append(f.reports, report{l, b})
		f.sel.setDown(b, true)
	}
	orig := udpTo(5000, "query")
	p := append([]byte(nil), orig...)
	require.Equal(t, Forward, f.host(p).Verdict)
	// The backend answers port unreachable, quoting what it received.
	icmp := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: packet.ICMPCodePortUnreach, Payload: p}.Build()
	r := f.peer(be1.Peer, icmp)
	require.Equal(t, Forward, r.Verdict)
	requireSums(t, icmp)
	require.Equal(t, vipAddr, packet.IPv4(icmp).Src())
	require.Equal(t, localAddr, packet.IPv4(icmp).Dst())
	// The quote is now exactly what the client sent.
	require.Equal(t, orig, []byte(packet.ICMPv4(icmp[20:]).Quoted()))
	require.Equal(t, []report{{lUDP, be1}}, f.reports)
	// Next datagram fails over without the engine calling HealthChanged.
	p = udpTo(5000, "retry")
	require.Equal(t, Forward, f.host(p).Verdict)
	require.Equal(t, be2.Addr, packet.IPv4(p).Dst())
}

func TestICMPErrorTruncatedQuote(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1)
	orig := syn(40000, 1)
	p := append([]byte(nil), orig...)
	require.Equal(t, Forward, f.host(p).Verdict)
	// TTL exceeded quoting only header + 8 bytes (no TCP checksum).
	icmp := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoICMP, ICMPType: packet.ICMPTimeExceeded, Payload: p[:28]}.Build()
	require.Equal(t, Forward, f.peer(be1.Peer, icmp).Verdict)
	requireSums(t, icmp)
	require.Equal(t, orig[:28], []byte(packet.ICMPv4(icmp[20:]).Quoted()))
	require.Empty(t, f.reports)
}

func TestICMPErrorGarbageQuote(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1)
	p := syn(40000, 1)
	require.Equal(t, Forward, f.host(p).Verdict)
	cases := map[string][]byte{
		"short":   p[:10],
		"not v4":  append([]byte{0x60}, p[1:28]...),
		"bad ihl": append([]byte{0x43}, p[1:28]...),
		"no l4":   p[:24],
	}
	for name, q := range cases {
		icmp := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: 1, Payload: q}.Build()
		require.Equal(t, Result{Verdict: Drop, Reason: ReasonICMPQuote}, f.peer(be1.Peer, icmp), name)
	}
	// An error about unrelated traffic passes untouched.
	other := P{Src: localAddr, Dst: be1.Addr, Proto: ProtoUDP, Sport: 1, Dport: 2}.Build()
	icmp := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: 3, Payload: other}.Build()
	require.Equal(t, Pass, f.peer(be1.Peer, icmp).Verdict)
	// An error about a binding from the wrong peer is dropped.
	icmp = P{Src: be2.Addr, Dst: localAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: 3, Payload: p}.Build()
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonPeerMismatch}, f.peer(be2.Peer, icmp))
}

func TestHostICMPErrorAboutReply(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	p := udpTo(5000, "q")
	require.Equal(t, Forward, f.host(p).Verdict)
	origReply := replyTo(p, 0, "answer")
	rep := append([]byte(nil), origReply...)
	require.Equal(t, Forward, f.peer(be1.Peer, rep).Verdict)
	// The client's host answers the reply with port unreachable.
	icmp := P{Src: localAddr, Dst: vipAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: 3, Payload: rep}.Build()
	r := f.host(icmp)
	require.Equal(t, Result{Verdict: Forward, Peer: be1.Peer}, r)
	requireSums(t, icmp)
	require.Equal(t, be1.Addr, packet.IPv4(icmp).Dst())
	require.Equal(t, origReply, []byte(packet.ICMPv4(icmp[20:]).Quoted()), "the backend sees its own datagram quoted")
}

func TestHairpin(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, beLocal)
	orig := syn(40000, 1)
	p := append([]byte(nil), orig...)
	r := f.host(p)
	require.Equal(t, Result{Verdict: Reflect}, r)
	require.Equal(t, vipAddr, packet.IPv4(p).Src(), "the local backend sees the VIP as source")
	require.Equal(t, localAddr, packet.IPv4(p).Dst())
	_, dp := ports(p)
	require.Equal(t, beLocal.Port, dp)
	requireSums(t, p)
	// The host's reply comes back through FromHost.
	rep := replyTo(p, packet.TCPFlagSYN|packet.TCPFlagACK, "")
	require.Equal(t, Result{Verdict: Reflect}, f.host(rep))
	require.Equal(t, vipAddr, packet.IPv4(rep).Src())
	require.Equal(t, localAddr, packet.IPv4(rep).Dst())
	sp, dp := ports(rep)
	require.Equal(t, uint16(443), sp)
	require.Equal(t, uint16(40000), dp)
	requireSums(t, rep)
	require.True(t, f.nat.Bindings()[0].Hairpin)
	// A peer cannot answer for it.
	require.Equal(t, ReasonVIPDestination, f.peer(2, replyTo(p, packet.TCPFlagACK, "")).Reason)
	// The host's port unreachable for the hairpinned request is translated
	// for the client and reported.
	icmp := P{Src: localAddr, Dst: vipAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: 3, Payload: p}.Build()
	require.Equal(t, Result{Verdict: Reflect}, f.host(icmp))
	requireSums(t, icmp)
	require.Equal(t, orig, []byte(packet.ICMPv4(icmp[20:]).Quoted()))
	require.Equal(t, []report{{lTCP, beLocal}}, f.reports)
}

func TestRemoval(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1, be2)
	setTCP(t, f, be1)
	p := udpTo(5000, "q")
	require.Equal(t, Forward, f.host(p).Verdict)

	require.True(t, f.nat.RemoveBackend(lUDP, be1))
	require.False(t, f.nat.RemoveBackend(lUDP, be1))
	p = udpTo(5000, "existing continues")
	require.Equal(t, Forward, f.host(p).Verdict)
	require.Equal(t, be1.Addr, packet.IPv4(p).Dst())
	p = udpTo(5001, "new")
	require.Equal(t, Forward, f.host(p).Verdict)
	require.Equal(t, be2.Addr, packet.IPv4(p).Dst())

	require.True(t, f.nat.RemoveListener(lUDP))
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonPortUnreachable}, f.host(udpTo(5002, "x")), "a removed listener refuses new flows")
	require.Equal(t, Forward, f.host(udpTo(5000, "still")).Verdict)
	ls, ok := f.nat.ListenerStats(lUDP)
	require.True(t, ok)
	require.True(t, ls.Removed)
	require.True(t, f.nat.IsVIP(vipAddr))

	openTCP(t, f, 40000)
	require.Equal(t, 1, f.nat.RemoveVIP(vipAddr))
	require.Equal(t, Drop, f.host(syn(40001, 1)).Verdict)
	ack := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40000, Dport: 443, Flags: packet.TCPFlagACK, Seq: 1001}.Build()
	require.Equal(t, Forward, f.host(ack).Verdict, "established TCP drains")
	require.True(t, f.nat.IsVIP(vipAddr), "a draining VIP stays claimed")

	f.clock.Advance(DefaultTCPIdleTimeout + DefaultQuarantine)
	require.Empty(t, f.nat.Bindings())
	require.False(t, f.nat.IsVIP(vipAddr))
	_, ok = f.nat.ListenerStats(lUDP)
	require.False(t, ok)
	require.Equal(t, Pass, f.host(udpTo(5000, "x")).Verdict)
}

func TestSetListenerValidation(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MaxBackends = 2; o.MaxListenersPerVIP = 1 })
	bad := []Listener{
		{VIP: netip.MustParseAddr("::1"), Proto: ProtoTCP, Port: 1},
		{VIP: localAddr, Proto: ProtoTCP, Port: 1},
		{VIP: vipAddr, Proto: ProtoICMP, Port: 1},
		{VIP: vipAddr, Proto: ProtoTCP, Port: 0},
	}
	for _, l := range bad {
		require.ErrorIs(t, f.nat.SetListener(l, ListenerConfig{}), ErrInvalidListener, "%v", l)
	}
	require.ErrorIs(t, f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{{Peer: 0, Addr: be1.Addr, Port: 1}}}), ErrInvalidBackend)
	require.ErrorIs(t, f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{{Peer: 5, Addr: localAddr, Port: 1}}}), ErrInvalidBackend)
	require.ErrorIs(t, f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{{Peer: 5, Addr: be1.Addr}}}), ErrInvalidBackend)
	require.ErrorIs(t, f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1, be2, be1}}), ErrLimit)
	require.NoError(t, f.nat.SetListener(lTCP, ListenerConfig{}))
	require.ErrorIs(t, f.nat.SetListener(lUDP, ListenerConfig{}), ErrLimit)
	// An empty listener claims its VIP but refuses flows (with a RST).
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonRefused}, f.host(syn(1, 1)))
	require.NoError(t, f.nat.Close())
	require.ErrorIs(t, f.nat.SetListener(lTCP, ListenerConfig{}), ErrClosed)
	require.Equal(t, Pass, f.host(syn(1, 1)).Verdict)
}

func TestNewValidation(t *testing.T) {
	_, err := New(Options{Selector: &testSel{}})
	require.ErrorIs(t, err, ErrInvalidOptions)
	_, err = New(Options{LocalAddr: localAddr})
	require.ErrorIs(t, err, ErrInvalidOptions)
	_, err = New(Options{LocalAddr: localAddr, Selector: &testSel{}, Capacity: MaxCapacity + 1})
	require.ErrorIs(t, err, ErrInvalidOptions)
	_, err = New(Options{LocalAddr: localAddr, Selector: &testSel{}, MTU: 10})
	require.ErrorIs(t, err, ErrInvalidOptions)
}

func TestCloseReleasesPorts(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	setTCP(t, f, be1)
	for i := range 10 {
		require.Equal(t, Forward, f.host(udpTo(uint16(100+i), "x")).Verdict)
	}
	openTCP(t, f, 40000)
	require.Equal(t, 11, f.res.InUse())
	require.NoError(t, f.nat.Close())
	require.NoError(t, f.nat.Close())
	require.Equal(t, 0, f.res.InUse())
	require.Empty(t, f.nat.Bindings())
	require.Equal(t, 0, f.clock.Pending(), "the sweep timer is stopped")
}

func TestDFTooBigSendsFragNeeded(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MTU = 600; o.HostMTU = 1500 })
	setUDP(t, f, be1)
	orig := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 5000, Dport: 53, Payload: make([]byte, 1000), DF: true}.Build()
	p := append([]byte(nil), orig...)
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonFragNeeded}, f.host(p))
	out := f.takeOut()
	require.Len(t, out, 1)
	require.Equal(t, ToHost, out[0].dir)
	icmp := packet.IPv4(out[0].pkt)
	require.NoError(t, icmp.Validate())
	require.Equal(t, vipAddr, icmp.Src())
	require.Equal(t, localAddr, icmp.Dst())
	m := packet.ICMPv4(icmp.Payload())
	require.Equal(t, uint8(packet.ICMPDestUnreachable), m.Type())
	require.Equal(t, uint8(packet.ICMPCodeFragNeeded), m.Code())
	require.Equal(t, uint16(600), m.MTU())
	require.Equal(t, orig[:28], []byte(m.Quoted()))
	requireSums(t, out[0].pkt)

	// Without DF it is fragmented to the MTU.
	q := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 5000, Dport: 53, Payload: make([]byte, 1000)}.Build()
	require.Equal(t, Consumed, f.host(q).Verdict)
	out = f.takeOut()
	require.Len(t, out, 2)
	for _, e := range out {
		require.Equal(t, ToOverlay, e.dir)
		require.LessOrEqual(t, len(e.pkt), 600)
		require.NoError(t, packet.IPv4(e.pkt).Validate())
		require.Equal(t, be1.Addr, packet.IPv4(e.pkt).Dst())
	}
	require.Equal(t, uint64(1), f.nat.Stats().Fragmented)
}

func TestNoEmit(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MTU = 600; o.Emit = nil })
	setUDP(t, f, be1)
	q := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 5000, Dport: 53, Payload: make([]byte, 1000)}.Build()
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonNoEmit}, f.host(q))
}

func TestSentinelErrors(t *testing.T) {
	r := NewMemReserver(MemReserverOptions{Min: 1000, Max: 1001, Seed: 1})
	for range 2 {
		_, err := r.Reserve(ProtoUDP, netip.AddrPort{})
		require.NoError(t, err)
	}
	_, err := r.Reserve(ProtoUDP, netip.AddrPort{})
	require.ErrorIs(t, err, ErrPortsExhausted)
	require.True(t, errors.Is(ErrClosed, ErrClosed))
}

func TestNoPortDropped(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Reserver = NewMemReserver(MemReserverOptions{Min: 1000, Max: 1000, Seed: 1}) })
	setUDP(t, f, be1)
	require.Equal(t, Forward, f.host(udpTo(1, "a")).Verdict)
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonNoPort}, f.host(udpTo(2, "a")))
}
