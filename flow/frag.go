package flow

import (
	"encoding/binary"

	"github.com/vipkit/vipkit/packet"
)

// Fragment reassembly (before NAT) and fragmentation (after it).
//
// From the host, fragments to a VIP are reassembled; from peers, fragments
// whose source is the address of a backend with bindings, and those from or
// to an address that only drains (whose datagram must not pose as one of
// its draining flows, see passPeerLocked); others are not NAT traffic and
// pass untouched. A reassembled datagram that is not NAT traffic after all
// (to or from an address that only drains) goes on whole, refragmented to
// the MTU of its direction.
//
// Incomplete datagrams are keyed by the side and authenticated sender they
// came from plus (src, dst, protocol, id), so one peer can neither complete
// nor disturb another's datagrams, and a NAT is one network. The cache is
// bounded in datagrams (total and per sender), bytes and fragments per
// datagram; when a bound would be exceeded the fragment is dropped with
// ReasonFragLimit (nothing held is evicted). Overlapping fragments discard
// the whole datagram (RFC 5722 for IPv6, applied to IPv4 too); exact
// duplicates are dropped alone. An incomplete datagram expires
// FragTimeout after its last fragment, by the clock-driven sweep.

const fragHeadroom = packet.IPv4MaxHeaderLen

type fragKey struct {
	side  side
	peer  PeerID
	src   uint32
	dst   uint32
	id    uint16
	proto uint8
}

type senderKey struct {
	side side
	peer PeerID
}

type span struct{ start, end int }

type fragEntry struct {
	key      fragKey
	buf      []byte // fragHeadroom + 65535: the datagram is assembled in place
	hdr      [packet.IPv4MaxHeaderLen]byte
	hl       int
	spans    []span
	total    int // payload length, -1 until the last fragment
	got      int
	deadline int64
	poisoned DropReason // nonzero: discarded; later fragments dropped until expiry
}

// fragCache holds the datagrams being reassembled. It is NAT.frags and
// guarded by the NAT's mu.
type fragCache struct {
	o         *Options
	m         map[fragKey]*fragEntry
	perSender map[senderKey]int
	bytes     int
	spare     []*fragEntry
}

func (fc *fragCache) init(o *Options) {
	fc.o = o
	fc.m = make(map[fragKey]*fragEntry, o.MaxFragDatagrams)
	fc.perSender = make(map[senderKey]int)
}

func (fc *fragCache) count() int { return len(fc.m) }

func (fc *fragCache) reset() {
	clear(fc.m)
	clear(fc.perSender)
	fc.bytes = 0
	fc.spare = nil
}

func (fc *fragCache) add(k fragKey) *fragEntry {
	var e *fragEntry
	if l := len(fc.spare); l > 0 {
		e = fc.spare[l-1]
		fc.spare = fc.spare[:l-1]
	} else {
		e = &fragEntry{buf: make([]byte, fragHeadroom+packet.IPv4MaxPacketLen), spans: make([]span, 0, 8)}
	}
	e.key, e.hl, e.total, e.got, e.poisoned = k, 0, -1, 0, 0
	e.spans = e.spans[:0]
	fc.m[k] = e
	fc.perSender[senderKey{k.side, k.peer}]++
	return e
}

func (fc *fragCache) remove(e *fragEntry) {
	delete(fc.m, e.key)
	sk := senderKey{e.key.side, e.key.peer}
	if fc.perSender[sk]--; fc.perSender[sk] <= 0 {
		delete(fc.perSender, sk)
	}
	fc.bytes -= e.got
	e.got = 0
}

func (fc *fragCache) recycle(e *fragEntry) {
	if len(fc.spare) < fc.o.MaxFragDatagrams {
		fc.spare = append(fc.spare, e)
	}
}

func (fc *fragCache) poison(e *fragEntry, r DropReason) {
	fc.bytes -= e.got
	e.got = 0
	e.spans = e.spans[:0]
	e.poisoned = r
}

