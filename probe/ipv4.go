package probe

import (
	"fmt"
	"net/netip"

	"github.com/vipkit/vipkit/packet"
)

const probeTTL = 64

// PacketLen is the size of a probe packet built by AppendIPv4UDP around a
// version 1 message: IPv4 header, UDP header and message. Probe byte
// counters count this many bytes per probe or reply.
const PacketLen = packet.IPv4MinHeaderLen + packet.UDPHeaderLen + MessageLen

// AppendIPv4UDP appends an IPv4/UDP datagram from src to dst carrying
// payload to b and returns the extended slice. The header has no options,
// DF set, TTL 64 and the given IP identification; both checksums are
// filled in. It allocates only when b lacks capacity. Both addresses must be
// IPv4 and the datagram must fit in 65535 bytes.
func AppendIPv4UDP(b []byte, src, dst netip.AddrPort, id uint16, payload []byte) ([]byte, error) {
	out, err := packet.AppendUDP(b, packet.IPv4Fields{Src: src.Addr(), Dst: dst.Addr(), ID: id, DF: true, TTL: probeTTL},
		packet.UDPFields{SrcPort: src.Port(), DstPort: dst.Port()}, payload)
	if err != nil {
		return b, fmt.Errorf("%w: %v → %v: %w", ErrPacket, src, dst, err)
	}
	return out, nil
}

// ParseIPv4UDP validates pkt as one unfragmented IPv4/UDP datagram and
// returns its addresses and payload (a subslice of pkt). It checks the
// version, header length, total length (trailing bytes beyond it are
// ignored, as link padding), the header checksum, the UDP length and the UDP
// checksum when it is not zero. A fragment is rejected: probes are far
// smaller than any MTU. Every failure wraps ErrPacket. It never panics and
// does not allocate on success.
func ParseIPv4UDP(pkt []byte) (src, dst netip.AddrPort, payload []byte, err error) {
	if len(pkt) < packet.IPv4MinHeaderLen+packet.UDPHeaderLen {
		return src, dst, nil, fmt.Errorf("%w: %d bytes", ErrPacket, len(pkt))
	}
	ip := packet.IPv4(pkt)
	if v := packet.Version(pkt); v != 4 {
		return src, dst, nil, fmt.Errorf("%w: IP version %d", ErrPacket, v)
	}
	ihl, total := ip.HeaderLen(), ip.TotalLen()
	switch {
	case ihl < packet.IPv4MinHeaderLen:
		return src, dst, nil, fmt.Errorf("%w: header length %d", ErrPacket, ihl)
	case total < ihl+packet.UDPHeaderLen || total > len(pkt):
		return src, dst, nil, fmt.Errorf("%w: total length %d (header %d, have %d bytes)", ErrPacket, total, ihl, len(pkt))
	case ip.Protocol() != packet.ProtoUDP:
		return src, dst, nil, fmt.Errorf("%w: protocol %d, not UDP", ErrPacket, ip.Protocol())
	case ip.IsFragment():
		return src, dst, nil, fmt.Errorf("%w: fragment", ErrPacket)
	case packet.Checksum(pkt[:ihl], 0) != 0:
		return src, dst, nil, fmt.Errorf("%w: bad IPv4 header checksum", ErrPacket)
	}
	ip = ip[:total] // bytes beyond the total length are link padding
	u := packet.UDP(ip[ihl:])
	if ul := u.Length(); ul != len(u) {
		return src, dst, nil, fmt.Errorf("%w: UDP length %d in a %d-byte datagram", ErrPacket, ul, len(u))
	}
	s4, d4 := ip.Src().As4(), ip.Dst().As4()
	if u.Checksum() != 0 && packet.Checksum(u, packet.PseudoHeaderSum(s4, d4, packet.ProtoUDP, len(u))) != 0 {
		return src, dst, nil, fmt.Errorf("%w: bad UDP checksum", ErrPacket)
	}
	src = netip.AddrPortFrom(ip.Src(), u.SrcPort())
	dst = netip.AddrPortFrom(ip.Dst(), u.DstPort())
	return src, dst, u[packet.UDPHeaderLen:], nil
}

// IsProbePacket reports whether pkt looks like probe traffic on port: an
// IPv4/UDP packet whose source or destination port is port. It reads only
// the headers (no checksum validation), for the engine to keep probe bytes
// out of user traffic counters and to divert probes to the Responder or the
// Prober before any user processing. It never panics.
func IsProbePacket(pkt []byte, port uint16) bool {
	u, ok := udpOfIPv4(pkt)
	return ok && (u.SrcPort() == port || u.DstPort() == port)
}

// IsToPort reports whether pkt is an IPv4/UDP packet to destination port
// port (a first fragment counts: it carries the port). It reads only the
// headers and never panics.
func IsToPort(pkt []byte, port uint16) bool {
	u, ok := udpOfIPv4(pkt)
	return ok && u.DstPort() == port
}

// udpOfIPv4 returns the UDP header of an IPv4 packet that is UDP and not a
// later fragment.
func udpOfIPv4(pkt []byte) (packet.UDP, bool) {
	if len(pkt) < packet.IPv4MinHeaderLen || packet.Version(pkt) != 4 {
		return nil, false
	}
	ip := packet.IPv4(pkt)
	ihl := ip.HeaderLen()
	if ip.Protocol() != packet.ProtoUDP || ihl < packet.IPv4MinHeaderLen || len(pkt) < ihl+packet.UDPHeaderLen || ip.FragOffset() != 0 {
		return nil, false
	}
	return packet.UDP(pkt[ihl:]), true
}
