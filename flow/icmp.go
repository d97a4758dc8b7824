package flow

import (
	"encoding/binary"

	"github.com/vipkit/vipkit/packet"
)

// icmpErrorLocked translates an ICMP error (destination unreachable, time
// exceeded, parameter problem) whose quoted datagram belongs to a binding:
// the quoted headers are put back into the form the error's recipient sent
// (RFC 5508 §4.2, RFC 3022 §4.3), with their checksums and the ICMP
// checksum updated incrementally.
// +checklocks:n.mu
func (n *NAT) icmpErrorLocked(pkt []byte, hl int, s side, peer PeerID, now int64) Result {
	q := pkt[hl+packet.ICMPv4HeaderLen:]
	if len(q) < packet.IPv4MinHeaderLen || packet.Version(q) != 4 {
		return n.drop(ReasonICMPQuote)
	}
	ihl := packet.IPv4(q).HeaderLen()
	if ihl < packet.IPv4MinHeaderLen || len(q) < ihl+packet.ICMPv4MinQuoted {
		return n.drop(ReasonICMPQuote)
	}
	iproto := Proto(q[packet.IPv4ProtoOff])
	if (iproto != ProtoTCP && iproto != ProtoUDP) || packet.IPv4(q).FragOffset() != 0 {
		// Legitimately not ours (an error about a ping, a later fragment):
		// from a peer it passes; quoted to a VIP it cannot be mapped,
		// unless the VIP only drains (then the error is for whoever
		// holds the address now).
		if s == sidePeer || n.drainingLocked(binary.BigEndian.Uint32(pkt[packet.IPv4DstOff:])) {
			return pass
		}
		return n.drop(ReasonICMPQuote)
	}
	il4 := q[ihl:]
	// The quoted datagram travelled the other way: its swapped tuple is a
	// tuple of ours.
	k := mkTuple(binary.BigEndian.Uint32(q[packet.IPv4DstOff:]), binary.BigEndian.Uint32(q[packet.IPv4SrcOff:]),
		binary.BigEndian.Uint16(il4[2:]), binary.BigEndian.Uint16(il4[0:]), iproto)
	e := n.idx.find(k)
	if s == sidePeer {
		// An error about a packet of a draining binding's flow on an
		// address that only drains poses as that flow's VIP side or
		// client side, as a packet with the error's tuple k would (see
		// passPeerLocked).
		if r := n.passPeerLocked(k, e != nil); r.Verdict == Drop {
			return r
		}
	}
	if e == nil {
		if s == sidePeer || n.drainingLocked(binary.BigEndian.Uint32(pkt[packet.IPv4DstOff:])) {
			return pass
		}
		return n.drop(ReasonNoFlow)
	}
	id, dir := e.id(), e.dir()
	b := &n.slots[id]
	c := &n.classes[b.class]
	orig, reply := n.tuples(id)
	hairpin := b.state&stHairpin != 0
	oSrc := binary.BigEndian.Uint32(pkt[packet.IPv4SrcOff:])
	if dir == dirRev {
		// An error about a packet we sent toward the backend: it goes back
		// to the client as if the VIP had answered.
		if (s == sidePeer) == hairpin {
			if s == sideHost {
				return n.drop(ReasonNoFlow)
			}
			return pass
		}
		if n.expireOneLocked(id, now) {
			if s == sidePeer {
				return pass
			}
			return n.drop(ReasonNoFlow)
		}
		if b.state&stQuarantined != 0 {
			return n.dropOnBinding(b, ReasonQuarantined)
		}
		if peer != c.peer {
			return n.dropOnBinding(b, ReasonPeerMismatch)
		}
		newSrc := oSrc
		if oSrc == reply.src() {
			newSrc = orig.dst()
		}
		rewriteICMPError(pkt, hl, newSrc, orig.src(), orig.src(), orig.dst(), orig.sport(), orig.dport())
		ls := c.ls
		sz := uint64(len(pkt))
		b.pktsIn++
		b.bytesIn += sz
		ls.counters.PacketsIn++
		ls.counters.BytesIn += sz
		ic := packet.ICMPv4(pkt[hl:])
		if ic.Type() == packet.ICMPDestUnreachable && ic.Code() == packet.ICMPCodePortUnreach {
			n.reports[s] = append(n.reports[s], unreachReport{listener: ls.listener, backend: n.backendOf(b)})
		}
		if s == sideHost {
			return Result{Verdict: Reflect}
		}
		return Result{Verdict: Forward}
	}
	// dirFwd: the client's host reports an error about a reply it got; it
	// goes to the backend as if about the packet the backend sent.
	if s == sidePeer {
		return pass
	}
	if now >= b.deadline {
		n.expireOneLocked(id, now)
		return n.drop(ReasonNoFlow)
	}
	newSrc := oSrc
	if oSrc == orig.src() {
		newSrc = reply.dst()
	}
	rewriteICMPError(pkt, hl, newSrc, reply.src(), reply.src(), reply.dst(), reply.sport(), reply.dport())
	ls := c.ls
	sz := uint64(len(pkt))
	b.pktsOut++
	b.bytesOut += sz
	ls.counters.PacketsOut++
	ls.counters.BytesOut += sz
	if hairpin {
		return Result{Verdict: Reflect}
	}
	return Result{Verdict: Forward, Peer: c.peer}
}

