package flow

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

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
	if len(frags) != 3 {
		t.Fatalf("len(frags) = %d, want %d: %v", len(frags), 3, frags)
	}
	for _, i := range []int{2, 0, 1} {
		if want, got := (Result{Verdict: Consumed}), f.host(frags[i]); got != want {
			t.Fatalf("f.host(frags[i]) = %v, want %v", got, want)
		}
	}
	out := f.takeOut()
	if len(out) != 3 {
		t.Fatalf("len(out) = %d, want %d: %v", len(out), 3, out)
	}
	dg := reassemble(t, [][]byte{out[0].pkt, out[1].pkt, out[2].pkt})
	if want, got := pkt[28:], dg[28:]; !bytes.Equal(got, want) {
		t.Fatalf("dg[28:] = %v, want %v", got, want)
	}
	requireSums(t, dg)
	if got := packet.IPv4(dg).Dst(); got != be1.Addr {
		t.Fatalf("packet.IPv4(dg).Dst() = %v, want %v", got, be1.Addr)
	}
}

func TestFragmentOverlapDiscardsDatagram(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	pkt := bigUDP(5000, 3000, 2)
	frags := fragment(pkt, 1200)
	if got := f.host(frags[0]).Verdict; got != Consumed {
		t.Fatalf("f.host(frags[0]).Verdict = %v, want %v", got, Consumed)
	}
	// A fragment overlapping the first one's tail.
	ov := append([]byte(nil), frags[1]...)
	binary.BigEndian.PutUint16(ov[6:], packet.IPv4FlagMF|uint16((1200-16)/8))
	packet.IPv4(ov).UpdateChecksum()
	if want, got := (Result{Verdict: Drop, Reason: ReasonFragOverlap}), f.host(ov); got != want {
		t.Fatalf("f.host(ov) = %v, want %v", got, want)
	}
	// The rest of the datagram is dropped too: nothing is ever emitted.
	if want, got := (Result{Verdict: Drop, Reason: ReasonFragOverlap}), f.host(frags[1]); got != want {
		t.Fatalf("f.host(frags[1]) = %v, want %v", got, want)
	}
	if want, got := (Result{Verdict: Drop, Reason: ReasonFragOverlap}), f.host(frags[2]); got != want {
		t.Fatalf("f.host(frags[2]) = %v, want %v", got, want)
	}
	if got := f.takeOut(); len(got) != 0 {
		t.Fatalf("f.takeOut() = %v, want empty", got)
	}
	if got := f.nat.Stats().FragBytes; got != 0 {
		t.Fatalf("f.nat.Stats().FragBytes = %v, want %v", got, 0)
	}
	// It is forgotten after the timeout.
	f.clock.Advance(DefaultFragTimeout + time.Second)
	if got := f.nat.Stats().FragPending; got != 0 {
		t.Fatalf("f.nat.Stats().FragPending = %v, want %v", got, 0)
	}
	for _, fr := range frags {
		if got := f.host(fr).Verdict; got != Consumed {
			t.Fatalf("f.host(fr).Verdict = %v, want %v", got, Consumed)
		}
	}
	if got := f.takeOut(); len(got) != 3 {
		t.Fatalf("len(f.takeOut()) = %d, want %d: %v", len(got), 3, got)
	}
}

func TestFragmentDuplicateTolerated(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	frags := fragment(bigUDP(5000, 3000, 3), 1200)
	if got := f.host(frags[0]).Verdict; got != Consumed {
		t.Fatalf("f.host(frags[0]).Verdict = %v, want %v", got, Consumed)
	}
	if want, got := (Result{Verdict: Drop, Reason: ReasonFragDuplicate}), f.host(append([]byte(nil), frags[0]...)); got != want {
		t.Fatalf("f.host(append([]byte(nil), frags[0]...)) = %v, want %v", got, want)
	}
	if got := f.host(frags[1]).Verdict; got != Consumed {
		t.Fatalf("f.host(frags[1]).Verdict = %v, want %v", got, Consumed)
	}
	if got := f.host(frags[2]).Verdict; got != Consumed {
		t.Fatalf("f.host(frags[2]).Verdict = %v, want %v", got, Consumed)
	}
	if got := f.takeOut(); len(got) != 3 {
		t.Fatalf("len(f.takeOut()) = %d, want %d: %v", len(got), 3, got)
	}
}

