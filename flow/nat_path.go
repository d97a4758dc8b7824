package flow

import (
	"encoding/binary"
	"math/bits"
	"time"
	"unsafe"

	"github.com/vipkit/vipkit/packet"
)

// FromHost handles a packet read from the host's TUN (the local ingress):
// pkt is the whole IP packet, now the current time of Options.Clock.
//
//   - To a VIP: a new flow gets a binding to a backend chosen by the
//     Selector; the packet is rewritten in place to the backend's overlay
//     address and port with a shadow source port (Forward, Result.Peer is
//     the backend's peer) or, for a local backend, to LocalAddr with the VIP
//     as source (Reflect: write it back into the host).
//   - A local backend's reply to a hairpinned flow is reverse-translated
//     (Reflect).
//   - Fragments to a VIP are reassembled first (Consumed; the translated
//     datagram, refragmented to the MTU, goes to Options.Emit).
//   - ICMP errors from the host about a binding are translated.
//   - A new flow to a VIP port without a listener, or to a listener
//     without backends, is refused: a TCP RST or an ICMP port unreachable
//     from the VIP goes to Options.Emit toward the host, rate-limited
//     (Options.ReplyRate), and the packet is dropped with ReasonRefused
//     or ReasonPortUnreachable (docs/empty-vips.md).
//   - An address that only drains (its listeners are gone, its bindings
//     are not; the VIP moved, say, because a node's address won it) is the
//     NAT's for those bindings' flows alone: everything else to it, new
//     flows included, is Pass, untouched, for whoever holds the address
//     now.
//   - Anything else (IPv6, traffic to non-VIP addresses) is Pass, untouched.
//
// Bad packets to a VIP are dropped with a reason. FromHost never panics,
// whatever pkt holds, and does not allocate for established flows.
func (n *NAT) FromHost(pkt []byte, now time.Time) Result {
	return n.handleOne(pkt, sideHost, LocalPeer, now)
}

// FromPeer handles a packet that authenticated peer peer sent through the
// overlay, before it is written to the host: admission, then reverse NAT.
//
//   - A packet with a VIP as source or destination is dropped
//     (ReasonVIPSource, ReasonVIPDestination): no peer may claim a VIP.
//     For an address that only drains, only packets that pose as one of
//     its draining bindings' flows are dropped so (a packet from it toward
//     such a flow's client or local backend, one to it with such a flow's
//     client tuple, or an ICMP error about such a flow's packets); the
//     rest, the traffic of whoever holds the address now, is handled as
//     for any other address.
//   - Packets for LocalAddr pass Options.Admit; then a reply matching a
//     binding must come from the binding's backend peer (else
//     ReasonPeerMismatch) and is rewritten in place so that its source is
//     the VIP and port the client used (Forward: write it to the host).
//     Replies to a quarantined shadow port are dropped.
//   - Fragments for LocalAddr are reassembled per sender (Consumed; the
//     datagram goes to Options.Emit toward the host, refragmented to
//     HostMTU).
//   - ICMP errors quoting a binding get their quoted headers restored; a
//     port unreachable is reported to Options.OnPortUnreachable.
//   - Everything else that is admitted is Pass, untouched.
//
// FromPeer never panics, whatever pkt holds, and does not allocate for
// established flows.
func (n *NAT) FromPeer(pkt []byte, peer PeerID, now time.Time) Result {
	return n.handleOne(pkt, sidePeer, peer, now)
}

// handleOne is FromHost and FromPeer: the lock-free prechecks, then the
// packet under the table lock, then the reports it queued.
func (n *NAT) handleOne(pkt []byte, s side, peer PeerID, now time.Time) Result {
	r, ours := n.precheck(pkt, s, peer, n.vips.Load())
	if !ours {
		return r
	}
	t := n.ns(now)
	n.mu.Lock()
	r = n.handleLocked(pkt, s, peer, t)
	n.mu.Unlock()
	if len(n.reports[s]) > 0 {
		n.flushReports(s)
	}
	return r
}

