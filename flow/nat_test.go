package flow

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/vipkit/vipkit/packet"
)

func setTCP(t testing.TB, f *fixture, bs ...Backend) {
	t.Helper()
	if err := f.nat.SetListener(lTCP, ListenerConfig{Backends: bs}); err != nil {
		t.Fatalf("f.nat.SetListener(lTCP, ListenerConfig{Backends: bs}): %v", err)
	}
}

func setUDP(t testing.TB, f *fixture, bs ...Backend) {
	t.Helper()
	if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: bs}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{Backends: bs}): %v", err)
	}
}

// openTCP sends a SYN from sport and the backend's SYN-ACK; it returns the
// translated SYN.
func openTCP(t testing.TB, f *fixture, sport uint16) []byte {
	t.Helper()
	p := syn(sport, 1000)
	r := f.host(p)
	if r.Verdict != Forward {
		t.Fatalf("SYN: %v: r.Verdict = %v, want %v", r.Reason, r.Verdict, Forward)
	}
	sa := replyTo(p, packet.TCPFlagSYN|packet.TCPFlagACK, "")
	if got := f.peer(r.Peer, sa).Verdict; got != Forward {
		t.Fatalf("f.peer(r.Peer, sa).Verdict = %v, want %v", got, Forward)
	}
	return p
}

func TestTCPForwardAndReverse(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1)
	orig := syn(40000, 1000)
	p := append([]byte(nil), orig...)
	r := f.host(p)
	if want := (Result{Verdict: Forward, Peer: be1.Peer}); r != want {
		t.Fatalf("r = %v, want %v", r, want)
	}
	ip := packet.IPv4(p)
	if got := ip.Src(); got != localAddr {
		t.Fatalf("ip.Src() = %v, want %v", got, localAddr)
	}
	if got := ip.Dst(); got != be1.Addr {
		t.Fatalf("ip.Dst() = %v, want %v", got, be1.Addr)
	}
	sp, dp := ports(p)
	if dp != be1.Port {
		t.Fatalf("dp = %v, want %v", dp, be1.Port)
	}
	if sp == uint16(40000) {
		t.Fatalf("sp = %v, want anything else", sp)
	}
	requireSums(t, p)
	// Only the NAT's fields changed.
	if want, got := orig[20+4:20+16], p[20+4:20+16]; !bytes.Equal(got, want) {
		t.Fatalf("p[20+4:20+16] = %v, want %v", got, want)
	}

	reply := replyTo(p, packet.TCPFlagSYN|packet.TCPFlagACK, "hello")
	r = f.peer(be1.Peer, reply)
	if r.Verdict != Forward {
		t.Fatalf("r.Verdict = %v, want %v", r.Verdict, Forward)
	}
	if got := packet.IPv4(reply).Src(); got != vipAddr {
		t.Fatalf("packet.IPv4(reply).Src() = %v, want %v", got, vipAddr)
	}
	if got := packet.IPv4(reply).Dst(); got != localAddr {
		t.Fatalf("packet.IPv4(reply).Dst() = %v, want %v", got, localAddr)
	}
	sp, dp = ports(reply)
	if sp != uint16(443) {
		t.Fatalf("sp = %v, want %v", sp, uint16(443))
	}
	if dp != uint16(40000) {
		t.Fatalf("dp = %v, want %v", dp, uint16(40000))
	}
	requireSums(t, reply)

	bs := f.nat.Bindings()
	if len(bs) != 1 {
		t.Fatalf("len(bs) = %d, want %d: %v", len(bs), 1, bs)
	}
	b := bs[0]
	if b.Listener != lTCP {
		t.Fatalf("b.Listener = %v, want %v", b.Listener, lTCP)
	}
	if b.Backend != be1 {
		t.Fatalf("b.Backend = %v, want %v", b.Backend, be1)
	}
	if want := netip.AddrPortFrom(localAddr, 40000); b.Client != want {
		t.Fatalf("b.Client = %v, want %v", b.Client, want)
	}
	if b.State != Active {
		t.Fatalf("b.State = %v, want %v", b.State, Active)
	}
	if b.PacketsOut != uint64(1) {
		t.Fatalf("b.PacketsOut = %v, want %v", b.PacketsOut, uint64(1))
	}
	if b.PacketsIn != uint64(1) {
		t.Fatalf("b.PacketsIn = %v, want %v", b.PacketsIn, uint64(1))
	}
	if b.BytesOut != uint64(len(p)) {
		t.Fatalf("b.BytesOut = %v, want %v", b.BytesOut, uint64(len(p)))
	}
	if b.BytesIn != uint64(len(reply)) {
		t.Fatalf("b.BytesIn = %v, want %v", b.BytesIn, uint64(len(reply)))
	}
	ls, ok := f.nat.ListenerStats(lTCP)
	if !ok {
		t.Fatal("ok is false")
	}
	if ls.Active != 1 {
		t.Fatalf("ls.Active = %v, want %v", ls.Active, 1)
	}
	if ls.PacketsIn != uint64(1) {
		t.Fatalf("ls.PacketsIn = %v, want %v", ls.PacketsIn, uint64(1))
	}
}

