package flow

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// Header validation errors. Each view's Validate returns one of them,
// wrapped with the view's name, and the packet path maps them to a
// DropReason.
var (
	// ErrTruncated: the buffer is shorter than the header (or the length a
	// header field claims).
	ErrTruncated = errors.New("flow: truncated header")
	// ErrBadIHL: an IPv4 header length below 5 words or beyond the packet.
	ErrBadIHL = errors.New("flow: bad IPv4 header length")
	// ErrBadLength: an IPv4 total length, UDP length or TCP data offset that
	// disagrees with the buffer.
	ErrBadLength = errors.New("flow: bad length field")
	// ErrBadChecksum: an IPv4 header whose checksum does not verify.
	ErrBadChecksum = errors.New("flow: bad IPv4 header checksum")
	// ErrNotIPv4: the version nibble is not 4.
	ErrNotIPv4 = errors.New("flow: not an IPv4 packet")
)

// Proto is an IP protocol number.
type Proto uint8

// The protocols the packet path understands.
const (
	ProtoICMP Proto = 1
	ProtoTCP  Proto = 6
	ProtoUDP  Proto = 17
)

// String returns "tcp", "udp", "icmp" or the number.
func (p Proto) String() string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoICMP:
		return "icmp"
	}
	return "proto(" + itoa(int(p)) + ")"
}

func itoa(v int) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	neg := v < 0
	if neg {
		v = -v
	}
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

// IPv4 is a zero-copy view of an IPv4 packet (RFC 791). Call Validate once;
// after it returns nil the accessors are safe. The accessors never copy; the
// setters write through to the underlying buffer and do not touch the header
// checksum (the packet path updates it incrementally).
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
//	|                    Options                    |    Padding    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type IPv4 []byte

// Offsets of the IPv4 header fields, per the diagram above.
const (
	ipv4VerIHL   = 0
	ipv4TOS      = 1
	ipv4TotalLen = 2
	ipv4ID       = 4
	ipv4FlagsOff = 6
	ipv4TTL      = 8
	ipv4Proto    = 9
	ipv4Checksum = 10
	ipv4Src      = 12
	ipv4Dst      = 16

	// IPv4MinHeaderLen is the length of an IPv4 header without options.
	IPv4MinHeaderLen = 20
	// IPv4MaxHeaderLen is the length of an IPv4 header with 40 bytes of
	// options (IHL 15).
	IPv4MaxHeaderLen = 60
	// IPv4MaxPacketLen is the largest IPv4 datagram (total length field).
	IPv4MaxPacketLen = 65535

	ipv4FlagDF     = 0x4000
	ipv4FlagMF     = 0x2000
	ipv4OffsetMask = 0x1fff
)

// Validate checks everything the accessors rely on: the version, the IHL,
// the total length (which must equal len(b): a packet path packet carries no
// padding) and the header checksum. It returns nil or an error matching one
// of ErrNotIPv4, ErrTruncated, ErrBadIHL, ErrBadLength or ErrBadChecksum.
func (b IPv4) Validate() error {
	if err := b.validateNoChecksum(); err != nil {
		return err
	}
	if ipHeaderSum(b[:b.HeaderLen()]) != 0xffff {
		return ErrBadChecksum
	}
	return nil
}

func (b IPv4) validateNoChecksum() error {
	if len(b) < IPv4MinHeaderLen {
		return ErrTruncated
	}
	if b[0]>>4 != 4 {
		return ErrNotIPv4
	}
	hl := int(b[0]&0xf) * 4
	if hl < IPv4MinHeaderLen || hl > len(b) {
		return ErrBadIHL
	}
	tl := int(binary.BigEndian.Uint16(b[ipv4TotalLen:]))
	if tl != len(b) || tl < hl {
		return ErrBadLength
	}
	return nil
}

// HeaderLen returns the header length in bytes (IHL × 4).
func (b IPv4) HeaderLen() int { return int(b[0]&0xf) * 4 }

// TotalLen returns the total length field.
func (b IPv4) TotalLen() int { return int(binary.BigEndian.Uint16(b[ipv4TotalLen:])) }

// ID returns the identification field.
func (b IPv4) ID() uint16 { return binary.BigEndian.Uint16(b[ipv4ID:]) }

// DF reports the don't-fragment flag.
func (b IPv4) DF() bool { return binary.BigEndian.Uint16(b[ipv4FlagsOff:])&ipv4FlagDF != 0 }