// precheck runs the checks that need no lock on a packet from side s (and
// peer, on the peer side). ours reports that the table must handle it;
// otherwise r is the packet's result: not for the NAT (the zero Result),
// or dropped with a counted reason.
//
// From the host, only IPv4 packets to a VIP are the NAT's. From a peer, a
// packet with a routed VIP as source or destination is dropped (no peer
// may claim a VIP), packets for LocalAddr are the NAT's and must pass
// Options.Admit, and so are packets from or to an address that only
// drains: the locked path lets them pass unless they claim a draining
// binding's flow (passPeerLocked).
func (n *NAT) precheck(p []byte, s side, peer PeerID, vs *vipSet) (r Result, ours bool) {
	if len(p) < packet.IPv4MinHeaderLen {
		if packet.Version(p) != 4 {
			return Result{}, false
		}
		return n.drop(ReasonTruncated), false
	}
	if packet.Version(p) != 4 {
		return Result{}, false
	}
	src := binary.BigEndian.Uint32(p[packet.IPv4SrcOff:])
	dst := binary.BigEndian.Uint32(p[packet.IPv4DstOff:])
	if s == sideHost {
		if !vs.has(dst) {
			return Result{}, false
		}
	} else {
		sk, dk := vs.kind(src), vs.kind(dst)
		switch {
		case sk == vipRouted:
			return n.drop(ReasonVIPSource), false
		case dk == vipRouted:
			return n.drop(ReasonVIPDestination), false
		case dst != n.local && sk|dk == vipNone:
			return Result{}, false
		}
	}
	if err := packet.IPv4(p).Validate(); err != nil {
		return n.drop(reasonFor(err)), false
	}
	if s == sidePeer && dst == n.local && n.o.Admit != nil && !n.o.Admit(peer, addrFrom(src), addrFrom(dst)) {
		return n.drop(ReasonAdmission), false
	}
	return Result{}, true
}

// batchChunk is how many packets a batch call prefetches at once.
const batchChunk = 64

// prefetchMinCapacity is the table size (bindings) above which batches
// prefetch: below it (≤ 3 MiB of table) the table stays in cache.
const prefetchMinCapacity = 16384

// FromHostBatch handles pkts as FromHost would, writing each packet's
// result to res[i] (len(res) ≥ len(pkts)). It takes the table lock once per
// chunk of 64 packets and, before translating, issues the chunk's
// hash-index loads back to back (an established packet needs nothing else
// from the table), so that their cache misses overlap instead of queueing:
// with tables far larger than the CPU caches this is about twice as fast
// per packet as FromHost. Emit and OnPortUnreachable behave as for
// FromHost. Results and rewrites are exactly those of calling FromHost on
// each packet in order.
func (n *NAT) FromHostBatch(pkts [][]byte, now time.Time, res []Result) {
	n.handleBatch(pkts, sideHost, LocalPeer, now, res)
}

// handleBatch is FromHostBatch and FromPeerBatch: per chunk of batchChunk
// packets, the lock-free prechecks, then the packets that are the NAT's
// under one lock (handleChunk).
func (n *NAT) handleBatch(pkts [][]byte, s side, peer PeerID, now time.Time, res []Result) {
	_ = res[:len(pkts)]
	t := n.ns(now)
	vs := n.vips.Load()
	for len(pkts) > 0 {
		c := min(len(pkts), batchChunk)
		chunk, out := pkts[:c], res[:c]
		pkts, res = pkts[c:], res[c:]
		mine := 0
		for i, p := range chunk {
			r, ours := n.precheck(p, s, peer, vs)
			if ours {
				r = Result{Verdict: Consumed} // placeholder: "ours"
				mine++
			}
			out[i] = r
		}
		if mine > 0 {
			n.handleChunk(s, peer, chunk, out, t)
		}
	}
}

// handleChunk translates, under one lock, the packets of a batch chunk that
// the lock-free prechecks marked as ours (Verdict Consumed), after
// prefetching their table entries, then sends the reports they queued.
func (n *NAT) handleChunk(side side, peer PeerID, chunk [][]byte, out []Result, t int64) {
	n.mu.Lock()
	n.prefetchLocked(chunk, out)
	for i, p := range chunk {
		if out[i].Verdict == Consumed {
			out[i] = n.handleLocked(p, side, peer, t)
		}
	}
	n.mu.Unlock()
	if len(n.reports[side]) > 0 {
		n.flushReports(side)
	}
}