func TestSourceAddressIsSNATed(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	p := P{Src: clientAlt, Dst: vipAddr, Proto: ProtoUDP, Sport: 5000, Dport: 53, Payload: []byte("q")}.Build()
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	if got := packet.IPv4(p).Src(); got != localAddr {
		t.Fatalf("packet.IPv4(p).Src() = %v, want %v", got, localAddr)
	}
	requireSums(t, p)
	rep := replyTo(p, 0, "a")
	if got := f.peer(be1.Peer, rep).Verdict; got != Forward {
		t.Fatalf("f.peer(be1.Peer, rep).Verdict = %v, want %v", got, Forward)
	}
	if got := packet.IPv4(rep).Dst(); got != clientAlt {
		t.Fatalf("packet.IPv4(rep).Dst() = %v, want %v", got, clientAlt)
	}
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
	if got := f.host(other).Verdict; got != Pass {
		t.Fatalf("f.host(other).Verdict = %v, want %v", got, Pass)
	}
	if !bytes.Equal(other, cp) {
		t.Fatalf("other = %v, want %v", other, cp)
	}
	if got := f.host([]byte{0x60, 0, 0}).Verdict; got != Pass {
		t.Fatalf("IPv6 passes: f.host([]byte{0x60, 0, 0}).Verdict = %v, want %v", got, Pass)
	}
	if got := f.peer(2, P{Src: be1.Addr, Dst: localAddr, Proto: ProtoUDP, Sport: 9, Dport: 9}.Build()).Verdict; got != Pass {
		t.Fatalf("f.peer(2, P{Src: be1.Addr, Dst: localAddr, Proto: ProtoUDP, Sport: 9, Dport: 9}.Build()).Verdict = %v, want %v", got, Pass)
	}

	// A peer never claims a VIP.
	r := f.peer(2, P{Src: vipAddr, Dst: localAddr, Proto: ProtoUDP, Sport: 53, Dport: 4000}.Build())
	if want := (Result{Verdict: Drop, Reason: ReasonVIPSource}); r != want {
		t.Fatalf("r = %v, want %v", r, want)
	}
	r = f.peer(2, P{Src: be1.Addr, Dst: vipAddr, Proto: ProtoUDP, Sport: 53, Dport: 4000}.Build())
	if want := (Result{Verdict: Drop, Reason: ReasonVIPDestination}); r != want {
		t.Fatalf("r = %v, want %v", r, want)
	}
	r = f.peer(2, P{Src: netip.MustParseAddr("100.64.0.66"), Dst: localAddr, Proto: ProtoUDP, Sport: 53, Dport: 4000}.Build())
	if want := (Result{Verdict: Drop, Reason: ReasonAdmission}); r != want {
		t.Fatalf("r = %v, want %v", r, want)
	}
	// Traffic that is not NAT traffic (probes, node-to-node) never enters
	// user counters.
	ls, ok := f.nat.ListenerStats(lUDP)
	if !ok {
		t.Fatal("ok is false")
	}
	if want := (Counters{}); ls.Counters != want {
		t.Fatalf("ls.Counters = %v, want %v", ls.Counters, want)
	}
	st := f.nat.Stats()
	if st.Drops[ReasonVIPSource] != uint64(1) {
		t.Fatalf("st.Drops[ReasonVIPSource] = %v, want %v", st.Drops[ReasonVIPSource], uint64(1))
	}
	if st.Drops[ReasonVIPDestination] != uint64(1) {
		t.Fatalf("st.Drops[ReasonVIPDestination] = %v, want %v", st.Drops[ReasonVIPDestination], uint64(1))
	}
	if st.Drops[ReasonAdmission] != uint64(1) {
		t.Fatalf("st.Drops[ReasonAdmission] = %v, want %v", st.Drops[ReasonAdmission], uint64(1))
	}
	if !slices.Contains(admitted, be1.Addr) {
		t.Fatalf("admitted = %v, want it to contain %v", admitted, be1.Addr)
	}
}

func TestReplyFromWrongPeerDropped(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	p := udpTo(5000, "q")
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	rep := replyTo(p, 0, "a")
	if want, got := (Result{Verdict: Drop, Reason: ReasonPeerMismatch}), f.peer(be2.Peer, rep); got != want {
		t.Fatalf("f.peer(be2.Peer, rep) = %v, want %v", got, want)
	}
	if got := f.nat.Bindings()[0].Drops[ReasonPeerMismatch]; got != uint64(1) {
		t.Fatalf("f.nat.Bindings()[0].Drops[ReasonPeerMismatch] = %v, want %v", got, uint64(1))
	}
	ls, _ := f.nat.ListenerStats(lUDP)
	if ls.Drops[ReasonPeerMismatch] != uint64(1) {
		t.Fatalf("ls.Drops[ReasonPeerMismatch] = %v, want %v", ls.Drops[ReasonPeerMismatch], uint64(1))
	}
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
			if wantV := (Result{Verdict: Drop, Reason: c.want}); r != wantV {
				t.Fatalf("r = %v, want %v", r, wantV)
			}
			if got := f.nat.Stats().Drops[c.want]; got != before+1 {
				t.Fatalf("f.nat.Stats().Drops[c.want] = %v, want %v", got, before+1)
			}
		})
	}
	if got := f.nat.Bindings(); len(got) != 0 {
		t.Fatalf("f.nat.Bindings() = %v, want empty", got)
	}
}

func TestL4ChecksumNotVerified(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	p := udpTo(5000, "x")
	p[27] ^= 0x55 // corrupt the UDP checksum
	bad := append([]byte(nil), p...)
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	// Still bad after NAT: differs from a recompute by the same amount.
	fixed := append([]byte(nil), p...)
	fixL4(fixed, false)
	if want, got := fixed[26:28], p[26:28]; bytes.Equal(got, want) {
		t.Fatalf("p[26:28] = %v, want anything else", got)
	}
	fixL4(bad, false)
	if want, got := bad[26:28], p[26:28]; bytes.Equal(got, want) {
		t.Fatalf("p[26:28] = %v, want anything else", got)
	}
}

func TestUDPZeroChecksumStaysZero(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	p := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 5000, Dport: 53, Payload: []byte("q"), NoUDPCsum: true}.Build()
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	if got := packet.UDP(p[20:]).Checksum(); got != uint16(0) {
		t.Fatalf("packet.UDP(p[20:]).Checksum() = %v, want %v", got, uint16(0))
	}
	requireSums(t, p)
}

