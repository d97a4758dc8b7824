package flow

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/packet"
)

// requireOnlyDiffer checks that got differs from orig only at the allowed
// byte offsets.
func requireOnlyDiffer(t testing.TB, orig, got []byte, allowed map[int]bool, msg string) {
	t.Helper()
	if len(got) != len(orig) {
		t.Fatalf("%v: len(got) = %v, want %v", msg, len(got), len(orig))
	}
	for i := range orig {
		if orig[i] != got[i] && !allowed[i] {
			t.Fatalf("%s: byte %d changed (%#x → %#x) outside the NAT's fields", msg, i, orig[i], got[i])
		}
	}
}

// natFields are the offsets a TCP/UDP translation may change.
func natFields(pkt []byte) map[int]bool {
	hl := packet.IPv4(pkt).HeaderLen()
	m := map[int]bool{10: true, 11: true}
	for i := 12; i < 20; i++ {
		m[i] = true
	}
	for i := range 4 {
		m[hl+i] = true
	}
	if Proto(pkt[9]) == ProtoTCP {
		m[hl+16], m[hl+17] = true, true
	} else {
		m[hl+6], m[hl+7] = true, true
	}
	return m
}

// icmpFields are the offsets an ICMP error translation may change.
func icmpFields(pkt []byte) map[int]bool {
	hl := packet.IPv4(pkt).HeaderLen()
	m := map[int]bool{10: true, 11: true, hl + 2: true, hl + 3: true}
	for i := 12; i < 20; i++ {
		m[i] = true
	}
	q := hl + 8
	ihl := int(pkt[q]&0xf) * 4
	for i := q + 10; i < q+20; i++ {
		m[i] = true
	}
	for i := range 4 {
		m[q+ihl+i] = true
	}
	if Proto(pkt[q+9]) == ProtoTCP {
		m[q+ihl+16], m[q+ihl+17] = true, true
	} else {
		m[q+ihl+6], m[q+ihl+7] = true, true
	}
	return m
}

// randPacket builds a random packet of exactly size bytes, or reports false
// when size is too small for proto (with hl header bytes).
func randPacket(rng *rand.Rand, size int, proto Proto, src, dst netip.Addr, sport, dport uint16) ([]byte, bool) {
	var opts []byte
	if rng.IntN(4) == 0 {
		// Router alert (copied) and NOPs.
		opts = []byte{0x94, 4, 0, 0, 1, 1, 1, 1}[:4*(1+rng.IntN(2))]
	}
	hl := packet.IPv4MinHeaderLen + len(opts)
	min := hl + packet.UDPHeaderLen
	if proto == ProtoTCP {
		min = hl + packet.TCPMinHeaderLen
	}
	if size < min {
		return nil, false
	}
	payload := make([]byte, size-min)
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	p := P{Src: src, Dst: dst, Proto: proto, Sport: sport, Dport: dport, Payload: payload, Options: opts,
		ID: uint16(rng.Uint32()), DF: rng.IntN(2) == 0, TTL: uint8(1 + rng.IntN(255)),
		Flags: packet.TCPFlagACK | packet.TCPFlagPSH, Seq: rng.Uint32(), Ack: rng.Uint32(), NoUDPCsum: rng.IntN(8) == 0}
	pkt := p.Build()
	pkt[1] = byte(rng.Uint32()) // TOS
	packet.IPv4(pkt).UpdateChecksum()
	return pkt, true
}