// FromPeerBatch handles pkts, all sent by peer, as FromPeer would, writing
// each packet's result to res[i] (len(res) ≥ len(pkts)); see FromHostBatch
// for how batching helps. wireguard-go delivers received packets in
// batches per peer, which is the shape this takes.
func (n *NAT) FromPeerBatch(pkts [][]byte, peer PeerID, now time.Time, res []Result) {
	n.handleBatch(pkts, sidePeer, peer, now, res)
}

// prefetchLocked loads, for every packet of a chunk marked as ours, the
// cache line of its hash index home: all an established packet needs. The
// loads do not depend on each other, so the CPU overlaps their misses; the
// translation that follows then finds them in cache.
// +checklocks:n.mu
func (n *NAT) prefetchLocked(chunk [][]byte, out []Result) {
	if n.o.Capacity <= prefetchMinCapacity || n.closed {
		return // the table fits in cache: prefetching would only cost
	}
	var sink uint64
	for i, p := range chunk {
		if out[i].Verdict != Consumed {
			continue
		}
		hl := packet.IPv4(p).HeaderLen()
		if len(p) < hl+4 {
			continue
		}
		k := packetTuple(p, p[hl:])
		sink += n.idx.entries[n.idx.home(k.k0, k.k1)].k1
	}
	n.sink += sink
}

// flushReports delivers the port-unreachable reports queued by side s. Only
// the goroutine calling FromHost (or FromPeer) touches its side's queue.
func (n *NAT) flushReports(s side) {
	for _, rp := range n.reports[s] {
		if n.o.OnPortUnreachable != nil {
			n.o.OnPortUnreachable(rp.listener, rp.backend)
		}
	}
	clear(n.reports[s])
	n.reports[s] = n.reports[s][:0]
	n.gen.Add(1)
}

func (n *NAT) drop(r DropReason) Result {
	n.drops[r].Add(1)
	return Result{Verdict: Drop, Reason: r}
}

func (n *NAT) dropOnListener(ls *listenerState, r DropReason) Result {
	if ls != nil {
		ls.counters.Drops[r]++
	}
	return n.drop(r)
}

// +checklocks:n.mu
func (n *NAT) dropOnBinding(b *binding, r DropReason) Result {
	if s := bindingDropSlot[r]; s > 0 {
		n.cold[n.idOf(b)].drops[s-1]++
	}
	return n.dropOnListener(n.classes[b.class].ls, r)
}

// idOf returns the slot index of b, a pointer into n.slots.
// +checklocks:n.mu
func (n *NAT) idOf(b *binding) uint32 {
	return uint32((uintptr(unsafe.Pointer(b)) - uintptr(unsafe.Pointer(&n.slots[0]))) / unsafe.Sizeof(binding{}))
}

var pass = Result{} // +checklocksignore: never written

// handleLocked dispatches a validated IPv4 packet.
// +checklocks:n.mu
func (n *NAT) handleLocked(pkt []byte, s side, peer PeerID, now int64) Result {
	if n.closed {
		return n.drop(ReasonClosed)
	}
	if packet.IPv4(pkt).IsFragment() {
		return n.fragmentLocked(pkt, s, peer, now)
	}
	return n.translateLocked(pkt, s, peer, now)
}