func TestTCPPinnedAndRetarget(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1, be2)
	p := openTCP(t, f, 40000)
	if got := packet.IPv4(p).Dst(); got != be1.Addr {
		t.Fatalf("packet.IPv4(p).Dst() = %v, want %v", got, be1.Addr)
	}
	// A "faster" backend does not move an established flow.
	f.sel.pick = func(req SelectRequest) int { return 1 }
	ack := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40000, Dport: 443, Flags: packet.TCPFlagACK, Seq: 1001}.Build()
	if got := f.host(ack).Verdict; got != Forward {
		t.Fatalf("f.host(ack).Verdict = %v, want %v", got, Forward)
	}
	if got := packet.IPv4(ack).Dst(); got != be1.Addr {
		t.Fatalf("packet.IPv4(ack).Dst() = %v, want %v", got, be1.Addr)
	}
	// Even a retransmitted SYN after the SYN-ACK stays.
	s := syn(40000, 1000)
	if got := f.host(s).Verdict; got != Forward {
		t.Fatalf("f.host(s).Verdict = %v, want %v", got, Forward)
	}
	if got := packet.IPv4(s).Dst(); got != be1.Addr {
		t.Fatalf("packet.IPv4(s).Dst() = %v, want %v", got, be1.Addr)
	}

	// Before any SYN-ACK, a retransmitted empty SYN may move.
	f.sel.pick = nil
	s1 := syn(40001, 5000)
	if got := f.host(s1).Verdict; got != Forward {
		t.Fatalf("f.host(s1).Verdict = %v, want %v", got, Forward)
	}
	if got := packet.IPv4(s1).Dst(); got != be1.Addr {
		t.Fatalf("packet.IPv4(s1).Dst() = %v, want %v", got, be1.Addr)
	}
	shadow1, _ := ports(s1)
	f.sel.pick = func(req SelectRequest) int {
		if req.Reason == SelectSYNRetry {
			if req.Prev != be1 {
				t.Fatalf("req.Prev = %v, want %v", req.Prev, be1)
			}
		}
		return 1
	}
	s2 := syn(40001, 5000)
	r := f.host(s2)
	if want := (Result{Verdict: Forward, Peer: be2.Peer}); r != want {
		t.Fatalf("r = %v, want %v", r, want)
	}
	if got := packet.IPv4(s2).Dst(); got != be2.Addr {
		t.Fatalf("packet.IPv4(s2).Dst() = %v, want %v", got, be2.Addr)
	}
	shadow2, _ := ports(s2)
	if shadow2 == shadow1 {
		t.Fatalf("shadow2 = %v, want anything else", shadow2)
	}
	ls, _ := f.nat.ListenerStats(lTCP)
	if ls.Retargets != uint64(1) {
		t.Fatalf("ls.Retargets = %v, want %v", ls.Retargets, uint64(1))
	}
	if ls.Quarantined != 1 {
		t.Fatalf("ls.Quarantined = %v, want %v", ls.Quarantined, 1)
	}
	// The old backend's late SYN-ACK hits the quarantine.
	late := replyTo(s1, packet.TCPFlagSYN|packet.TCPFlagACK, "")
	if want, got := (Result{Verdict: Drop, Reason: ReasonQuarantined}), f.peer(be1.Peer, late); got != want {
		t.Fatalf("f.peer(be1.Peer, late) = %v, want %v", got, want)
	}

	// A SYN carrying data is never retargeted.
	f.sel.pick = nil
	d1 := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40002, Dport: 443, Flags: packet.TCPFlagSYN, Seq: 7, Payload: []byte("GET")}.Build()
	if got := f.host(d1).Verdict; got != Forward {
		t.Fatalf("f.host(d1).Verdict = %v, want %v", got, Forward)
	}
	f.sel.pick = func(SelectRequest) int { return 1 }
	d2 := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40002, Dport: 443, Flags: packet.TCPFlagSYN, Seq: 7}.Build()
	if got := f.host(d2).Verdict; got != Forward {
		t.Fatalf("f.host(d2).Verdict = %v, want %v", got, Forward)
	}
	if got := packet.IPv4(d2).Dst(); got != be1.Addr {
		t.Fatalf("packet.IPv4(d2).Dst() = %v, want %v", got, be1.Addr)
	}
}

func TestTCPNewSYNSequenceNewBinding(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1)
	p := openTCP(t, f, 40000)
	sh1, _ := ports(p)
	q := syn(40000, 99999)
	if got := f.host(q).Verdict; got != Forward {
		t.Fatalf("f.host(q).Verdict = %v, want %v", got, Forward)
	}
	sh2, _ := ports(q)
	if sh2 == sh1 {
		t.Fatalf("sh2 = %v, want anything else", sh2)
	}
	st := f.nat.Stats()
	if st.Active != 1 {
		t.Fatalf("st.Active = %v, want %v", st.Active, 1)
	}
	if st.Quarantined != 1 {
		t.Fatalf("st.Quarantined = %v, want %v", st.Quarantined, 1)
	}
	if st.Created != uint64(2) {
		t.Fatalf("st.Created = %v, want %v", st.Created, uint64(2))
	}
}

func TestTCPNonSYNWithoutBindingDropped(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1)
	ack := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 1, Dport: 443, Flags: packet.TCPFlagACK}.Build()
	if want, got := (Result{Verdict: Drop, Reason: ReasonNoFlow}), f.host(ack); got != want {
		t.Fatalf("f.host(ack) = %v, want %v", got, want)
	}
}