func TestPropertyNATEverySize(t *testing.T) {
	seed := testenv.Seed(t, 3)
	rng := rand.New(rand.NewPCG(seed, 3))
	const mtu = 1420
	f := newFixture(t, func(o *Options) { o.Capacity = 1 << 14; o.MTU = mtu })
	if err := f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}); err != nil {
		t.Fatalf("f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}): %v", err)
	}
	if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be2}}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be2}}): %v", err)
	}
	hairTCP := Listener{VIP: vip2Addr, Proto: ProtoTCP, Port: 80}
	hairUDP := Listener{VIP: vip2Addr, Proto: ProtoUDP, Port: 80}
	if err := f.nat.SetListener(hairTCP, ListenerConfig{Backends: []Backend{beLocal}}); err != nil {
		t.Fatalf("f.nat.SetListener(hairTCP, ListenerConfig{Backends: []Backend{beLocal}}): %v", err)
	}
	if err := f.nat.SetListener(hairUDP, ListenerConfig{Backends: []Backend{beLocal}}); err != nil {
		t.Fatalf("f.nat.SetListener(hairUDP, ListenerConfig{Backends: []Backend{beLocal}}): %v", err)
	}

	sport := uint16(1024)
	for size := 20; size <= mtu; size++ {
		kind := rng.IntN(3)
		proto := ProtoTCP
		if kind == 1 {
			proto = ProtoUDP
		}
		hair := rng.IntN(4) == 0
		vip, vport := vipAddr, map[Proto]uint16{ProtoTCP: 443, ProtoUDP: 53}[proto]
		if hair {
			vip, vport = vip2Addr, 80
		}
		sport++
		client := localAddr
		if rng.IntN(3) == 0 {
			client = netip.AddrFrom4([4]byte{100, 64, byte(rng.IntN(256)), byte(1 + rng.IntN(250))})
		}
		if kind == 2 {
			icmpCase(t, f, rng, size, proto, client, sport, vip, vport, hair)
			continue
		}
		pkt, ok := randPacket(rng, size, proto, client, vip, sport, vport)
		if !ok {
			// Too small for its protocol: dropped as truncated, untouched.
			pkt = P{Src: client, Dst: vip, Proto: 0xfe, Payload: make([]byte, size-20)}.Build()
			pkt[9] = byte(proto)
			packet.IPv4(pkt).UpdateChecksum()
			orig := append([]byte(nil), pkt...)
			r := f.host(pkt)
			if r.Verdict != Drop {
				t.Fatalf("size %d: r.Verdict = %v, want %v", size, r.Verdict, Drop)
			}
			if !slices.Contains(([]DropReason{ReasonTruncated, ReasonBadLength}), r.Reason) {
				t.Fatalf("([]DropReason{ReasonTruncated, ReasonBadLength}) = %v, want it to contain %v", ([]DropReason{ReasonTruncated, ReasonBadLength}), r.Reason)
			}
			if !bytes.Equal(pkt, orig) {
				t.Fatalf("pkt = %v, want %v", pkt, orig)
			}
			continue
		}
		if proto == ProtoTCP {
			// Open with a SYN first (same tuple) so the segment has a binding.
			s := P{Src: client, Dst: vip, Proto: ProtoTCP, Sport: sport, Dport: vport, Flags: packet.TCPFlagSYN, Seq: 1}.Build()
			if got := f.host(s).Verdict; got == Drop {
				t.Fatalf("f.host(s).Verdict = %v, want anything else", got)
			}
		}
		orig := append([]byte(nil), pkt...)
		r := f.host(pkt)
		if hair {
			if r.Verdict != Reflect {
				t.Fatalf("size %d: %v: r.Verdict = %v, want %v", size, r.Reason, r.Verdict, Reflect)
			}
			if got := packet.IPv4(pkt).Src(); got != vip {
				t.Fatalf("packet.IPv4(pkt).Src() = %v, want %v", got, vip)
			}
			if got := packet.IPv4(pkt).Dst(); got != localAddr {
				t.Fatalf("packet.IPv4(pkt).Dst() = %v, want %v", got, localAddr)
			}
		} else {
			if r.Verdict != Forward {
				t.Fatalf("size %d: %v: r.Verdict = %v, want %v", size, r.Reason, r.Verdict, Forward)
			}
			if got := packet.IPv4(pkt).Src(); got != localAddr {
				t.Fatalf("packet.IPv4(pkt).Src() = %v, want %v", got, localAddr)
			}
		}
		requireOnlyDiffer(t, orig, pkt, natFields(pkt), "ingress")
		requireSums(t, pkt)

		// The backend's reply, of the same size, through the reverse path.
		rep, _ := randPacket(rng, size, proto, packet.IPv4(pkt).Dst(), packet.IPv4(pkt).Src(), binary.BigEndian.Uint16(pkt[packet.IPv4(pkt).HeaderLen()+2:]), binary.BigEndian.Uint16(pkt[packet.IPv4(pkt).HeaderLen():]))
		origRep := append([]byte(nil), rep...)
		if hair {
			if got := f.host(rep).Verdict; got != Reflect {
				t.Fatalf("f.host(rep).Verdict = %v, want %v", got, Reflect)
			}
		} else {
			peer := be1.Peer
			if proto == ProtoUDP {
				peer = be2.Peer
			}
			if got := f.peer(peer, rep).Verdict; got != Forward {
				t.Fatalf("f.peer(peer, rep).Verdict = %v, want %v", got, Forward)
			}
		}
		requireOnlyDiffer(t, origRep, rep, natFields(rep), "reverse")
		requireSums(t, rep)
		if got := packet.IPv4(rep).Src(); got != vip {
			t.Fatalf("packet.IPv4(rep).Src() = %v, want %v", got, vip)
		}
		if got := packet.IPv4(rep).Dst(); got != client {
			t.Fatalf("packet.IPv4(rep).Dst() = %v, want %v", got, client)
		}
		sp, dp := ports(rep)
		if sp != vport {
			t.Fatalf("sp = %v, want %v", sp, vport)
		}
		if dp != sport {
			t.Fatalf("dp = %v, want %v", dp, sport)
		}
	}
}

