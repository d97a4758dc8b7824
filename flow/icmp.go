package flow

import "encoding/binary"

// icmpErrorLocked translates an ICMP error (destination unreachable, time
// exceeded, parameter problem) whose quoted datagram belongs to a binding:
// the quoted headers are put back into the form the error's recipient sent
// (RFC 5508 §4.2, RFC 3022 §4.3), with their checksums and the ICMP
// checksum updated incrementally.
func (n *NAT) icmpErrorLocked(pkt []byte, hl int, s side, peer PeerID, now int64) Result {
	q := pkt[hl+ICMPv4HeaderLen:]
	if len(q) < IPv4MinHeaderLen || q[0]>>4 != 4 {
		return n.drop(ReasonICMPQuote)
	}
	ihl := int(q[0]&0xf) * 4
	if ihl < IPv4MinHeaderLen || len(q) < ihl+icmpMinQuotedL4 {
		return n.drop(ReasonICMPQuote)
	}
	iproto := Proto(q[ipv4Proto])
	if (iproto != ProtoTCP && iproto != ProtoUDP) || IPv4(q).FragOffset() != 0 {
		// Legitimately not ours (an error about a ping, a later fragment):
		// from a peer it passes; quoted to a VIP it cannot be mapped.
		if s == sidePeer {
			return pass
		}
		return n.drop(ReasonICMPQuote)
	}
	il4 := q[ihl:]
	// The quoted datagram travelled the other way: its swapped tuple is a
	// tuple of ours.
	k := mkTuple(binary.BigEndian.Uint32(q[ipv4Dst:]), binary.BigEndian.Uint32(q[ipv4Src:]),
		binary.BigEndian.Uint16(il4[2:]), binary.BigEndian.Uint16(il4[0:]), iproto)
	e := n.idx.find(k)
	if e == nil {
		if s == sidePeer {
			return pass
		}
		return n.drop(ReasonNoFlow)
	}
	id, dir := e.id(), e.dir()
	b := &n.slots[id]
	c := &n.classes[b.cls]
	orig, reply := n.tuples(id)
	hairpin := b.st&stHairpin != 0
	oSrc := binary.BigEndian.Uint32(pkt[ipv4Src:])
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
		if b.st&stQuarantined != 0 {
			return n.dropB(b, ReasonQuarantined)
		}
		if peer != c.peer {
			return n.dropB(b, ReasonPeerMismatch)
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
		ls.c.PacketsIn++
		ls.c.BytesIn += sz
		ic := ICMPv4(pkt[hl:])
		if ic.Type() == ICMPDestUnreachable && ic.Code() == ICMPCodePortUnreach {
			n.reports[s] = append(n.reports[s], unreachReport{l: ls.l, b: n.backendOf(b)})
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
	ls.c.PacketsOut++
	ls.c.BytesOut += sz
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
	q := icmp[ICMPv4HeaderLen:]
	ihl := int(q[0]&0xf) * 4
	il4 := q[ihl:]

	var dICMP uint32
	dAddr := addDelta(delta32(binary.BigEndian.Uint32(q[ipv4Src:]), iSrc), delta32(binary.BigEndian.Uint32(q[ipv4Dst:]), iDst))
	binary.BigEndian.PutUint32(q[ipv4Src:], iSrc)
	binary.BigEndian.PutUint32(q[ipv4Dst:], iDst)
	oldIC := binary.BigEndian.Uint16(q[ipv4Checksum:])
	adjust(q[ipv4Checksum:], dAddr)
	dICMP = addDelta(dAddr, delta16(oldIC, binary.BigEndian.Uint16(q[ipv4Checksum:])))

	dPorts := addDelta(delta16(binary.BigEndian.Uint16(il4[0:]), iSport), delta16(binary.BigEndian.Uint16(il4[2:]), iDport))
	binary.BigEndian.PutUint16(il4[0:], iSport)
	binary.BigEndian.PutUint16(il4[2:], iDport)
	dICMP = addDelta(dICMP, dPorts)
	dL4 := addDelta(dAddr, dPorts)
	switch Proto(q[ipv4Proto]) {
	case ProtoUDP:
		old := binary.BigEndian.Uint16(il4[udpChecksum:])
		adjustUDP(il4[udpChecksum:], dL4)
		dICMP = addDelta(dICMP, delta16(old, binary.BigEndian.Uint16(il4[udpChecksum:])))
	case ProtoTCP:
		if len(il4) >= tcpChecksum+2 {
			old := binary.BigEndian.Uint16(il4[tcpChecksum:])
			adjust(il4[tcpChecksum:], dL4)
			dICMP = addDelta(dICMP, delta16(old, binary.BigEndian.Uint16(il4[tcpChecksum:])))
		}
	}
	adjust(icmp[icmpChecksum:], dICMP)

	dOuter := addDelta(delta32(binary.BigEndian.Uint32(pkt[ipv4Src:]), oSrc), delta32(binary.BigEndian.Uint32(pkt[ipv4Dst:]), oDst))
	binary.BigEndian.PutUint32(pkt[ipv4Src:], oSrc)
	binary.BigEndian.PutUint32(pkt[ipv4Dst:], oDst)
	adjust(pkt[ipv4Checksum:], dOuter)
}
