package packet

import "encoding/binary"

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
	TCPSrcPortOff  = 0
	TCPDstPortOff  = 2
	TCPSeqOff      = 4
	TCPAckOff      = 8
	TCPDataOffOff  = 12
	TCPFlagsOff    = 13
	TCPWindowOff   = 14
	TCPChecksumOff = 16
	TCPUrgentOff   = 18

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
	off := int(b[TCPDataOffOff]>>4) * 4
	if off < TCPMinHeaderLen || off > len(b) {
		return ErrBadLength
	}
	return nil
}

// SrcPort returns the source port.
func (b TCP) SrcPort() uint16 { return binary.BigEndian.Uint16(b[TCPSrcPortOff:]) }

// DstPort returns the destination port.
func (b TCP) DstPort() uint16 { return binary.BigEndian.Uint16(b[TCPDstPortOff:]) }

// Seq returns the sequence number.
func (b TCP) Seq() uint32 { return binary.BigEndian.Uint32(b[TCPSeqOff:]) }

// Ack returns the acknowledgment number.
func (b TCP) Ack() uint32 { return binary.BigEndian.Uint32(b[TCPAckOff:]) }

// HeaderLen returns the data offset in bytes.
func (b TCP) HeaderLen() int { return int(b[TCPDataOffOff]>>4) * 4 }

// Flags returns the flags byte (TCPFlag* bits).
func (b TCP) Flags() uint8 { return b[TCPFlagsOff] }

// Checksum returns the checksum field.
func (b TCP) Checksum() uint16 { return binary.BigEndian.Uint16(b[TCPChecksumOff:]) }

// Payload returns the segment's data.
func (b TCP) Payload() []byte { return b[b.HeaderLen():] }
