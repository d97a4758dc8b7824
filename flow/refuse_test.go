package flow

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/vipkit/vipkit/packet"
)

// reply returns the single packet the NAT emitted toward the host, with
// its IPv4 and L4 checksums verified.
func (f *fixture) reply(t *testing.T) packet.IPv4 {
	t.Helper()
	out := f.takeOut()
	if len(out) != 1 {
		t.Fatalf("one reply: len(out) = %d, want %d: %v", len(out), 1, out)
	}
	if out[0].dir != ToHost {
		t.Fatalf("out[0].dir = %v, want %v", out[0].dir, ToHost)
	}
	ip := packet.IPv4(out[0].pkt)
	if err := ip.Validate(); err != nil {
		t.Fatalf("ip.Validate(): %v", err)
	}
	if want := ip.TotalLen(); len(ip) != want {
		t.Fatalf("len(ip) = %v, want %v", len(ip), want)
	}
	requireSums(t, ip)
	return ip
}

// emptyFixture has a VIP with a TCP listener on 443 and a UDP listener on
// 53, both without backends.
func emptyFixture(t *testing.T, mods ...func(*Options)) *fixture {
	f := newFixture(t, mods...)
	if err := f.nat.SetListener(lTCP, ListenerConfig{}); err != nil {
		t.Fatalf("f.nat.SetListener(lTCP, ListenerConfig{}): %v", err)
	}
	if err := f.nat.SetListener(lUDP, ListenerConfig{}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{}): %v", err)
	}
	return f
}

func TestRefuseTCPSynWithRST(t *testing.T) {
	for _, c := range []struct {
		name  string
		dport uint16
		cause DropReason
	}{
		{"empty listener", 443, ReasonNoBackend},
		{"no listener on the VIP", 8080, ReasonNoListener},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := emptyFixture(t)
			pay := []byte("syn data")
			p := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40000, Dport: c.dport,
				Flags: packet.TCPFlagSYN, Seq: 0xfffffffa, Payload: pay}.Build()
			r := f.host(p)
			if want := (Result{Verdict: Drop, Reason: ReasonRefused}); r != want {
				t.Fatalf("r = %v, want %v", r, want)
			}
			ip := f.reply(t)
			if got := ip.Protocol(); got != packet.ProtoTCP {
				t.Fatalf("ip.Protocol() = %v, want %v", got, packet.ProtoTCP)
			}
			if got := ip.Src(); got != vipAddr {
				t.Fatalf("from the VIP: ip.Src() = %v, want %v", got, vipAddr)
			}
			if got := ip.Dst(); got != localAddr {
				t.Fatalf("ip.Dst() = %v, want %v", got, localAddr)
			}
			tc := packet.TCP(ip.Payload())
			if got := tc.SrcPort(); got != c.dport {
				t.Fatalf("tc.SrcPort() = %v, want %v", got, c.dport)
			}
			if got := tc.DstPort(); got != uint16(40000) {
				t.Fatalf("tc.DstPort() = %v, want %v", got, uint16(40000))
			}
			if got := tc.Seq(); got != uint32(0) {
				t.Fatalf("tc.Seq() = %v, want %v", got, uint32(0))
			}
			// SYN's seq + 1 (the SYN) + payload, wrapping.
			if got := tc.Ack(); got != uint32(0xfffffffa)+1+uint32(len(pay)) {
				t.Fatalf("tc.Ack() = %v, want %v", got, uint32(0xfffffffa)+1+uint32(len(pay)))
			}
			if got := tc.Flags(); got != uint8(packet.TCPFlagRST|packet.TCPFlagACK) {
				t.Fatalf("tc.Flags() = %v, want %v", got, uint8(packet.TCPFlagRST|packet.TCPFlagACK))
			}
			if got := tc.Payload(); len(got) != 0 {
				t.Fatalf("tc.Payload() = %v, want empty", got)
			}
			st := f.nat.Stats()
			if st.Drops[ReasonRefused] != uint64(1) {
				t.Fatalf("st.Drops[ReasonRefused] = %v, want %v", st.Drops[ReasonRefused], uint64(1))
			}
			if st.Drops[c.cause] != 0 {
				t.Fatalf("counted as refused, not as its cause: st.Drops[c.cause] = %v, want 0", st.Drops[c.cause])
			}
			if c.cause == ReasonNoBackend {
				ls, ok := f.nat.ListenerStats(lTCP)
				if !ok {
					t.Fatal("ok is false")
				}
				if ls.Drops[ReasonRefused] != uint64(1) {
					t.Fatalf("ls.Drops[ReasonRefused] = %v, want %v", ls.Drops[ReasonRefused], uint64(1))
				}
			}
		})
	}
}