// translateLocked handles a whole (unfragmented), validated IPv4 packet.
// +checklocks:n.mu
func (n *NAT) translateLocked(pkt []byte, s side, peer PeerID, now int64) Result {
	hl := packet.IPv4(pkt).HeaderLen()
	l4 := pkt[hl:]
	switch Proto(pkt[packet.IPv4ProtoOff]) {
	case ProtoTCP:
		if err := packet.TCP(l4).Validate(); err != nil {
			return n.drop(reasonFor(err))
		}
	case ProtoUDP:
		if err := packet.UDP(l4).Validate(); err != nil {
			return n.drop(reasonFor(err))
		}
	case ProtoICMP:
		if len(l4) < packet.ICMPv4HeaderLen {
			return n.drop(ReasonTruncated)
		}
		if packet.ICMPv4(l4).IsError() {
			n.flushLocked()
			return n.icmpErrorLocked(pkt, hl, s, peer, now)
		}
		fallthrough
	default:
		if s == sideHost && !n.drainingLocked(binary.BigEndian.Uint32(pkt[packet.IPv4DstOff:])) {
			return n.drop(ReasonUnsupported)
		}
		return pass
	}
	k := packetTuple(pkt, l4)
	e := n.idx.find(k)
	var id uint32
	var dir int
	if e != nil {
		if r, ok := n.fastLocked(pkt, hl, e, s, peer, now); ok {
			return r
		}
		id, dir = e.id(), e.dir()
	}
	n.flushLocked()
	if s == sideHost {
		switch {
		case e == nil:
			return n.newFlowLocked(pkt, hl, k, now)
		case dir == dirFwd:
			return n.outLocked(pkt, hl, k, id, now)
		case n.slots[id].state&stHairpin != 0:
			return n.inLocked(pkt, hl, id, s, peer, now)
		}
		return n.drop(ReasonNoFlow)
	}
	if e == nil || dir == dirFwd || n.slots[id].state&stHairpin != 0 {
		return n.passPeerLocked(k, e != nil)
	}
	return n.inLocked(pkt, hl, id, s, peer, now)
}

// passPeerLocked is the verdict on a peer's TCP or UDP packet (tuple k)
// that no binding translates; matched says that k itself is in the index
// (a binding's client tuple, or a hairpin reply's). It passes, unless it
// involves an address that only drains and claims one of its bindings'
// flows there:
//
//   - from the address, with k reversed in the index: the packet poses as
//     the VIP's side of a binding (toward its client, or toward a local
//     backend by hairpin); dropped with ReasonVIPSource;
//   - to the address, with k in the index: it poses as the client's side
//     (or a local backend's reply); dropped with ReasonVIPDestination.
//
// Everything else from and to the address is the traffic of whoever holds
// it now (a node whose address won it, say) and passes untouched.
// +checklocks:n.mu
func (n *NAT) passPeerLocked(k tuple, matched bool) Result {
	if !n.vips.Load().anyDraining() {
		return pass
	}
	if n.drainingLocked(k.src()) && n.idx.find(k.reverse()) != nil {
		return n.drop(ReasonVIPSource)
	}
	if matched && n.drainingLocked(k.dst()) {
		return n.drop(ReasonVIPDestination)
	}
	return pass
}

// drainingPeerLocked reports whether a peer's packet is from or to an
// address that only drains.
// +checklocks:n.mu
func (n *NAT) drainingPeerLocked(pkt []byte) bool {
	vs := n.vips.Load()
	return vs.anyDraining() && (vs.kind(binary.BigEndian.Uint32(pkt[packet.IPv4SrcOff:])) == vipDraining ||
		vs.kind(binary.BigEndian.Uint32(pkt[packet.IPv4DstOff:])) == vipDraining)
}

// newFlowLocked creates a binding for a packet to a VIP that has none.
// +checklocks:n.mu
func (n *NAT) newFlowLocked(pkt []byte, hl int, k tuple, now int64) Result {
	if n.vips.Load().kind(k.dst()) != vipRouted {
		// The address only drains (or no longer is a VIP): new flows to
		// it are not ours; they go to whoever holds it now.
		return pass
	}
	li, ok := n.listenerByKey[listenerKey{k.dst(), k.dport(), k.proto()}]
	if !ok {
		return n.refuseLocked(pkt, hl, nil, ReasonNoListener, now)
	}
	ls := n.listeners[li]
	if ls.removed {
		return n.refuseLocked(pkt, hl, ls, ReasonNoListener, now)
	}
	var isn uint32
	var synData bool
	if k.proto() == ProtoTCP {
		t := packet.TCP(pkt[hl:])
		if t.Flags()&(packet.TCPFlagSYN|packet.TCPFlagACK|packet.TCPFlagRST) != packet.TCPFlagSYN {
			if len(ls.backends) == 0 {
				return n.refuseLocked(pkt, hl, ls, ReasonNoFlow, now)
			}
			return n.dropOnListener(ls, ReasonNoFlow)
		}
		isn, synData = t.Seq(), len(t) > t.HeaderLen()
	}
	i := n.selectLocked(ls, SelectNew, Backend{}, now)
	if i < 0 {
		if len(ls.backends) == 0 {
			return n.refuseLocked(pkt, hl, ls, ReasonNoBackend, now)
		}
		return n.dropOnListener(ls, ReasonNoBackend)
	}
	id, r := n.bindLocked(k, ls, ls.backends[i], now, isn, synData)
	if r != ReasonNone {
		return n.dropOnListener(ls, r)
	}
	return n.applyOutLocked(pkt, hl, id, now)
}