func TestTCPRetention(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1)
	openTCP(t, f, 40000)
	bs := f.nat.Bindings()
	if want := f.clock.Now().Add(7200 * time.Second); !reflect.DeepEqual(bs[0].Expires, want) {
		t.Fatalf("bs[0].Expires = %v, want %v", bs[0].Expires, want)
	}

	// RST shortens retention.
	rst := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40000, Dport: 443, Flags: packet.TCPFlagRST, Seq: 1001}.Build()
	if got := f.host(rst).Verdict; got != Forward {
		t.Fatalf("f.host(rst).Verdict = %v, want %v", got, Forward)
	}
	if want, got := f.clock.Now().Add(DefaultTCPClosedTimeout), f.nat.Bindings()[0].Expires; !reflect.DeepEqual(got, want) {
		t.Fatalf("f.nat.Bindings()[0].Expires = %v, want %v", got, want)
	}
	f.clock.Advance(DefaultTCPClosedTimeout)
	bs = f.nat.Bindings()
	if len(bs) != 1 {
		t.Fatalf("len(bs) = %d, want %d: %v", len(bs), 1, bs)
	}
	if bs[0].State != Quarantined {
		t.Fatalf("bs[0].State = %v, want %v", bs[0].State, Quarantined)
	}
	f.clock.Advance(DefaultQuarantine)
	if got := f.nat.Bindings(); len(got) != 0 {
		t.Fatalf("f.nat.Bindings() = %v, want empty", got)
	}
	if got := f.res.InUse(); got != 0 {
		t.Fatalf("f.res.InUse() = %v, want %v", got, 0)
	}

	// FIN in both directions: 120 s.
	p := openTCP(t, f, 40001)
	fin := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40001, Dport: 443, Flags: packet.TCPFlagFIN | packet.TCPFlagACK, Seq: 1001}.Build()
	if got := f.host(fin).Verdict; got != Forward {
		t.Fatalf("f.host(fin).Verdict = %v, want %v", got, Forward)
	}
	if want, got := f.clock.Now().Add(7200*time.Second), f.nat.Bindings()[0].Expires; !reflect.DeepEqual(got, want) {
		t.Fatalf("f.nat.Bindings()[0].Expires = %v, want %v", got, want)
	}
	rfin := replyTo(p, packet.TCPFlagFIN|packet.TCPFlagACK, "")
	if got := f.peer(be1.Peer, rfin).Verdict; got != Forward {
		t.Fatalf("f.peer(be1.Peer, rfin).Verdict = %v, want %v", got, Forward)
	}
	if want, got := f.clock.Now().Add(DefaultTCPFinTimeout), f.nat.Bindings()[0].Expires; !reflect.DeepEqual(got, want) {
		t.Fatalf("f.nat.Bindings()[0].Expires = %v, want %v", got, want)
	}
}

func TestIdleExpiryAndQuarantine(t *testing.T) {
	f := newFixture(t)
	if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}, IdleTimeout: 30 * time.Second}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}, IdleTimeout: 30 * time.Second}): %v", err)
	}
	p := udpTo(5000, "q")
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	sh, _ := ports(p)
	f.clock.Advance(29 * time.Second)
	rep := replyTo(p, 0, "a")
	if got := f.peer(be1.Peer, rep).Verdict; got != Forward {
		t.Fatalf("f.peer(be1.Peer, rep).Verdict = %v, want %v", got, Forward)
	} // extends to 59 s
	f.clock.Advance(29 * time.Second)
	if got := f.nat.Bindings()[0].State; got != Active {
		t.Fatalf("f.nat.Bindings()[0].State = %v, want %v", got, Active)
	}
	f.clock.Advance(1 * time.Second) // 59 s: idle expiry, on the clock, without traffic
	bs := f.nat.Bindings()
	if len(bs) != 1 {
		t.Fatalf("len(bs) = %d, want %d: %v", len(bs), 1, bs)
	}
	if bs[0].State != Quarantined {
		t.Fatalf("bs[0].State = %v, want %v", bs[0].State, Quarantined)
	}
	if got := f.res.InUse(); got != 1 {
		t.Fatalf("f.res.InUse() = %v, want %v", got, 1)
	}

	// Late replies are dropped; a new datagram gets a new shadow port.
	rep = replyTo(p, 0, "late")
	if want, got := (Result{Verdict: Drop, Reason: ReasonQuarantined}), f.peer(be1.Peer, rep); got != want {
		t.Fatalf("f.peer(be1.Peer, rep) = %v, want %v", got, want)
	}
	p2 := udpTo(5000, "again")
	if got := f.host(p2).Verdict; got != Forward {
		t.Fatalf("f.host(p2).Verdict = %v, want %v", got, Forward)
	}
	sh2, _ := ports(p2)
	if sh2 == sh {
		t.Fatalf("sh2 = %v, want anything else", sh2)
	}

	f.clock.Advance(DefaultQuarantine) // 179 s: the first leaves quarantine, the second (idle since 89 s) is in it
	bs = f.nat.Bindings()
	if len(bs) != 1 {
		t.Fatalf("len(bs) = %d, want %d: %v", len(bs), 1, bs)
	}
	if got := bs[0].Shadow.Port(); got != sh2 {
		t.Fatalf("bs[0].Shadow.Port() = %v, want %v", got, sh2)
	}
	if bs[0].State != Quarantined {
		t.Fatalf("bs[0].State = %v, want %v", bs[0].State, Quarantined)
	}
	f.clock.Advance(30 * time.Second)
	if got := f.nat.Bindings(); len(got) != 0 {
		t.Fatalf("f.nat.Bindings() = %v, want empty", got)
	}
	if got := f.res.InUse(); got != 0 {
		t.Fatalf("f.res.InUse() = %v, want %v", got, 0)
	}
}

func TestCapacitySharedAndNeverEvicts(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Capacity = 4 })
	setUDP(t, f, be1)
	for i := range 4 {
		if got := f.host(udpTo(uint16(1000+i), "x")).Verdict; got != Forward {
			t.Fatalf("f.host(udpTo(uint16(1000+i), \"x\")).Verdict = %v, want %v", got, Forward)
		}
	}
	r := f.host(udpTo(2000, "x"))
	if want := (Result{Verdict: Drop, Reason: ReasonCapacity}); r != want {
		t.Fatalf("r = %v, want %v", r, want)
	}
	if got := f.nat.Stats().Refused; got != uint64(1) {
		t.Fatalf("f.nat.Stats().Refused = %v, want %v", got, uint64(1))
	}
	// Existing flows still work.
	if got := f.host(udpTo(1000, "y")).Verdict; got != Forward {
		t.Fatalf("f.host(udpTo(1000, \"y\")).Verdict = %v, want %v", got, Forward)
	}
	// Expiry moves them into quarantine, which still counts.
	f.clock.Advance(DefaultUDPIdleTimeout)
	st := f.nat.Stats()
	if st.Quarantined != 4 {
		t.Fatalf("st.Quarantined = %v, want %v", st.Quarantined, 4)
	}
	if got := f.host(udpTo(2000, "x")).Verdict; got != Drop {
		t.Fatalf("f.host(udpTo(2000, \"x\")).Verdict = %v, want %v", got, Drop)
	}
	f.clock.Advance(DefaultQuarantine)
	if got := f.host(udpTo(2000, "x")).Verdict; got != Forward {
		t.Fatalf("f.host(udpTo(2000, \"x\")).Verdict = %v, want %v", got, Forward)
	}
	ls, _ := f.nat.ListenerStats(lUDP)
	if ls.Drops[ReasonCapacity] != uint64(2) {
		t.Fatalf("ls.Drops[ReasonCapacity] = %v, want %v", ls.Drops[ReasonCapacity], uint64(2))
	}
}