// icmpCase sends a flow, then an ICMP error of exactly size bytes quoting
// the translated packet, and checks the translation.
func icmpCase(t *testing.T, f *fixture, rng *rand.Rand, size int, proto Proto, client netip.Addr, sport uint16, vip netip.Addr, vport uint16, hair bool) {
	flags := uint8(0)
	if proto == ProtoTCP {
		flags = packet.TCPFlagSYN
	}
	req := P{Src: client, Dst: vip, Proto: proto, Sport: sport, Dport: vport, Flags: flags, Seq: 9, Payload: make([]byte, 1380)}.Build()
	origReq := append([]byte(nil), req...)
	r := f.host(req)
	if !slices.Contains(([]Verdict{Forward, Reflect}), r.Verdict) {
		t.Fatalf("([]Verdict{Forward, Reflect}) = %v, want it to contain %v", ([]Verdict{Forward, Reflect}), r.Verdict)
	}
	qlen := size - packet.IPv4MinHeaderLen - packet.ICMPv4HeaderLen
	if qlen < 0 {
		// Not even an ICMP header.
		pkt := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoICMP}.Build()[:size]
		binary.BigEndian.PutUint16(pkt[2:], uint16(size))
		packet.IPv4(pkt).UpdateChecksum()
		if want, got := (Result{Verdict: Drop, Reason: ReasonTruncated}), f.peer(2, pkt); got != want {
			t.Fatalf("f.peer(2, pkt) = %v, want %v", got, want)
		}
		return
	}
	typ, code := uint8(packet.ICMPDestUnreachable), uint8(rng.IntN(16))
	if rng.IntN(3) == 0 {
		typ, code = packet.ICMPTimeExceeded, 0
	}
	quote := append([]byte(nil), req[:min(qlen, len(req))]...)
	src := packet.IPv4(req).Dst()
	icmp := P{Src: src, Dst: packet.IPv4(req).Src(), Proto: ProtoICMP, ICMPType: typ, ICMPCode: code, Payload: quote}.Build()
	orig := append([]byte(nil), icmp...)
	var got Result
	if hair {
		got = f.host(icmp)
	} else {
		got = f.peer(r.Peer, icmp)
	}
	if qlen < packet.IPv4MinHeaderLen+packet.ICMPv4MinQuoted {
		if want := (Result{Verdict: Drop, Reason: ReasonICMPQuote}); got != want {
			t.Fatalf("size %d: got = %v, want %v", size, got, want)
		}
		return
	}
	want := Forward
	if hair {
		want = Reflect
	}
	if got.Verdict != want {
		t.Fatalf("size %d: %v: got.Verdict = %v, want %v", size, got.Reason, got.Verdict, want)
	}
	requireOnlyDiffer(t, orig, icmp, icmpFields(icmp), "icmp")
	// The outer checksums equal a full recompute; the quote is what the
	// client sent, truncated.
	cp := append([]byte(nil), icmp...)
	packet.IPv4(cp).UpdateChecksum()
	fixL4(cp, false)
	if !bytes.Equal(icmp, cp) {
		t.Fatalf("size %d: checksums: icmp = %v, want %v", size, icmp, cp)
	}
	if want, got := origReq[:len(quote)], []byte(packet.ICMPv4(icmp[20:]).Quoted()); !bytes.Equal(got, want) {
		t.Fatalf("size %d: []byte(packet.ICMPv4(icmp[20:]).Quoted()) = %v, want %v", size, got, want)
	}
	if got := packet.IPv4(icmp).Src(); got != vip {
		t.Fatalf("packet.IPv4(icmp).Src() = %v, want %v", got, vip)
	}
	if got := packet.IPv4(icmp).Dst(); got != client {
		t.Fatalf("packet.IPv4(icmp).Dst() = %v, want %v", got, client)
	}
}

