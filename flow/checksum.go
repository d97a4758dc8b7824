package flow

import (
	"encoding/binary"
	"math/bits"
)

// Checksum returns the Internet checksum (RFC 1071) of b, with initial added
// to the one's-complement sum (use PseudoHeaderSum for TCP/UDP). An odd final
// byte is padded with zero. It is the full recompute the packet path never
// needs: the path updates checksums incrementally (RFC 1624).
func Checksum(b []byte, initial uint32) uint16 {
	return ^fold64(sum64(b) + uint64(initial))
}

// PseudoHeaderSum returns the unfolded one's-complement sum of the IPv4
// pseudo-header (RFC 9293 §3.1, RFC 768) for a TCP or UDP segment of length
// l, to pass to Checksum as initial.
func PseudoHeaderSum(src, dst [4]byte, proto Proto, l int) uint32 {
	s := uint32(binary.BigEndian.Uint16(src[0:])) + uint32(binary.BigEndian.Uint16(src[2:])) +
		uint32(binary.BigEndian.Uint16(dst[0:])) + uint32(binary.BigEndian.Uint16(dst[2:])) +
		uint32(proto) + uint32(l)
	return s
}

// sum64 adds b as big-endian 16-bit words into a 64-bit accumulator, eight
// bytes at a time. The result still needs folding.
func sum64(b []byte) uint64 {
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

// fold64 folds a 64-bit one's-complement sum to 16 bits.
func fold64(s uint64) uint16 {
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

// ipHeaderSum returns the folded one's-complement sum of an IPv4 header,
// checksum field included: 0xffff means the checksum verifies.
func ipHeaderSum(h []byte) uint16 {
	if len(h) == IPv4MinHeaderLen {
		s := uint64(binary.BigEndian.Uint32(h[0:])) + uint64(binary.BigEndian.Uint32(h[4:])) +
			uint64(binary.BigEndian.Uint32(h[8:])) + uint64(binary.BigEndian.Uint32(h[12:])) +
			uint64(binary.BigEndian.Uint32(h[16:]))
		return fold64(s)
	}
	return fold64(sum64(h))
}

// A delta is a one's-complement sum of (¬old + new) over rewritten 16-bit
// words, folded to 16 bits (RFC 1624 eqn. 3: HC' = ¬(¬HC + ¬m + m')). Adding
// deltas composes rewrites; ^d undoes one.

// delta16 returns the delta of rewriting one 16-bit word.
func delta16(old, new uint16) uint32 { return fold32(uint32(^old) + uint32(new)) }

// delta32 returns the delta of rewriting a 32-bit field (an address).
func delta32(old, new uint32) uint32 {
	return fold32(uint32(^uint16(old>>16)) + uint32(^uint16(old)) + (new >> 16) + (new & 0xffff))
}

// addDelta composes two deltas.
func addDelta(a, b uint32) uint32 { return fold32(a + b) }

// adjust applies delta d to the checksum stored at b[0:2].
func adjust(b []byte, d uint32) {
	c := uint32(^binary.BigEndian.Uint16(b)) + d
	c = fold32(c)
	binary.BigEndian.PutUint16(b, ^uint16(c))
}

// adjustUDP is adjust for a UDP checksum: zero means "no checksum" and stays
// zero, and a computed zero is sent as 0xffff (RFC 768).
func adjustUDP(b []byte, d uint32) {
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
