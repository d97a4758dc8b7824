package flow

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vipkit/vipkit/packet"
)

// reply returns the single packet the NAT emitted toward the host, with
// its IPv4 and L4 checksums verified.
func (f *fixture) reply(t *testing.T) packet.IPv4 {
	t.Helper()
	out := f.takeOut()
	require.Len(t, out, 1, "one reply")
	require.Equal(t, ToHost, out[0].dir)
	ip := packet.IPv4(out[0].pkt)
	require.NoError(t, ip.Validate())
	require.Equal(t, ip.TotalLen(), len(ip))
	requireSums(t, ip)
	return ip
}

// emptyFixture has a VIP with a TCP listener on 443 and a UDP listener on
// 53, both without backends.
func emptyFixture(t *testing.T, mods ...func(*Options)) *fixture {
	f := newFixture(t, mods...)
	require.NoError(t, f.nat.SetListener(lTCP, ListenerConfig{}))
	require.NoError(t, f.nat.SetListener(lUDP, ListenerConfig{}))
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
			require.Equal(t, Result{Verdict: Drop, Reason: ReasonRefused}, r)
			ip := f.reply(t)
			require.Equal(t, packet.ProtoTCP, ip.Protocol())
			require.Equal(t, vipAddr, ip.Src(), "from the VIP")
			require.Equal(t, localAddr, ip.Dst())
			tc := packet.TCP(ip.Payload())
			require.Equal(t, c.dport, tc.SrcPort())
			require.Equal(t, uint16(40000), tc.DstPort())
			require.Equal(t, uint32(0), tc.Seq())
			// SYN's seq + 1 (the SYN) + payload, wrapping.
			require.Equal(t, uint32(0xfffffffa)+1+uint32(len(pay)), tc.Ack())
			require.Equal(t, uint8(packet.TCPFlagRST|packet.TCPFlagACK), tc.Flags())
			require.Empty(t, tc.Payload())
			st := f.nat.Stats()
			require.Equal(t, uint64(1), st.Drops[ReasonRefused])
			require.Zero(t, st.Drops[c.cause], "counted as refused, not as its cause")
			if c.cause == ReasonNoBackend {
				ls, ok := f.nat.ListenerStats(lTCP)
				require.True(t, ok)
				require.Equal(t, uint64(1), ls.Drops[ReasonRefused])
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
	require.Equal(t, uint32(7777), tc.Seq())
	require.Equal(t, uint8(packet.TCPFlagRST), tc.Flags())
	// Without ACK (a FIN alone): <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>,
	// the FIN counting one.
	f.host(P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40000, Dport: 443,
		Flags: packet.TCPFlagFIN, Seq: 100, Payload: []byte("ab")}.Build())
	tc = packet.TCP(f.reply(t).Payload())
	require.Equal(t, uint32(0), tc.Seq())
	require.Equal(t, uint32(103), tc.Ack())
	require.Equal(t, uint8(packet.TCPFlagRST|packet.TCPFlagACK), tc.Flags())
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
			require.Equal(t, Result{Verdict: Drop, Reason: ReasonPortUnreachable}, f.host(p))
			ip := f.reply(t)
			require.Equal(t, packet.ProtoICMP, ip.Protocol())
			require.Equal(t, vipAddr, ip.Src(), "from the VIP")
			require.Equal(t, localAddr, ip.Dst())
			ic := packet.ICMPv4(ip.Payload())
			require.Equal(t, uint8(packet.ICMPDestUnreachable), ic.Type())
			require.Equal(t, uint8(packet.ICMPCodePortUnreach), ic.Code())
			// The original IP header (with its options) and 8 bytes of data.
			require.Equal(t, orig[:24+8], ic.Quoted())
			require.Equal(t, uint64(1), f.nat.Stats().Drops[ReasonPortUnreachable])
			require.Equal(t, uint64(1), f.nat.Stats().ICMPSent)
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
			require.Equal(t, Result{Verdict: Drop, Reason: c.cause}, r)
			require.Empty(t, f.takeOut(), "no reply")
		})
	}
}