// reassemble naively puts fragments back together (test oracle).
func reassemble(t testing.TB, frags [][]byte) []byte {
	t.Helper()
	var first []byte
	data := map[int][]byte{}
	total := -1
	for _, f := range frags {
		ip := packet.IPv4(f)
		if err := ip.Validate(); err != nil {
			t.Fatalf("ip.Validate(): %v", err)
		}
		off := ip.FragOffset()
		data[off] = ip.Payload()
		if off == 0 {
			first = f
		}
		if !ip.MF() {
			total = off + len(ip.Payload())
		}
	}
	if first == nil {
		t.Fatal("first is nil")
	}
	if total < 0 {
		t.Fatalf("total = %v, want >= %v", total, 0)
	}
	payload := make([]byte, 0, total)
	for len(payload) < total {
		d, ok := data[len(payload)]
		if !ok {
			t.Fatalf("gap at %d: ok is false", len(payload))
		}
		payload = append(payload, d...)
	}
	hl := packet.IPv4(first).HeaderLen()
	dg := append(append([]byte(nil), first[:hl]...), payload...)
	binary.BigEndian.PutUint16(dg[2:], uint16(len(dg)))
	binary.BigEndian.PutUint16(dg[6:], binary.BigEndian.Uint16(dg[6:])&packet.IPv4FlagDF)
	packet.IPv4(dg).UpdateChecksum()
	return dg
}

// fragment splits pkt into fragments with at most chunk payload bytes each
// (chunk a multiple of 8).
func fragment(pkt []byte, chunk int) [][]byte {
	hl := packet.IPv4(pkt).HeaderLen()
	payload := pkt[hl:]
	var out [][]byte
	for off := 0; off < len(payload); off += chunk {
		end := min(off+chunk, len(payload))
		f := append(append([]byte(nil), pkt[:hl]...), payload[off:end]...)
		binary.BigEndian.PutUint16(f[2:], uint16(len(f)))
		fo := uint16(off / 8)
		if end < len(payload) {
			fo |= packet.IPv4FlagMF
		}
		binary.BigEndian.PutUint16(f[6:], fo)
		packet.IPv4(f).UpdateChecksum()
		out = append(out, f)
	}
	return out
}