func TestUDPFailover(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1, be2)
	p := udpTo(5000, "1")
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	if got := packet.IPv4(p).Dst(); got != be1.Addr {
		t.Fatalf("packet.IPv4(p).Dst() = %v, want %v", got, be1.Addr)
	}
	// Unavailability is noticed after HealthChanged, not per packet.
	f.sel.setDown(be1, true)
	p = udpTo(5000, "2")
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	if got := packet.IPv4(p).Dst(); got != be1.Addr {
		t.Fatalf("packet.IPv4(p).Dst() = %v, want %v", got, be1.Addr)
	}
	f.nat.HealthChanged()
	p = udpTo(5000, "3")
	if want, got := (Result{Verdict: Forward, Peer: be2.Peer}), f.host(p); got != want {
		t.Fatalf("f.host(p) = %v, want %v", got, want)
	}
	if got := packet.IPv4(p).Dst(); got != be2.Addr {
		t.Fatalf("packet.IPv4(p).Dst() = %v, want %v", got, be2.Addr)
	}
	ls, _ := f.nat.ListenerStats(lUDP)
	if ls.Failovers != uint64(1) {
		t.Fatalf("ls.Failovers = %v, want %v", ls.Failovers, uint64(1))
	}
	if got := f.nat.Stats().Failovers; got != uint64(1) {
		t.Fatalf("f.nat.Stats().Failovers = %v, want %v", got, uint64(1))
	}
	// Nothing is replayed: exactly the datagrams given were forwarded.
	if len(f.out) != 0 {
		t.Fatalf("f.out = %v, want empty", f.out)
	}
	if got := f.nat.Bindings()[0].PacketsOut + f.nat.Bindings()[1].PacketsOut - 2; got != uint64(1) {
		t.Fatalf("f.nat.Bindings()[0].PacketsOut+f.nat.Bindings()[1].PacketsOut-2 = %v, want %v", got, uint64(1))
	}
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
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	// The backend answers port unreachable, quoting what it received.
	icmp := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: packet.ICMPCodePortUnreach, Payload: p}.Build()
	r := f.peer(be1.Peer, icmp)
	if r.Verdict != Forward {
		t.Fatalf("r.Verdict = %v, want %v", r.Verdict, Forward)
	}
	requireSums(t, icmp)
	if got := packet.IPv4(icmp).Src(); got != vipAddr {
		t.Fatalf("packet.IPv4(icmp).Src() = %v, want %v", got, vipAddr)
	}
	if got := packet.IPv4(icmp).Dst(); got != localAddr {
		t.Fatalf("packet.IPv4(icmp).Dst() = %v, want %v", got, localAddr)
	}
	// The quote is now exactly what the client sent.
	if got := []byte(packet.ICMPv4(icmp[20:]).Quoted()); !bytes.Equal(got, orig) {
		t.Fatalf("[]byte(packet.ICMPv4(icmp[20:]).Quoted()) = %v, want %v", got, orig)
	}
	if want := ([]report{{lUDP, be1}}); !reflect.DeepEqual(f.reports, want) {
		t.Fatalf("f.reports = %v, want %v", f.reports, want)
	}
	// Next datagram fails over without the engine calling HealthChanged.
	p = udpTo(5000, "retry")
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	if got := packet.IPv4(p).Dst(); got != be2.Addr {
		t.Fatalf("packet.IPv4(p).Dst() = %v, want %v", got, be2.Addr)
	}
}

func TestICMPErrorTruncatedQuote(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1)
	orig := syn(40000, 1)
	p := append([]byte(nil), orig...)
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	// TTL exceeded quoting only header + 8 bytes (no TCP checksum).
	icmp := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoICMP, ICMPType: packet.ICMPTimeExceeded, Payload: p[:28]}.Build()
	if got := f.peer(be1.Peer, icmp).Verdict; got != Forward {
		t.Fatalf("f.peer(be1.Peer, icmp).Verdict = %v, want %v", got, Forward)
	}
	requireSums(t, icmp)
	if want, got := orig[:28], []byte(packet.ICMPv4(icmp[20:]).Quoted()); !bytes.Equal(got, want) {
		t.Fatalf("[]byte(packet.ICMPv4(icmp[20:]).Quoted()) = %v, want %v", got, want)
	}
	if len(f.reports) != 0 {
		t.Fatalf("f.reports = %v, want empty", f.reports)
	}
}

