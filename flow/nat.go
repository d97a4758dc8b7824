package flow

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vipkit/vipkit/packet"
	"github.com/vipkit/vipkit/transport"
)

// side is where a packet came from.
type side uint8

const (
	sideHost side = iota // read from the host's TUN (FromHost)
	sidePeer             // received from an overlay peer (FromPeer)
)

// binding state bits
const (
	stActive = 1 << iota
	stQuarantined
	stHairpin
	stSynAck  // the backend answered the SYN: the flow is pinned
	stFinOut  // FIN seen from the client
	stFinIn   // FIN seen from the backend
	stSynData // the SYN carried data: never retargeted
)

const noID = ^uint32(0)

// Per-binding drop reasons (a compact subset; the listener and NAT count
// every reason).
var bindingDropSlot = [NumDropReasons]int8{
	ReasonQuarantined:  1,
	ReasonPeerMismatch: 2,
	ReasonFragNeeded:   3,
	ReasonNoEmit:       4,
}

const bindingDropSlots = 4

// binding is one NAT binding, stored inline in NAT.slots: 64 bytes, one
// cache line, holding what the fast path's log updates (counters, idle
// deadline) and the full path's per-binding state. The fast path itself
// reads only the binding's index entries (hot.go). The rest (tuple parts,
// wheel links, drop counters) is in NAT.cold, read only by the full path
// and the sweep. The tuples are not stored whole: the listener and the
// backend come from the binding's class.
type binding struct {
	deadline int64 // idle expiry (active) or end of quarantine, ns since NAT.base
	idle     int64 // current retention, ns

	pktsOut, bytesOut, pktsIn, bytesIn uint64

	cls uint32 // class index: listener and backend
	gen uint32 // health generation last checked (UDP)
	isn uint32 // the client's SYN sequence number
	st  uint8
}

// bcold is the rarely used part of a binding, in NAT.cold.
type bcold struct {
	client        uint32 // C
	cport, shadow uint16
	wprev, wnext  uint32 // expiry wheel links; wnext also links the free list
	wbucket       uint32
	drops         [bindingDropSlots]uint32
}

type lkey struct {
	vip   uint32
	port  uint16
	proto Proto
}

type listenerState struct {
	l        Listener
	key      lkey
	idx      uint32
	backends []Backend
	idle     int64
	removed  bool
	refs     int // bindings (active or quarantined) referring to it

	active, quarantined           int
	created, retargets, failovers uint64
	c                             Counters

	// bes holds the per-backend state of every configured backend and of
	// every removed one that still has bindings (backends.go).
	bes map[Backend]*backendState
}

type vipInfo struct {
	listeners, bindings int
	claimed             bool // ClaimVIP: claimed without listeners
}

type unreachReport struct {
	l Listener
	b Backend
}

// NAT is the flow table and packet path of one overlay network at one node:
// the NAT at the client's ingress that maps (VIP, port, protocol) to backends
// through shadow ports, its reverse path with admission, fragment
// reassembly and refragmentation, ICMP error translation and hairpin.
//
// The vip engine sits between the host's TUN and wireguard-go and calls
// FromHost for every packet read from the host and FromPeer for every packet
// wireguard-go delivers, then acts on the Result. Control methods
// (SetListener, RemoveListener, RemoveBackend, RemoveVIP, HealthChanged,
// stats) may be called at any time from any goroutine.
//
// Concurrency: the host side (FromHost, FromHostBatch) and the peer side
// (FromPeer, FromPeerBatch) may run concurrently with each other and with
// the control methods, but each side is driven by one goroutine at a time
// (like PacketIO.Read and Write). The table is guarded by one
// mutex held for a few tens of nanoseconds per packet; packets that are not
// NAT traffic (not to a VIP from the host, not to LocalAddr from a peer) do
// not take it.
//
// Memory: New allocates the whole table for Options.Capacity up front: 128
// bytes per binding of hash index (two 32-byte entries, one per direction,
// holding what an established packet needs, at a load factor of at most
// ½), 64 bytes of binding and 36 of colder per-binding state, about 230
// bytes per flow in all (BenchmarkTranslate reports it as B/flow), backed
// by transparent huge pages where the kernel allows. The fragment cache
// holds at most MaxFragDatagrams buffers of 64 KiB.
//
// Packet path: an established packet is translated from its own index
// entry, which holds the rewrite target, the checksum deltas, the health
// generation and a lower bound of the idle deadline; its counters and
// deadline extension go to a short log applied in batches. At a million
// flows that is one cache miss per packet (see hot.go). Everything else
// (new flows, TCP SYN/FIN/RST, UDP after a health change, quarantine,
// fragments, ICMP errors) takes the full path on the bindings.
//
// Batches: FromHostBatch and FromPeerBatch handle a PacketIO batch with one
// lock acquisition per 64 packets and overlap the table's cache misses;
// prefer them on the engine's batched paths.
//
// Close releases all state and every reserved port.
type NAT struct {
	o     Options
	local uint32
	clock transport.Clock
	res   PortReserver
	base  time.Time
	gran  int64 // wheel granularity, ns

	vips  atomic.Pointer[vipSet]
	gen   atomic.Uint32
	drops [NumDropReasons]atomic.Uint64

	mu        sync.Mutex
	closed    bool
	idx       index
	slots     []binding
	cold      []bcold
	freeHead  uint32 // free list of binding ids through bcold.wnext
	fresh     uint32 // ids from here on were never used
	classes   []bclass
	classMap  map[classKey]uint32
	classFree []uint32
	log       [logSize]logEnt // fast-path packets not yet applied to bindings
	nlog      int
	sweptU    uint32 // time of the last sweep, in until units
	hotLimit  uint32 // classes below it use the fast path (classNone; tests lower it)
	used      int    // active + quarantined
	nquar     int
	wheel     []uint32
	wheelTick int64
	lis       []*listenerState
	lisFree   []uint32
	lmap      map[lkey]uint32
	vipInfo   map[uint32]*vipInfo
	beRefs    map[uint32]int // bindings per backend address: which peers' fragments to reassemble
	frags     fragCache
	timer     transport.Timer
	armed     bool
	scratch   []byte
	reply     []byte             // a refusal being built (refuse.go)
	sink      uint64             // keeps the prefetching loads alive
	reports   [2][]unreachReport // per side, delivered after the lock is released

	created, failovers, retargets, refused    uint64
	reassembled, fragmented, icmpSent         uint64
	idleTCP, idleUDP, closedTCP, finTCP, qtn  int64
	fragTimeout                               int64
	replyCost, replyMax, replyCredit, replyAt int64 // refusals' token bucket, ns
}