// outLocked handles a client packet of an existing binding.
// +checklocks:n.mu
func (n *NAT) outLocked(pkt []byte, hl int, k tuple, id uint32, now int64) Result {
	b := &n.slots[id]
	if now >= b.deadline {
		n.expireOneLocked(id, now)
		return n.newFlowLocked(pkt, hl, k, now)
	}
	l4 := pkt[hl:]
	switch k.proto() {
	case ProtoTCP:
		fl := l4[packet.TCPFlagsOff]
		if fl&(packet.TCPFlagSYN|packet.TCPFlagACK|packet.TCPFlagRST) == packet.TCPFlagSYN {
			if binary.BigEndian.Uint32(l4[packet.TCPSeqOff:]) != b.isn {
				// A new SYN sequence on a reused tuple: a new binding.
				n.retireLocked(id, now)
				return n.newFlowLocked(pkt, hl, k, now)
			}
			if b.state&(stSynAck|stSynData) == 0 && len(l4) == packet.TCP(l4).HeaderLen() {
				from := n.classes[b.class].bs
				if nid, moved := n.rebindLocked(id, SelectSYNRetry, now); moved {
					if nid == noID {
						return Result{Verdict: Drop, Reason: ReasonNoPort}
					}
					id = nid
					n.classes[n.slots[id].class].ls.retargets++
					from.retargets++
					n.retargets++
				}
			}
		}
		n.tcpFlags(&n.slots[id], fl, true)
	case ProtoUDP:
		if b.gen != n.gen.Load() {
			b.gen = n.gen.Load()
			ls := n.classes[b.class].ls
			if !n.o.Selector.Available(ls.listener, n.backendOf(b), n.timeOf(now)) {
				from := n.classes[b.class].bs
				if nid, moved := n.rebindLocked(id, SelectFailover, now); moved {
					if nid == noID {
						return Result{Verdict: Drop, Reason: ReasonNoPort}
					}
					id = nid
					n.classes[n.slots[id].class].ls.failovers++
					from.failovers++
					n.failovers++
				}
			}
		}
	}
	return n.applyOutLocked(pkt, hl, id, now)
}

func (n *NAT) tcpFlags(b *binding, fl uint8, out bool) {
	if fl&packet.TCPFlagRST != 0 {
		b.idle = min(b.idle, n.closedTCP)
		return
	}
	if fl&packet.TCPFlagFIN != 0 {
		if out {
			b.state |= stFinOut
		} else {
			b.state |= stFinIn
		}
		if b.state&(stFinOut|stFinIn) == stFinOut|stFinIn {
			b.idle = min(b.idle, n.finTCP)
		}
	}
	if !out && fl&(packet.TCPFlagSYN|packet.TCPFlagACK) == packet.TCPFlagSYN|packet.TCPFlagACK {
		b.state |= stSynAck
	}
}

// applyOutLocked rewrites a client packet for binding id and decides where
// it goes.
// +checklocks:n.mu
func (n *NAT) applyOutLocked(pkt []byte, hl int, id uint32, now int64) Result {
	b := &n.slots[id]
	n.touchLocked(id, now)
	hairpin := b.state&stHairpin != 0
	dir, mtu := ToOverlay, n.o.MTU
	if hairpin {
		dir, mtu = ToHost, n.o.HostMTU
	}
	if len(pkt) > mtu {
		if packet.IPv4(pkt).DF() {
			n.fragNeededLocked(pkt, hl, mtu, ToHost)
			return n.dropOnBinding(b, ReasonFragNeeded)
		}
	}
	c := &n.classes[b.class]
	if r, done := n.rewriteCountLocked(b, id, pkt, hl, true, dir, mtu); done {
		return r
	}
	if hairpin {
		return Result{Verdict: Reflect}
	}
	return Result{Verdict: Forward, Peer: c.peer}
}

