package packet

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// DefaultTTL is the TTL the builders write when IPv4Fields.TTL is zero.
const DefaultTTL = 64

// IPv4Fields are the values IPv4.Encode writes.
type IPv4Fields struct {
	TOS uint8
	// TotalLen is the total length field; zero means len of the buffer.
	TotalLen int
	ID       uint16
	DF       bool // don't fragment
	MF       bool // more fragments
	// FragOffset is the fragment offset in bytes, a multiple of 8.
	FragOffset int
	// TTL is the time to live; zero means DefaultTTL.
	TTL      uint8
	Protocol Proto
	Src, Dst netip.Addr // IPv4 addresses
	// Options are copied after the fixed header; their length must be a
	// multiple of 4 and at most 40 bytes.
	Options []byte
}

// HeaderLen returns the header length f encodes to.
func (f *IPv4Fields) HeaderLen() int { return IPv4MinHeaderLen + len(f.Options) }

// Encode writes the header f describes into b and fills in its checksum,
// as gVisor's header.IPv4.Encode does. b must hold at least f.HeaderLen()
// bytes (it panics otherwise, like any out-of-range slice index); the
// payload after the header is left alone. Check f with AppendTCP and its
// siblings when it comes from outside the program.
func (b IPv4) Encode(f *IPv4Fields) {
	hl := f.HeaderLen()
	_ = b[hl-1]
	b[IPv4VerIHLOff] = 0x40 | byte(hl/4)
	b[IPv4TOSOff] = f.TOS
	tl := f.TotalLen
	if tl == 0 {
		tl = len(b)
	}
	binary.BigEndian.PutUint16(b[IPv4TotalLenOff:], uint16(tl))
	binary.BigEndian.PutUint16(b[IPv4IDOff:], f.ID)
	fo := uint16(f.FragOffset/8) & IPv4FragOffsetMask
	if f.DF {
		fo |= IPv4FlagDF
	}
	if f.MF {
		fo |= IPv4FlagMF
	}
	binary.BigEndian.PutUint16(b[IPv4FlagsOff:], fo)
	b[IPv4TTLOff] = f.TTL
	if f.TTL == 0 {
		b[IPv4TTLOff] = DefaultTTL
	}
	b[IPv4ProtoOff] = byte(f.Protocol)
	s, d := f.Src.As4(), f.Dst.As4()
	copy(b[IPv4SrcOff:IPv4SrcOff+4], s[:])
	copy(b[IPv4DstOff:IPv4DstOff+4], d[:])
	copy(b[IPv4MinHeaderLen:hl], f.Options)
	b.UpdateChecksum()
}

// check reports why f cannot head a datagram of l4 bytes.
func (f *IPv4Fields) check(l4 int) error {
	if !f.Src.Is4() || !f.Dst.Is4() {
		return fmt.Errorf("%w: %v → %v", ErrNotIPv4Addr, f.Src, f.Dst)
	}
	if len(f.Options)%4 != 0 || len(f.Options) > IPv4MaxHeaderLen-IPv4MinHeaderLen {
		return fmt.Errorf("%w: %d bytes of options", ErrBadIHL, len(f.Options))
	}
	if t := f.HeaderLen() + l4; t > IPv4MaxPacketLen {
		return fmt.Errorf("%w: %d bytes", ErrTooBig, t)
	}
	return nil
}

// TCPFields are the values TCP.Encode writes (a header without options).
type TCPFields struct {
	SrcPort, DstPort uint16
	Seq, Ack         uint32
	Flags            uint8 // TCPFlag* bits
	Window           uint16
	Urgent           uint16
}

// Encode writes the 20-byte header f describes into b (data offset 5) and
// zeroes the checksum; UpdateChecksum fills it in once the payload is in
// place. b must hold at least TCPMinHeaderLen bytes.
func (b TCP) Encode(f *TCPFields) {
	_ = b[TCPMinHeaderLen-1]
	binary.BigEndian.PutUint16(b[TCPSrcPortOff:], f.SrcPort)
	binary.BigEndian.PutUint16(b[TCPDstPortOff:], f.DstPort)
	binary.BigEndian.PutUint32(b[TCPSeqOff:], f.Seq)
	binary.BigEndian.PutUint32(b[TCPAckOff:], f.Ack)
	b[TCPDataOffOff] = 5 << 4
	b[TCPFlagsOff] = f.Flags
	binary.BigEndian.PutUint16(b[TCPWindowOff:], f.Window)
	binary.BigEndian.PutUint16(b[TCPChecksumOff:], 0)
	binary.BigEndian.PutUint16(b[TCPUrgentOff:], f.Urgent)
}

// UpdateChecksum recomputes the checksum of the whole segment b (header
// and payload) with the pseudo-header of src and dst.
func (b TCP) UpdateChecksum(src, dst [4]byte) {
	binary.BigEndian.PutUint16(b[TCPChecksumOff:], 0)
	binary.BigEndian.PutUint16(b[TCPChecksumOff:], Checksum(b, PseudoHeaderSum(src, dst, ProtoTCP, len(b))))
}

// UDPFields are the values UDP.Encode writes.
type UDPFields struct {
	SrcPort, DstPort uint16
	// Length is the length field; zero means len of the buffer.
	Length int
}