// fragmentLocked takes one validated fragment. When it completes a
// datagram, the datagram is translated and emitted.
// +checklocks:n.mu
func (n *NAT) fragmentLocked(pkt []byte, s side, peer PeerID, now int64) Result {
	ip := packet.IPv4(pkt)
	if s == sidePeer && n.backendAddrRefs[binary.BigEndian.Uint32(pkt[packet.IPv4SrcOff:])] == 0 && !n.drainingPeerLocked(pkt) {
		// Not from a backend address with bindings, nor from or to an
		// address that only drains: not NAT traffic, left for the host to
		// reassemble.
		return pass
	}
	hl := ip.HeaderLen()
	off := ip.FragOffset()
	data := pkt[hl:]
	mf := ip.MF()
	end := off + len(data)
	fc := &n.frags
	k := fragKey{s, peer, binary.BigEndian.Uint32(pkt[packet.IPv4SrcOff:]), binary.BigEndian.Uint32(pkt[packet.IPv4DstOff:]), ip.ID(), pkt[packet.IPv4ProtoOff]}
	e := fc.m[k]
	if e != nil && e.poisoned != 0 {
		return n.drop(e.poisoned)
	}
	poison := func(r DropReason) Result {
		if e != nil {
			fc.poison(e, r)
		}
		return n.drop(r) // +checklocksignore: the closure runs inline, under the caller's n.mu
	}
	if end+hl > packet.IPv4MaxPacketLen {
		return poison(ReasonFragTooBig)
	}
	if mf && (len(data) == 0 || len(data)%8 != 0) {
		return n.drop(ReasonBadLength)
	}
	if e == nil {
		if len(fc.m) >= n.o.MaxFragDatagrams || fc.perSender[senderKey{s, peer}] >= n.o.MaxFragDatagramsPerSender ||
			fc.bytes+len(data) > n.o.MaxFragBytes {
			return n.drop(ReasonFragLimit)
		}
		e = fc.add(k)
		n.armLocked()
	} else if fc.bytes+len(data) > n.o.MaxFragBytes {
		return poison(ReasonFragLimit)
	}
	e.deadline = now + n.fragTimeout
	if !mf {
		if e.total >= 0 && e.total != end {
			return poison(ReasonFragOverlap)
		}
		for _, sp := range e.spans {
			if sp.end > end {
				return poison(ReasonFragOverlap)
			}
		}
		e.total = end
	} else if e.total >= 0 && end > e.total {
		return poison(ReasonFragOverlap)
	}
	for _, sp := range e.spans {
		if sp.start == off && sp.end == end {
			return n.drop(ReasonFragDuplicate)
		}
		if off < sp.end && sp.start < end {
			return poison(ReasonFragOverlap)
		}
	}
	if len(e.spans) >= n.o.MaxFragments {
		return poison(ReasonFragTooMany)
	}
	copy(e.buf[fragHeadroom+off:], data)
	e.spans = append(e.spans, span{off, end})
	e.got += len(data)
	fc.bytes += len(data)
	if off == 0 {
		copy(e.hdr[:], pkt[:hl])
		e.hl = hl
	}
	if e.total < 0 || e.got != e.total || e.hl == 0 {
		return Result{Verdict: Consumed}
	}
	// Complete: build the datagram in place behind the payload.
	hl = e.hl
	if hl+e.total > packet.IPv4MaxPacketLen {
		return poison(ReasonFragTooBig)
	}
	dg := e.buf[fragHeadroom-hl : fragHeadroom+e.total]
	copy(dg, e.hdr[:hl])
	binary.BigEndian.PutUint16(dg[packet.IPv4TotalLenOff:], uint16(len(dg)))
	binary.BigEndian.PutUint16(dg[packet.IPv4FlagsOff:], binary.BigEndian.Uint16(dg[packet.IPv4FlagsOff:])&packet.IPv4FlagDF)
	packet.IPv4(dg).UpdateChecksum()
	fc.remove(e)
	defer fc.recycle(e)
	n.reassembled++
	r := n.translateLocked(dg, s, peer, now)
	dir := ToOverlay
	if s == sidePeer || r.Verdict == Reflect {
		dir = ToHost
	}
	switch r.Verdict {
	case Forward, Reflect, Pass:
		if !n.emitFragmentsLocked(dir, dg, n.mtuOf(dir)) {
			return n.drop(ReasonNoEmit)
		}
	case Drop:
		return r
	}
	return Result{Verdict: Consumed}
}

func (n *NAT) mtuOf(d Direction) int {
	if d == ToHost {
		return n.o.HostMTU
	}
	return n.o.MTU
}

// expireFragsLocked drops incomplete datagrams idle since before now.
// +checklocks:n.mu
func (n *NAT) expireFragsLocked(now int64) {
	for _, e := range n.frags.m {
		if e.deadline <= now {
			if e.poisoned == 0 {
				n.drops[ReasonFragTimeout].Add(1)
			}
			n.frags.remove(e)
			n.frags.recycle(e)
		}
	}
}