// rewriteCountLocked rewrites pkt for binding b (id) in one direction (out:
// the client's packet, to the backend; otherwise the backend's reply, back
// to the client), counts it on the binding and its listener, and sends a
// packet larger than mtu out in fragments towards dir. done reports that
// the result is final (fragmented, or dropped); otherwise the caller
// decides where the packet goes.
// +checklocks:n.mu
func (n *NAT) rewriteCountLocked(b *binding, id uint32, pkt []byte, hl int, out bool, dir Direction, mtu int) (r Result, done bool) {
	ls := n.classes[b.class].ls
	from, to := n.tuples(id)
	if !out {
		from, to = to, from
	}
	dIP, dL4 := deltas(from, to)
	rewrite(pkt, hl, bits.RotateLeft64(to.k0, 32), bits.RotateLeft32(to.ports(), 16), dIP, dL4)
	sz := uint64(len(pkt))
	if out {
		b.pktsOut++
		b.bytesOut += sz
		ls.counters.PacketsOut++
		ls.counters.BytesOut += sz
	} else {
		b.pktsIn++
		b.bytesIn += sz
		ls.counters.PacketsIn++
		ls.counters.BytesIn += sz
	}
	if len(pkt) <= mtu {
		return Result{}, false
	}
	if !n.emitFragmentsLocked(dir, pkt, mtu) {
		return n.dropOnBinding(b, ReasonNoEmit), true
	}
	return Result{Verdict: Consumed}, true
}

// inLocked handles a backend's reply for binding id.
// +checklocks:n.mu
func (n *NAT) inLocked(pkt []byte, hl int, id uint32, s side, peer PeerID, now int64) Result {
	b := &n.slots[id]
	if n.expireOneLocked(id, now) {
		if s == sideHost {
			return n.drop(ReasonNoFlow)
		}
		return pass
	}
	if b.state&stQuarantined != 0 {
		return n.dropOnBinding(b, ReasonQuarantined)
	}
	c := &n.classes[b.class]
	if peer != c.peer {
		return n.dropOnBinding(b, ReasonPeerMismatch)
	}
	if c.ls.key.proto == ProtoTCP {
		n.tcpFlags(b, pkt[hl+packet.TCPFlagsOff], false)
	}
	n.touchLocked(id, now)
	mtu := n.o.HostMTU
	if len(pkt) > mtu && packet.IPv4(pkt).DF() {
		back := ToOverlay
		if s == sideHost {
			back = ToHost
		}
		n.fragNeededLocked(pkt, hl, mtu, back)
		return n.dropOnBinding(b, ReasonFragNeeded)
	}
	if r, done := n.rewriteCountLocked(b, id, pkt, hl, false, ToHost, mtu); done {
		return r
	}
	if s == sideHost {
		return Result{Verdict: Reflect}
	}
	return Result{Verdict: Forward}
}

// touchLocked extends binding id's idle deadline to now + its retention.
// Extensions leave the wheel entry where it is (the sweep moves it later);
// a shortened retention (RST, FIN) moves it now.
// +checklocks:n.mu
func (n *NAT) touchLocked(id uint32, now int64) {
	b := &n.slots[id]
	d := now + b.idle
	if d < b.deadline {
		b.deadline = d
		n.wheelUnlink(id)
		n.wheelLink(id)
	} else {
		b.deadline = d
	}
	n.syncLocked(id, now)
}

// rewrite writes new addresses (src<<32|dst) and ports (sport<<16|dport)
// into a TCP or UDP packet and applies the precomputed checksum deltas.
func rewrite(pkt []byte, hl int, addrs uint64, ports uint32, dIP, dL4 uint16) {
	binary.BigEndian.PutUint64(pkt[packet.IPv4SrcOff:], addrs)
	packet.Adjust(pkt[packet.IPv4ChecksumOff:], uint32(dIP))
	l4 := pkt[hl:]
	binary.BigEndian.PutUint32(l4, ports)
	if pkt[packet.IPv4ProtoOff] == byte(ProtoTCP) {
		packet.Adjust(l4[packet.TCPChecksumOff:], uint32(dL4))
	} else {
		packet.AdjustUDP(l4[packet.UDPChecksumOff:], uint32(dL4))
	}
}
