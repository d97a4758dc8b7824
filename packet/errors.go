package packet

import "errors"

// Header validation errors. Each view's Validate returns one of them as is;
// callers wrap them with context and match them with errors.Is.
var (
	// ErrTruncated means the buffer is shorter than the header, or than the
	// length a header field claims.
	ErrTruncated = errors.New("packet: truncated header")
	// ErrBadIHL reports an IPv4 header length below 5 words or beyond the
	// packet.
	ErrBadIHL = errors.New("packet: bad IPv4 header length")
	// ErrBadLength reports an IPv4 total length, UDP length or TCP data
	// offset that disagrees with the buffer.
	ErrBadLength = errors.New("packet: bad length field")
	// ErrBadChecksum reports an IPv4 header whose checksum does not verify.
	ErrBadChecksum = errors.New("packet: bad IPv4 header checksum")
	// ErrNotIPv4 means the version nibble is not 4.
	ErrNotIPv4 = errors.New("packet: not an IPv4 packet")
	// ErrTooBig means a builder was asked for a datagram longer than 65535
	// bytes.
	ErrTooBig = errors.New("packet: datagram too big")
	// ErrNotIPv4Addr means a builder was given an address that is not IPv4.
	ErrNotIPv4Addr = errors.New("packet: address is not IPv4")
)
