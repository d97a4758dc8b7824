package flow

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vipkit/vipkit/internal/syncx"
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
var bindingDropSlot = [NumDropReasons]int8{ // +checklocksignore: never written
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
// backend come from the binding's class. The layout matters: the fields
// are ordered widest first so that they pack into one 64-byte line with
// 3 bytes to spare (TestBindingSize); a new field belongs in bindingCold
// unless the full path reads it on every packet.
type binding struct {
	deadline int64 // idle expiry (active) or end of quarantine, ns since NAT.base
	idle     int64 // current retention, ns

	pktsOut, bytesOut, pktsIn, bytesIn uint64

	class uint32 // class index: listener and backend
	gen   uint32 // health generation last checked (UDP)
	isn   uint32 // the client's SYN sequence number
	state uint8
}

// bindingCold is the rarely used part of a binding, in NAT.cold. Its
// fields are ordered so that it packs into 36 bytes (TestBindingSize bounds
// it at 40), which keeps the whole table within 240 bytes a flow.
type bindingCold struct {
	client               uint32 // C
	clientPort, shadow   uint16
	wheelPrev, wheelNext uint32 // expiry wheel links; wheelNext also links the free list
	wheelBucket          uint32
	drops                [bindingDropSlots]uint32
}

type listenerKey struct {
	vip   uint32
	port  uint16
	proto Proto
}

// listenerState is one listener's configuration and counters. Everything
// in it is guarded by the owning NAT's mu (checklocks cannot name a lock
// in another struct, so its fields carry no annotation).
type listenerState struct {
	listener Listener
	key      listenerKey
	slot     uint32
	backends []Backend
	idle     int64
	removed  bool
	refs     int // bindings (active or quarantined) referring to it

	active, quarantined           int
	created, retargets, failovers uint64
	counters                      Counters

	// byBackend holds the per-backend state of every configured backend and of
	// every removed one that still has bindings (backends.go).
	byBackend map[Backend]*backendState
}

type vipInfo struct {
	listeners, bindings int
	claimed             bool // ClaimVIP: claimed without listeners
}

type unreachReport struct {
	listener Listener
	backend  Backend
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
	// Set by New and not written again: read without the lock. The
	// checklocks analyzer cannot tell immutable fields from guarded ones, so
	// those it would infer a guard for say +checklocksignore.
	o        Options         // +checklocksignore: immutable after New
	local    uint32          // +checklocksignore: immutable after New
	clock    transport.Clock // +checklocksignore: immutable after New
	reserver PortReserver    // +checklocksignore: immutable after New; safe for concurrent use
	base     time.Time       // +checklocksignore: immutable after New
	tickLen  int64           // +checklocksignore: immutable after New; wheel tick, ns

	// Lock-free: read by the prechecks of both sides without mu.
	vips  atomic.Pointer[vipSet] // replaced whole under mu
	gen   atomic.Uint32
	drops [NumDropReasons]atomic.Uint64

	// mu guards the table and the fields annotated with it. Both packet
	// sides and the control methods take it; the sweep takes it on the
	// clock's goroutine.
	mu syncx.Mutex
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	idx index
	// +checklocks:mu
	slots []binding
	// +checklocks:mu
	cold []bindingCold
	// +checklocks:mu
	freeHead uint32 // free list of binding ids through bindingCold.wheelNext
	// +checklocks:mu
	fresh uint32 // ids from here on were never used
	// +checklocks:mu
	classes []bindingClass
	// +checklocks:mu
	classMap map[classKey]uint32
	// +checklocks:mu
	classFree []uint32
	// +checklocks:mu
	log [logSize]logEntry // fast-path packets not yet applied to bindings
	// +checklocks:mu
	logLen int
	// +checklocks:mu
	sweptUntil uint32 // time of the last sweep, in until units
	// +checklocks:mu
	hotLimit uint32 // classes below it use the fast path (classNone; tests lower it)
	// +checklocks:mu
	inUse int // active + quarantined
	// +checklocks:mu
	quarantined int
	// +checklocks:mu
	wheel []uint32
	// +checklocks:mu
	wheelTick int64
	// +checklocks:mu
	listeners []*listenerState
	// +checklocks:mu
	freeListeners []uint32
	// +checklocks:mu
	listenerByKey map[listenerKey]uint32
	// +checklocks:mu
	vipInfo map[uint32]*vipInfo
	// +checklocks:mu
	backendAddrRefs map[uint32]int // bindings per backend address: which peers' fragments to reassemble
	// +checklocks:mu
	frags fragCache
	// +checklocks:mu
	timer transport.Timer
	// +checklocks:mu
	armed bool
	// +checklocks:mu
	scratch []byte
	// +checklocks:mu
	reply []byte // a refusal being built (refuse.go)
	// +checklocks:mu
	sink uint64 // keeps the prefetching loads alive

	// reports[s] is owned by the goroutine driving side s: it appends
	// under mu (an ICMP port unreachable it translated) and delivers
	// them after releasing mu (flushReports), so that the callback never
	// runs under the lock. Neither side touches the other's queue.
	reports [2][]unreachReport

	// Totals, under mu.
	// +checklocks:mu
	created uint64
	// +checklocks:mu
	failovers uint64
	// +checklocks:mu
	retargets uint64
	// +checklocks:mu
	refused uint64
	// +checklocks:mu
	reassembled uint64
	// +checklocks:mu
	fragmented uint64
	// +checklocks:mu
	icmpSent uint64

	// Timeouts (ns), set by New and not written again.
	idleTCP     int64 // +checklocksignore: immutable after New
	idleUDP     int64 // +checklocksignore: immutable after New
	closedTCP   int64 // +checklocksignore: immutable after New
	finTCP      int64 // +checklocksignore: immutable after New
	quarantine  int64 // +checklocksignore: immutable after New
	fragTimeout int64 // +checklocksignore: immutable after New

	// The refusals' token bucket (refuse.go), in ns: the cost of one reply
	// and the burst are set by New; the credit and the time of the last
	// refill change under mu.
	replyCost int64 // +checklocksignore: immutable after New
	replyMax  int64 // +checklocksignore: immutable after New
	// +checklocks:mu
	replyCredit int64
	// +checklocks:mu
	replyAt int64
}

// New returns a NAT for one overlay network. It validates the options
// (errors match ErrInvalidOptions) and allocates the table.
func New(o Options) (*NAT, error) {
	if err := o.normalize(); err != nil {
		return nil, err
	}
	n := &NAT{
		o:               o,
		local:           addr4(o.LocalAddr),
		clock:           transport.Or(o.Clock),
		reserver:        o.Reserver,
		tickLen:         int64(o.SweepInterval),
		listenerByKey:   make(map[listenerKey]uint32),
		vipInfo:         make(map[uint32]*vipInfo),
		backendAddrRefs: make(map[uint32]int),
		classMap:        make(map[classKey]uint32),
		freeHead:        noID,
		hotLimit:        classNone,
	}
	if n.reserver == nil {
		n.reserver = NewMemReserver(MemReserverOptions{})
	}
	n.base = n.clock.Now()
	n.idx = newIndex(2*o.Capacity, rand.Uint64(), rand.Uint64())
	n.slots = make([]binding, o.Capacity)
	adviseHuge(unsafe.Pointer(unsafe.SliceData(n.slots)), uintptr(len(n.slots))*unsafe.Sizeof(binding{}))
	n.cold = make([]bindingCold, o.Capacity)
	adviseHuge(unsafe.Pointer(unsafe.SliceData(n.cold)), uintptr(len(n.cold))*unsafe.Sizeof(bindingCold{}))
	n.wheel = make([]uint32, wheelSize)
	for i := range n.wheel {
		n.wheel[i] = noID
	}
	n.idleTCP, n.idleUDP = int64(o.TCPIdleTimeout), int64(o.UDPIdleTimeout)
	n.closedTCP, n.finTCP, n.quarantine = int64(o.TCPClosedTimeout), int64(o.TCPFinTimeout), int64(o.Quarantine)
	n.fragTimeout = int64(o.FragTimeout)
	n.frags.init(&n.o)
	n.scratch = make([]byte, max(o.MTU, o.HostMTU, 2*packet.IPv4MaxHeaderLen+2*packet.ICMPv4HeaderLen+16))
	n.reply = make([]byte, 0, 2*packet.IPv4MaxHeaderLen+packet.ICMPv4HeaderLen+packet.ICMPv4MinQuoted)
	n.initReplies() // +checklocksignore: n is not shared yet
	return n, nil
}

func addr4(a netip.Addr) uint32 { b := a.As4(); return binary.BigEndian.Uint32(b[:]) }

func addrFrom(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

func (n *NAT) ns(t time.Time) int64 { return int64(t.Sub(n.base)) }

func (n *NAT) timeOf(v int64) time.Time { return n.base.Add(time.Duration(v)) }

// LocalAddr returns Options.LocalAddr.
func (n *NAT) LocalAddr() netip.Addr { return n.o.LocalAddr }

// IsVIP reports whether a is a VIP of a configured listener or of a binding
// that still drains. It is safe to call concurrently and does not lock.
func (n *NAT) IsVIP(a netip.Addr) bool { return a.Is4() && n.vips.Load().has(addr4(a)) }