func TestICMPErrorGarbageQuote(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1)
	p := syn(40000, 1)
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	cases := map[string][]byte{
		"short":   p[:10],
		"not v4":  append([]byte{0x60}, p[1:28]...),
		"bad ihl": append([]byte{0x43}, p[1:28]...),
		"no l4":   p[:24],
	}
	for name, q := range cases {
		icmp := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: 1, Payload: q}.Build()
		if want, got := (Result{Verdict: Drop, Reason: ReasonICMPQuote}), f.peer(be1.Peer, icmp); got != want {
			t.Fatalf("%v: f.peer(be1.Peer, icmp) = %v, want %v", name, got, want)
		}
	}
	// An error about unrelated traffic passes untouched.
	other := P{Src: localAddr, Dst: be1.Addr, Proto: ProtoUDP, Sport: 1, Dport: 2}.Build()
	icmp := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: 3, Payload: other}.Build()
	if got := f.peer(be1.Peer, icmp).Verdict; got != Pass {
		t.Fatalf("f.peer(be1.Peer, icmp).Verdict = %v, want %v", got, Pass)
	}
	// An error about a binding from the wrong peer is dropped.
	icmp = P{Src: be2.Addr, Dst: localAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: 3, Payload: p}.Build()
	if want, got := (Result{Verdict: Drop, Reason: ReasonPeerMismatch}), f.peer(be2.Peer, icmp); got != want {
		t.Fatalf("f.peer(be2.Peer, icmp) = %v, want %v", got, want)
	}
}

func TestHostICMPErrorAboutReply(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	p := udpTo(5000, "q")
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	origReply := replyTo(p, 0, "answer")
	rep := append([]byte(nil), origReply...)
	if got := f.peer(be1.Peer, rep).Verdict; got != Forward {
		t.Fatalf("f.peer(be1.Peer, rep).Verdict = %v, want %v", got, Forward)
	}
	// The client's host answers the reply with port unreachable.
	icmp := P{Src: localAddr, Dst: vipAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: 3, Payload: rep}.Build()
	r := f.host(icmp)
	if want := (Result{Verdict: Forward, Peer: be1.Peer}); r != want {
		t.Fatalf("r = %v, want %v", r, want)
	}
	requireSums(t, icmp)
	if got := packet.IPv4(icmp).Dst(); got != be1.Addr {
		t.Fatalf("packet.IPv4(icmp).Dst() = %v, want %v", got, be1.Addr)
	}
	if got := []byte(packet.ICMPv4(icmp[20:]).Quoted()); !bytes.Equal(got, origReply) {
		t.Fatalf("the backend sees its own datagram quoted: []byte(packet.ICMPv4(icmp[20:]).Quoted()) = %v, want %v", got, origReply)
	}
}

func TestHairpin(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, beLocal)
	orig := syn(40000, 1)
	p := append([]byte(nil), orig...)
	r := f.host(p)
	if want := (Result{Verdict: Reflect}); r != want {
		t.Fatalf("r = %v, want %v", r, want)
	}
	if got := packet.IPv4(p).Src(); got != vipAddr {
		t.Fatalf("the local backend sees the VIP as source: packet.IPv4(p).Src() = %v, want %v", got, vipAddr)
	}
	if got := packet.IPv4(p).Dst(); got != localAddr {
		t.Fatalf("packet.IPv4(p).Dst() = %v, want %v", got, localAddr)
	}
	_, dp := ports(p)
	if dp != beLocal.Port {
		t.Fatalf("dp = %v, want %v", dp, beLocal.Port)
	}
	requireSums(t, p)
	// The host's reply comes back through FromHost.
	rep := replyTo(p, packet.TCPFlagSYN|packet.TCPFlagACK, "")
	if want, got := (Result{Verdict: Reflect}), f.host(rep); got != want {
		t.Fatalf("f.host(rep) = %v, want %v", got, want)
	}
	if got := packet.IPv4(rep).Src(); got != vipAddr {
		t.Fatalf("packet.IPv4(rep).Src() = %v, want %v", got, vipAddr)
	}
	if got := packet.IPv4(rep).Dst(); got != localAddr {
		t.Fatalf("packet.IPv4(rep).Dst() = %v, want %v", got, localAddr)
	}
	sp, dp := ports(rep)
	if sp != uint16(443) {
		t.Fatalf("sp = %v, want %v", sp, uint16(443))
	}
	if dp != uint16(40000) {
		t.Fatalf("dp = %v, want %v", dp, uint16(40000))
	}
	requireSums(t, rep)
	if !f.nat.Bindings()[0].Hairpin {
		t.Fatal("f.nat.Bindings()[0].Hairpin is false")
	}
	// A peer cannot answer for it.
	if got := f.peer(2, replyTo(p, packet.TCPFlagACK, "")).Reason; got != ReasonVIPDestination {
		t.Fatalf("f.peer(2, replyTo(p, packet.TCPFlagACK, \"\")).Reason = %v, want %v", got, ReasonVIPDestination)
	}
	// The host's port unreachable for the hairpinned request is translated
	// for the client and reported.
	icmp := P{Src: localAddr, Dst: vipAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: 3, Payload: p}.Build()
	if want, got := (Result{Verdict: Reflect}), f.host(icmp); got != want {
		t.Fatalf("f.host(icmp) = %v, want %v", got, want)
	}
	requireSums(t, icmp)
	if got := []byte(packet.ICMPv4(icmp[20:]).Quoted()); !bytes.Equal(got, orig) {
		t.Fatalf("[]byte(packet.ICMPv4(icmp[20:]).Quoted()) = %v, want %v", got, orig)
	}
	if want := ([]report{{lTCP, beLocal}}); !reflect.DeepEqual(f.reports, want) {
		t.Fatalf("f.reports = %v, want %v", f.reports, want)
	}
}