// New returns a NAT for one overlay network. It validates the options
// (errors match ErrInvalidOptions) and allocates the table.
func New(o Options) (*NAT, error) {
	if err := o.normalize(); err != nil {
		return nil, err
	}
	n := &NAT{
		o:        o,
		local:    addr4(o.LocalAddr),
		clock:    transport.Or(o.Clock),
		res:      o.Reserver,
		gran:     int64(o.SweepInterval),
		lmap:     make(map[lkey]uint32),
		vipInfo:  make(map[uint32]*vipInfo),
		beRefs:   make(map[uint32]int),
		classMap: make(map[classKey]uint32),
		freeHead: noID,
		hotLimit: classNone,
	}
	if n.res == nil {
		n.res = NewMemReserver(MemReserverOptions{})
	}
	n.base = n.clock.Now()
	n.idx = newIndex(2*o.Capacity, rand.Uint64(), rand.Uint64())
	n.slots = make([]binding, o.Capacity)
	adviseHuge(unsafe.Pointer(unsafe.SliceData(n.slots)), uintptr(len(n.slots))*unsafe.Sizeof(binding{}))
	n.cold = make([]bcold, o.Capacity)
	adviseHuge(unsafe.Pointer(unsafe.SliceData(n.cold)), uintptr(len(n.cold))*unsafe.Sizeof(bcold{}))
	n.wheel = make([]uint32, wheelSize)
	for i := range n.wheel {
		n.wheel[i] = noID
	}
	n.idleTCP, n.idleUDP = int64(o.TCPIdleTimeout), int64(o.UDPIdleTimeout)
	n.closedTCP, n.finTCP, n.qtn = int64(o.TCPClosedTimeout), int64(o.TCPFinTimeout), int64(o.Quarantine)
	n.fragTimeout = int64(o.FragTimeout)
	n.frags.init(&n.o)
	n.scratch = make([]byte, max(o.MTU, o.HostMTU, 2*packet.IPv4MaxHeaderLen+2*packet.ICMPv4HeaderLen+16))
	n.reply = make([]byte, 0, 2*packet.IPv4MaxHeaderLen+packet.ICMPv4HeaderLen+packet.ICMPv4MinQuoted)
	n.initReplies()
	return n, nil
}

func addr4(a netip.Addr) uint32 { b := a.As4(); return binary.BigEndian.Uint32(b[:]) }

func addrFrom(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

func (n *NAT) ns(t time.Time) int64     { return int64(t.Sub(n.base)) }
func (n *NAT) timeOf(v int64) time.Time { return n.base.Add(time.Duration(v)) }

// LocalAddr returns Options.LocalAddr.
func (n *NAT) LocalAddr() netip.Addr { return n.o.LocalAddr }

// IsVIP reports whether a is a VIP of a configured listener or of a binding
// that still drains. It is safe to call concurrently and does not lock.
func (n *NAT) IsVIP(a netip.Addr) bool { return a.Is4() && n.vips.Load().has(addr4(a)) }

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
// packet with a VIP as source or destination is dropped (no peer may claim
// a VIP), only packets for LocalAddr are the NAT's, and they must pass
// Options.Admit.
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
		switch {
		case vs.has(src):
			return n.drop(ReasonVIPSource), false
		case vs.has(dst):
			return n.drop(ReasonVIPDestination), false
		case dst != n.local:
			return Result{}, false
		}
	}
	if err := packet.IPv4(p).Validate(); err != nil {
		return n.drop(reasonFor(err)), false
	}
	if s == sidePeer && n.o.Admit != nil && !n.o.Admit(peer, addrFrom(src), addrFrom(dst)) {
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
		sink += n.idx.ents[n.idx.home(k.k0, k.k1)].k1
	}
	n.sink += sink
}

