package flow

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vipkit/vipkit/packet"
)

func bigUDP(sport uint16, n int, id uint16) []byte {
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	return P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: sport, Dport: 53, Payload: payload, ID: id}.Build()
}

func TestFragmentsReassembledOutOfOrder(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	pkt := bigUDP(5000, 3000, 1)
	frags := fragment(pkt, 1200)
	require.Len(t, frags, 3)
	for _, i := range []int{2, 0, 1} {
		require.Equal(t, Result{Verdict: Consumed}, f.host(frags[i]))
	}
	out := f.takeOut()
	require.Len(t, out, 3)
	dg := reassemble(t, [][]byte{out[0].pkt, out[1].pkt, out[2].pkt})
	require.Equal(t, pkt[28:], dg[28:])
	requireSums(t, dg)
	require.Equal(t, be1.Addr, packet.IPv4(dg).Dst())
}

func TestFragmentOverlapDiscardsDatagram(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	pkt := bigUDP(5000, 3000, 2)
	frags := fragment(pkt, 1200)
	require.Equal(t, Consumed, f.host(frags[0]).Verdict)
	// A fragment overlapping the first one's tail.
	ov := append([]byte(nil), frags[1]...)
	binary.BigEndian.PutUint16(ov[6:], packet.IPv4FlagMF|uint16((1200-16)/8))
	packet.IPv4(ov).UpdateChecksum()
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonFragOverlap}, f.host(ov))
	// The rest of the datagram is dropped too: nothing is ever emitted.
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonFragOverlap}, f.host(frags[1]))
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonFragOverlap}, f.host(frags[2]))
	require.Empty(t, f.takeOut())
	require.Equal(t, 0, f.nat.Stats().FragBytes)
	// It is forgotten after the timeout.
	f.clock.Advance(DefaultFragTimeout + time.Second)
	require.Equal(t, 0, f.nat.Stats().FragPending)
	for _, fr := range frags {
		require.Equal(t, Consumed, f.host(fr).Verdict)
	}
	require.Len(t, f.takeOut(), 3)
}

func TestFragmentDuplicateTolerated(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	frags := fragment(bigUDP(5000, 3000, 3), 1200)
	require.Equal(t, Consumed, f.host(frags[0]).Verdict)
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonFragDuplicate}, f.host(append([]byte(nil), frags[0]...)))
	require.Equal(t, Consumed, f.host(frags[1]).Verdict)
	require.Equal(t, Consumed, f.host(frags[2]).Verdict)
	require.Len(t, f.takeOut(), 3)
}

func TestFragmentExpiryOnClock(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	frags := fragment(bigUDP(5000, 3000, 4), 1200)
	require.Equal(t, Consumed, f.host(frags[0]).Verdict)
	require.Equal(t, 1, f.nat.Stats().FragPending)
	f.clock.Advance(DefaultFragTimeout - time.Second)
	require.Equal(t, 1, f.nat.Stats().FragPending)
	// No further traffic: the clock alone expires it.
	f.clock.Advance(2 * time.Second)
	st := f.nat.Stats()
	require.Equal(t, 0, st.FragPending)
	require.Equal(t, 0, st.FragBytes)
	require.Equal(t, uint64(1), st.Drops[ReasonFragTimeout])
}

func TestFragmentLimits(t *testing.T) {
	f := newFixture(t, func(o *Options) {
		o.MaxFragDatagrams = 4
		o.MaxFragDatagramsPerSender = 3
		o.MaxFragBytes = 10000
		o.MaxFragments = 3
	})
	setUDP(t, f, be1)
	// Per sender.
	for i := range 3 {
		require.Equal(t, Consumed, f.host(fragment(bigUDP(5000, 3000, uint16(10+i)), 1200)[0]).Verdict)
	}
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonFragLimit}, f.host(fragment(bigUDP(5000, 3000, 20), 1200)[0]))
	// Another sender (a peer, a backend with a binding) still has room,
	// scoped separately, until the global bound.
	require.Equal(t, Forward, f.host(udpTo(9, "x")).Verdict)
	rep := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoUDP, Sport: 1, Dport: 2, Payload: make([]byte, 3000), ID: 10}.Build()
	require.Equal(t, Consumed, f.peer(be1.Peer, fragment(rep, 1200)[0]).Verdict)
	rep2 := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoUDP, Sport: 1, Dport: 2, Payload: make([]byte, 3000), ID: 11}.Build()
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonFragLimit}, f.peer(be1.Peer, fragment(rep2, 1200)[0]))
	st := f.nat.Stats()
	require.Equal(t, 4, st.FragPending)
	require.LessOrEqual(t, st.FragBytes, 10000)

	// Bytes: fill up to the byte bound with the pending datagrams.
	g := newFixture(t, func(o *Options) { o.MaxFragBytes = 2000 })
	setUDP(t, g, be1)
	frags := fragment(bigUDP(5000, 3000, 1), 1200)
	require.Equal(t, Consumed, g.host(frags[0]).Verdict)
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonFragLimit}, g.host(frags[1]))
	require.Equal(t, 0, g.nat.Stats().FragBytes, "the datagram is discarded, its bytes freed")

	// Fragments per datagram.
	h := newFixture(t, func(o *Options) { o.MaxFragments = 3 })
	setUDP(t, h, be1)
	frags = fragment(bigUDP(5000, 3000, 1), 512)
	require.Greater(t, len(frags), 3)
	for _, fr := range frags[:3] {
		require.Equal(t, Consumed, h.host(fr).Verdict)
	}
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonFragTooMany}, h.host(frags[3]))
}

