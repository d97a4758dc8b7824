package probe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/packet"
)

var (
	addrA = netip.MustParseAddr("100.64.0.1")
	addrB = netip.MustParseAddr("100.64.0.2")
)

func validRequest() []byte {
	b, _ := Message{Type: TypeRequest, Session: 0xdeadbeef, Sequence: 7, Nonce: 0x0102030405060708}.Marshal(make([]byte, MessageLen))
	return b
}

func withByte(b []byte, i int, v byte) []byte {
	c := append([]byte(nil), b...)
	c[i] = v
	return c
}

var messageTable = []struct {
	name string
	in   []byte
	want error
}{
	{"request", validRequest(), nil},
	{"reply", withByte(validRequest(), offType, byte(TypeReply)), nil},
	{"empty", nil, ErrMalformed},
	{"one byte", []byte{'v'}, ErrMalformed},
	{"bad magic", withByte(validRequest(), 0, 'x'), ErrMalformed},
	{"version 2", withByte(validRequest(), offVersion, 2), ErrVersion},
	{"version 0", withByte(validRequest(), offVersion, 0), ErrVersion},
	{"short", validRequest()[:MessageLen-1], ErrMalformed},
	{"long", append(validRequest(), 0), ErrMalformed},
	{"type 0", withByte(validRequest(), offType, 0), ErrMessageType},
	{"type 3", withByte(validRequest(), offType, 3), ErrMessageType},
}

func TestParseMessage(t *testing.T) {
	for _, tc := range messageTable {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ParseMessage(tc.in)
			if !errors.Is(err, tc.want) {
				t.Fatalf("ParseMessage: err %v, want %v", err, tc.want)
			}
			if err != nil {
				return
			}
			if m.Session != 0xdeadbeef || m.Sequence != 7 || m.Nonce != 0x0102030405060708 {
				t.Fatalf("decoded %+v", m)
			}
			out := m.Bytes()
			if !bytes.Equal(out[:], tc.in) {
				t.Fatalf("round trip %x, want %x", out, tc.in)
			}
		})
	}
}

func TestMarshalShortBuffer(t *testing.T) {
	if _, err := (Message{Type: TypeRequest}).Marshal(make([]byte, MessageLen-1)); !errors.Is(err, ErrShortBuffer) {
		t.Fatalf("err %v, want ErrShortBuffer", err)
	}
}

func TestMessageTypeString(t *testing.T) {
	for ty, want := range map[MessageType]string{TypeRequest: "request", TypeReply: "reply", 9: "type(9)"} {
		if got := ty.String(); got != want {
			t.Errorf("%d: %q, want %q", ty, got, want)
		}
	}
}

func FuzzParseMessage(f *testing.F) {
	for _, tc := range messageTable {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMessage(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrMessageType) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		out := m.Bytes()
		if !bytes.Equal(out[:], b) {
			t.Fatalf("accepted %x but re-encodes as %x", b, out)
		}
		var r Responder
		reply, err := r.Respond(b, make([]byte, MessageLen))
		if (err == nil) != (m.Type == TypeRequest) {
			t.Fatalf("Respond on %v: %v", m.Type, err)
		}
		if err == nil {
			rm, err := ParseMessage(reply)
			if err != nil || rm.Type != TypeReply || rm.Session != m.Session || rm.Sequence != m.Sequence || rm.Nonce != m.Nonce || len(reply) != len(b) {
				t.Fatalf("reply %x (%v) to %x", reply, err, b)
			}
		}
	})
}

func probePacket(t testing.TB, src, dst netip.AddrPort, payload []byte) []byte {
	t.Helper()
	pkt, err := AppendIPv4UDP(nil, src, dst, 0x1234, payload)
	if err != nil {
		t.Fatal(err)
	}
	return pkt
}