// MF reports the more-fragments flag.
func (b IPv4) MF() bool { return binary.BigEndian.Uint16(b[ipv4FlagsOff:])&ipv4FlagMF != 0 }

// FragOffset returns the fragment offset in bytes.
func (b IPv4) FragOffset() int {
	return int(binary.BigEndian.Uint16(b[ipv4FlagsOff:])&ipv4OffsetMask) * 8
}

// IsFragment reports whether the packet is a fragment (MF set or a nonzero
// offset).
func (b IPv4) IsFragment() bool {
	return binary.BigEndian.Uint16(b[ipv4FlagsOff:])&(ipv4FlagMF|ipv4OffsetMask) != 0
}

// TTL returns the time-to-live field.
func (b IPv4) TTL() uint8 { return b[ipv4TTL] }

// Protocol returns the protocol field.
func (b IPv4) Protocol() Proto { return Proto(b[ipv4Proto]) }

// Checksum returns the header checksum field.
func (b IPv4) Checksum() uint16 { return binary.BigEndian.Uint16(b[ipv4Checksum:]) }

// Src returns the source address.
func (b IPv4) Src() netip.Addr { return netip.AddrFrom4([4]byte(b[ipv4Src : ipv4Src+4])) }

// Dst returns the destination address.
func (b IPv4) Dst() netip.Addr { return netip.AddrFrom4([4]byte(b[ipv4Dst : ipv4Dst+4])) }

// Payload returns the bytes after the header, up to the total length.
func (b IPv4) Payload() []byte { return b[b.HeaderLen():b.TotalLen()] }

// SetChecksum sets the header checksum field.
func (b IPv4) SetChecksum(c uint16) { binary.BigEndian.PutUint16(b[ipv4Checksum:], c) }

// UpdateChecksum recomputes the header checksum from scratch.
func (b IPv4) UpdateChecksum() {
	b.SetChecksum(0)
	b.SetChecksum(^ipHeaderSum(b[:b.HeaderLen()]))
}

// TCP is a zero-copy view of a TCP header and payload (RFC 9293). Call
// Validate once; then the accessors are safe.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|          Source Port          |       Destination Port        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                        Sequence Number                        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                    Acknowledgment Number                      |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  Data |       |C|E|U|A|P|R|S|F|                               |
//	| Offset| Rsrvd |W|C|R|C|S|S|Y|I|            Window             |
//	|       |       |R|E|G|K|H|T|N|N|                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|           Checksum            |         Urgent Pointer        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type TCP []byte

// Offsets of the TCP header fields.
const (
	tcpSrcPort  = 0
	tcpDstPort  = 2
	tcpSeq      = 4
	tcpAck      = 8
	tcpDataOff  = 12
	tcpFlags    = 13
	tcpWindow   = 14
	tcpChecksum = 16
	tcpUrgent   = 18

	// TCPMinHeaderLen is the length of a TCP header without options.
	TCPMinHeaderLen = 20
)

// TCP flag bits, as in the flags byte.
const (
	TCPFlagFIN = 0x01
	TCPFlagSYN = 0x02
	TCPFlagRST = 0x04
	TCPFlagPSH = 0x08
	TCPFlagACK = 0x10
)

// Validate checks the header length and the data offset. It returns nil,
// ErrTruncated or ErrBadLength.
func (b TCP) Validate() error {
	if len(b) < TCPMinHeaderLen {
		return ErrTruncated
	}
	off := int(b[tcpDataOff]>>4) * 4
	if off < TCPMinHeaderLen || off > len(b) {
		return ErrBadLength
	}
	return nil
}

// SrcPort returns the source port.
func (b TCP) SrcPort() uint16 { return binary.BigEndian.Uint16(b[tcpSrcPort:]) }

// DstPort returns the destination port.
func (b TCP) DstPort() uint16 { return binary.BigEndian.Uint16(b[tcpDstPort:]) }

// Seq returns the sequence number.
func (b TCP) Seq() uint32 { return binary.BigEndian.Uint32(b[tcpSeq:]) }

// Ack returns the acknowledgment number.
func (b TCP) Ack() uint32 { return binary.BigEndian.Uint32(b[tcpAck:]) }

// HeaderLen returns the data offset in bytes.
func (b TCP) HeaderLen() int { return int(b[tcpDataOff]>>4) * 4 }

// Flags returns the flags byte (TCPFlag* bits).
func (b TCP) Flags() uint8 { return b[tcpFlags] }