// flushReports delivers the port-unreachable reports queued by side s. Only
// the goroutine calling FromHost (or FromPeer) touches its side's queue.
func (n *NAT) flushReports(s side) {
	for _, rp := range n.reports[s] {
		if n.o.OnPortUnreachable != nil {
			n.o.OnPortUnreachable(rp.l, rp.b)
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

func (n *NAT) dropL(ls *listenerState, r DropReason) Result {
	if ls != nil {
		ls.c.Drops[r]++
	}
	return n.drop(r)
}

func (n *NAT) dropB(b *binding, r DropReason) Result {
	if s := bindingDropSlot[r]; s > 0 {
		n.cold[n.idOf(b)].drops[s-1]++
	}
	return n.dropL(n.classes[b.cls].ls, r)
}

// idOf returns the slot index of b, a pointer into n.slots.
func (n *NAT) idOf(b *binding) uint32 {
	return uint32((uintptr(unsafe.Pointer(b)) - uintptr(unsafe.Pointer(&n.slots[0]))) / unsafe.Sizeof(binding{}))
}

var pass = Result{}

// handleLocked dispatches a validated IPv4 packet.
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
		if s == sideHost {
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
		case n.slots[id].st&stHairpin != 0:
			return n.inLocked(pkt, hl, id, s, peer, now)
		}
		return n.drop(ReasonNoFlow)
	}
	if e == nil || dir == dirFwd || n.slots[id].st&stHairpin != 0 {
		return pass
	}
	return n.inLocked(pkt, hl, id, s, peer, now)
}

// newFlowLocked creates a binding for a packet to a VIP that has none.
func (n *NAT) newFlowLocked(pkt []byte, hl int, k tuple, now int64) Result {
	li, ok := n.lmap[lkey{k.dst(), k.dport(), k.proto()}]
	if !ok {
		return n.refuseLocked(pkt, hl, nil, ReasonNoListener, now)
	}
	ls := n.lis[li]
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
			return n.dropL(ls, ReasonNoFlow)
		}
		isn, synData = t.Seq(), len(t) > t.HeaderLen()
	}
	i := n.selectLocked(ls, SelectNew, Backend{}, now)
	if i < 0 {
		if len(ls.backends) == 0 {
			return n.refuseLocked(pkt, hl, ls, ReasonNoBackend, now)
		}
		return n.dropL(ls, ReasonNoBackend)
	}
	id, r := n.bindLocked(k, ls, ls.backends[i], now, isn, synData)
	if r != ReasonNone {
		return n.dropL(ls, r)
	}
	return n.applyOutLocked(pkt, hl, id, now)
}

func (n *NAT) selectLocked(ls *listenerState, why SelectReason, prev Backend, now int64) int {
	if len(ls.backends) == 0 || ls.removed {
		return -1
	}
	i := n.o.Selector.Select(SelectRequest{
		Listener:   ls.l,
		Candidates: ls.backends,
		Reason:     why,
		Prev:       prev,
		Now:        n.timeOf(now),
	})
	if i < 0 || i >= len(ls.backends) {
		return -1
	}
	return i
}

// hasRoomLocked reports whether one more binding fits, expiring what is due
// first when the table is full.
func (n *NAT) hasRoomLocked(now int64) bool {
	if n.used < n.o.Capacity {
		return true
	}
	n.expireLocked(now)
	return n.used < n.o.Capacity
}

// bindLocked creates a binding for client tuple k (which must have no
// forward entry) to backend be.
func (n *NAT) bindLocked(k tuple, ls *listenerState, be Backend, now int64, isn uint32, synData bool) (uint32, DropReason) {
	if !n.hasRoomLocked(now) {
		n.refused++
		return noID, ReasonCapacity
	}
	proto := k.proto()
	hairpin := be.Addr == n.o.LocalAddr
	baddr := addr4(be.Addr)
	laddr := n.local
	if hairpin {
		laddr = k.dst()
	}
	bap := be.AddrPort()
	// A reply tuple must be unique in the index (it could collide with
	// another binding's client tuple in contrived hairpin cases): hold
	// colliding ports until a free one is found, then give them back.
	var held [8]uint16
	nheld := 0
	var rk tuple
	found := false
	for nheld < len(held) {
		p, err := n.res.Reserve(proto, bap)
		if err != nil {
			break
		}
		rk = mkTuple(baddr, laddr, be.Port, p, proto)
		if n.idx.find(rk) == nil {
			found = true
			break
		}
		held[nheld] = p
		nheld++
	}
	for _, p := range held[:nheld] {
		n.res.Release(proto, bap, p)
	}
	if !found {
		return noID, ReasonNoPort
	}
	if n.idx.find(k) != nil { // cannot happen: callers retire k first
		n.res.Release(proto, bap, rk.dport())
		return noID, ReasonNoFlow
	}
	var id uint32
	if n.freeHead != noID {
		id = n.freeHead
		n.freeHead = n.cold[id].wnext
	} else {
		id = n.fresh
		n.fresh++
	}
	n.idx.insert(k, id, dirFwd, 0, 0)
	n.idx.insert(rk, id, dirRev, 0, 0)

	b := &n.slots[id]
	*b = binding{
		idle: ls.idle,
		cls:  n.classRefLocked(ls, be),
		isn:  isn,
		gen:  n.gen.Load(),
		st:   stActive,
	}
	n.cold[id] = bcold{
		client: k.src(), cport: k.sport(), shadow: rk.dport(),
		wprev: noID, wnext: noID, wbucket: noID,
	}
	if hairpin {
		b.st |= stHairpin
	}
	if synData {
		b.st |= stSynData
	}
	b.deadline = now + b.idle
	ls.refs++
	ls.active++
	ls.created++
	bs := n.classes[b.cls].bs
	bs.active++
	bs.created++
	n.used++
	n.created++
	n.vipRefLocked(k.dst(), 0, +1)
	n.beRefs[baddr]++
	n.wheelLink(id)
	n.syncLocked(id, now)
	n.armLocked()
	return id, ReasonNone
}