func TestRefuseTCPNonSyn(t *testing.T) {
	f := emptyFixture(t)
	// With ACK: <SEQ=SEG.ACK><CTL=RST>.
	f.host(P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40000, Dport: 443,
		Flags: packet.TCPFlagACK | packet.TCPFlagPSH, Seq: 100, Ack: 7777, Payload: []byte("abc")}.Build())
	tc := packet.TCP(f.reply(t).Payload())
	if got := tc.Seq(); got != uint32(7777) {
		t.Fatalf("tc.Seq() = %v, want %v", got, uint32(7777))
	}
	if got := tc.Flags(); got != uint8(packet.TCPFlagRST) {
		t.Fatalf("tc.Flags() = %v, want %v", got, uint8(packet.TCPFlagRST))
	}
	// Without ACK (a FIN alone): <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>,
	// the FIN counting one.
	f.host(P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40000, Dport: 443,
		Flags: packet.TCPFlagFIN, Seq: 100, Payload: []byte("ab")}.Build())
	tc = packet.TCP(f.reply(t).Payload())
	if got := tc.Seq(); got != uint32(0) {
		t.Fatalf("tc.Seq() = %v, want %v", got, uint32(0))
	}
	if got := tc.Ack(); got != uint32(103) {
		t.Fatalf("tc.Ack() = %v, want %v", got, uint32(103))
	}
	if got := tc.Flags(); got != uint8(packet.TCPFlagRST|packet.TCPFlagACK) {
		t.Fatalf("tc.Flags() = %v, want %v", got, uint8(packet.TCPFlagRST|packet.TCPFlagACK))
	}
}

func TestRefuseUDPWithPortUnreachable(t *testing.T) {
	for _, c := range []struct {
		name  string
		dport uint16
	}{{"empty listener", 53}, {"no listener on the VIP", 5353}} {
		t.Run(c.name, func(t *testing.T) {
			f := emptyFixture(t)
			p := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 5000, Dport: c.dport,
				Payload: []byte("a query longer than eight bytes"), Options: []byte{1, 1, 1, 1}}.Build()
			orig := append([]byte(nil), p...)
			if want, got := (Result{Verdict: Drop, Reason: ReasonPortUnreachable}), f.host(p); got != want {
				t.Fatalf("f.host(p) = %v, want %v", got, want)
			}
			ip := f.reply(t)
			if got := ip.Protocol(); got != packet.ProtoICMP {
				t.Fatalf("ip.Protocol() = %v, want %v", got, packet.ProtoICMP)
			}
			if got := ip.Src(); got != vipAddr {
				t.Fatalf("from the VIP: ip.Src() = %v, want %v", got, vipAddr)
			}
			if got := ip.Dst(); got != localAddr {
				t.Fatalf("ip.Dst() = %v, want %v", got, localAddr)
			}
			ic := packet.ICMPv4(ip.Payload())
			if got := ic.Type(); got != uint8(packet.ICMPDestUnreachable) {
				t.Fatalf("ic.Type() = %v, want %v", got, uint8(packet.ICMPDestUnreachable))
			}
			if got := ic.Code(); got != uint8(packet.ICMPCodePortUnreach) {
				t.Fatalf("ic.Code() = %v, want %v", got, uint8(packet.ICMPCodePortUnreach))
			}
			// The original IP header (with its options) and 8 bytes of data.
			if want, got := orig[:24+8], ic.Quoted(); !bytes.Equal(got, want) {
				t.Fatalf("ic.Quoted() = %v, want %v", got, want)
			}
			if got := f.nat.Stats().Drops[ReasonPortUnreachable]; got != uint64(1) {
				t.Fatalf("f.nat.Stats().Drops[ReasonPortUnreachable] = %v, want %v", got, uint64(1))
			}
			if got := f.nat.Stats().ICMPSent; got != uint64(1) {
				t.Fatalf("f.nat.Stats().ICMPSent = %v, want %v", got, uint64(1))
			}
		})
	}
}

