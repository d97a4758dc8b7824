// Package packet is the one place vipkit parses and builds packet headers:
// zero-copy views of IPv4, TCP, UDP and ICMPv4 headers with one validity
// check each, the Internet checksum (RFC 1071) and its incremental update
// (RFC 1624), and builders that encode headers into a buffer.
//
// A view is a byte slice with accessors, as in gVisor's header package:
//
//	ip := packet.IPv4(pkt)
//	if err := ip.Validate(); err != nil {
//		return err // matches ErrTruncated, ErrBadIHL, ErrBadLength, ...
//	}
//	src, proto := ip.Src(), ip.Protocol()
//
// After Validate returns nil the accessors never panic; before it they may.
// Accessors never copy and setters write through. A rewrite that changes a
// field covered by a checksum updates that checksum with Delta16/Delta32,
// AddDelta and Adjust (or AdjustUDP), which equal a full recompute and cost
// a few instructions; Checksum is the full recompute.
//
// The builders (IPv4.Encode, TCP.Encode, UDP.Encode, ICMPv4.Encode, and
// AppendTCP, AppendUDP and AppendICMPv4 for whole packets) write headers
// with correct checksums, for injected packets and for tests.
//
// The package imports nothing of vipkit's and allocates nothing, except
// the Append builders when the destination lacks capacity. Field offsets
// (IPv4SrcOff, TCPFlagsOff, ...) are exported for the packet path's
// rewrites, which must not pay for a view's checks twice.
package packet
