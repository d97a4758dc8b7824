package probe

import (
	"fmt"
	"sync/atomic"

	"github.com/vipkit/vipkit/packet"
)

// Responder answers probe requests on behalf of a node's agent. The agent's
// engine diverts every packet for the probe port on its own overlay address
// to RespondIPv4 (or, holding the UDP payload already, to Respond) before
// its host stack sees it, and sends the reply back through the tunnel.
//
// A Responder answers only version 1 requests of exactly MessageLen bytes,
// with a reply of the same size (no amplification), and never answers a
// reply (no loops between two agents). It keeps no state per prober, so a
// replayed request is answered again; the prober, not the responder, rejects
// the replayed reply. Rate limiting, if wanted, belongs to the engine, which
// knows the authenticated peer.
//
// The zero value answers on DefaultPort. A Responder is safe for concurrent
// use; its counters are updated atomically. Its methods do not allocate on
// success.
type Responder struct {
	// Port is the reserved UDP port answered by RespondIPv4; 0 means
	// DefaultPort.
	Port uint16

	answered      atomic.Uint64
	answeredBytes atomic.Uint64
	rejected      atomic.Uint64
}

// ResponderStats are a Responder's counters. Probe bytes are IP packet bytes
// (PacketLen per message) and are never part of user traffic counters.
type ResponderStats struct {
	Answered      uint64 // requests answered
	AnsweredBytes uint64 // bytes of the replies sent (requests are the same size)
	Rejected      uint64 // malformed, wrong version or type, not for the port
}

func (r *Responder) port() uint16 {
	if r.Port == 0 {
		return DefaultPort
	}
	return r.Port
}

// Respond answers the probe request payload req: it writes the reply
// payload into out (at least MessageLen bytes) and returns it. It fails with
// ErrMalformed, ErrVersion, ErrMessageType (req is a reply) or ErrShortBuffer.
func (r *Responder) Respond(req, out []byte) ([]byte, error) {
	m, err := ParseMessage(req)
	if err == nil && m.Type != TypeRequest {
		err = fmt.Errorf("%w: %v where a request is expected", ErrMessageType, m.Type)
	}
	if err != nil {
		r.rejected.Add(1)
		return nil, err
	}
	m.Type = TypeReply
	reply, err := m.Marshal(out)
	if err != nil {
		r.rejected.Add(1)
		return nil, err
	}
	r.answered.Add(1)
	r.answeredBytes.Add(PacketLen)
	return reply, nil
}

// RespondIPv4 answers the probe request packet pkt (an IPv4/UDP datagram to
// the responder's port). It appends the reply packet, from the probe port
// back to the request's source, to out[:0] and returns it; out needs
// PacketLen bytes of capacity for the call not to allocate. It fails with
// ErrPacket, ErrNotProbe, or the errors of Respond.
func (r *Responder) RespondIPv4(pkt, out []byte) ([]byte, error) {
	src, dst, payload, err := ParseIPv4UDP(pkt)
	if err == nil && dst.Port() != r.port() {
		err = fmt.Errorf("%w: UDP port %d, probes use %d", ErrNotProbe, dst.Port(), r.port())
	}
	if err != nil {
		r.rejected.Add(1)
		return nil, err
	}
	var buf [MessageLen]byte
	reply, err := r.Respond(payload, buf[:])
	if err != nil {
		return nil, err
	}
	id := packet.IPv4(pkt).ID() // echo the request's; DF is set
	return AppendIPv4UDP(out[:0], dst, src, id, reply)
}

// Stats returns the responder's counters.
func (r *Responder) Stats() ResponderStats {
	return ResponderStats{
		Answered:      r.answered.Load(),
		AnsweredBytes: r.answeredBytes.Load(),
		Rejected:      r.rejected.Load(),
	}
}