// outLocked handles a client packet of an existing binding.
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
			if b.st&(stSynAck|stSynData) == 0 && len(l4) == packet.TCP(l4).HeaderLen() {
				from := n.classes[b.cls].bs
				if nid, moved := n.rebindLocked(id, SelectSYNRetry, now); moved {
					if nid == noID {
						return Result{Verdict: Drop, Reason: ReasonNoPort}
					}
					id = nid
					n.classes[n.slots[id].cls].ls.retargets++
					from.retargets++
					n.retargets++
				}
			}
		}
		n.tcpFlags(&n.slots[id], fl, true)
	case ProtoUDP:
		if b.gen != n.gen.Load() {
			b.gen = n.gen.Load()
			ls := n.classes[b.cls].ls
			if !n.o.Selector.Available(ls.l, n.backendOf(b), n.timeOf(now)) {
				from := n.classes[b.cls].bs
				if nid, moved := n.rebindLocked(id, SelectFailover, now); moved {
					if nid == noID {
						return Result{Verdict: Drop, Reason: ReasonNoPort}
					}
					id = nid
					n.classes[n.slots[id].cls].ls.failovers++
					from.failovers++
					n.failovers++
				}
			}
		}
	}
	return n.applyOutLocked(pkt, hl, id, now)
}

// rebindLocked asks the selector for another backend for binding id and,
// when it names a different one and there is room, retires id and binds the
// flow anew. It reports the binding to use.
func (n *NAT) rebindLocked(id uint32, why SelectReason, now int64) (uint32, bool) {
	b := &n.slots[id]
	ls := n.classes[b.cls].ls
	cur := n.backendOf(b)
	i := n.selectLocked(ls, why, cur, now)
	if i < 0 || ls.backends[i] == cur {
		return id, false
	}
	if !n.hasRoomLocked(now) {
		n.refused++
		ls.c.Drops[ReasonCapacity]++
		n.drops[ReasonCapacity].Add(1)
		return id, false
	}
	k, _ := n.tuples(id)
	isn, synData := b.isn, b.st&stSynData != 0
	n.retireLocked(id, now)
	nid, r := n.bindLocked(k, ls, ls.backends[i], now, isn, synData)
	if r != ReasonNone {
		// The reserver failed; the old binding is already retired. Count it;
		// the packet goes out on nothing: the caller re-looks up.
		ls.c.Drops[r]++
		n.drops[r].Add(1)
		return noID, true
	}
	return nid, true
}

func (n *NAT) backendOf(b *binding) Backend {
	c := &n.classes[b.cls]
	return Backend{Peer: c.peer, Addr: addrFrom(c.addr), Port: c.port}
}

func (n *NAT) tcpFlags(b *binding, fl uint8, out bool) {
	if fl&packet.TCPFlagRST != 0 {
		b.idle = min(b.idle, n.closedTCP)
		return
	}
	if fl&packet.TCPFlagFIN != 0 {
		if out {
			b.st |= stFinOut
		} else {
			b.st |= stFinIn
		}
		if b.st&(stFinOut|stFinIn) == stFinOut|stFinIn {
			b.idle = min(b.idle, n.finTCP)
		}
	}
	if !out && fl&(packet.TCPFlagSYN|packet.TCPFlagACK) == packet.TCPFlagSYN|packet.TCPFlagACK {
		b.st |= stSynAck
	}
}

