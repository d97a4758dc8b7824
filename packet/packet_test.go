package packet

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/vipkit/vipkit/internal/testenv"
)

var (
	addrA = netip.MustParseAddr("100.64.0.1")
	addrB = netip.MustParseAddr("100.100.0.10")
)

func mustTCP(t testing.TB, flags uint8, payload string) []byte {
	t.Helper()
	p, err := AppendTCP(nil, IPv4Fields{Src: addrA, Dst: addrB, ID: 7, DF: true},
		TCPFields{SrcPort: 40000, DstPort: 443, Seq: 1, Ack: 2, Flags: flags, Window: 65535}, []byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustUDP(t testing.TB, payload string) []byte {
	t.Helper()
	p, err := AppendUDP(nil, IPv4Fields{Src: addrA, Dst: addrB}, UDPFields{SrcPort: 5353, DstPort: 53}, []byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustICMP(t testing.TB, typ, code uint8, rest uint32, payload []byte) []byte {
	t.Helper()
	p, err := AppendICMPv4(nil, IPv4Fields{Src: addrB, Dst: addrA}, ICMPv4Fields{Type: typ, Code: code, Rest: rest}, payload)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// seedPackets are the unit tests' packets, the fuzz corpus seeds.
func seedPackets(t testing.TB) [][]byte {
	opts, err := AppendUDP(nil, IPv4Fields{Src: addrA, Dst: addrB, Options: []byte{0x94, 4, 0, 0}}, UDPFields{SrcPort: 1, DstPort: 53}, nil)
	if err != nil {
		t.Fatal(err)
	}
	good := mustUDP(t, "payload")
	bad := append([]byte(nil), good...)
	bad[10] ^= 1
	syn := mustTCP(t, TCPFlagSYN, "")
	return [][]byte{
		good, bad, opts, syn, mustTCP(t, TCPFlagACK|TCPFlagPSH, "data"),
		mustICMP(t, ICMPDestUnreachable, ICMPCodeFragNeeded, 1400, syn), mustICMP(t, ICMPEchoRequest, 0, 1, []byte("ping")),
		good[:10], {0x45}, {0x60, 0, 0, 0}, {},
	}
}

// The builders' packets validate at every layer and read back what was
// written, with checksums that verify.
func TestBuildersRoundTrip(t *testing.T) {
	p := mustTCP(t, TCPFlagSYN|TCPFlagACK, "hello")
	ip := IPv4(p)
	if err := ip.Validate(); err != nil {
		t.Fatal(err)
	}
	if ip.Src() != addrA || ip.Dst() != addrB || ip.Protocol() != ProtoTCP || ip.ID() != 7 || !ip.DF() || ip.MF() || ip.TTL() != DefaultTTL {
		t.Fatalf("IPv4 fields read back wrong: %v %v %v %d %v %v %d", ip.Src(), ip.Dst(), ip.Protocol(), ip.ID(), ip.DF(), ip.MF(), ip.TTL())
	}
	if ip.Src32() != binary.BigEndian.Uint32(addrA.AsSlice()) || ip.Dst32() != binary.BigEndian.Uint32(addrB.AsSlice()) {
		t.Fatal("Src32/Dst32 disagree with the addresses")
	}
	tcp := TCP(ip.Payload())
	if err := tcp.Validate(); err != nil {
		t.Fatal(err)
	}
	if tcp.SrcPort() != 40000 || tcp.DstPort() != 443 || tcp.Seq() != 1 || tcp.Ack() != 2 || tcp.Flags() != TCPFlagSYN|TCPFlagACK || string(tcp.Payload()) != "hello" {
		t.Fatalf("TCP fields read back wrong")
	}
	if c := Checksum(tcp, PseudoHeaderSum(addrA.As4(), addrB.As4(), ProtoTCP, len(tcp))); c != 0 {
		t.Fatalf("TCP checksum does not verify: residue %#04x", c)
	}

	u := mustUDP(t, "q")
	ud := UDP(IPv4(u).Payload())
	if err := ud.Validate(); err != nil || ud.Length() != 9 || string(ud.Payload()) != "q" || ud.Checksum() == 0 {
		t.Fatalf("UDP: %v len %d payload %q csum %#x", err, ud.Length(), ud.Payload(), ud.Checksum())
	}
	if c := Checksum(ud, PseudoHeaderSum(addrA.As4(), addrB.As4(), ProtoUDP, len(ud))); c != 0 {
		t.Fatalf("UDP checksum does not verify: residue %#04x", c)
	}

	m := ICMPv4(IPv4(mustICMP(t, ICMPDestUnreachable, ICMPCodeFragNeeded, 1400, p[:28])).Payload())
	if err := m.Validate(); err != nil || !m.IsError() || m.MTU() != 1400 || len(m.Quoted()) != 28 || Checksum(m, 0) != 0 {
		t.Fatalf("ICMPv4: %v error %v mtu %d quoted %d", err, m.IsError(), m.MTU(), len(m.Quoted()))
	}
}

func TestBuildersRefuseBadInput(t *testing.T) {
	v6 := netip.MustParseAddr("fd00::1")
	big := make([]byte, IPv4MaxPacketLen)
	for _, c := range []struct {
		name string
		ip   IPv4Fields
		pl   []byte
		want error
	}{
		{"IPv6 source", IPv4Fields{Src: v6, Dst: addrB}, nil, ErrNotIPv4Addr},
		{"zero destination", IPv4Fields{Src: addrA}, nil, ErrNotIPv4Addr},
		{"options not a multiple of 4", IPv4Fields{Src: addrA, Dst: addrB, Options: []byte{1, 2, 3}}, nil, ErrBadIHL},
		{"options beyond 40 bytes", IPv4Fields{Src: addrA, Dst: addrB, Options: make([]byte, 44)}, nil, ErrBadIHL},
		{"datagram beyond 65535 bytes", IPv4Fields{Src: addrA, Dst: addrB}, big, ErrTooBig},
	} {
		prefix := []byte("keep")
		out, err := AppendUDP(prefix, c.ip, UDPFields{SrcPort: 1, DstPort: 2}, c.pl)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.want)
		}
		if string(out) != "keep" {
			t.Errorf("%s: the buffer changed on error: %q", c.name, out)
		}
	}
	// The largest datagram that fits is accepted.
	if _, err := AppendUDP(nil, IPv4Fields{Src: addrA, Dst: addrB}, UDPFields{}, big[:IPv4MaxPacketLen-28]); err != nil {
		t.Fatalf("65535-byte datagram: %v", err)
	}
}

func TestValidateErrors(t *testing.T) {
	good := mustUDP(t, "payload")
	mod := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"good", good, nil},
		{"empty", nil, ErrTruncated},
		{"19 bytes", good[:19], ErrTruncated},
		{"IPv6", mod(func(b []byte) { b[0] = 0x65 }), ErrNotIPv4},
		{"IHL 4", mod(func(b []byte) { b[0] = 0x44 }), ErrBadIHL},
		{"IHL beyond the packet", mod(func(b []byte) { b[0] = 0x4f }), ErrBadIHL},
		{"total length short", mod(func(b []byte) { b[3]-- }), ErrBadLength},
		{"padding after total length", append(append([]byte(nil), good...), 0), ErrBadLength},
		{"bad checksum", mod(func(b []byte) { b[10] ^= 1 }), ErrBadChecksum},
	} {
		if err := IPv4(c.b).Validate(); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if err := (TCP{0, 1}).Validate(); !errors.Is(err, ErrTruncated) {
		t.Errorf("short TCP: %v", err)
	}
	tcp := append([]byte(nil), IPv4(mustTCP(t, 0, "")).Payload()...)
	tcp[TCPDataOffOff] = 4 << 4
	if err := TCP(tcp).Validate(); !errors.Is(err, ErrBadLength) {
		t.Errorf("TCP data offset 4: %v", err)
	}
	tcp[TCPDataOffOff] = 6 << 4
	if err := TCP(tcp).Validate(); !errors.Is(err, ErrBadLength) {
		t.Errorf("TCP data offset beyond the segment: %v", err)
	}
	if err := (UDP{0, 1, 0, 2, 0, 7, 0, 0}).Validate(); !errors.Is(err, ErrBadLength) {
		t.Errorf("UDP length 7: %v", err)
	}
	if err := (UDP{0, 1, 0, 2, 0, 9, 0, 0}).Validate(); !errors.Is(err, ErrBadLength) {
		t.Errorf("UDP length beyond the buffer: %v", err)
	}
	if err := (ICMPv4{3, 3, 0}).Validate(); !errors.Is(err, ErrTruncated) {
		t.Errorf("short ICMPv4: %v", err)
	}
	if Version(nil) != 0 || Version(good) != 4 || Version([]byte{0x60}) != 6 {
		t.Error("Version")
	}
}

// naiveChecksum is RFC 1071 word by word, the model Checksum must equal.
func naiveChecksum(b []byte, initial uint32) uint16 {
	s := uint64(initial)
	for i := 0; i+1 < len(b); i += 2 {
		s += uint64(b[i])<<8 | uint64(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint64(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func TestChecksumMatchesNaive(t *testing.T) {
	seed := testenv.Seed(t, 1)
	r := rand.New(rand.NewPCG(seed, seed))
	for n := 0; n < 300; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if n%7 == 0 {
			for i := range b {
				b[i] = 0xff // carries in every word
			}
		}
		init := r.Uint32() >> 8
		if got, want := Checksum(b, init), naiveChecksum(b, init); got != want {
			t.Fatalf("len %d init %#x: Checksum %#04x, naive %#04x", n, init, got, want)
		}
	}
}

// TestPropertyIncrementalEqualsRecompute rewrites addresses and ports of
// random TCP and UDP packets with Delta16/Delta32/AddDelta and Adjust (the
// packet path's way) and checks every checksum against a full recompute.
func TestPropertyIncrementalEqualsRecompute(t *testing.T) {
	seed := testenv.Seed(t, 1)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b9))
	rounds := 2000
	if testenv.Long() {
		rounds = 200000
	}
	for round := range rounds {
		src := netip.AddrFrom4([4]byte{byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32())})
		dst := netip.AddrFrom4([4]byte{byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32())})
		payload := make([]byte, r.IntN(1500))
		for i := range payload {
			payload[i] = byte(r.Uint32())
		}
		var opts []byte
		if r.IntN(4) == 0 {
			opts = make([]byte, 4*(1+r.IntN(10)))
			for i := range opts {
				opts[i] = byte(r.Uint32())
			}
		}
		ipf := IPv4Fields{Src: src, Dst: dst, ID: uint16(r.Uint32()), TTL: uint8(1 + r.IntN(255)), Options: opts}
		isTCP := r.IntN(2) == 0
		var p []byte
		var err error
		if isTCP {
			p, err = AppendTCP(nil, ipf, TCPFields{SrcPort: uint16(r.Uint32()), DstPort: uint16(r.Uint32()), Seq: r.Uint32(), Flags: uint8(r.Uint32())}, payload)
		} else {
			p, err = AppendUDP(nil, ipf, UDPFields{SrcPort: uint16(r.Uint32()), DstPort: uint16(r.Uint32())}, payload)
		}
		if err != nil {
			t.Fatal(err)
		}
		ip := IPv4(p)
		hl := ip.HeaderLen()
		l4 := p[hl:]
		// Rewrite both addresses and both ports, as NAT does, composing one
		// delta for the IP header and one for the L4 checksum.
		newSrc, newDst := r.Uint32(), r.Uint32()
		newSport, newDport := uint16(r.Uint32()), uint16(r.Uint32())
		dIP := AddDelta(Delta32(ip.Src32(), newSrc), Delta32(ip.Dst32(), newDst))
		dL4 := AddDelta(dIP, AddDelta(Delta16(binary.BigEndian.Uint16(l4[0:]), newSport), Delta16(binary.BigEndian.Uint16(l4[2:]), newDport)))
		binary.BigEndian.PutUint32(p[IPv4SrcOff:], newSrc)
		binary.BigEndian.PutUint32(p[IPv4DstOff:], newDst)
		binary.BigEndian.PutUint16(l4[0:], newSport)
		binary.BigEndian.PutUint16(l4[2:], newDport)
		Adjust(p[IPv4ChecksumOff:], dIP)
		// And a TTL decrement, a 16-bit word of the header alone.
		oldWord := binary.BigEndian.Uint16(p[IPv4TTLOff:])
		p[IPv4TTLOff]--
		Adjust(p[IPv4ChecksumOff:], Delta16(oldWord, binary.BigEndian.Uint16(p[IPv4TTLOff:])))
		if isTCP {
			Adjust(l4[TCPChecksumOff:], dL4)
		} else {
			AdjustUDP(l4[UDPChecksumOff:], dL4)
		}

		if err := ip.Validate(); err != nil {
			t.Fatalf("seed %d round %d: after rewrite: %v", seed, round, err)
		}
		want := append([]byte(nil), p...)
		IPv4(want).UpdateChecksum()
		if ip.Checksum() != IPv4(want).Checksum() {
			t.Fatalf("seed %d round %d: IPv4 checksum %#04x, recompute %#04x", seed, round, ip.Checksum(), IPv4(want).Checksum())
		}
		s4, d4 := ip.Src().As4(), ip.Dst().As4()
		wl4 := want[hl:]
		var got, full uint16
		if isTCP {
			TCP(wl4).UpdateChecksum(s4, d4)
			got, full = TCP(l4).Checksum(), TCP(wl4).Checksum()
		} else {
			UDP(wl4).UpdateChecksum(s4, d4)
			got, full = UDP(l4).Checksum(), UDP(wl4).Checksum()
		}
		// One's-complement ±0: an incremental update never yields 0x0000
		// for nonzero data (RFC 1624 eqn. 3), a recompute gives 0xffff.
		if got != full {
			t.Fatalf("seed %d round %d (tcp %v): L4 checksum %#04x, recompute %#04x", seed, round, isTCP, got, full)
		}
	}
}

// A UDP datagram sent without a checksum keeps none through a rewrite.
func TestAdjustUDPZeroStaysZero(t *testing.T) {
	b := []byte{0, 0}
	AdjustUDP(b, Delta32(0x01020304, 0x05060708))
	if binary.BigEndian.Uint16(b) != 0 {
		t.Fatalf("zero UDP checksum became %#04x", binary.BigEndian.Uint16(b))
	}
}

func TestProtoString(t *testing.T) {
	for p, want := range map[Proto]string{ProtoTCP: "tcp", ProtoUDP: "udp", ProtoICMP: "icmp", 47: "proto(47)"} {
		if p.String() != want {
			t.Errorf("%d: %q", p, p.String())
		}
	}
}
