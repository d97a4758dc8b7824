package packet

import (
	"encoding/binary"
	"net/netip"
)

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
	IPv4VerIHLOff   = 0
	IPv4TOSOff      = 1
	IPv4TotalLenOff = 2
	IPv4IDOff       = 4
	IPv4FlagsOff    = 6
	IPv4TTLOff      = 8
	IPv4ProtoOff    = 9
	IPv4ChecksumOff = 10
	IPv4SrcOff      = 12
	IPv4DstOff      = 16

	// IPv4MinHeaderLen is the length of an IPv4 header without options.
	IPv4MinHeaderLen = 20
	// IPv4MaxHeaderLen is the length of an IPv4 header with 40 bytes of
	// options (IHL 15).
	IPv4MaxHeaderLen = 60
	// IPv4MaxPacketLen is the largest IPv4 datagram (total length field).
	IPv4MaxPacketLen = 65535

	IPv4FlagDF         = 0x4000
	IPv4FlagMF         = 0x2000
	IPv4FragOffsetMask = 0x1fff
)

// Validate checks everything the accessors rely on: the version, the IHL,
// the total length (which must equal len(b): a packet path packet carries no
// padding) and the header checksum. It returns nil or an error matching one
// of ErrNotIPv4, ErrTruncated, ErrBadIHL, ErrBadLength or ErrBadChecksum.
func (b IPv4) Validate() error {
	if err := b.validateNoChecksum(); err != nil {
		return err
	}
	if headerSum(b[:b.HeaderLen()]) != 0xffff {
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
	tl := int(binary.BigEndian.Uint16(b[IPv4TotalLenOff:]))
	if tl != len(b) || tl < hl {
		return ErrBadLength
	}
	return nil
}

// HeaderLen returns the header length in bytes (IHL × 4).
func (b IPv4) HeaderLen() int { return int(b[0]&0xf) * 4 }

// TotalLen returns the total length field.
func (b IPv4) TotalLen() int { return int(binary.BigEndian.Uint16(b[IPv4TotalLenOff:])) }

// ID returns the identification field.
func (b IPv4) ID() uint16 { return binary.BigEndian.Uint16(b[IPv4IDOff:]) }

// DF reports the don't-fragment flag.
func (b IPv4) DF() bool { return binary.BigEndian.Uint16(b[IPv4FlagsOff:])&IPv4FlagDF != 0 }

// MF reports the more-fragments flag.
func (b IPv4) MF() bool { return binary.BigEndian.Uint16(b[IPv4FlagsOff:])&IPv4FlagMF != 0 }

// FragOffset returns the fragment offset in bytes.
func (b IPv4) FragOffset() int {
	return int(binary.BigEndian.Uint16(b[IPv4FlagsOff:])&IPv4FragOffsetMask) * 8
}

// IsFragment reports whether the packet is a fragment (MF set or a nonzero
// offset).
func (b IPv4) IsFragment() bool {
	return binary.BigEndian.Uint16(b[IPv4FlagsOff:])&(IPv4FlagMF|IPv4FragOffsetMask) != 0
}

// TTL returns the time-to-live field.
func (b IPv4) TTL() uint8 { return b[IPv4TTLOff] }

// Protocol returns the protocol field.
func (b IPv4) Protocol() Proto { return Proto(b[IPv4ProtoOff]) }

// Checksum returns the header checksum field.
func (b IPv4) Checksum() uint16 { return binary.BigEndian.Uint16(b[IPv4ChecksumOff:]) }

// Src returns the source address.
func (b IPv4) Src() netip.Addr { return netip.AddrFrom4([4]byte(b[IPv4SrcOff : IPv4SrcOff+4])) }

// Dst returns the destination address.
func (b IPv4) Dst() netip.Addr { return netip.AddrFrom4([4]byte(b[IPv4DstOff : IPv4DstOff+4])) }

// Payload returns the bytes after the header, up to the total length.
func (b IPv4) Payload() []byte { return b[b.HeaderLen():b.TotalLen()] }

// SetChecksum sets the header checksum field.
func (b IPv4) SetChecksum(c uint16) { binary.BigEndian.PutUint16(b[IPv4ChecksumOff:], c) }

// UpdateChecksum recomputes the header checksum from scratch.
func (b IPv4) UpdateChecksum() {
	b.SetChecksum(0)
	b.SetChecksum(^headerSum(b[:b.HeaderLen()]))
}

// Src32 returns the source address as a big-endian uint32, for table keys.
func (b IPv4) Src32() uint32 { return binary.BigEndian.Uint32(b[IPv4SrcOff:]) }

// Dst32 returns the destination address as a big-endian uint32.
func (b IPv4) Dst32() uint32 { return binary.BigEndian.Uint32(b[IPv4DstOff:]) }