func TestPropertyLargeDatagrams(t *testing.T) {
	seed := testenv.Seed(t, 4)
	rng := rand.New(rand.NewPCG(seed, 4))
	const mtu = 1420
	f := newFixture(t, func(o *Options) { o.MTU = mtu; o.Capacity = 1 << 12 })
	if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}): %v", err)
	}
	if err := f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}); err != nil {
		t.Fatalf("f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}): %v", err)
	}
	sizes := []int{mtu + 1, 1500, 2000, 4096, 8972, 9000, 20000, 40000, 65535}
	for i := 0; i < 20; i++ {
		sizes = append(sizes, mtu+1+rng.IntN(packet.IPv4MaxPacketLen-mtu-1))
	}
	for i, size := range sizes {
		proto := ProtoUDP
		if i%3 == 2 {
			proto = ProtoTCP
		}
		sport := uint16(20000 + i)
		vport := map[Proto]uint16{ProtoTCP: 443, ProtoUDP: 53}[proto]
		if proto == ProtoTCP {
			s := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: sport, Dport: vport, Flags: packet.TCPFlagSYN, Seq: 1}.Build()
			if got := f.host(s).Verdict; got != Forward {
				t.Fatalf("f.host(s).Verdict = %v, want %v", got, Forward)
			}
		}
		pkt, ok := randPacket(rng, size, proto, localAddr, vipAddr, sport, vport)
		if !ok {
			t.Fatal("ok is false")
		}
		binary.BigEndian.PutUint16(pkt[6:], 0) // clear DF: the host fragmented it
		packet.IPv4(pkt).UpdateChecksum()
		hl := packet.IPv4(pkt).HeaderLen()
		frags := fragment(pkt, (mtu-hl)&^7)
		rng.Shuffle(len(frags), func(a, b int) { frags[a], frags[b] = frags[b], frags[a] })
		for j, fr := range frags {
			r := f.host(fr)
			if r.Verdict != Consumed {
				t.Fatalf("size %d frag %d: %v: r.Verdict = %v, want %v", size, j, r.Reason, r.Verdict, Consumed)
			}
		}
		out := f.takeOut()
		var got [][]byte
		for _, e := range out {
			if e.dir != ToOverlay {
				t.Fatalf("e.dir = %v, want %v", e.dir, ToOverlay)
			}
			if len(e.pkt) > mtu {
				t.Fatalf("len(e.pkt) = %v, want <= %v", len(e.pkt), mtu)
			}
			got = append(got, e.pkt)
		}
		dg := reassemble(t, got)
		if want, got := pkt[hl:][tcpOrUDPHeader(proto):], dg[hl:][tcpOrUDPHeader(proto):]; !bytes.Equal(got, want) {
			t.Fatalf("size %d: payload byte-identical: dg[hl:][tcpOrUDPHeader(proto):] = %v, want %v", size, got, want)
		}
		requireOnlyDiffer(t, pkt, dg, natFields(dg), "large ingress")
		requireSums(t, dg)
		if got := packet.IPv4(dg).Dst(); got != be1.Addr {
			t.Fatalf("packet.IPv4(dg).Dst() = %v, want %v", got, be1.Addr)
		}

		// The backend's large reply, fragmented by the backend.
		rep, _ := randPacket(rng, size, proto, be1.Addr, localAddr, be1.Port, binary.BigEndian.Uint16(dg[hl:]))
		binary.BigEndian.PutUint16(rep[6:], 0)
		packet.IPv4(rep).UpdateChecksum()
		rhl := packet.IPv4(rep).HeaderLen()
		for _, fr := range fragment(rep, (mtu-rhl)&^7) {
			if got := f.peer(be1.Peer, fr).Verdict; got != Consumed {
				t.Fatalf("f.peer(be1.Peer, fr).Verdict = %v, want %v", got, Consumed)
			}
		}
		out = f.takeOut()
		got = got[:0]
		for _, e := range out {
			if e.dir != ToHost {
				t.Fatalf("e.dir = %v, want %v", e.dir, ToHost)
			}
			if len(e.pkt) > mtu {
				t.Fatalf("len(e.pkt) = %v, want <= %v", len(e.pkt), mtu)
			}
			got = append(got, e.pkt)
		}
		rdg := reassemble(t, got)
		requireOnlyDiffer(t, rep, rdg, natFields(rdg), "large reverse")
		requireSums(t, rdg)
		if got := packet.IPv4(rdg).Src(); got != vipAddr {
			t.Fatalf("packet.IPv4(rdg).Src() = %v, want %v", got, vipAddr)
		}
		sp, dp := ports(rdg)
		if sp != vport {
			t.Fatalf("sp = %v, want %v", sp, vport)
		}
		if dp != sport {
			t.Fatalf("dp = %v, want %v", dp, sport)
		}
	}
	st := f.nat.Stats()
	if st.Reassembled != uint64(2*len(sizes)) {
		t.Fatalf("st.Reassembled = %v, want %v", st.Reassembled, uint64(2*len(sizes)))
	}
	if st.FragPending != 0 {
		t.Fatalf("st.FragPending = %v, want %v", st.FragPending, 0)
	}
	if st.FragBytes != 0 {
		t.Fatalf("st.FragBytes = %v, want %v", st.FragBytes, 0)
	}
}

func tcpOrUDPHeader(p Proto) int {
	if p == ProtoTCP {
		return packet.TCPMinHeaderLen
	}
	return packet.UDPHeaderLen
}