// applyOutLocked rewrites a client packet for binding id and decides where
// it goes.
func (n *NAT) applyOutLocked(pkt []byte, hl int, id uint32, now int64) Result {
	b := &n.slots[id]
	n.touchLocked(id, now)
	hairpin := b.st&stHairpin != 0
	dir, mtu := ToOverlay, n.o.MTU
	if hairpin {
		dir, mtu = ToHost, n.o.HostMTU
	}
	if len(pkt) > mtu {
		if packet.IPv4(pkt).DF() {
			n.fragNeededLocked(pkt, hl, mtu, ToHost)
			return n.dropB(b, ReasonFragNeeded)
		}
	}
	c := &n.classes[b.cls]
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
func (n *NAT) rewriteCountLocked(b *binding, id uint32, pkt []byte, hl int, out bool, dir Direction, mtu int) (r Result, done bool) {
	ls := n.classes[b.cls].ls
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
		ls.c.PacketsOut++
		ls.c.BytesOut += sz
	} else {
		b.pktsIn++
		b.bytesIn += sz
		ls.c.PacketsIn++
		ls.c.BytesIn += sz
	}
	if len(pkt) <= mtu {
		return Result{}, false
	}
	if !n.emitFragmentsLocked(dir, pkt, mtu) {
		return n.dropB(b, ReasonNoEmit), true
	}
	return Result{Verdict: Consumed}, true
}