func TestRefuseNeverAnswers(t *testing.T) {
	f := emptyFixture(t)
	bcast := netip.MustParseAddr("255.255.255.255")
	mcast := netip.MustParseAddr("224.0.0.5")
	for _, c := range []struct {
		name  string
		pkt   []byte
		cause DropReason
	}{
		{"rst", P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 1, Dport: 443, Flags: packet.TCPFlagRST, Seq: 5}.Build(), ReasonNoFlow},
		{"rst-ack", P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 1, Dport: 443, Flags: packet.TCPFlagRST | packet.TCPFlagACK, Seq: 5}.Build(), ReasonNoFlow},
		{"broadcast source", P{Src: bcast, Dst: vipAddr, Proto: ProtoUDP, Sport: 1, Dport: 53}.Build(), ReasonNoBackend},
		{"multicast source", P{Src: mcast, Dst: vipAddr, Proto: ProtoTCP, Sport: 1, Dport: 443, Flags: packet.TCPFlagSYN}.Build(), ReasonNoBackend},
		{"unspecified source", P{Src: netip.IPv4Unspecified(), Dst: vipAddr, Proto: ProtoUDP, Sport: 1, Dport: 53}.Build(), ReasonNoBackend},
		{"icmp error", P{Src: localAddr, Dst: vipAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: 3,
			Payload: P{Src: vipAddr, Dst: localAddr, Proto: ProtoUDP, Sport: 53, Dport: 1}.Build()}.Build(), ReasonNoFlow},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := f.host(c.pkt)
			if want := (Result{Verdict: Drop, Reason: c.cause}); r != want {
				t.Fatalf("r = %v, want %v", r, want)
			}
			if got := f.takeOut(); len(got) != 0 {
				t.Fatalf("no reply: f.takeOut() = %v, want empty", got)
			}
		})
	}
}

func TestRefuseFragments(t *testing.T) {
	f := emptyFixture(t)
	big := make([]byte, 64)
	p := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 5000, Dport: 53, Payload: big, ID: 9}.Build()
	first, second := fragmentAt(t, p, 32)
	// A later fragment alone is never answered (it waits, then expires).
	if got := f.host(second).Verdict; got != Consumed {
		t.Fatalf("f.host(second).Verdict = %v, want %v", got, Consumed)
	}
	if got := f.takeOut(); len(got) != 0 {
		t.Fatalf("f.takeOut() = %v, want empty", got)
	}
	// The datagram, once whole, is answered once, quoting its first bytes.
	if want, got := (Result{Verdict: Drop, Reason: ReasonPortUnreachable}), f.host(first); got != want {
		t.Fatalf("f.host(first) = %v, want %v", got, want)
	}
	ip := f.reply(t)
	ic := packet.ICMPv4(ip.Payload())
	if got := ic.Code(); got != uint8(packet.ICMPCodePortUnreach) {
		t.Fatalf("ic.Code() = %v, want %v", got, uint8(packet.ICMPCodePortUnreach))
	}
	q := packet.IPv4(ic.Quoted())
	if got := q.FragOffset(); got != 0 {
		t.Fatalf("q.FragOffset() = %v, want 0", got)
	}
	if got := f.nat.Stats().Drops[ReasonPortUnreachable]; got != uint64(1) {
		t.Fatalf("f.nat.Stats().Drops[ReasonPortUnreachable] = %v, want %v", got, uint64(1))
	}
}

// fragmentAt splits a whole datagram into two fragments at offset off
// (a multiple of 8 of its payload).
func fragmentAt(t *testing.T, pkt []byte, off int) (first, second []byte) {
	t.Helper()
	hl := packet.IPv4(pkt).HeaderLen()
	pay := pkt[hl:]
	mk := func(data []byte, fo int, mf bool) []byte {
		b := make([]byte, hl+len(data))
		copy(b, pkt[:hl])
		copy(b[hl:], data)
		fl := uint16(fo / 8)
		if mf {
			fl |= packet.IPv4FlagMF
		}
		b[6], b[7] = byte(fl>>8), byte(fl)
		b[2], b[3] = byte(len(b)>>8), byte(len(b))
		packet.IPv4(b).UpdateChecksum()
		return b
	}
	return mk(pay[:off], 0, true), mk(pay[off:], off, false)
}

