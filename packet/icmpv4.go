package packet

import "encoding/binary"

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
	ICMPv4TypeOff     = 0
	ICMPv4CodeOff     = 1
	ICMPv4ChecksumOff = 2
	ICMPv4RestOff     = 4
	ICMPv4MTUOff      = 6

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
	ICMPv4MinQuoted      = 8 // "64 bits of original data"
)

// Validate checks the header length. It returns nil or ErrTruncated.
func (b ICMPv4) Validate() error {
	if len(b) < ICMPv4HeaderLen {
		return ErrTruncated
	}
	return nil
}

// Type returns the type.
func (b ICMPv4) Type() uint8 { return b[ICMPv4TypeOff] }

// Code returns the code.
func (b ICMPv4) Code() uint8 { return b[ICMPv4CodeOff] }

// Checksum returns the checksum field.
func (b ICMPv4) Checksum() uint16 { return binary.BigEndian.Uint16(b[ICMPv4ChecksumOff:]) }

// MTU returns the next-hop MTU of a fragmentation-needed message.
func (b ICMPv4) MTU() uint16 { return binary.BigEndian.Uint16(b[ICMPv4MTUOff:]) }

// IsError reports whether the message is an error that quotes a datagram
// (destination unreachable, time exceeded, parameter problem).
func (b ICMPv4) IsError() bool {
	switch b[ICMPv4TypeOff] {
	case ICMPDestUnreachable, ICMPTimeExceeded, ICMPParameterProblem:
		return true
	}
	return false
}

// Quoted returns the quoted datagram of an error message.
func (b ICMPv4) Quoted() []byte { return b[ICMPv4HeaderLen:] }
