package packet

import (
	"encoding/binary"
	"math/bits"
)

// Checksum returns the Internet checksum (RFC 1071) of b, with initial added
// to the one's-complement sum (PseudoHeaderSum for TCP and UDP, 0
// otherwise). An odd final byte is padded with zero. It is the full
// recompute; a rewrite of a few fields updates the checksum incrementally
// with Adjust instead.
func Checksum(b []byte, initial uint32) uint16 {
	s, c := bits.Add64(Sum(b), uint64(initial), 0) // Sum may be near 2^64: keep the carry
	return ^Fold(s + c)
}

// PseudoHeaderSum returns the unfolded one's-complement sum of the IPv4
// pseudo-header (RFC 9293 §3.1, RFC 768) of a TCP or UDP segment of length
// l, to pass to Checksum as initial.
func PseudoHeaderSum(src, dst [4]byte, proto Proto, l int) uint32 {
	return uint32(binary.BigEndian.Uint16(src[0:])) + uint32(binary.BigEndian.Uint16(src[2:])) +
		uint32(binary.BigEndian.Uint16(dst[0:])) + uint32(binary.BigEndian.Uint16(dst[2:])) +
		uint32(proto) + uint32(l)
}

// Sum adds b as big-endian 16-bit words (an odd final byte padded with
// zero) into a 64-bit one's-complement accumulator, eight bytes at a time.
// The result is unfolded: pass it to Fold.
func Sum(b []byte) uint64 {
	var s, c uint64
	for len(b) >= 32 {
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[0:]), c)
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[8:]), c)
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[16:]), c)
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[24:]), c)
		b = b[32:]
	}
	for len(b) >= 8 {
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b), c)
		b = b[8:]
	}
	s += c // end-around carry; cannot overflow again (s ≤ 2^64-1-1+1)
	var t uint64
	for len(b) >= 2 {
		t += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		t += uint64(b[0]) << 8
	}
	s, c = bits.Add64(s, t, 0)
	return s + c
}

// Fold folds a 64-bit one's-complement sum to 16 bits.
func Fold(s uint64) uint16 {
	s = (s >> 32) + (s & 0xffffffff)
	s = (s >> 32) + (s & 0xffffffff)
	s = (s >> 16) + (s & 0xffff)
	s = (s >> 16) + (s & 0xffff)
	s = (s >> 16) + (s & 0xffff)
	return uint16(s)
}

// fold32 folds a 32-bit one's-complement sum to 16 bits.
func fold32(s uint32) uint32 {
	s = (s >> 16) + (s & 0xffff)
	s = (s >> 16) + (s & 0xffff)
	return s
}

// headerSum returns the folded one's-complement sum of an IPv4 header,
// checksum field included: 0xffff means the checksum verifies.
func headerSum(h []byte) uint16 {
	if len(h) == IPv4MinHeaderLen {
		s := uint64(binary.BigEndian.Uint32(h[0:])) + uint64(binary.BigEndian.Uint32(h[4:])) +
			uint64(binary.BigEndian.Uint32(h[8:])) + uint64(binary.BigEndian.Uint32(h[12:])) +
			uint64(binary.BigEndian.Uint32(h[16:]))
		return Fold(s)
	}
	return Fold(Sum(h))
}

// A delta is the one's-complement sum of (¬old + new) over the rewritten
// 16-bit words of a checksummed range, folded to 16 bits (RFC 1624 eqn. 3:
// HC' = ¬(¬HC + ¬m + m')). Deltas compose with AddDelta; the bitwise
// complement of a delta undoes it. Adjust applies one to a checksum field.

// Delta16 returns the delta of rewriting one 16-bit word from old to new.
func Delta16(old, new uint16) uint32 { return fold32(uint32(^old) + uint32(new)) }

// Delta32 returns the delta of rewriting a 32-bit field (an IPv4 address)
// from old to new.
func Delta32(old, new uint32) uint32 {
	return fold32(uint32(^uint16(old>>16)) + uint32(^uint16(old)) + (new >> 16) + (new & 0xffff))
}

// AddDelta composes two deltas.
func AddDelta(a, b uint32) uint32 { return fold32(a + b) }

// Adjust applies delta d to the checksum stored big-endian at b[0:2] (an
// IPv4 header, TCP or ICMPv4 checksum field).
func Adjust(b []byte, d uint32) {
	c := uint32(^binary.BigEndian.Uint16(b)) + d
	c = fold32(c)
	binary.BigEndian.PutUint16(b, ^uint16(c))
}

// AdjustUDP is Adjust for a UDP checksum field: zero means the sender
// computed no checksum and stays zero, and a computed zero is written as
// 0xffff (RFC 768).
func AdjustUDP(b []byte, d uint32) {
	old := binary.BigEndian.Uint16(b)
	if old == 0 {
		return
	}
	c := fold32(uint32(^old) + d)
	n := ^uint16(c)
	if n == 0 {
		n = 0xffff
	}
	binary.BigEndian.PutUint16(b, n)
}