func TestAppendParseIPv4UDP(t *testing.T) {
	src := netip.AddrPortFrom(addrA, 40000)
	dst := netip.AddrPortFrom(addrB, DefaultPort)
	for _, n := range []int{0, 1, MessageLen, 1000} {
		payload := bytes.Repeat([]byte{0xab}, n)
		pkt := probePacket(t, src, dst, payload)
		if len(pkt) != 28+n {
			t.Fatalf("len %d", len(pkt))
		}
		gs, gd, gp, err := ParseIPv4UDP(append(pkt, 0, 0)) // link padding is ignored
		if err != nil || gs != src || gd != dst || !bytes.Equal(gp, payload) {
			t.Fatalf("n=%d: %v %v %x %v", n, gs, gd, gp, err)
		}
	}
	if _, err := AppendIPv4UDP(nil, netip.MustParseAddrPort("[::1]:1"), dst, 0, nil); !errors.Is(err, ErrPacket) {
		t.Fatalf("IPv6: %v", err)
	}
	if _, err := AppendIPv4UDP(nil, src, dst, 0, make([]byte, 70000)); !errors.Is(err, ErrPacket) {
		t.Fatalf("oversize: %v", err)
	}
}

// packetTable holds mutations of a valid probe packet and whether parsing
// must fail.
func packetTable(t testing.TB) []struct {
	name string
	pkt  []byte
	ok   bool
} {
	good := probePacket(t, netip.AddrPortFrom(addrA, 5555), netip.AddrPortFrom(addrB, DefaultPort), validRequest())
	mut := func(f func(p []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	refix := func(p []byte) []byte { // recompute the IPv4 header checksum
		binary.BigEndian.PutUint16(p[packet.IPv4ChecksumOff:], 0)
		binary.BigEndian.PutUint16(p[packet.IPv4ChecksumOff:], packet.Checksum(p[:20], 0))
		return p
	}
	return []struct {
		name string
		pkt  []byte
		ok   bool
	}{
		{"good", good, true},
		{"no UDP checksum", mut(func(p []byte) []byte { p[26], p[27] = 0, 0; return p }), true},
		{"truncated", good[:27], false},
		{"IPv6 version", mut(func(p []byte) []byte { p[0] = 0x65; return p }), false},
		{"IHL 4", mut(func(p []byte) []byte { p[0] = 0x44; return refix(p) }), false},
		{"total length past end", mut(func(p []byte) []byte { p[3] = 200; return refix(p) }), false},
		{"total length short", mut(func(p []byte) []byte { p[3] = 27; return refix(p) }), false},
		{"TCP", mut(func(p []byte) []byte { p[packet.IPv4ProtoOff] = 6; return refix(p) }), false},
		{"more fragments", mut(func(p []byte) []byte { p[6] |= 0x20; return refix(p) }), false},
		{"fragment offset", mut(func(p []byte) []byte { p[7] = 1; return refix(p) }), false},
		{"header checksum", mut(func(p []byte) []byte { p[packet.IPv4ChecksumOff] ^= 1; return p }), false},
		{"UDP checksum", mut(func(p []byte) []byte { p[27] ^= 1; return p }), false},
		{"UDP length", mut(func(p []byte) []byte { p[25]--; return p }), false},
		{"payload flipped", mut(func(p []byte) []byte { p[40] ^= 0x80; return p }), false},
	}
}

func TestParseIPv4UDPTable(t *testing.T) {
	for _, tc := range packetTable(t) {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := ParseIPv4UDP(tc.pkt)
			if tc.ok != (err == nil) {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrPacket) {
				t.Fatalf("err %v does not match ErrPacket", err)
			}
		})
	}
}