func TestRefuseRateLimit(t *testing.T) {
	f := emptyFixture(t)
	n := 0
	for i := 0; i < 1000; i++ {
		r := f.host(syn(uint16(1000+i), 1))
		if r.Reason == ReasonRefused {
			n++
		} else {
			if want := (Result{Verdict: Drop, Reason: ReasonNoBackend}); r != want {
				t.Fatalf("over the limit: dropped silently: r = %v, want %v", r, want)
			}
		}
	}
	if n != DefaultReplyBurst {
		t.Fatalf("the burst, then nothing: n = %v, want %v", n, DefaultReplyBurst)
	}
	if got := f.takeOut(); len(got) != DefaultReplyBurst {
		t.Fatalf("len(f.takeOut()) = %d, want %d: %v", len(got), DefaultReplyBurst, got)
	}
	// Tokens come back at DefaultReplyRate per second, on the NAT's clock.
	f.clock.Advance(time.Second / DefaultReplyRate)
	if got := f.host(syn(1, 1)).Reason; got != ReasonRefused {
		t.Fatalf("f.host(syn(1, 1)).Reason = %v, want %v", got, ReasonRefused)
	}
	if got := f.host(syn(2, 1)).Reason; got != ReasonNoBackend {
		t.Fatalf("f.host(syn(2, 1)).Reason = %v, want %v", got, ReasonNoBackend)
	}
	f.clock.Advance(time.Hour)
	n = 0
	for i := 0; i < 2*DefaultReplyBurst; i++ {
		if f.host(udpTo(uint16(3000+i), "x")).Reason == ReasonPortUnreachable {
			n++
		}
	}
	if n != DefaultReplyBurst {
		t.Fatalf("the bucket holds at most the burst: n = %v, want %v", n, DefaultReplyBurst)
	}
}

func TestRefuseDefaultsPinned(t *testing.T) {
	if DefaultReplyRate != 100 {
		t.Fatalf("DefaultReplyRate = %v, want %v", DefaultReplyRate, 100)
	}
	if DefaultReplyBurst != 20 {
		t.Fatalf("DefaultReplyBurst = %v, want %v", DefaultReplyBurst, 20)
	}
}

func TestRefuseDisabled(t *testing.T) {
	f := emptyFixture(t, func(o *Options) { o.ReplyRate = -1 })
	if want, got := (Result{Verdict: Drop, Reason: ReasonNoBackend}), f.host(syn(1, 1)); got != want {
		t.Fatalf("f.host(syn(1, 1)) = %v, want %v", got, want)
	}
	if want, got := (Result{Verdict: Drop, Reason: ReasonNoBackend}), f.host(udpTo(1, "x")); got != want {
		t.Fatalf("f.host(udpTo(1, \"x\")) = %v, want %v", got, want)
	}
	if got := f.takeOut(); len(got) != 0 {
		t.Fatalf("f.takeOut() = %v, want empty", got)
	}
}

func TestRefuseOnlyEmpty(t *testing.T) {
	// A listener with backends that are all ineligible is not empty: its
	// SYN is dropped silently so that a retransmission can find a backend
	// that recovers.
	f := newFixture(t)
	if err := f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}); err != nil {
		t.Fatalf("f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}): %v", err)
	}
	f.sel.setDown(be1, true)
	if want, got := (Result{Verdict: Drop, Reason: ReasonNoBackend}), f.host(syn(1, 1)); got != want {
		t.Fatalf("f.host(syn(1, 1)) = %v, want %v", got, want)
	}
	if got := f.takeOut(); len(got) != 0 {
		t.Fatalf("f.takeOut() = %v, want empty", got)
	}
}

