package flow

import (
	"encoding/binary"

	"github.com/vipkit/vipkit/packet"
)

// The fast path. An established packet is translated from its index entry
// alone: the entry (32 bytes, one cache line with its neighbour) holds the
// translation target, the health generation and a lower bound of the
// binding's idle deadline. What the packet changes in the binding (its
// counters and its idle deadline) goes to a small log in cache that is
// applied in batches, with the cache misses of a whole batch overlapped. At
// a million flows the table is far larger than the CPU caches, and each
// dependent miss costs a full memory latency; this keeps the chain of one
// packet to a single miss.
//
// Index entry values, per direction:
//
//	fwd (client → VIP:vport):  v0 = gen<<32 | shadow<<16 | dL4
//	rev (backend → L:shadow):  v0 = client<<32 | cport<<16 | dL4
//	both:                      v1 = class<<48 | dIP<<32 | until
//
// class indexes NAT.classes, one per (listener, backend) pair with
// bindings: the listener (VIP, port, counters) and the backend (peer,
// address, port); classNone sends every packet to the full path (a
// quarantined binding, or a class beyond the first 65535). The rewrite of a
// client packet is (local address or, for hairpin, the VIP; backend; shadow
// port; backend port), of a reply (VIP; client; VIP port; client port);
// dIP and dL4 are its precomputed checksum deltas (RFC 1624) for the IPv4
// header and the TCP/UDP checksum. until is a lower bound of the binding's
// deadline in units of 2^untilShift ns, compared with wraparound: before
// it, the binding is certainly alive. The full path refreshes it (syncLocked)
// whenever it changes a binding, and the expiry sweep when it re-files a
// binding whose deadline moved on, so a flow with steady traffic takes the
// full path at most once per idle period (its first packet after the old
// deadline, unless the sweep got there first). gen is the health generation the binding
// last checked (UDP failover). Everything else (TCP SYN, FIN, RST; UDP after
// HealthChanged; quarantine; packets that need fragmenting; a peer
// mismatch) takes the full path, which first applies the log so that it
// sees exact state.

const (
	untilShift = 24 // until units: 2^24 ns ≈ 16.8 ms
	// untilSpan bounds how far ahead until may be and how far a packet's
	// time may run past the last sweep before the fast path stops trusting
	// until (209 days; the comparison wraps at twice that).
	untilSpan = 1 << 30

	classNone = 0xffff // hot class: the entry's packets take the full path

	logSize = 64 // per-packet log entries applied at once
)

// bindingClass is a (listener, backend) pair that bindings share, guarded,
// like NAT.classes, by the NAT's mu.
type bindingClass struct {
	ls   *listenerState
	bs   *backendState // the backend's cumulative state in ls
	peer PeerID
	addr uint32
	port uint16
	refs int32
}

type classKey struct {
	listener uint32
	peer     PeerID
	addr     uint32
	port     uint16
}

// logEntry records one fast-path packet: binding id and direction, size, time.
type logEntry struct {
	ref  uint32
	size uint32
	t    int64
}

// fastLocked translates an established packet from its index entry e alone
// when nothing but the rewrite and the counters is due. It reports false,
// having changed nothing, when the packet needs the full path.
// +checklocks:n.mu
func (n *NAT) fastLocked(pkt []byte, hl int, e *indexEntry, s side, peer PeerID, now int64) (Result, bool) {
	v0, v1 := e.v0, e.v1
	nowU := uint32(now >> untilShift)
	ci := v1 >> 48
	if ci == classNone || int32(uint32(v1)-nowU) <= 0 || int32(nowU-n.sweptUntil) >= untilSpan {
		return Result{}, false
	}
	l4 := pkt[hl:]
	tcp := pkt[packet.IPv4ProtoOff] == byte(ProtoTCP)
	if tcp && l4[packet.TCPFlagsOff]&(packet.TCPFlagSYN|packet.TCPFlagFIN|packet.TCPFlagRST) != 0 {
		return Result{}, false
	}
	c := &n.classes[ci]
	hairpin := c.peer == LocalPeer
	ls := c.ls
	sz := uint64(len(pkt))
	dir := e.k1 >> dirShift & 1
	var newA uint64
	var newP uint32
	var r Result
	if dir == dirFwd {
		mtu := n.o.MTU
		if hairpin {
			mtu = n.o.HostMTU
		}
		if s != sideHost || len(pkt) > mtu || (!tcp && uint32(v0>>32) != n.gen.Load()) {
			return Result{}, false
		}
		src := n.local
		if hairpin {
			src = binary.BigEndian.Uint32(pkt[packet.IPv4DstOff:]) // the VIP
		}
		newA = uint64(src)<<32 | uint64(c.addr)
		newP = uint32(v0)&0xffff0000 | uint32(c.port)
		ls.counters.PacketsOut++
		ls.counters.BytesOut += sz
		r = Result{Verdict: Forward, Peer: c.peer}
		if hairpin {
			r = Result{Verdict: Reflect}
		}
	} else {
		if (s == sideHost) != hairpin || peer != c.peer || len(pkt) > n.o.HostMTU {
			return Result{}, false
		}
		newA = uint64(ls.key.vip)<<32 | v0>>32
		newP = uint32(ls.key.port)<<16 | uint32(v0)>>16
		ls.counters.PacketsIn++
		ls.counters.BytesIn += sz
		r = Result{Verdict: Forward}
		if hairpin {
			r = Result{Verdict: Reflect}
		}
	}
	rewrite(pkt, hl, newA, newP, uint16(v1>>32), uint16(v0))
	if n.logLen == logSize {
		n.flushLocked()
	}
	n.log[n.logLen] = logEntry{ref: uint32(e.k1 & (1<<24 - 1)), size: uint32(sz), t: now}
	n.logLen++
	return r, true
}

