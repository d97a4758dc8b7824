package probe

import (
	"encoding/binary"
	"fmt"
)

// Probe message format, version 1.
//
// A probe is a UDP datagram from the prober's overlay address (any source
// port) to DefaultPort (configurable) on the peer's overlay address, sent
// through the encrypted tunnel like user traffic, so that it measures the
// full round trip of the actual data plane, relays included. The peer's agent
// intercepts datagrams to that port before its host stack and answers with a
// Responder: the host's firewall and ICMP policy are not involved, the
// reply proves the peer's agent (not only its kernel) is forwarding, and the
// probe never reaches a user application. A reply goes from the probe port
// back to the request's source address and port.
//
// Why UDP to a reserved port and not ICMP echo: an echo is answered by the
// peer's kernel, which may filter it, shares its identifier space with the
// user's own pings (so probe replies could be confused with user traffic
// and counted as such), and carries no version. A reserved-port datagram
// is classified unambiguously (IsProbePacket), so probe bytes stay out of
// user counters.
//
// The UDP payload is exactly MessageLen (24) bytes, big-endian:
//
//		 0                   1                   2                   3
//		 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//		+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//		|      magic 'v' 'p' (0x7670)   |    version    |     type      |
//		+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//		|                           session                             |
//		+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//		|                           sequence                            |
//		|                                                               |
//		+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//		|                            nonce                              |
//		|                                                               |
//		+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
//	  - version is 1. A message of another version is rejected (ErrVersion)
//	    and never answered; a later version may add fields after the nonce.
//	  - type is 1 (request) or 2 (reply). A reply copies session, sequence
//	    and nonce from its request.
//	  - session is random per Prober: replies to an earlier run do not match.
//	  - sequence counts the prober's probes to one peer, from 0; a reply is
//	    matched to its probe by (peer, sequence).
//	  - nonce is random per probe: a reply must echo it, so a reply cannot be
//	    made up or replayed from another probe with the same sequence.
//
// Messages of any other length are malformed (ErrMalformed): a Responder
// never sends more bytes than it received, so it cannot amplify.
const (
	// MessageLen is the size of a version 1 probe message, in bytes.
	MessageLen = 24

	// Version is the probe message version this package speaks.
	Version = 1

	// DefaultPort is the reserved UDP port on overlay addresses that the
	// agents' Responders answer.
	DefaultPort = 51829

	magic0, magic1 = 'v', 'p'

	offMagic   = 0
	offVersion = 2
	offType    = 3
	offSession = 4
	offSeq     = 8
	offNonce   = 16
)

// MessageType is the type byte of a probe message.
type MessageType uint8

// Message types.
const (
	TypeRequest MessageType = 1
	TypeReply   MessageType = 2
)

func (t MessageType) String() string {
	switch t {
	case TypeRequest:
		return "request"
	case TypeReply:
		return "reply"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Message is a decoded probe message. The zero value is not a valid message.
type Message struct {
	Type     MessageType
	Session  uint32
	Sequence uint64
	Nonce    uint64
}

// Marshal writes m in the version 1 format into b, which must hold
// MessageLen bytes, and returns b[:MessageLen].
func (m Message) Marshal(b []byte) ([]byte, error) {
	if len(b) < MessageLen {
		return nil, fmt.Errorf("%w: %d bytes for a %d-byte probe message", ErrShortBuffer, len(b), MessageLen)
	}
	b = b[:MessageLen]
	b[offMagic], b[offMagic+1] = magic0, magic1
	b[offVersion] = Version
	b[offType] = byte(m.Type)
	binary.BigEndian.PutUint32(b[offSession:], m.Session)
	binary.BigEndian.PutUint64(b[offSeq:], m.Sequence)
	binary.BigEndian.PutUint64(b[offNonce:], m.Nonce)
	return b, nil
}

// Bytes returns m encoded as a fixed-size array (no allocation).
func (m Message) Bytes() [MessageLen]byte {
	var a [MessageLen]byte
	_, _ = m.Marshal(a[:])
	return a
}

// ParseMessage decodes a probe message (the UDP payload). It fails with
// ErrMalformed (wrong length or magic), ErrVersion, or ErrMessageType (a type
// other than request and reply). It never panics and does not retain b.
func ParseMessage(b []byte) (Message, error) {
	if len(b) < offVersion+1 || b[offMagic] != magic0 || b[offMagic+1] != magic1 {
		return Message{}, fmt.Errorf("%w: %d bytes without the magic", ErrMalformed, len(b))
	}
	if v := b[offVersion]; v != Version {
		return Message{}, fmt.Errorf("%w: version %d", ErrVersion, v)
	}
	if len(b) != MessageLen {
		return Message{}, fmt.Errorf("%w: %d bytes, version 1 is %d", ErrMalformed, len(b), MessageLen)
	}
	m := Message{
		Type:     MessageType(b[offType]),
		Session:  binary.BigEndian.Uint32(b[offSession:]),
		Sequence: binary.BigEndian.Uint64(b[offSeq:]),
		Nonce:    binary.BigEndian.Uint64(b[offNonce:]),
	}
	if m.Type != TypeRequest && m.Type != TypeReply {
		return Message{}, fmt.Errorf("%w: %v", ErrMessageType, m.Type)
	}
	return m, nil
}