// emitFragmentsLocked gives pkt to Emit, split into fragments of at most mtu
// bytes when it is larger (RFC 791: payload split on 8-byte boundaries;
// options without the copy bit only in the first fragment).
// +checklocks:n.mu
func (n *NAT) emitFragmentsLocked(dir Direction, pkt []byte, mtu int) bool {
	if n.o.Emit == nil {
		return false
	}
	if len(pkt) <= mtu {
		n.o.Emit(dir, pkt)
		return true
	}
	n.fragmented++
	ip := packet.IPv4(pkt)
	hl := ip.HeaderLen()
	payload := pkt[hl:]
	baseOff := ip.FragOffset()
	baseMF := ip.MF()
	var later [packet.IPv4MaxHeaderLen]byte
	ll := packet.IPv4MinHeaderLen + copiedOptions(later[packet.IPv4MinHeaderLen:], pkt[packet.IPv4MinHeaderLen:hl])
	copy(later[:packet.IPv4MinHeaderLen], pkt[:packet.IPv4MinHeaderLen])
	later[0] = 0x40 | byte(ll/4)
	buf := n.scratch
	for off := 0; off < len(payload); {
		h := pkt[:hl]
		if off > 0 {
			h = later[:ll]
		}
		size := min((mtu-len(h))&^7, len(payload)-off)
		last := off+size == len(payload)
		copy(buf, h)
		copy(buf[len(h):], payload[off:off+size])
		f := packet.IPv4(buf[:len(h)+size])
		binary.BigEndian.PutUint16(f[packet.IPv4TotalLenOff:], uint16(len(f)))
		fo := uint16((baseOff + off) / 8)
		if !last || baseMF {
			fo |= packet.IPv4FlagMF
		}
		binary.BigEndian.PutUint16(f[packet.IPv4FlagsOff:], fo)
		f.UpdateChecksum()
		n.o.Emit(dir, f)
		off += size
	}
	return true
}

// copiedOptions copies the IPv4 options whose copy bit is set from opts to
// dst, pads them to a multiple of 4 and returns their length.
func copiedOptions(dst, opts []byte) int {
	w := 0
	for i := 0; i < len(opts); {
		t := opts[i]
		if t == 0 { // end of options
			break
		}
		if t == 1 { // no-op
			i++
			continue
		}
		if i+1 >= len(opts) {
			break
		}
		l := int(opts[i+1])
		if l < 2 || i+l > len(opts) {
			break
		}
		if t&0x80 != 0 {
			w += copy(dst[w:], opts[i:i+l])
		}
		i += l
	}
	for w%4 != 0 {
		dst[w] = 0
		w++
	}
	return w
}

// fragNeededLocked sends the sender of pkt an ICMP fragmentation-needed
// error carrying mtu, from pkt's destination, quoting pkt's header and
// first 8 bytes of data as they were received (before any rewrite).
// +checklocks:n.mu
func (n *NAT) fragNeededLocked(pkt []byte, hl, mtu int, dir Direction) {
	if n.o.Emit == nil {
		return
	}
	q := min(len(pkt), hl+packet.ICMPv4MinQuoted)
	out := n.scratch[:packet.IPv4MinHeaderLen+packet.ICMPv4HeaderLen+q]
	clear(out[:packet.IPv4MinHeaderLen+packet.ICMPv4HeaderLen])
	out[0] = 0x45
	binary.BigEndian.PutUint16(out[packet.IPv4TotalLenOff:], uint16(len(out)))
	out[packet.IPv4TTLOff] = 64
	out[packet.IPv4ProtoOff] = byte(ProtoICMP)
	copy(out[packet.IPv4SrcOff:packet.IPv4SrcOff+4], pkt[packet.IPv4DstOff:packet.IPv4DstOff+4])
	copy(out[packet.IPv4DstOff:packet.IPv4DstOff+4], pkt[packet.IPv4SrcOff:packet.IPv4SrcOff+4])
	icmp := out[packet.IPv4MinHeaderLen:]
	icmp[packet.ICMPv4TypeOff] = packet.ICMPDestUnreachable
	icmp[packet.ICMPv4CodeOff] = packet.ICMPCodeFragNeeded
	binary.BigEndian.PutUint16(icmp[packet.ICMPv4MTUOff:], uint16(mtu))
	copy(icmp[packet.ICMPv4HeaderLen:], pkt[:q])
	binary.BigEndian.PutUint16(icmp[packet.ICMPv4ChecksumOff:], packet.Checksum(icmp, 0))
	packet.IPv4(out).UpdateChecksum()
	n.icmpSent++
	n.o.Emit(dir, out)
}