func TestClaimVIPRefuses(t *testing.T) {
	f := newFixture(t)
	if got := f.host(syn(1, 1)).Verdict; got != Pass {
		t.Fatalf("an unclaimed address is not the NAT's: f.host(syn(1, 1)).Verdict = %v, want %v", got, Pass)
	}
	if err := f.nat.ClaimVIP(vipAddr); err != nil {
		t.Fatalf("f.nat.ClaimVIP(vipAddr): %v", err)
	}
	if err := f.nat.ClaimVIP(vipAddr); err != nil {
		t.Fatalf("idempotent: f.nat.ClaimVIP(vipAddr): %v", err)
	}
	if !f.nat.IsVIP(vipAddr) {
		t.Fatal("f.nat.IsVIP(vipAddr) is false")
	}
	if want, got := (Result{Verdict: Drop, Reason: ReasonRefused}), f.host(syn(1, 1)); got != want {
		t.Fatalf("f.host(syn(1, 1)) = %v, want %v", got, want)
	}
	if want, got := (Result{Verdict: Drop, Reason: ReasonPortUnreachable}), f.host(udpTo(1, "x")); got != want {
		t.Fatalf("f.host(udpTo(1, \"x\")) = %v, want %v", got, want)
	}
	if got := f.takeOut(); len(got) != 2 {
		t.Fatalf("len(f.takeOut()) = %d, want %d: %v", len(got), 2, got)
	}
	// A listener added and removed leaves the claim; releasing it ends it.
	if err := f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}); err != nil {
		t.Fatalf("f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}): %v", err)
	}
	if !f.nat.RemoveListener(lTCP) {
		t.Fatal("f.nat.RemoveListener(lTCP) is false")
	}
	if !f.nat.IsVIP(vipAddr) {
		t.Fatal("f.nat.IsVIP(vipAddr) is false")
	}
	if !f.nat.ReleaseVIP(vipAddr) {
		t.Fatal("f.nat.ReleaseVIP(vipAddr) is false")
	}
	if f.nat.ReleaseVIP(vipAddr) {
		t.Fatal("f.nat.ReleaseVIP(vipAddr) is true")
	}
	if f.nat.IsVIP(vipAddr) {
		t.Fatal("f.nat.IsVIP(vipAddr) is true")
	}
	if got := f.host(syn(1, 1)).Verdict; got != Pass {
		t.Fatalf("f.host(syn(1, 1)).Verdict = %v, want %v", got, Pass)
	}
	// Released while a listener holds it: the listener keeps it.
	if err := f.nat.ClaimVIP(vipAddr); err != nil {
		t.Fatalf("f.nat.ClaimVIP(vipAddr): %v", err)
	}
	if err := f.nat.SetListener(lUDP, ListenerConfig{}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{}): %v", err)
	}
	if !f.nat.ReleaseVIP(vipAddr) {
		t.Fatal("f.nat.ReleaseVIP(vipAddr) is false")
	}
	if !f.nat.IsVIP(vipAddr) {
		t.Fatal("f.nat.IsVIP(vipAddr) is false")
	}
	if err := f.nat.ClaimVIP(localAddr); !errors.Is(err, ErrInvalidListener) {
		t.Fatalf("f.nat.ClaimVIP(localAddr) = %v, want ErrInvalidListener", err)
	}
	if err := f.nat.ClaimVIP(netip.MustParseAddr("::1")); !errors.Is(err, ErrInvalidListener) {
		t.Fatalf("f.nat.ClaimVIP(netip.MustParseAddr(\"::1\")) = %v, want ErrInvalidListener", err)
	}
	if err := f.nat.Close(); err != nil {
		t.Fatalf("f.nat.Close(): %v", err)
	}
	if err := f.nat.ClaimVIP(vip2Addr); !errors.Is(err, ErrClosed) {
		t.Fatalf("f.nat.ClaimVIP(vip2Addr) = %v, want ErrClosed", err)
	}
}

func TestReplyOptionsBounds(t *testing.T) {
	for _, c := range []struct {
		rate, burst int
		ok          bool
	}{
		{MaxReplyRate, MaxReplyBurst, true},
		{MaxReplyRate + 1, 0, false},
		{0, MaxReplyBurst + 1, false},
		{0, -1, false},
		{-1, 0, true},
	} {
		_, err := New(Options{LocalAddr: localAddr, Selector: &testSel{}, ReplyRate: c.rate, ReplyBurst: c.burst})
		if c.ok {
			if err != nil {
				t.Fatalf("%+v: %v", c, err)
			}
		} else {
			if !errors.Is(err, ErrInvalidOptions) {
				t.Fatalf("%+v: error %v, want ErrInvalidOptions", c, err)
			}
		}
	}
	// At the largest rate and burst the bucket still counts exactly.
	f := emptyFixture(t, func(o *Options) { o.ReplyRate, o.ReplyBurst = MaxReplyRate, MaxReplyBurst })
	f.clock.Advance(1 << 62) // a jump far beyond the bucket's size
	for i := 0; i < MaxReplyBurst; i++ {
		if f.nat.FromHost(syn(uint16(i), 1), f.clock.Now()).Reason != ReasonRefused {
			t.Fatalf("refusal %d of the burst not sent", i)
		}
	}
	if got := f.host(syn(1, 1)).Reason; got != ReasonNoBackend {
		t.Fatalf("f.host(syn(1, 1)).Reason = %v, want %v", got, ReasonNoBackend)
	}
	f.out = nil
}