func TestRefuseFragments(t *testing.T) {
	f := emptyFixture(t)
	big := make([]byte, 64)
	p := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 5000, Dport: 53, Payload: big, ID: 9}.Build()
	first, second := fragmentAt(t, p, 32)
	// A later fragment alone is never answered (it waits, then expires).
	require.Equal(t, Consumed, f.host(second).Verdict)
	require.Empty(t, f.takeOut())
	// The datagram, once whole, is answered once, quoting its first bytes.
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonPortUnreachable}, f.host(first))
	ip := f.reply(t)
	ic := packet.ICMPv4(ip.Payload())
	require.Equal(t, uint8(packet.ICMPCodePortUnreach), ic.Code())
	q := packet.IPv4(ic.Quoted())
	require.Zero(t, q.FragOffset())
	require.Equal(t, uint64(1), f.nat.Stats().Drops[ReasonPortUnreachable])
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
			require.Equal(t, Result{Verdict: Drop, Reason: ReasonNoBackend}, r, "over the limit: dropped silently")
		}
	}
	require.Equal(t, DefaultReplyBurst, n, "the burst, then nothing")
	require.Len(t, f.takeOut(), DefaultReplyBurst)
	// Tokens come back at DefaultReplyRate per second, on the NAT's clock.
	f.clock.Advance(time.Second / DefaultReplyRate)
	require.Equal(t, ReasonRefused, f.host(syn(1, 1)).Reason)
	require.Equal(t, ReasonNoBackend, f.host(syn(2, 1)).Reason)
	f.clock.Advance(time.Hour)
	n = 0
	for i := 0; i < 2*DefaultReplyBurst; i++ {
		if f.host(udpTo(uint16(3000+i), "x")).Reason == ReasonPortUnreachable {
			n++
		}
	}
	require.Equal(t, DefaultReplyBurst, n, "the bucket holds at most the burst")
}

func TestRefuseDefaultsPinned(t *testing.T) {
	require.Equal(t, 100, DefaultReplyRate)
	require.Equal(t, 20, DefaultReplyBurst)
}

func TestRefuseDisabled(t *testing.T) {
	f := emptyFixture(t, func(o *Options) { o.ReplyRate = -1 })
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonNoBackend}, f.host(syn(1, 1)))
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonNoBackend}, f.host(udpTo(1, "x")))
	require.Empty(t, f.takeOut())
}

func TestRefuseOnlyEmpty(t *testing.T) {
	// A listener with backends that are all ineligible is not empty: its
	// SYN is dropped silently so that a retransmission can find a backend
	// that recovers.
	f := newFixture(t)
	require.NoError(t, f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}))
	f.sel.setDown(be1, true)
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonNoBackend}, f.host(syn(1, 1)))
	require.Empty(t, f.takeOut())
}

func TestClaimVIPRefuses(t *testing.T) {
	f := newFixture(t)
	require.Equal(t, Pass, f.host(syn(1, 1)).Verdict, "an unclaimed address is not the NAT's")
	require.NoError(t, f.nat.ClaimVIP(vipAddr))
	require.NoError(t, f.nat.ClaimVIP(vipAddr), "idempotent")
	require.True(t, f.nat.IsVIP(vipAddr))
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonRefused}, f.host(syn(1, 1)))
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonPortUnreachable}, f.host(udpTo(1, "x")))
	require.Len(t, f.takeOut(), 2)
	// A listener added and removed leaves the claim; releasing it ends it.
	require.NoError(t, f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}))
	require.True(t, f.nat.RemoveListener(lTCP))
	require.True(t, f.nat.IsVIP(vipAddr))
	require.True(t, f.nat.ReleaseVIP(vipAddr))
	require.False(t, f.nat.ReleaseVIP(vipAddr))
	require.False(t, f.nat.IsVIP(vipAddr))
	require.Equal(t, Pass, f.host(syn(1, 1)).Verdict)
	// Released while a listener holds it: the listener keeps it.
	require.NoError(t, f.nat.ClaimVIP(vipAddr))
	require.NoError(t, f.nat.SetListener(lUDP, ListenerConfig{}))
	require.True(t, f.nat.ReleaseVIP(vipAddr))
	require.True(t, f.nat.IsVIP(vipAddr))
	require.ErrorIs(t, f.nat.ClaimVIP(localAddr), ErrInvalidListener)
	require.ErrorIs(t, f.nat.ClaimVIP(netip.MustParseAddr("::1")), ErrInvalidListener)
	require.NoError(t, f.nat.Close())
	require.ErrorIs(t, f.nat.ClaimVIP(vip2Addr), ErrClosed)
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
			require.NoError(t, err, "%+v", c)
		} else {
			require.ErrorIs(t, err, ErrInvalidOptions, "%+v", c)
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
	require.Equal(t, ReasonNoBackend, f.host(syn(1, 1)).Reason)
	f.out = nil
}