// inLocked handles a backend's reply for binding id.
func (n *NAT) inLocked(pkt []byte, hl int, id uint32, s side, peer PeerID, now int64) Result {
	b := &n.slots[id]
	if n.expireOneLocked(id, now) {
		if s == sideHost {
			return n.drop(ReasonNoFlow)
		}
		return pass
	}
	if b.st&stQuarantined != 0 {
		return n.dropB(b, ReasonQuarantined)
	}
	c := &n.classes[b.cls]
	if peer != c.peer {
		return n.dropB(b, ReasonPeerMismatch)
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
		return n.dropB(b, ReasonFragNeeded)
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

// retireLocked moves an active binding to quarantine, from time at: its
// client tuple no longer matches; its shadow port stays reserved and late
// replies are dropped until at + Quarantine.
func (n *NAT) retireLocked(id uint32, at int64) {
	b := &n.slots[id]
	if b.st&stActive == 0 {
		return
	}
	orig, _ := n.tuples(id)
	n.idx.remove(orig)
	b.st = b.st&^stActive | stQuarantined
	b.deadline = at + n.qtn
	ls := n.classes[b.cls].ls
	ls.active--
	ls.quarantined++
	bs := n.classes[b.cls].bs
	bs.active--
	bs.quarantined++
	n.nquar++
	n.wheelUnlink(id)
	n.wheelLink(id)
	n.syncLocked(id, at)
}

// expireOneLocked applies idle expiry and quarantine end to binding id at
// now, as the sweep would, and reports whether the binding is gone.
func (n *NAT) expireOneLocked(id uint32, now int64) bool {
	b := &n.slots[id]
	if b.st&stActive != 0 && now >= b.deadline {
		n.retireLocked(id, b.deadline)
	}
	if b.st&stQuarantined != 0 && now >= b.deadline {
		n.freeLocked(id)
		return true
	}
	return false
}

// freeLocked ends a quarantined binding and releases its port.
func (n *NAT) freeLocked(id uint32) {
	b := &n.slots[id]
	orig, reply := n.tuples(id)
	n.idx.remove(reply)
	n.wheelUnlink(id)
	n.res.Release(orig.proto(), netip.AddrPortFrom(addrFrom(reply.src()), reply.sport()), reply.dport())
	ls := n.classes[b.cls].ls
	n.backendFreedLocked(n.classes[b.cls].bs, n.countersOf(id))
	n.classUnrefLocked(b.cls)
	ls.quarantined--
	ls.refs--
	n.nquar--
	n.used--
	n.vipRefLocked(orig.dst(), 0, -1)
	if n.beRefs[reply.src()]--; n.beRefs[reply.src()] <= 0 {
		delete(n.beRefs, reply.src())
	}
	if ls.removed && ls.refs == 0 {
		n.dropListenerLocked(ls)
	}
	*b = binding{}
	n.cold[id] = bcold{wprev: noID, wnext: n.freeHead, wbucket: noID}
	n.freeHead = id
}

// Expiry wheel: one list per SweepInterval tick, wheelSize ticks around.
// An entry sits in the bucket of its deadline (clamped to the wheel's
// reach); packets extend deadlines without moving entries, and the sweep
// moves entries whose deadline has moved on.
const (
	wheelBits = 13
	wheelSize = 1 << wheelBits
	wheelMask = wheelSize - 1
)

func (n *NAT) bucketFor(deadline int64) uint32 {
	t := deadline / n.gran
	if t < n.wheelTick {
		t = n.wheelTick
	}
	if t-n.wheelTick >= wheelSize {
		t = n.wheelTick + wheelSize - 1
	}
	return uint32(t & wheelMask)
}

func (n *NAT) wheelLink(id uint32) {
	b := &n.cold[id]
	bk := n.bucketFor(n.slots[id].deadline)
	b.wbucket = bk
	b.wprev = noID
	b.wnext = n.wheel[bk]
	if b.wnext != noID {
		n.cold[b.wnext].wprev = id
	}
	n.wheel[bk] = id
}

func (n *NAT) wheelUnlink(id uint32) {
	b := &n.cold[id]
	if b.wbucket == noID {
		return
	}
	if b.wprev != noID {
		n.cold[b.wprev].wnext = b.wnext
	} else {
		n.wheel[b.wbucket] = b.wnext
	}
	if b.wnext != noID {
		n.cold[b.wnext].wprev = b.wprev
	}
	b.wprev, b.wnext, b.wbucket = noID, noID, noID
}

// expireLocked retires active bindings and frees quarantined ones whose
// deadline is at or before now.
func (n *NAT) expireLocked(now int64) {
	n.flushLocked()
	if u := uint32(now >> untilShift); int32(u-n.sweptU) > 0 {
		n.sweptU = u
	}
	nowTick := now / n.gran
	if nowTick < n.wheelTick {
		nowTick = n.wheelTick
	}
	start := n.wheelTick
	if nowTick-start >= wheelSize {
		start = nowTick - wheelSize + 1
	}
	for t := start; t <= nowTick; t++ {
		bk := uint32(t & wheelMask)
		id := n.wheel[bk]
		for id != noID {
			b := &n.slots[id]
			next := n.cold[id].wnext
			if b.deadline <= now && b.st&stActive != 0 {
				n.retireLocked(id, b.deadline)
			}
			if b.deadline <= now {
				n.freeLocked(id)
			} else if nb := n.bucketFor(b.deadline); nb != n.cold[id].wbucket {
				n.wheelUnlink(id)
				n.wheelLink(id)
				if b.st&stActive != 0 {
					n.syncLocked(id, now) // the deadline moved on: so does until
				}
			}
			id = next
		}
	}
	n.wheelTick = nowTick
}

func (n *NAT) armLocked() {
	if n.armed || n.closed || (n.used == 0 && n.frags.count() == 0) {
		return
	}
	n.armed = true
	if n.timer == nil {
		n.timer = n.clock.AfterFunc(n.o.SweepInterval, n.sweep)
	} else {
		n.timer.Reset(n.o.SweepInterval)
	}
}

// sweep runs on the clock: it expires bindings and fragments independently
// of traffic.
func (n *NAT) sweep() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.armed = false
	if n.closed {
		return
	}
	now := n.ns(n.clock.Now())
	n.expireLocked(now)
	n.expireFragsLocked(now)
	n.armLocked()
}

// Expire retires and frees every binding and drops every incomplete
// datagram whose time has come at now. The clock-driven sweep calls it every
// SweepInterval; callers only need it to force expiry at an exact time.
func (n *NAT) Expire(now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	t := n.ns(now)
	n.expireLocked(t)
	n.expireFragsLocked(t)
}

// vipRefLocked counts listeners and bindings per VIP and republishes the
// lock-free VIP set when one appears or disappears.
func (n *NAT) vipRefLocked(vip uint32, dl, db int) {
	vi := n.vipInfo[vip]
	if vi == nil {
		vi = &vipInfo{}
		n.vipInfo[vip] = vi
		defer n.publishVIPsLocked()
	}
	vi.listeners += dl
	vi.bindings += db
	if vi.listeners == 0 && vi.bindings == 0 && !vi.claimed {
		delete(n.vipInfo, vip)
		n.publishVIPsLocked()
	}
}

func (n *NAT) publishVIPsLocked() {
	addrs := make([]uint32, 0, len(n.vipInfo))
	for a := range n.vipInfo {
		addrs = append(addrs, a)
	}
	n.vips.Store(newVIPSet(addrs))
}

// vipSet is an immutable open-addressing set of IPv4 addresses.
type vipSet struct {
	ents []uint32
	mask uint32
}

func newVIPSet(addrs []uint32) *vipSet {
	if len(addrs) == 0 {
		return nil
	}
	size := 8
	for size < 4*len(addrs) {
		size <<= 1
	}
	s := &vipSet{ents: make([]uint32, size), mask: uint32(size - 1)}
	for _, a := range addrs {
		i := vipHash(a) & s.mask
		for s.ents[i] != 0 {
			i = (i + 1) & s.mask
		}
		s.ents[i] = a
	}
	return s
}

func vipHash(a uint32) uint32 { return (a * 0x9e3779b1) ^ (a >> 16) }

func (s *vipSet) has(a uint32) bool {
	if s == nil || a == 0 {
		return false
	}
	i := vipHash(a) & s.mask
	for {
		e := s.ents[i]
		if e == a {
			return true
		}
		if e == 0 {
			return false
		}
		i = (i + 1) & s.mask
	}
}

// SetListener creates or updates a listener: its VIP becomes a VIP (FromHost
// translates traffic to it; peers may no longer use it), and new flows to it
// are bound to one of cfg.Backends. Updating a removed listener that still
// drains revives it. Errors match ErrInvalidListener, ErrInvalidBackend,
// ErrLimit or ErrClosed.
func (n *NAT) SetListener(l Listener, cfg ListenerConfig) error {
	if !l.VIP.Is4() || l.VIP.IsUnspecified() || l.VIP == n.o.LocalAddr || (l.Proto != ProtoTCP && l.Proto != ProtoUDP) || l.Port == 0 {
		return fmt.Errorf("%w: %v", ErrInvalidListener, l)
	}
	if cfg.IdleTimeout < 0 {
		return fmt.Errorf("%w: %v: negative idle timeout", ErrInvalidListener, l)
	}
	if len(cfg.Backends) > n.o.MaxBackends {
		return fmt.Errorf("%w: %v has %d backends, at most %d", ErrLimit, l, len(cfg.Backends), n.o.MaxBackends)
	}
	for _, b := range cfg.Backends {
		if err := n.checkBackend(b); err != nil {
			return err
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	k := lkey{addr4(l.VIP), l.Port, l.Proto}
	li, ok := n.lmap[k]
	var ls *listenerState
	if ok {
		ls = n.lis[li]
		if ls.removed {
			if vi := n.vipInfo[k.vip]; vi != nil && vi.listeners >= n.o.MaxListenersPerVIP {
				return fmt.Errorf("%w: %v: more than %d listeners on the VIP", ErrLimit, l, n.o.MaxListenersPerVIP)
			}
			ls.removed = false
			n.vipRefLocked(k.vip, +1, 0)
		}
	} else {
		if vi := n.vipInfo[k.vip]; vi != nil && vi.listeners >= n.o.MaxListenersPerVIP {
			return fmt.Errorf("%w: %v: more than %d listeners on the VIP", ErrLimit, l, n.o.MaxListenersPerVIP)
		}
		ls = &listenerState{l: l, key: k}
		if len(n.lisFree) > 0 {
			ls.idx = n.lisFree[len(n.lisFree)-1]
			n.lisFree = n.lisFree[:len(n.lisFree)-1]
			n.lis[ls.idx] = ls
		} else {
			ls.idx = uint32(len(n.lis))
			n.lis = append(n.lis, ls)
		}
		n.lmap[k] = ls.idx
		n.vipRefLocked(k.vip, +1, 0)
	}
	ls.backends = append(ls.backends[:0:0], cfg.Backends...)
	n.configureBackendsLocked(ls)
	ls.idle = int64(cfg.IdleTimeout)
	if ls.idle == 0 {
		ls.idle = n.idleUDP
		if l.Proto == ProtoTCP {
			ls.idle = n.idleTCP
		}
	}
	return nil
}

func (n *NAT) checkBackend(b Backend) error {
	if !b.Addr.Is4() || b.Addr.IsUnspecified() || b.Port == 0 {
		return fmt.Errorf("%w: %v", ErrInvalidBackend, b.AddrPort())
	}
	if (b.Addr == n.o.LocalAddr) != (b.Peer == LocalPeer) {
		return fmt.Errorf("%w: %v with peer %d: the local address belongs to LocalPeer only", ErrInvalidBackend, b.AddrPort(), b.Peer)
	}
	return nil
}

// RemoveListener stops new bindings to l; its bindings continue until they
// expire. The VIP stays claimed while any of its listeners or bindings
// remain. It reports whether l was configured.
func (n *NAT) RemoveListener(l Listener) bool {
	if !l.VIP.Is4() {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.removeListenerLocked(lkey{addr4(l.VIP), l.Port, l.Proto})
}

func (n *NAT) removeListenerLocked(k lkey) bool {
	li, ok := n.lmap[k]
	if !ok || n.lis[li].removed {
		return false
	}
	ls := n.lis[li]
	ls.removed = true
	ls.backends = nil
	n.configureBackendsLocked(ls)
	n.vipRefLocked(k.vip, -1, 0)
	if ls.refs == 0 {
		n.dropListenerLocked(ls)
	}
	return true
}

func (n *NAT) dropListenerLocked(ls *listenerState) {
	if n.o.OnListenerGone != nil {
		n.o.OnListenerGone(ls.stats())
	}
	delete(n.lmap, ls.key)
	n.lis[ls.idx] = nil
	n.lisFree = append(n.lisFree, ls.idx)
}

// RemoveBackend stops new bindings of l to b; existing bindings continue
// until they expire. It reports whether b was a backend of l.
func (n *NAT) RemoveBackend(l Listener, b Backend) bool {
	if !l.VIP.Is4() {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	li, ok := n.lmap[lkey{addr4(l.VIP), l.Port, l.Proto}]
	if !ok {
		return false
	}
	ls := n.lis[li]
	for i, c := range ls.backends {
		if c == b {
			ls.backends = append(ls.backends[:i:i], ls.backends[i+1:]...)
			n.configureBackendsLocked(ls)
			return true
		}
	}
	return false
}

// ClaimVIP claims vip even while it has no listener: an empty VIP, which
// resolves but cannot accept traffic. Its packets from the host are then
// the NAT's and refused like those to a port without a listener (a RST or
// an ICMP port unreachable, see Options.ReplyRate) instead of passing.
// It fails with ErrInvalidListener for an address that is not IPv4 or is
// LocalAddr, and with ErrClosed after Close.
func (n *NAT) ClaimVIP(vip netip.Addr) error {
	if !vip.Is4() || vip == n.o.LocalAddr {
		return fmt.Errorf("%w: VIP %v", ErrInvalidListener, vip)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	a := addr4(vip)
	if vi := n.vipInfo[a]; vi != nil {
		vi.claimed = true
		return nil
	}
	n.vipInfo[a] = &vipInfo{claimed: true}
	n.publishVIPsLocked()
	return nil
}

// ReleaseVIP undoes ClaimVIP; the VIP stays claimed while it has
// listeners or bindings. It reports whether vip was claimed.
func (n *NAT) ReleaseVIP(vip netip.Addr) bool {
	if !vip.Is4() {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	a := addr4(vip)
	vi := n.vipInfo[a]
	if vi == nil || !vi.claimed {
		return false
	}
	vi.claimed = false
	n.vipRefLocked(a, 0, 0)
	return true
}

// RemoveVIP removes every listener of vip (see RemoveListener) and returns
// how many there were.
func (n *NAT) RemoveVIP(vip netip.Addr) int {
	if !vip.Is4() {
		return 0
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	a := addr4(vip)
	var keys []lkey
	for k := range n.lmap {
		if k.vip == a {
			keys = append(keys, k)
		}
	}
	c := 0
	for _, k := range keys {
		if n.removeListenerLocked(k) {
			c++
		}
	}
	return c
}

// HealthChanged tells the NAT that backend availability may have changed:
// each UDP binding asks Selector.Available once more on its next datagram
// and fails over when its backend is unavailable.
func (n *NAT) HealthChanged() { n.gen.Add(1) }

// Close releases all bindings, fragments and every reserved port, and stops
// the sweep. Later packets are dropped with ReasonClosed and control methods
// return ErrClosed. Close is idempotent.
func (n *NAT) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	if n.timer != nil {
		n.timer.Stop()
	}
	n.nlog = 0
	for id := range n.slots[:n.fresh] {
		b := &n.slots[id]
		if b.st == 0 {
			continue
		}
		orig, reply := n.tuples(uint32(id))
		n.res.Release(orig.proto(), netip.AddrPortFrom(addrFrom(reply.src()), reply.sport()), reply.dport())
	}
	// Drop the table itself: a million-flow table is ~230 MB.
	n.idx = index{}
	n.slots, n.cold, n.fresh, n.freeHead = nil, nil, 0, noID
	n.classes, n.classMap, n.classFree = nil, map[classKey]uint32{}, nil
	n.wheel = nil
	n.used, n.nquar = 0, 0
	n.frags.reset()
	n.lis, n.lmap, n.vipInfo, n.beRefs = nil, map[lkey]uint32{}, map[uint32]*vipInfo{}, map[uint32]int{}
	n.vips.Store(nil)
	return nil
}

func (n *NAT) countersOf(id uint32) Counters {
	b := &n.slots[id]
	c := Counters{PacketsOut: b.pktsOut, BytesOut: b.bytesOut, PacketsIn: b.pktsIn, BytesIn: b.bytesIn}
	for r, s := range bindingDropSlot {
		if s > 0 {
			c.Drops[r] = uint64(n.cold[id].drops[s-1])
		}
	}
	return c
}

// Bindings returns a snapshot of every active and quarantined binding.
func (n *NAT) Bindings() []BindingInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.flushLocked()
	out := make([]BindingInfo, 0, n.used)
	for id := range n.slots[:n.fresh] {
		b := &n.slots[id]
		if b.st == 0 {
			continue
		}
		orig, reply := n.tuples(uint32(id))
		st := Active
		if b.st&stQuarantined != 0 {
			st = Quarantined
		}
		out = append(out, BindingInfo{
			Listener: n.classes[b.cls].ls.l,
			Backend:  n.backendOf(b),
			Client:   netip.AddrPortFrom(addrFrom(orig.src()), orig.sport()),
			Shadow:   netip.AddrPortFrom(addrFrom(reply.dst()), reply.dport()),
			State:    st,
			Hairpin:  b.st&stHairpin != 0,
			Expires:  n.timeOf(b.deadline),
			Counters: n.countersOf(uint32(id)),
		})
	}
	return out
}

// ListenerStats returns a snapshot of listener l, including a removed
// listener that still drains. It reports false for an unknown listener.
func (n *NAT) ListenerStats(l Listener) (ListenerStats, bool) {
	if !l.VIP.Is4() {
		return ListenerStats{}, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	li, ok := n.lmap[lkey{addr4(l.VIP), l.Port, l.Proto}]
	if !ok {
		return ListenerStats{}, false
	}
	return n.lis[li].stats(), true
}

func (ls *listenerState) stats() ListenerStats {
	return ListenerStats{
		Listener: ls.l, Removed: ls.removed, Backends: len(ls.backends),
		Active: ls.active, Quarantined: ls.quarantined,
		Created: ls.created, Retargets: ls.retargets, Failovers: ls.failovers,
		Counters: ls.c,
	}
}

// Stats returns a snapshot of the NAT's counters.
func (n *NAT) Stats() Stats {
	n.mu.Lock()
	s := Stats{
		Capacity: n.o.Capacity, Active: n.used - n.nquar, Quarantined: n.nquar,
		Created: n.created, Failovers: n.failovers, Retargets: n.retargets, Refused: n.refused,
		FragPending: n.frags.count(), FragBytes: n.frags.bytes,
		Reassembled: n.reassembled, Fragmented: n.fragmented, ICMPSent: n.icmpSent,
	}
	n.mu.Unlock()
	for r := range s.Drops {
		s.Drops[r] = n.drops[r].Load()
	}
	return s
}