// Encode writes the header f describes into b and zeroes the checksum;
// UpdateChecksum fills it in once the payload is in place. b must hold at
// least UDPHeaderLen bytes.
func (b UDP) Encode(f *UDPFields) {
	_ = b[UDPHeaderLen-1]
	binary.BigEndian.PutUint16(b[UDPSrcPortOff:], f.SrcPort)
	binary.BigEndian.PutUint16(b[UDPDstPortOff:], f.DstPort)
	l := f.Length
	if l == 0 {
		l = len(b)
	}
	binary.BigEndian.PutUint16(b[UDPLengthOff:], uint16(l))
	binary.BigEndian.PutUint16(b[UDPChecksumOff:], 0)
}

// UpdateChecksum recomputes the checksum of the whole datagram b with the
// pseudo-header of src and dst; a computed zero is written as 0xffff
// (RFC 768).
func (b UDP) UpdateChecksum(src, dst [4]byte) {
	binary.BigEndian.PutUint16(b[UDPChecksumOff:], 0)
	c := Checksum(b, PseudoHeaderSum(src, dst, ProtoUDP, len(b)))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(b[UDPChecksumOff:], c)
}

// ICMPv4Fields are the values ICMPv4.Encode writes.
type ICMPv4Fields struct {
	Type, Code uint8
	// Rest is the second word: identifier and sequence of an echo, the
	// next-hop MTU of a fragmentation-needed error in its low 16 bits.
	Rest uint32
}

// Encode writes the header f describes into b and zeroes the checksum;
// UpdateChecksum fills it in once the payload is in place. b must hold at
// least ICMPv4HeaderLen bytes.
func (b ICMPv4) Encode(f *ICMPv4Fields) {
	_ = b[ICMPv4HeaderLen-1]
	b[ICMPv4TypeOff] = f.Type
	b[ICMPv4CodeOff] = f.Code
	binary.BigEndian.PutUint16(b[ICMPv4ChecksumOff:], 0)
	binary.BigEndian.PutUint32(b[ICMPv4RestOff:], f.Rest)
}

// UpdateChecksum recomputes the checksum of the whole message b.
func (b ICMPv4) UpdateChecksum() {
	binary.BigEndian.PutUint16(b[ICMPv4ChecksumOff:], 0)
	binary.BigEndian.PutUint16(b[ICMPv4ChecksumOff:], Checksum(b, 0))
}

// grow appends n zero bytes to b and returns the extended slice and the
// new part.
func grow(b []byte, n int) ([]byte, []byte) {
	start := len(b)
	if cap(b)-start < n {
		nb := make([]byte, start, start+n)
		copy(nb, b)
		b = nb
	}
	b = b[:start+n]
	clear(b[start:])
	return b, b[start:]
}

// AppendTCP appends an IPv4/TCP packet (ip with Protocol set to TCP, tcp,
// payload) with all checksums filled in to b and returns the extended
// slice. It allocates only when b lacks capacity. It fails, leaving b as
// it was, with ErrNotIPv4Addr, ErrBadIHL (options) or ErrTooBig.
func AppendTCP(b []byte, ip IPv4Fields, tcp TCPFields, payload []byte) ([]byte, error) {
	l4 := TCPMinHeaderLen + len(payload)
	if err := ip.check(l4); err != nil {
		return b, err
	}
	ip.Protocol, ip.TotalLen = ProtoTCP, 0
	out, p := grow(b, ip.HeaderLen()+l4)
	IPv4(p).Encode(&ip)
	t := TCP(p[ip.HeaderLen():])
	t.Encode(&tcp)
	copy(t[TCPMinHeaderLen:], payload)
	t.UpdateChecksum(ip.Src.As4(), ip.Dst.As4())
	return out, nil
}

// AppendUDP is AppendTCP for a UDP datagram; its checksum is always
// computed.
func AppendUDP(b []byte, ip IPv4Fields, udp UDPFields, payload []byte) ([]byte, error) {
	l4 := UDPHeaderLen + len(payload)
	if err := ip.check(l4); err != nil {
		return b, err
	}
	ip.Protocol, ip.TotalLen, udp.Length = ProtoUDP, 0, 0
	out, p := grow(b, ip.HeaderLen()+l4)
	IPv4(p).Encode(&ip)
	u := UDP(p[ip.HeaderLen():])
	u.Encode(&udp)
	copy(u[UDPHeaderLen:], payload)
	u.UpdateChecksum(ip.Src.As4(), ip.Dst.As4())
	return out, nil
}

// AppendICMPv4 is AppendTCP for an ICMPv4 message; payload is the echo
// data or the quoted datagram of an error.
func AppendICMPv4(b []byte, ip IPv4Fields, icmp ICMPv4Fields, payload []byte) ([]byte, error) {
	l4 := ICMPv4HeaderLen + len(payload)
	if err := ip.check(l4); err != nil {
		return b, err
	}
	ip.Protocol, ip.TotalLen = ProtoICMP, 0
	out, p := grow(b, ip.HeaderLen()+l4)
	IPv4(p).Encode(&ip)
	m := ICMPv4(p[ip.HeaderLen():])
	m.Encode(&icmp)
	copy(m[ICMPv4HeaderLen:], payload)
	m.UpdateChecksum()
	return out, nil
}
