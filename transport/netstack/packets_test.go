package netstack_test

import (
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// udpPacket builds an IPv4 or IPv6 UDP packet with correct checksums.
func udpPacket(src, dst netip.AddrPort, ttl uint8, payload []byte) []byte {
	s := tcpip.AddrFromSlice(src.Addr().AsSlice())
	d := tcpip.AddrFromSlice(dst.Addr().AsSlice())
	ulen := header.UDPMinimumSize + len(payload)
	var pkt []byte
	var u header.UDP
	if src.Addr().Is4() {
		pkt = make([]byte, header.IPv4MinimumSize+ulen)
		ip := header.IPv4(pkt)
		ip.Encode(&header.IPv4Fields{
			TotalLength: uint16(len(pkt)),
			TTL:         ttl,
			Protocol:    uint8(header.UDPProtocolNumber),
			SrcAddr:     s,
			DstAddr:     d,
		})
		ip.SetChecksum(^ip.CalculateChecksum())
		u = header.UDP(pkt[header.IPv4MinimumSize:])
	} else {
		pkt = make([]byte, header.IPv6MinimumSize+ulen)
		header.IPv6(pkt).Encode(&header.IPv6Fields{
			PayloadLength:     uint16(ulen),
			TransportProtocol: header.UDPProtocolNumber,
			HopLimit:          ttl,
			SrcAddr:           s,
			DstAddr:           d,
		})
		u = header.UDP(pkt[header.IPv6MinimumSize:])
	}
	u.Encode(&header.UDPFields{SrcPort: src.Port(), DstPort: dst.Port(), Length: uint16(ulen)})
	copy(u.Payload(), payload)
	xsum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, s, d, uint16(ulen))
	xsum = checksum.Checksum(payload, xsum)
	u.SetChecksum(^u.CalculateChecksum(xsum))
	return pkt
}

// tcpSYN builds a TCP SYN with correct checksums.
func tcpSYN(src, dst netip.Addr, sport, dport uint16) []byte {
	s := tcpip.AddrFromSlice(src.AsSlice())
	d := tcpip.AddrFromSlice(dst.AsSlice())
	hl := header.IPv4MinimumSize
	if src.Is6() {
		hl = header.IPv6MinimumSize
	}
	pkt := make([]byte, hl+header.TCPMinimumSize)
	if src.Is4() {
		ip := header.IPv4(pkt)
		ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(pkt)), TTL: 64, Protocol: uint8(header.TCPProtocolNumber), SrcAddr: s, DstAddr: d})
		ip.SetChecksum(^ip.CalculateChecksum())
	} else {
		header.IPv6(pkt).Encode(&header.IPv6Fields{PayloadLength: header.TCPMinimumSize, TransportProtocol: header.TCPProtocolNumber, HopLimit: 64, SrcAddr: s, DstAddr: d})
	}
	tc := header.TCP(pkt[hl:])
	tc.Encode(&header.TCPFields{SrcPort: sport, DstPort: dport, SeqNum: 1000, DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagSyn, WindowSize: 65535})
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, s, d, header.TCPMinimumSize)
	tc.SetChecksum(^tc.CalculateChecksum(xsum))
	return pkt
}