func TestIsProbePacket(t *testing.T) {
	req := probePacket(t, netip.AddrPortFrom(addrA, DefaultPort), netip.AddrPortFrom(addrB, DefaultPort), validRequest())
	user := probePacket(t, netip.AddrPortFrom(addrA, 5353), netip.AddrPortFrom(addrB, 53), []byte("dns"))
	for _, tc := range []struct {
		name string
		pkt  []byte
		want bool
	}{
		{"probe", req, true},
		{"user UDP", user, false},
		{"short", req[:10], false},
		{"TCP", withByte(req, packet.IPv4ProtoOff, 6), false},
		{"fragment", withByte(req, 7, 3), false},
		{"bad IHL", withByte(req, 0, 0x4f), false},
	} {
		if got := IsProbePacket(tc.pkt, DefaultPort); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestIsToPort: only the destination port counts, a first fragment (MF
// set, offset 0) is caught by its port, later fragments and other
// protocols are not.
func TestIsToPort(t *testing.T) {
	to := probePacket(t, netip.AddrPortFrom(addrA, 40000), netip.AddrPortFrom(addrB, DefaultPort), validRequest())
	from := probePacket(t, netip.AddrPortFrom(addrA, DefaultPort), netip.AddrPortFrom(addrB, 53), validRequest())
	for _, tc := range []struct {
		name string
		pkt  []byte
		want bool
	}{
		{"to the port", to, true},
		{"from the port", from, false},
		{"first fragment", withByte(to, 6, 0x20), true},
		{"later fragment", withByte(to, 7, 3), false},
		{"TCP", withByte(to, packet.IPv4ProtoOff, 6), false},
		{"short", to[:22], false},
		{"IPv6", withByte(to, 0, 0x60), false},
	} {
		if got := IsToPort(tc.pkt, DefaultPort); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestResponderIPv4(t *testing.T) {
	var r Responder
	src := netip.AddrPortFrom(addrA, DefaultPort)
	dst := netip.AddrPortFrom(addrB, DefaultPort)
	req := probePacket(t, src, dst, validRequest())
	out := make([]byte, 0, PacketLen)
	reply, err := r.RespondIPv4(req, out)
	if err != nil {
		t.Fatal(err)
	}
	rs, rd, payload, err := ParseIPv4UDP(reply)
	if err != nil || rs != dst || rd != src || len(reply) != PacketLen {
		t.Fatalf("reply %v → %v (%d bytes): %v", rs, rd, len(reply), err)
	}
	m, err := ParseMessage(payload)
	if err != nil || m.Type != TypeReply || m.Sequence != 7 || m.Nonce != 0x0102030405060708 {
		t.Fatalf("reply message %+v: %v", m, err)
	}

	for _, tc := range []struct {
		name string
		pkt  []byte
		want error
	}{
		{"reply is not answered", reply, ErrMessageType},
		{"other port", probePacket(t, src, netip.AddrPortFrom(addrB, 53), validRequest()), ErrNotProbe},
		{"garbage payload", probePacket(t, src, dst, []byte("hello")), ErrMalformed},
		{"future version", probePacket(t, src, dst, withByte(validRequest(), offVersion, 2)), ErrVersion},
		{"bad packet", req[:20], ErrPacket},
	} {
		if _, err := r.RespondIPv4(tc.pkt, out); !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
	}
	if st := r.Stats(); st.Answered != 1 || st.AnsweredBytes != PacketLen || st.Rejected != 5 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := r.Respond(validRequest(), make([]byte, 3)); !errors.Is(err, ErrShortBuffer) {
		t.Fatalf("short buffer: %v", err)
	}
}

func TestResponderZeroAlloc(t *testing.T) {
	testenv.SkipIfLockOrder(t)
	var r Responder
	req := probePacket(t, netip.AddrPortFrom(addrA, DefaultPort), netip.AddrPortFrom(addrB, DefaultPort), validRequest())
	out := make([]byte, 0, PacketLen)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := r.RespondIPv4(req, out); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("RespondIPv4 allocates %v times per packet", n)
	}
}

func FuzzParseIPv4UDP(f *testing.F) {
	for _, tc := range packetTable(f) {
		f.Add(tc.pkt)
	}
	f.Fuzz(func(t *testing.T, pkt []byte) {
		src, dst, payload, err := ParseIPv4UDP(pkt)
		IsProbePacket(pkt, DefaultPort)
		var r Responder
		reply, rerr := r.RespondIPv4(pkt, nil)
		if err != nil {
			if !errors.Is(err, ErrPacket) || rerr == nil {
				t.Fatalf("parse %v, respond %v", err, rerr)
			}
			return
		}
		// A parsed datagram re-encodes to a datagram that parses the same.
		again, err := AppendIPv4UDP(nil, src, dst, 0, payload)
		if err != nil {
			t.Fatal(err)
		}
		s2, d2, p2, err := ParseIPv4UDP(again)
		if err != nil || s2 != src || d2 != dst || !bytes.Equal(p2, payload) {
			t.Fatalf("re-encode: %v", err)
		}
		if rerr == nil {
			rs, rd, _, err := ParseIPv4UDP(reply)
			if err != nil || rs != dst || rd != src || len(reply) > len(pkt) {
				t.Fatalf("reply %v→%v %d bytes for %d: %v", rs, rd, len(reply), len(pkt), err)
			}
		}
	})
}