// flushLocked applies the fast path's log to the bindings: counters, and
// idle deadlines extended as touchLocked would have. Everything that reads
// or changes bindings beyond the fast path calls it first.
// +checklocks:n.mu
func (n *NAT) flushLocked() {
	if n.logLen > 8 && n.o.Capacity > prefetchMinCapacity {
		// Load every binding first: the misses overlap.
		var sink int64
		for i := range n.logLen {
			sink += n.slots[n.log[i].ref&idMask].deadline
		}
		n.sink += uint64(sink)
	}
	for i := range n.logLen {
		l := &n.log[i]
		id := l.ref & idMask
		b := &n.slots[id]
		if l.ref>>dirShift == dirFwd {
			b.pktsOut++
			b.bytesOut += uint64(l.size)
		} else {
			b.pktsIn++
			b.bytesIn += uint64(l.size)
		}
		if d := l.t + b.idle; d >= b.deadline {
			b.deadline = d
		} else { // a packet older than the last one: as touchLocked
			n.touchLocked(id, l.t)
		}
	}
	n.logLen = 0
}

// untilOf returns the fast path's until for a deadline, at time now.
func untilOf(deadline, now int64) uint32 {
	u, lim := deadline>>untilShift, now>>untilShift+untilSpan-1
	return uint32(min(u, lim))
}

// syncLocked refreshes the index entries of binding id from the binding:
// it must run after anything changes the binding's deadline, generation or
// state.
// +checklocks:n.mu
func (n *NAT) syncLocked(id uint32, now int64) {
	b := &n.slots[id]
	orig, reply := n.tuples(id)
	ci := uint64(classNone)
	if b.state&stActive != 0 && b.class < n.hotLimit {
		ci = uint64(b.class)
	}
	ci = ci<<48 | uint64(untilOf(b.deadline, now))
	fIP, fL4 := deltas(orig, reply)
	rIP, rL4 := deltas(reply, orig)
	if e := n.idx.find(orig); e != nil && b.state&stActive != 0 {
		e.v0 = uint64(b.gen)<<32 | uint64(reply.dport())<<16 | uint64(fL4)
		e.v1 = ci | uint64(fIP)<<32
	}
	if e := n.idx.find(reply); e != nil {
		e.v0 = uint64(orig.src())<<32 | uint64(orig.sport())<<16 | uint64(rL4)
		e.v1 = ci | uint64(rIP)<<32
	}
}

// deltas returns the checksum deltas of rewriting a packet with tuple from
// to the reverse of tuple to (its source becomes to's destination, ...).
func deltas(from, to tuple) (dIP, dL4 uint16) {
	ip := packet.AddDelta(packet.Delta32(from.src(), to.dst()), packet.Delta32(from.dst(), to.src()))
	l4 := packet.AddDelta(ip, packet.AddDelta(packet.Delta16(from.sport(), to.dport()), packet.Delta16(from.dport(), to.sport())))
	return uint16(ip), uint16(l4)
}

// tuples returns binding id's client tuple (C:cport → VIP:vport) and reply
// tuple (B:bport → L:shadow, where L is the VIP for hairpin).
// +checklocks:n.mu
func (n *NAT) tuples(id uint32) (orig, reply tuple) {
	c := &n.classes[n.slots[id].class]
	d := &n.cold[id]
	k := c.ls.key
	l := n.local
	if c.peer == LocalPeer {
		l = k.vip
	}
	return mkTuple(d.client, k.vip, d.clientPort, k.port, k.proto), mkTuple(c.addr, l, c.port, d.shadow, k.proto)
}

// classRefLocked returns the class of (ls, be), creating it, with one more
// reference.
// +checklocks:n.mu
func (n *NAT) classRefLocked(ls *listenerState, be Backend) uint32 {
	k := classKey{ls.slot, be.Peer, addr4(be.Addr), be.Port}
	if ci, ok := n.classMap[k]; ok {
		n.classes[ci].refs++
		return ci
	}
	var ci uint32
	if l := len(n.classFree); l > 0 {
		ci = n.classFree[l-1]
		n.classFree = n.classFree[:l-1]
	} else {
		ci = uint32(len(n.classes))
		n.classes = append(n.classes, bindingClass{})
	}
	n.classes[ci] = bindingClass{ls: ls, bs: n.backendStateLocked(ls, be), peer: be.Peer, addr: k.addr, port: be.Port, refs: 1}
	n.classMap[k] = ci
	return ci
}

// +checklocks:n.mu
func (n *NAT) classUnrefLocked(ci uint32) {
	c := &n.classes[ci]
	if c.refs--; c.refs > 0 {
		return
	}
	delete(n.classMap, classKey{c.ls.slot, c.peer, c.addr, c.port})
	*c = bindingClass{}
	n.classFree = append(n.classFree, ci)
}