func TestFragmentExpiryOnClock(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	frags := fragment(bigUDP(5000, 3000, 4), 1200)
	if got := f.host(frags[0]).Verdict; got != Consumed {
		t.Fatalf("f.host(frags[0]).Verdict = %v, want %v", got, Consumed)
	}
	if got := f.nat.Stats().FragPending; got != 1 {
		t.Fatalf("f.nat.Stats().FragPending = %v, want %v", got, 1)
	}
	f.clock.Advance(DefaultFragTimeout - time.Second)
	if got := f.nat.Stats().FragPending; got != 1 {
		t.Fatalf("f.nat.Stats().FragPending = %v, want %v", got, 1)
	}
	// No further traffic: the clock alone expires it.
	f.clock.Advance(2 * time.Second)
	st := f.nat.Stats()
	if st.FragPending != 0 {
		t.Fatalf("st.FragPending = %v, want %v", st.FragPending, 0)
	}
	if st.FragBytes != 0 {
		t.Fatalf("st.FragBytes = %v, want %v", st.FragBytes, 0)
	}
	if st.Drops[ReasonFragTimeout] != uint64(1) {
		t.Fatalf("st.Drops[ReasonFragTimeout] = %v, want %v", st.Drops[ReasonFragTimeout], uint64(1))
	}
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
		if got := f.host(fragment(bigUDP(5000, 3000, uint16(10+i)), 1200)[0]).Verdict; got != Consumed {
			t.Fatalf("f.host(fragment(bigUDP(5000, 3000, uint16(10+i)), 1200)[0]).Verdict = %v, want %v", got, Consumed)
		}
	}
	if want, got := (Result{Verdict: Drop, Reason: ReasonFragLimit}), f.host(fragment(bigUDP(5000, 3000, 20), 1200)[0]); got != want {
		t.Fatalf("f.host(fragment(bigUDP(5000, 3000, 20), 1200)[0]) = %v, want %v", got, want)
	}
	// Another sender (a peer, a backend with a binding) still has room,
	// scoped separately, until the global bound.
	if got := f.host(udpTo(9, "x")).Verdict; got != Forward {
		t.Fatalf("f.host(udpTo(9, \"x\")).Verdict = %v, want %v", got, Forward)
	}
	rep := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoUDP, Sport: 1, Dport: 2, Payload: make([]byte, 3000), ID: 10}.Build()
	if got := f.peer(be1.Peer, fragment(rep, 1200)[0]).Verdict; got != Consumed {
		t.Fatalf("f.peer(be1.Peer, fragment(rep, 1200)[0]).Verdict = %v, want %v", got, Consumed)
	}
	rep2 := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoUDP, Sport: 1, Dport: 2, Payload: make([]byte, 3000), ID: 11}.Build()
	if want, got := (Result{Verdict: Drop, Reason: ReasonFragLimit}), f.peer(be1.Peer, fragment(rep2, 1200)[0]); got != want {
		t.Fatalf("f.peer(be1.Peer, fragment(rep2, 1200)[0]) = %v, want %v", got, want)
	}
	st := f.nat.Stats()
	if st.FragPending != 4 {
		t.Fatalf("st.FragPending = %v, want %v", st.FragPending, 4)
	}
	if st.FragBytes > 10000 {
		t.Fatalf("st.FragBytes = %v, want <= %v", st.FragBytes, 10000)
	}

	// Bytes: fill up to the byte bound with the pending datagrams.
	g := newFixture(t, func(o *Options) { o.MaxFragBytes = 2000 })
	setUDP(t, g, be1)
	frags := fragment(bigUDP(5000, 3000, 1), 1200)
	if got := g.host(frags[0]).Verdict; got != Consumed {
		t.Fatalf("g.host(frags[0]).Verdict = %v, want %v", got, Consumed)
	}
	if want, got := (Result{Verdict: Drop, Reason: ReasonFragLimit}), g.host(frags[1]); got != want {
		t.Fatalf("g.host(frags[1]) = %v, want %v", got, want)
	}
	if got := g.nat.Stats().FragBytes; got != 0 {
		t.Fatalf("the datagram is discarded, its bytes freed: g.nat.Stats().FragBytes = %v, want %v", got, 0)
	}

	// Fragments per datagram.
	h := newFixture(t, func(o *Options) { o.MaxFragments = 3 })
	setUDP(t, h, be1)
	frags = fragment(bigUDP(5000, 3000, 1), 512)
	if len(frags) <= 3 {
		t.Fatalf("len(frags) = %v, want > %v", len(frags), 3)
	}
	for _, fr := range frags[:3] {
		if got := h.host(fr).Verdict; got != Consumed {
			t.Fatalf("h.host(fr).Verdict = %v, want %v", got, Consumed)
		}
	}
	if want, got := (Result{Verdict: Drop, Reason: ReasonFragTooMany}), h.host(frags[3]); got != want {
		t.Fatalf("h.host(frags[3]) = %v, want %v", got, want)
	}
}

func TestFragmentTooBig(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	frags := fragment(bigUDP(5000, 3000, 5), 1200)
	last := append([]byte(nil), frags[2]...)
	binary.BigEndian.PutUint16(last[6:], 8190) // offset 65520
	packet.IPv4(last).UpdateChecksum()
	if want, got := (Result{Verdict: Drop, Reason: ReasonFragTooBig}), f.host(last); got != want {
		t.Fatalf("f.host(last) = %v, want %v", got, want)
	}
	// Non-last fragments must be multiples of 8.
	odd := P{Src: localAddr, Dst: vipAddr, Proto: 0xfe, Payload: make([]byte, 13), ID: 9}.Build()
	odd[9] = byte(ProtoUDP)
	binary.BigEndian.PutUint16(odd[6:], packet.IPv4FlagMF)
	packet.IPv4(odd).UpdateChecksum()
	if want, got := (Result{Verdict: Drop, Reason: ReasonBadLength}), f.host(odd); got != want {
		t.Fatalf("f.host(odd) = %v, want %v", got, want)
	}
}

