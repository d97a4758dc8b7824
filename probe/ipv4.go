package probe

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// IPv4 and UDP header layout used to carry probe messages through the
// overlay (which carries IPv4 only).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|Version|  IHL  |Type of Service|          Total Length         |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|         Identification        |Flags|      Fragment Offset    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  Time to Live |    Protocol   |         Header Checksum       |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                       Source Address                          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                    Destination Address                        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|          Source Port          |       Destination Port        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|            Length             |           Checksum            |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
const (
	ipv4MinHeaderLen = 20
	udpHeaderLen     = 8

	ipVersionIHL = 0
	ipTotalLen   = 2
	ipID         = 4
	ipFlagsFrag  = 6
	ipTTL        = 8
	ipProto      = 9
	ipChecksum   = 10
	ipSrc        = 12
	ipDst        = 16

	udpSrcPort  = 0
	udpDstPort  = 2
	udpLen      = 4
	udpChecksum = 6

	protoUDP = 17
	ipFlagDF = 0x4000
	ipMF     = 0x2000
	fragMask = 0x1fff

	probeTTL = 64
)

// PacketLen is the size of a probe packet built by AppendIPv4UDP around a
// version 1 message: IPv4 header, UDP header and message. Probe byte
// counters count this many bytes per probe or reply.
const PacketLen = ipv4MinHeaderLen + udpHeaderLen + MessageLen

// AppendIPv4UDP appends an IPv4/UDP datagram from src to dst carrying
// payload to b and returns the extended slice. The header has no options,
// DF set, TTL 64 and the given IP identification; both checksums are
// filled in. It allocates only when b lacks capacity. Both addresses must be
// IPv4 and the datagram must fit in 65535 bytes.
func AppendIPv4UDP(b []byte, src, dst netip.AddrPort, id uint16, payload []byte) ([]byte, error) {
	if !src.Addr().Is4() || !dst.Addr().Is4() {
		return b, fmt.Errorf("%w: addresses %v → %v are not both IPv4", ErrPacket, src, dst)
	}
	total := ipv4MinHeaderLen + udpHeaderLen + len(payload)
	if total > 0xffff {
		return b, fmt.Errorf("%w: %d-byte datagram", ErrPacket, total)
	}
	start := len(b)
	b = append(b, make([]byte, total-len(payload))...)
	b = append(b, payload...)
	p := b[start:]
	p[ipVersionIHL] = 0x45
	binary.BigEndian.PutUint16(p[ipTotalLen:], uint16(total))
	binary.BigEndian.PutUint16(p[ipID:], id)
	binary.BigEndian.PutUint16(p[ipFlagsFrag:], ipFlagDF)
	p[ipTTL] = probeTTL
	p[ipProto] = protoUDP
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(p[ipSrc:], s4[:])
	copy(p[ipDst:], d4[:])
	binary.BigEndian.PutUint16(p[ipChecksum:], ^fold(sum(p[:ipv4MinHeaderLen], 0)))

	u := p[ipv4MinHeaderLen:]
	binary.BigEndian.PutUint16(u[udpSrcPort:], src.Port())
	binary.BigEndian.PutUint16(u[udpDstPort:], dst.Port())
	binary.BigEndian.PutUint16(u[udpLen:], uint16(len(u)))
	c := ^fold(sum(u, pseudoSum(s4, d4, len(u))))
	if c == 0 {
		c = 0xffff // RFC 768: a computed zero is sent as all ones
	}
	binary.BigEndian.PutUint16(u[udpChecksum:], c)
	return b, nil
}