func TestRemoval(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1, be2)
	setTCP(t, f, be1)
	p := udpTo(5000, "q")
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}

	if !f.nat.RemoveBackend(lUDP, be1) {
		t.Fatal("f.nat.RemoveBackend(lUDP, be1) is false")
	}
	if f.nat.RemoveBackend(lUDP, be1) {
		t.Fatal("f.nat.RemoveBackend(lUDP, be1) is true")
	}
	p = udpTo(5000, "existing continues")
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	if got := packet.IPv4(p).Dst(); got != be1.Addr {
		t.Fatalf("packet.IPv4(p).Dst() = %v, want %v", got, be1.Addr)
	}
	p = udpTo(5001, "new")
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	if got := packet.IPv4(p).Dst(); got != be2.Addr {
		t.Fatalf("packet.IPv4(p).Dst() = %v, want %v", got, be2.Addr)
	}

	if !f.nat.RemoveListener(lUDP) {
		t.Fatal("f.nat.RemoveListener(lUDP) is false")
	}
	if want, got := (Result{Verdict: Drop, Reason: ReasonPortUnreachable}), f.host(udpTo(5002, "x")); got != want {
		t.Fatalf("a removed listener refuses new flows: f.host(udpTo(5002, \"x\")) = %v, want %v", got, want)
	}
	if got := f.host(udpTo(5000, "still")).Verdict; got != Forward {
		t.Fatalf("f.host(udpTo(5000, \"still\")).Verdict = %v, want %v", got, Forward)
	}
	ls, ok := f.nat.ListenerStats(lUDP)
	if !ok {
		t.Fatal("ok is false")
	}
	if !ls.Removed {
		t.Fatal("ls.Removed is false")
	}
	if !f.nat.IsVIP(vipAddr) {
		t.Fatal("f.nat.IsVIP(vipAddr) is false")
	}

	openTCP(t, f, 40000)
	if got := f.nat.RemoveVIP(vipAddr); got != 1 {
		t.Fatalf("f.nat.RemoveVIP(vipAddr) = %v, want %v", got, 1)
	}
	if got := f.host(syn(40001, 1)).Verdict; got != Pass {
		t.Fatalf("a new flow to an address that only drains is not the NAT's: f.host(syn(40001, 1)).Verdict = %v, want %v", got, Pass)
	}
	ack := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40000, Dport: 443, Flags: packet.TCPFlagACK, Seq: 1001}.Build()
	if got := f.host(ack).Verdict; got != Forward {
		t.Fatalf("established TCP drains: f.host(ack).Verdict = %v, want %v", got, Forward)
	}
	if !f.nat.IsVIP(vipAddr) {
		t.Fatal("a draining VIP stays claimed: f.nat.IsVIP(vipAddr) is false")
	}

	f.clock.Advance(DefaultTCPIdleTimeout + DefaultQuarantine)
	if got := f.nat.Bindings(); len(got) != 0 {
		t.Fatalf("f.nat.Bindings() = %v, want empty", got)
	}
	if f.nat.IsVIP(vipAddr) {
		t.Fatal("f.nat.IsVIP(vipAddr) is true")
	}
	_, ok = f.nat.ListenerStats(lUDP)
	if ok {
		t.Fatal("ok is true")
	}
	if got := f.host(udpTo(5000, "x")).Verdict; got != Pass {
		t.Fatalf("f.host(udpTo(5000, \"x\")).Verdict = %v, want %v", got, Pass)
	}
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
		if err := f.nat.SetListener(l, ListenerConfig{}); !errors.Is(err, ErrInvalidListener) {
			t.Fatalf("%v: f.nat.SetListener(l, ListenerConfig{}) = %v, want ErrInvalidListener", l, err)
		}
	}
	if err := f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{{Peer: 0, Addr: be1.Addr, Port: 1}}}); !errors.Is(err, ErrInvalidBackend) {
		t.Fatalf("f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{{Peer: 0, Addr: be1.Addr, Port: 1}}}) = %v, want ErrInvalidBackend", err)
	}
	if err := f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{{Peer: 5, Addr: localAddr, Port: 1}}}); !errors.Is(err, ErrInvalidBackend) {
		t.Fatalf("f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{{Peer: 5, Addr: localAddr, Port: 1}}}) = %v, want ErrInvalidBackend", err)
	}
	if err := f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{{Peer: 5, Addr: be1.Addr}}}); !errors.Is(err, ErrInvalidBackend) {
		t.Fatalf("f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{{Peer: 5, Addr: be1.Addr}}}) = %v, want ErrInvalidBackend", err)
	}
	if err := f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1, be2, be1}}); !errors.Is(err, ErrLimit) {
		t.Fatalf("f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1, be2, be1}}) = %v, want ErrLimit", err)
	}
	if err := f.nat.SetListener(lTCP, ListenerConfig{}); err != nil {
		t.Fatalf("f.nat.SetListener(lTCP, ListenerConfig{}): %v", err)
	}
	if err := f.nat.SetListener(lUDP, ListenerConfig{}); !errors.Is(err, ErrLimit) {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{}) = %v, want ErrLimit", err)
	}
	// An empty listener claims its VIP but refuses flows (with a RST).
	if want, got := (Result{Verdict: Drop, Reason: ReasonRefused}), f.host(syn(1, 1)); got != want {
		t.Fatalf("f.host(syn(1, 1)) = %v, want %v", got, want)
	}
	if err := f.nat.Close(); err != nil {
		t.Fatalf("f.nat.Close(): %v", err)
	}
	if err := f.nat.SetListener(lTCP, ListenerConfig{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("f.nat.SetListener(lTCP, ListenerConfig{}) = %v, want ErrClosed", err)
	}
	if got := f.host(syn(1, 1)).Verdict; got != Pass {
		t.Fatalf("f.host(syn(1, 1)).Verdict = %v, want %v", got, Pass)
	}
}

func TestNewValidation(t *testing.T) {
	_, err := New(Options{Selector: &testSel{}})
	if !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("error %v, want ErrInvalidOptions", err)
	}
	_, err = New(Options{LocalAddr: localAddr})
	if !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("error %v, want ErrInvalidOptions", err)
	}
	_, err = New(Options{LocalAddr: localAddr, Selector: &testSel{}, Capacity: MaxCapacity + 1})
	if !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("error %v, want ErrInvalidOptions", err)
	}
	_, err = New(Options{LocalAddr: localAddr, Selector: &testSel{}, MTU: 10})
	if !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("error %v, want ErrInvalidOptions", err)
	}
}