func TestFragmentTooBig(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	frags := fragment(bigUDP(5000, 3000, 5), 1200)
	last := append([]byte(nil), frags[2]...)
	binary.BigEndian.PutUint16(last[6:], 8190) // offset 65520
	packet.IPv4(last).UpdateChecksum()
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonFragTooBig}, f.host(last))
	// Non-last fragments must be multiples of 8.
	odd := P{Src: localAddr, Dst: vipAddr, Proto: 0xfe, Payload: make([]byte, 13), ID: 9}.Build()
	odd[9] = byte(ProtoUDP)
	binary.BigEndian.PutUint16(odd[6:], packet.IPv4FlagMF)
	packet.IPv4(odd).UpdateChecksum()
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonBadLength}, f.host(odd))
}

func TestFragmentScopedBySender(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	p := udpTo(5000, "x")
	require.Equal(t, Forward, f.host(p).Verdict)
	_, shadow := ports(replyTo(p, 0, ""))
	rep := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoUDP, Sport: be1.Port, Dport: shadow, Payload: make([]byte, 3000), ID: 77}.Build()
	frags := fragment(rep, 1200)
	// Peer 2 sends the first two, peer 9 (spoofing the same source) the
	// last: nothing completes.
	require.Equal(t, Consumed, f.peer(be1.Peer, frags[0]).Verdict)
	require.Equal(t, Consumed, f.peer(be1.Peer, frags[1]).Verdict)
	require.Equal(t, Consumed, f.peer(9, frags[2]).Verdict)
	require.Empty(t, f.takeOut())
	require.Equal(t, 2, f.nat.Stats().FragPending)
	require.Equal(t, Consumed, f.peer(be1.Peer, frags[2]).Verdict)
	out := f.takeOut()
	require.Len(t, out, 3)
	dg := reassemble(t, [][]byte{out[0].pkt, out[1].pkt, out[2].pkt})
	require.Equal(t, vipAddr, packet.IPv4(dg).Src())
	requireSums(t, dg)
}

func TestFragmentedReplyFromWrongPeerDropped(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	p := udpTo(5000, "x")
	require.Equal(t, Forward, f.host(p).Verdict)
	_, shadow := ports(replyTo(p, 0, ""))
	rep := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoUDP, Sport: be1.Port, Dport: shadow, Payload: make([]byte, 3000), ID: 78}.Build()
	frags := fragment(rep, 1200)
	require.Equal(t, Consumed, f.peer(9, frags[0]).Verdict)
	require.Equal(t, Consumed, f.peer(9, frags[1]).Verdict)
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonPeerMismatch}, f.peer(9, frags[2]))
	require.Empty(t, f.takeOut())
}

func TestFragmentOptionsCopied(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MTU = 600 })
	setUDP(t, f, be1)
	// Router alert (copied) + a timestamp-like option without the copy bit.
	pkt := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 1, Dport: 53, Payload: make([]byte, 1000),
		Options: []byte{0x94, 4, 0, 0, 0x07, 4, 0, 0}}.Build()
	require.Equal(t, Consumed, f.host(pkt).Verdict)
	out := f.takeOut()
	require.Greater(t, len(out), 1)
	require.Equal(t, 28, packet.IPv4(out[0].pkt).HeaderLen())
	for _, e := range out[1:] {
		ip := packet.IPv4(e.pkt)
		require.Equal(t, 24, ip.HeaderLen())
		require.Equal(t, []byte{0x94, 4, 0, 0}, []byte(ip[20:24]))
	}
	dg := reassemble(t, [][]byte{out[0].pkt, out[1].pkt})
	requireSums(t, dg)
}

// Fragments from peers that are not backends of any binding are not NAT
// traffic: they pass untouched, for the host to reassemble.
func TestFragmentsFromOtherPeersPass(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	other := P{Src: be2.Addr, Dst: localAddr, Proto: ProtoUDP, Sport: 1, Dport: 2, Payload: make([]byte, 3000), ID: 5}.Build()
	for _, fr := range fragment(other, 1200) {
		cp := append([]byte(nil), fr...)
		require.Equal(t, Pass, f.peer(be2.Peer, fr).Verdict)
		require.Equal(t, cp, fr)
	}
	require.Equal(t, 0, f.nat.Stats().FragPending)
}