// rewriteICMPError sets the outer addresses and the quoted datagram's
// addresses and ports of an ICMP error, updating the outer IPv4 checksum,
// the quoted IPv4 checksum, the quoted TCP/UDP checksum when it was quoted,
// and the ICMP checksum, all incrementally.
func rewriteICMPError(pkt []byte, hl int, oSrc, oDst, iSrc, iDst uint32, iSport, iDport uint16) {
	icmp := pkt[hl:]
	q := icmp[packet.ICMPv4HeaderLen:]
	ihl := packet.IPv4(q).HeaderLen()
	il4 := q[ihl:]

	var dICMP uint32
	dAddr := packet.AddDelta(packet.Delta32(binary.BigEndian.Uint32(q[packet.IPv4SrcOff:]), iSrc), packet.Delta32(binary.BigEndian.Uint32(q[packet.IPv4DstOff:]), iDst))
	binary.BigEndian.PutUint32(q[packet.IPv4SrcOff:], iSrc)
	binary.BigEndian.PutUint32(q[packet.IPv4DstOff:], iDst)
	oldIC := binary.BigEndian.Uint16(q[packet.IPv4ChecksumOff:])
	packet.Adjust(q[packet.IPv4ChecksumOff:], dAddr)
	dICMP = packet.AddDelta(dAddr, packet.Delta16(oldIC, binary.BigEndian.Uint16(q[packet.IPv4ChecksumOff:])))

	dPorts := packet.AddDelta(packet.Delta16(binary.BigEndian.Uint16(il4[0:]), iSport), packet.Delta16(binary.BigEndian.Uint16(il4[2:]), iDport))
	binary.BigEndian.PutUint16(il4[0:], iSport)
	binary.BigEndian.PutUint16(il4[2:], iDport)
	dICMP = packet.AddDelta(dICMP, dPorts)
	dL4 := packet.AddDelta(dAddr, dPorts)
	switch Proto(q[packet.IPv4ProtoOff]) {
	case ProtoUDP:
		old := binary.BigEndian.Uint16(il4[packet.UDPChecksumOff:])
		packet.AdjustUDP(il4[packet.UDPChecksumOff:], dL4)
		dICMP = packet.AddDelta(dICMP, packet.Delta16(old, binary.BigEndian.Uint16(il4[packet.UDPChecksumOff:])))
	case ProtoTCP:
		if len(il4) >= packet.TCPChecksumOff+2 {
			old := binary.BigEndian.Uint16(il4[packet.TCPChecksumOff:])
			packet.Adjust(il4[packet.TCPChecksumOff:], dL4)
			dICMP = packet.AddDelta(dICMP, packet.Delta16(old, binary.BigEndian.Uint16(il4[packet.TCPChecksumOff:])))
		}
	}
	packet.Adjust(icmp[packet.ICMPv4ChecksumOff:], dICMP)

	dOuter := packet.AddDelta(packet.Delta32(binary.BigEndian.Uint32(pkt[packet.IPv4SrcOff:]), oSrc), packet.Delta32(binary.BigEndian.Uint32(pkt[packet.IPv4DstOff:]), oDst))
	binary.BigEndian.PutUint32(pkt[packet.IPv4SrcOff:], oSrc)
	binary.BigEndian.PutUint32(pkt[packet.IPv4DstOff:], oDst)
	packet.Adjust(pkt[packet.IPv4ChecksumOff:], dOuter)
}
