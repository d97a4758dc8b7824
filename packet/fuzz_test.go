package packet

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// Every view's Validate accepts or refuses any input without panicking,
// and after it accepts, every accessor stays inside the buffer.
func FuzzIPv4(f *testing.F) {
	for _, p := range seedPackets(f) {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ip := IPv4(b)
		if ip.Validate() != nil {
			return
		}
		if ip.HeaderLen() > len(b) || ip.TotalLen() != len(b) {
			t.Fatalf("header %d total %d of %d bytes", ip.HeaderLen(), ip.TotalLen(), len(b))
		}
		_ = ip.Payload()
		_, _, _, _, _, _, _ = ip.Src(), ip.Dst(), ip.ID(), ip.FragOffset(), ip.Protocol(), ip.Src32(), ip.Dst32()
		// A valid header's checksum verifies, and recomputing changes nothing.
		cp := append([]byte(nil), b...)
		IPv4(cp).UpdateChecksum()
		if ip.Checksum() != IPv4(cp).Checksum() {
			t.Fatalf("recompute %#04x, have %#04x", IPv4(cp).Checksum(), ip.Checksum())
		}
	})
}

func FuzzTCP(f *testing.F) {
	for _, p := range seedPackets(f) {
		if IPv4(p).Validate() == nil && IPv4(p).Protocol() == ProtoTCP {
			f.Add([]byte(IPv4(p).Payload()))
		}
	}
	f.Add([]byte{0, 1, 0, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		h := TCP(b)
		if h.Validate() != nil {
			return
		}
		if h.HeaderLen() > len(b) {
			t.Fatalf("data offset %d of %d bytes", h.HeaderLen(), len(b))
		}
		_ = h.Payload()
		_, _, _, _, _, _ = h.SrcPort(), h.DstPort(), h.Seq(), h.Ack(), h.Flags(), h.Checksum()
	})
}

func FuzzUDP(f *testing.F) {
	for _, p := range seedPackets(f) {
		if IPv4(p).Validate() == nil && IPv4(p).Protocol() == ProtoUDP {
			f.Add([]byte(IPv4(p).Payload()))
		}
	}
	f.Add([]byte{0, 1, 0, 2, 0, 200, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h := UDP(b)
		if h.Validate() != nil {
			return
		}
		if h.Length() > len(b) {
			t.Fatalf("length %d of %d bytes", h.Length(), len(b))
		}
		_ = h.Payload()
		_, _, _ = h.SrcPort(), h.DstPort(), h.Checksum()
	})
}

func FuzzICMPv4(f *testing.F) {
	for _, p := range seedPackets(f) {
		if IPv4(p).Validate() == nil && IPv4(p).Protocol() == ProtoICMP {
			f.Add([]byte(IPv4(p).Payload()))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h := ICMPv4(b)
		if h.Validate() != nil {
			return
		}
		_, _, _, _, _ = h.Type(), h.Code(), h.MTU(), h.IsError(), h.Checksum()
		_ = h.Quoted()
	})
}

// FuzzChecksum checks the eight-bytes-at-a-time sum against RFC 1071 word
// by word for arbitrary data.
func FuzzChecksum(f *testing.F) {
	f.Add([]byte("0123456789abcdef0123456789abcdef!"), uint32(0))
	f.Add(bytes.Repeat([]byte{0xff}, 67), uint32(0xffffff))
	f.Fuzz(func(t *testing.T, b []byte, initial uint32) {
		initial >>= 8 // a pseudo-header sum is below 2^24
		if got, want := Checksum(b, initial), naiveChecksum(b, initial); got != want {
			t.Fatalf("Checksum %#04x, naive %#04x", got, want)
		}
	})
}

// FuzzChecksumIncremental checks RFC 1624 updates against a full recompute
// for arbitrary data and arbitrary 32-bit and 16-bit rewrites.
func FuzzChecksumIncremental(f *testing.F) {
	f.Add([]byte("0123456789abcdef"), uint32(0xc0a80001), uint16(443), uint8(4))
	f.Add([]byte{0xff, 0xff, 0, 0, 0xff, 0xff}, uint32(0), uint16(0), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, v32 uint32, v16 uint16, at uint8) {
		if len(data) < 8 {
			return
		}
		buf := append([]byte{0, 0}, data...) // checksum field at 0
		binary.BigEndian.PutUint16(buf, Checksum(buf, 0))
		off := 2 + 2*(int(at)%((len(data)-4)/2+1))
		if off+4 > len(buf) {
			return
		}
		// same compares as one's-complement values: the only ambiguity is
		// ±0, which RFC 1624 eqn. 3 leaves only for all-zero data (its
		// update gives 0x0000 where a recompute gives 0xffff).
		same := func() bool {
			want := append([]byte(nil), buf...)
			binary.BigEndian.PutUint16(want, 0)
			got, full := binary.BigEndian.Uint16(buf), Checksum(want, 0)
			return got == full || (got == 0 && full == 0xffff && !bytes.ContainsFunc(want[2:], func(r rune) bool { return r != 0 }))
		}
		old32 := binary.BigEndian.Uint32(buf[off:])
		binary.BigEndian.PutUint32(buf[off:], v32)
		Adjust(buf, Delta32(old32, v32))
		if !same() {
			t.Fatalf("32-bit rewrite of %x: checksum %#04x", buf[2:], binary.BigEndian.Uint16(buf))
		}
		o := binary.BigEndian.Uint16(buf[off+2:])
		binary.BigEndian.PutUint16(buf[off+2:], v16)
		Adjust(buf, Delta16(o, v16))
		if !same() {
			t.Fatalf("16-bit rewrite of %x: checksum %#04x", buf[2:], binary.BigEndian.Uint16(buf))
		}
	})
}