func TestFragmentScopedBySender(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	p := udpTo(5000, "x")
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	_, shadow := ports(replyTo(p, 0, ""))
	rep := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoUDP, Sport: be1.Port, Dport: shadow, Payload: make([]byte, 3000), ID: 77}.Build()
	frags := fragment(rep, 1200)
	// Peer 2 sends the first two, peer 9 (spoofing the same source) the
	// last: nothing completes.
	if got := f.peer(be1.Peer, frags[0]).Verdict; got != Consumed {
		t.Fatalf("f.peer(be1.Peer, frags[0]).Verdict = %v, want %v", got, Consumed)
	}
	if got := f.peer(be1.Peer, frags[1]).Verdict; got != Consumed {
		t.Fatalf("f.peer(be1.Peer, frags[1]).Verdict = %v, want %v", got, Consumed)
	}
	if got := f.peer(9, frags[2]).Verdict; got != Consumed {
		t.Fatalf("f.peer(9, frags[2]).Verdict = %v, want %v", got, Consumed)
	}
	if got := f.takeOut(); len(got) != 0 {
		t.Fatalf("f.takeOut() = %v, want empty", got)
	}
	if got := f.nat.Stats().FragPending; got != 2 {
		t.Fatalf("f.nat.Stats().FragPending = %v, want %v", got, 2)
	}
	if got := f.peer(be1.Peer, frags[2]).Verdict; got != Consumed {
		t.Fatalf("f.peer(be1.Peer, frags[2]).Verdict = %v, want %v", got, Consumed)
	}
	out := f.takeOut()
	if len(out) != 3 {
		t.Fatalf("len(out) = %d, want %d: %v", len(out), 3, out)
	}
	dg := reassemble(t, [][]byte{out[0].pkt, out[1].pkt, out[2].pkt})
	if got := packet.IPv4(dg).Src(); got != vipAddr {
		t.Fatalf("packet.IPv4(dg).Src() = %v, want %v", got, vipAddr)
	}
	requireSums(t, dg)
}

func TestFragmentedReplyFromWrongPeerDropped(t *testing.T) {
	f := newFixture(t)
	setUDP(t, f, be1)
	p := udpTo(5000, "x")
	if got := f.host(p).Verdict; got != Forward {
		t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
	}
	_, shadow := ports(replyTo(p, 0, ""))
	rep := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoUDP, Sport: be1.Port, Dport: shadow, Payload: make([]byte, 3000), ID: 78}.Build()
	frags := fragment(rep, 1200)
	if got := f.peer(9, frags[0]).Verdict; got != Consumed {
		t.Fatalf("f.peer(9, frags[0]).Verdict = %v, want %v", got, Consumed)
	}
	if got := f.peer(9, frags[1]).Verdict; got != Consumed {
		t.Fatalf("f.peer(9, frags[1]).Verdict = %v, want %v", got, Consumed)
	}
	if want, got := (Result{Verdict: Drop, Reason: ReasonPeerMismatch}), f.peer(9, frags[2]); got != want {
		t.Fatalf("f.peer(9, frags[2]) = %v, want %v", got, want)
	}
	if got := f.takeOut(); len(got) != 0 {
		t.Fatalf("f.takeOut() = %v, want empty", got)
	}
}

func TestFragmentOptionsCopied(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MTU = 600 })
	setUDP(t, f, be1)
	// Router alert (copied) + a timestamp-like option without the copy bit.
	pkt := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 1, Dport: 53, Payload: make([]byte, 1000),
		Options: []byte{0x94, 4, 0, 0, 0x07, 4, 0, 0}}.Build()
	if got := f.host(pkt).Verdict; got != Consumed {
		t.Fatalf("f.host(pkt).Verdict = %v, want %v", got, Consumed)
	}
	out := f.takeOut()
	if len(out) <= 1 {
		t.Fatalf("len(out) = %v, want > %v", len(out), 1)
	}
	if got := packet.IPv4(out[0].pkt).HeaderLen(); got != 28 {
		t.Fatalf("packet.IPv4(out[0].pkt).HeaderLen() = %v, want %v", got, 28)
	}
	for _, e := range out[1:] {
		ip := packet.IPv4(e.pkt)
		if got := ip.HeaderLen(); got != 24 {
			t.Fatalf("ip.HeaderLen() = %v, want %v", got, 24)
		}
		if want, got := ([]byte{0x94, 4, 0, 0}), []byte(ip[20:24]); !bytes.Equal(got, want) {
			t.Fatalf("[]byte(ip[20:24]) = %v, want %v", got, want)
		}
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
		if got := f.peer(be2.Peer, fr).Verdict; got != Pass {
			t.Fatalf("f.peer(be2.Peer, fr).Verdict = %v, want %v", got, Pass)
		}
		if !bytes.Equal(fr, cp) {
			t.Fatalf("fr = %v, want %v", fr, cp)
		}
	}
	if got := f.nat.Stats().FragPending; got != 0 {
		t.Fatalf("f.nat.Stats().FragPending = %v, want %v", got, 0)
	}
}