func TestCloseReleasesPorts(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	setTCP(t, f, be1)
	for i := range 10 {
		if got := f.host(udpTo(uint16(100+i), "x")).Verdict; got != Forward {
			t.Fatalf("f.host(udpTo(uint16(100+i), \"x\")).Verdict = %v, want %v", got, Forward)
		}
	}
	openTCP(t, f, 40000)
	if got := f.res.InUse(); got != 11 {
		t.Fatalf("f.res.InUse() = %v, want %v", got, 11)
	}
	if err := f.nat.Close(); err != nil {
		t.Fatalf("f.nat.Close(): %v", err)
	}
	if err := f.nat.Close(); err != nil {
		t.Fatalf("f.nat.Close(): %v", err)
	}
	if got := f.res.InUse(); got != 0 {
		t.Fatalf("f.res.InUse() = %v, want %v", got, 0)
	}
	if got := f.nat.Bindings(); len(got) != 0 {
		t.Fatalf("f.nat.Bindings() = %v, want empty", got)
	}
	if got := f.clock.Pending(); got != 0 {
		t.Fatalf("the sweep timer is stopped: f.clock.Pending() = %v, want %v", got, 0)
	}
}

func TestDFTooBigSendsFragNeeded(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MTU = 600; o.HostMTU = 1500 })
	setUDP(t, f, be1)
	orig := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 5000, Dport: 53, Payload: make([]byte, 1000), DF: true}.Build()
	p := append([]byte(nil), orig...)
	if want, got := (Result{Verdict: Drop, Reason: ReasonFragNeeded}), f.host(p); got != want {
		t.Fatalf("f.host(p) = %v, want %v", got, want)
	}
	out := f.takeOut()
	if len(out) != 1 {
		t.Fatalf("len(out) = %d, want %d: %v", len(out), 1, out)
	}
	if out[0].dir != ToHost {
		t.Fatalf("out[0].dir = %v, want %v", out[0].dir, ToHost)
	}
	icmp := packet.IPv4(out[0].pkt)
	if err := icmp.Validate(); err != nil {
		t.Fatalf("icmp.Validate(): %v", err)
	}
	if got := icmp.Src(); got != vipAddr {
		t.Fatalf("icmp.Src() = %v, want %v", got, vipAddr)
	}
	if got := icmp.Dst(); got != localAddr {
		t.Fatalf("icmp.Dst() = %v, want %v", got, localAddr)
	}
	m := packet.ICMPv4(icmp.Payload())
	if got := m.Type(); got != uint8(packet.ICMPDestUnreachable) {
		t.Fatalf("m.Type() = %v, want %v", got, uint8(packet.ICMPDestUnreachable))
	}
	if got := m.Code(); got != uint8(packet.ICMPCodeFragNeeded) {
		t.Fatalf("m.Code() = %v, want %v", got, uint8(packet.ICMPCodeFragNeeded))
	}
	if got := m.MTU(); got != uint16(600) {
		t.Fatalf("m.MTU() = %v, want %v", got, uint16(600))
	}
	if want, got := orig[:28], []byte(m.Quoted()); !bytes.Equal(got, want) {
		t.Fatalf("[]byte(m.Quoted()) = %v, want %v", got, want)
	}
	requireSums(t, out[0].pkt)

	// Without DF it is fragmented to the MTU.
	q := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 5000, Dport: 53, Payload: make([]byte, 1000)}.Build()
	if got := f.host(q).Verdict; got != Consumed {
		t.Fatalf("f.host(q).Verdict = %v, want %v", got, Consumed)
	}
	out = f.takeOut()
	if len(out) != 2 {
		t.Fatalf("len(out) = %d, want %d: %v", len(out), 2, out)
	}
	for _, e := range out {
		if e.dir != ToOverlay {
			t.Fatalf("e.dir = %v, want %v", e.dir, ToOverlay)
		}
		if len(e.pkt) > 600 {
			t.Fatalf("len(e.pkt) = %v, want <= %v", len(e.pkt), 600)
		}
		if err := packet.IPv4(e.pkt).Validate(); err != nil {
			t.Fatalf("packet.IPv4(e.pkt).Validate(): %v", err)
		}
		if got := packet.IPv4(e.pkt).Dst(); got != be1.Addr {
			t.Fatalf("packet.IPv4(e.pkt).Dst() = %v, want %v", got, be1.Addr)
		}
	}
	if got := f.nat.Stats().Fragmented; got != uint64(1) {
		t.Fatalf("f.nat.Stats().Fragmented = %v, want %v", got, uint64(1))
	}
}

func TestNoEmit(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MTU = 600; o.Emit = nil })
	setUDP(t, f, be1)
	q := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 5000, Dport: 53, Payload: make([]byte, 1000)}.Build()
	if want, got := (Result{Verdict: Drop, Reason: ReasonNoEmit}), f.host(q); got != want {
		t.Fatalf("f.host(q) = %v, want %v", got, want)
	}
}

func TestSentinelErrors(t *testing.T) {
	r := NewMemReserver(MemReserverOptions{Min: 1000, Max: 1001, Seed: 1})
	for range 2 {
		_, err := r.Reserve(ProtoUDP, netip.AddrPort{})
		if err != nil {
			t.Fatalf("%v", err)
		}
	}
	_, err := r.Reserve(ProtoUDP, netip.AddrPort{})
	if !errors.Is(err, ErrPortsExhausted) {
		t.Fatalf("error %v, want ErrPortsExhausted", err)
	}
	if !errors.Is(ErrClosed, ErrClosed) {
		t.Fatal("errors.Is(ErrClosed, ErrClosed) is false")
	}
}

func TestNoPortDropped(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Reserver = NewMemReserver(MemReserverOptions{Min: 1000, Max: 1000, Seed: 1}) })
	setUDP(t, f, be1)
	if got := f.host(udpTo(1, "a")).Verdict; got != Forward {
		t.Fatalf("f.host(udpTo(1, \"a\")).Verdict = %v, want %v", got, Forward)
	}
	if want, got := (Result{Verdict: Drop, Reason: ReasonNoPort}), f.host(udpTo(2, "a")); got != want {
		t.Fatalf("f.host(udpTo(2, \"a\")) = %v, want %v", got, want)
	}
}