// ParseIPv4UDP validates pkt as one unfragmented IPv4/UDP datagram and
// returns its addresses and payload (a subslice of pkt). It checks the
// version, header length, total length (trailing bytes beyond it are
// ignored, as link padding), the header checksum, the UDP length and the UDP
// checksum when it is not zero. A fragment is rejected: probes are far
// smaller than any MTU. Every failure wraps ErrPacket. It never panics and
// does not allocate on success.
func ParseIPv4UDP(pkt []byte) (src, dst netip.AddrPort, payload []byte, err error) {
	if len(pkt) < ipv4MinHeaderLen+udpHeaderLen {
		return src, dst, nil, fmt.Errorf("%w: %d bytes", ErrPacket, len(pkt))
	}
	if pkt[ipVersionIHL]>>4 != 4 {
		return src, dst, nil, fmt.Errorf("%w: IP version %d", ErrPacket, pkt[ipVersionIHL]>>4)
	}
	ihl := int(pkt[ipVersionIHL]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(pkt[ipTotalLen:]))
	switch {
	case ihl < ipv4MinHeaderLen:
		return src, dst, nil, fmt.Errorf("%w: header length %d", ErrPacket, ihl)
	case total < ihl+udpHeaderLen || total > len(pkt):
		return src, dst, nil, fmt.Errorf("%w: total length %d (header %d, have %d bytes)", ErrPacket, total, ihl, len(pkt))
	case pkt[ipProto] != protoUDP:
		return src, dst, nil, fmt.Errorf("%w: protocol %d, not UDP", ErrPacket, pkt[ipProto])
	case binary.BigEndian.Uint16(pkt[ipFlagsFrag:])&(ipMF|fragMask) != 0:
		return src, dst, nil, fmt.Errorf("%w: fragment", ErrPacket)
	case fold(sum(pkt[:ihl], 0)) != 0xffff:
		return src, dst, nil, fmt.Errorf("%w: bad IPv4 header checksum", ErrPacket)
	}
	pkt = pkt[:total]
	u := pkt[ihl:]
	if ul := int(binary.BigEndian.Uint16(u[udpLen:])); ul != len(u) {
		return src, dst, nil, fmt.Errorf("%w: UDP length %d in a %d-byte datagram", ErrPacket, ul, len(u))
	}
	s4 := [4]byte(pkt[ipSrc : ipSrc+4])
	d4 := [4]byte(pkt[ipDst : ipDst+4])
	if binary.BigEndian.Uint16(u[udpChecksum:]) != 0 && fold(sum(u, pseudoSum(s4, d4, len(u)))) != 0xffff {
		return src, dst, nil, fmt.Errorf("%w: bad UDP checksum", ErrPacket)
	}
	src = netip.AddrPortFrom(netip.AddrFrom4(s4), binary.BigEndian.Uint16(u[udpSrcPort:]))
	dst = netip.AddrPortFrom(netip.AddrFrom4(d4), binary.BigEndian.Uint16(u[udpDstPort:]))
	return src, dst, u[udpHeaderLen:], nil
}

// IsProbePacket reports whether pkt looks like probe traffic on port: an
// IPv4/UDP packet whose source or destination port is port. It reads only
// the headers (no checksum validation), for the engine to keep probe bytes
// out of user traffic counters and to divert probes to the Responder or the
// Prober before any user processing. It never panics.
func IsProbePacket(pkt []byte, port uint16) bool {
	if len(pkt) < ipv4MinHeaderLen || pkt[ipVersionIHL]>>4 != 4 || pkt[ipProto] != protoUDP {
		return false
	}
	ihl := int(pkt[ipVersionIHL]&0x0f) * 4
	if ihl < ipv4MinHeaderLen || len(pkt) < ihl+udpHeaderLen ||
		binary.BigEndian.Uint16(pkt[ipFlagsFrag:])&fragMask != 0 {
		return false
	}
	u := pkt[ihl:]
	return binary.BigEndian.Uint16(u[udpSrcPort:]) == port || binary.BigEndian.Uint16(u[udpDstPort:]) == port
}

// sum adds b as big-endian 16-bit words to acc (RFC 1071), unfolded.
func sum(b []byte, acc uint32) uint32 {
	for len(b) >= 2 {
		acc += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		acc += uint32(b[0]) << 8
	}
	return acc
}

func fold(acc uint32) uint16 {
	for acc>>16 != 0 {
		acc = acc&0xffff + acc>>16
	}
	return uint16(acc)
}

func pseudoSum(src, dst [4]byte, udpLength int) uint32 {
	acc := sum(src[:], 0)
	acc = sum(dst[:], acc)
	return acc + protoUDP + uint32(udpLength)
}
