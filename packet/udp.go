package packet

import "encoding/binary"

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
	UDPSrcPortOff  = 0
	UDPDstPortOff  = 2
	UDPLengthOff   = 4
	UDPChecksumOff = 6

	// UDPHeaderLen is the length of a UDP header.
	UDPHeaderLen = 8
)

// Validate checks the header length and that the length field lies between
// 8 and len(b). It returns nil, ErrTruncated or ErrBadLength.
func (b UDP) Validate() error {
	if len(b) < UDPHeaderLen {
		return ErrTruncated
	}
	l := int(binary.BigEndian.Uint16(b[UDPLengthOff:]))
	if l < UDPHeaderLen || l > len(b) {
		return ErrBadLength
	}
	return nil
}

// SrcPort returns the source port.
func (b UDP) SrcPort() uint16 { return binary.BigEndian.Uint16(b[UDPSrcPortOff:]) }

// DstPort returns the destination port.
func (b UDP) DstPort() uint16 { return binary.BigEndian.Uint16(b[UDPDstPortOff:]) }

// Length returns the length field.
func (b UDP) Length() int { return int(binary.BigEndian.Uint16(b[UDPLengthOff:])) }

// Checksum returns the checksum field; 0 means the sender computed none.
func (b UDP) Checksum() uint16 { return binary.BigEndian.Uint16(b[UDPChecksumOff:]) }

// Payload returns the datagram's data, up to the length field.
func (b UDP) Payload() []byte { return b[UDPHeaderLen:b.Length()] }