// Checksum returns the checksum field.
func (b TCP) Checksum() uint16 { return binary.BigEndian.Uint16(b[tcpChecksum:]) }

// Payload returns the segment's data.
func (b TCP) Payload() []byte { return b[b.HeaderLen():] }

// UDP is a zero-copy view of a UDP datagram (RFC 768). Call Validate once;
// then the accessors are safe.
//
//	 0      7 8     15 16    23 24    31
//	+--------+--------+--------+--------+
//	|     Source      |   Destination   |
//	|      Port       |      Port       |
//	+--------+--------+--------+--------+
//	|                 |                 |
//	|     Length      |    Checksum     |
//	+--------+--------+--------+--------+
type UDP []byte

// Offsets of the UDP header fields.
const (
	udpSrcPort  = 0
	udpDstPort  = 2
	udpLength   = 4
	udpChecksum = 6

	// UDPHeaderLen is the length of a UDP header.
	UDPHeaderLen = 8
)

// Validate checks the header length and that the length field lies between
// 8 and len(b). It returns nil, ErrTruncated or ErrBadLength.
func (b UDP) Validate() error {
	if len(b) < UDPHeaderLen {
		return ErrTruncated
	}
	l := int(binary.BigEndian.Uint16(b[udpLength:]))
	if l < UDPHeaderLen || l > len(b) {
		return ErrBadLength
	}
	return nil
}

// SrcPort returns the source port.
func (b UDP) SrcPort() uint16 { return binary.BigEndian.Uint16(b[udpSrcPort:]) }

// DstPort returns the destination port.
func (b UDP) DstPort() uint16 { return binary.BigEndian.Uint16(b[udpDstPort:]) }

// Length returns the length field.
func (b UDP) Length() int { return int(binary.BigEndian.Uint16(b[udpLength:])) }

// Checksum returns the checksum field; 0 means the sender computed none.
func (b UDP) Checksum() uint16 { return binary.BigEndian.Uint16(b[udpChecksum:]) }

// Payload returns the datagram's data, up to the length field.
func (b UDP) Payload() []byte { return b[UDPHeaderLen:b.Length()] }

// ICMPv4 is a zero-copy view of an ICMPv4 message (RFC 792). Call Validate
// once; then the accessors are safe.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|     Type      |     Code      |          Checksum             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|     unused / identifier+sequence / (unused, next-hop MTU)     |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|      Internet Header + 64 bits of Original Data Datagram      |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type ICMPv4 []byte

// Offsets of the ICMPv4 header fields.
const (
	icmpType     = 0
	icmpCode     = 1
	icmpChecksum = 2
	icmpRest     = 4
	icmpMTU      = 6

	// ICMPv4HeaderLen is the length of the ICMPv4 header.
	ICMPv4HeaderLen = 8
)

// ICMPv4 types and codes the packet path produces or translates.
const (
	ICMPEchoReply        = 0
	ICMPDestUnreachable  = 3
	ICMPEchoRequest      = 8
	ICMPTimeExceeded     = 11
	ICMPParameterProblem = 12
	ICMPCodePortUnreach  = 3
	ICMPCodeFragNeeded   = 4
	ICMPCodeTTLExceeded  = 0
	icmpMinQuotedL4      = 8 // "64 bits of original data"
)

// Validate checks the header length. It returns nil or ErrTruncated.
func (b ICMPv4) Validate() error {
	if len(b) < ICMPv4HeaderLen {
		return ErrTruncated
	}
	return nil
}

// Type returns the type.
func (b ICMPv4) Type() uint8 { return b[icmpType] }

// Code returns the code.
func (b ICMPv4) Code() uint8 { return b[icmpCode] }

// Checksum returns the checksum field.
func (b ICMPv4) Checksum() uint16 { return binary.BigEndian.Uint16(b[icmpChecksum:]) }

// MTU returns the next-hop MTU of a fragmentation-needed message.
func (b ICMPv4) MTU() uint16 { return binary.BigEndian.Uint16(b[icmpMTU:]) }

// IsError reports whether the message is an error that quotes a datagram
// (destination unreachable, time exceeded, parameter problem).
func (b ICMPv4) IsError() bool {
	switch b[icmpType] {
	case ICMPDestUnreachable, ICMPTimeExceeded, ICMPParameterProblem:
		return true
	}
	return false
}

// Quoted returns the quoted datagram of an error message.
func (b ICMPv4) Quoted() []byte { return b[ICMPv4HeaderLen:] }
