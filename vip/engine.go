package vip

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/probe"
	"github.com/vipkit/vipkit/transport"
)

// Engine errors.
var (
	// ErrEngineOptions is another name for ErrInvalidOptions: the same
	// error value, so errors.Is matches either.
	//
	// Deprecated: use ErrInvalidOptions.
	ErrEngineOptions = ErrInvalidOptions
	// ErrEngineClosed is returned by the engine's methods after Close. It
	// matches transport.ErrClosed (and so net.ErrClosed).
	ErrEngineClosed = fmt.Errorf("vip: engine closed: %w", transport.ErrClosed)
)

// Engine defaults.
const (
	// DefaultEngineQueue is the number of packets the engine itself
	// creates (probes, probe replies, fragments, ICMP errors) that may wait
	// for wireguard-go's next Read; beyond it they are dropped and counted.
	DefaultEngineQueue = 1024
	// engineBatches is how many host batches the pump may have read ahead.
	engineBatches = 4
)

// EngineOptions configures NewEngine. Zero fields take their defaults.
type EngineOptions struct {
	// Registry is the network's configuration. Required. The engine reads
	// it (List, Nodes, Limits); whoever builds the Registry wires
	// RegistryOptions.OnChange to Engine.Apply.
	Registry *Registry
	// Self is this node's identity; it must be a member (Registry.Nodes)
	// with an IPv4 overlay address, which becomes the NAT's local address.
	// Required.
	Self NodeID
	// Host is the host's side: a kernel TUN or a gVisor netstack host.
	// Required. The engine owns it: Close closes it.
	Host transport.PacketIO
	// Clock drives probes, checks, flow expiry and the path poll. nil
	// means the real clock.
	Clock transport.Clock
	// Dialer opens the TCP connect checks (over the host's stack: the
	// overlay). nil means a zero net.Dialer.
	Dialer probe.Dialer
	// PathUp is the data-path input of the prober: it reports whether this
	// node has a data path to a peer (for example, the WireGuard peer had a
	// handshake within the last 180 s). nil means always up. It is called
	// from the engine's path timer and must not block.
	PathUp func(NodeID) bool
	// PathInterval is how often PathUp is asked and health changes are
	// passed on to UDP bindings; 0 means the prober's interval.
	PathInterval time.Duration
	// Prober tunes the RTT prober (zero: 1 s / 3 s / 2 misses / 10 s,
	// docs/defaults.md).
	Prober probe.ProberConfig
	// ProbePort is the reserved UDP probe port; 0 means probe.DefaultPort.
	// The engine makes and answers probes itself: host packets to this
	// port of any overlay address are dropped (ProbeTraffic.HostDropped).
	ProbePort uint16
	// UnreachableHold is how long an ICMP port-unreachable excludes a
	// backend; 0 means 10 s.
	UnreachableHold time.Duration
	// CheckTick is the connect checker's worker tick; 0 means 250 ms.
	CheckTick time.Duration
	// Reserver reserves the NAT's shadow ports; nil means an in-memory
	// reserver (use flow.OSReserver on a kernel host, or the netstack
	// host's ReservePort, so that no local socket takes a shadow port).
	Reserver flow.PortReserver
	// Flow, when set, adjusts the NAT's options after the engine fills
	// them in (LocalAddr, Selector, Clock, Emit, OnPortUnreachable, MTU,
	// and the limits from the Registry). Tests use it for short timeouts.
	Flow func(*flow.Options)
	// Queue bounds the engine's own outbound packets; 0 means
	// DefaultEngineQueue.
	Queue int
	// Admit is the network/peer admission of packets from peers to this
	// node, applied before reverse NAT (flow.Options.Admit): from is the
	// authenticated peer (the zero NodeID when the source is no member's
	// address). The engine always requires the source to lie in the
	// overlay range; nil admits every such packet.
	Admit func(from NodeID, src, dst netip.Addr) bool
	// ReadAhead makes the engine read the host from a goroutine of its
	// own, into buffers of its own, up to four batches ahead of Read, even
	// when the host is a transport.ReadInterrupter. Such a host (a kernel
	// TUN from wg.PacketIOFromTUN, a netstack host) is otherwise read
	// straight into Read's buffers, which saves a copy of every outbound
	// packet and a goroutine hand-off per batch. Reading ahead overlaps
	// the host's reads with wireguard-go's encryption, which only pays
	// where cores are to spare. A host that cannot interrupt its Read is
	// always read ahead: engine-made packets must leave while it is idle.
	ReadAhead bool
}

// Engine is the VIP data path of one overlay network at one node: a
// transport.PacketIO wrapper between the host's stack and wireguard-go,
//
//	host stack (Host) ⇄ Engine ⇄ wireguard-go (wg.NewDevice(engine, ...)) ⇄ Bind ⇄ network
//
// the way Tailscale's tstun.Wrapper sits between the OS TUN and
// wireguard-go. It composes the Registry's configuration (crdt), health and
// RTT (probe) and the NAT (flow):
//
//   - Its Read side is what wireguard-go encrypts: host batches, read
//     straight into wireguard-go's buffers (or, see
//     EngineOptions.ReadAhead, by a pump goroutine into the engine's),
//     pass each packet through flow's FromHost;
//     connections to a VIP are bound to the eligible backend with the
//     lowest smoothed RTT (a local backend is hairpinned back into the
//     host with the VIP as source); other traffic passes unchanged. The
//     engine's own packets (probes, probe replies, fragments) are merged in.
//   - Its Write side takes what wireguard-go decrypted: the authenticated
//     peer of a packet is the member whose overlay address is its source
//     (wireguard-go enforces cryptokey routing on receive); probes to this
//     node are answered and replies measured without reaching the host;
//     everything else goes through flow's FromPeer (admission, refusal of
//     VIP sources, reverse NAT) into the host.
//
// Configuration: Apply reads Registry.List and routes only Routable
// services; removed backends, listeners and VIPs stop new bindings while
// existing bindings drain with their original VIP address. A draining UDP
// binding keeps its removed backend until idle expiry as long as the
// backend's path is healthy (it fails over when it is not), so the engine
// keeps probing every peer that draining bindings still use. Whoever builds
// the Registry calls Apply from RegistryOptions.OnChange, which runs after
// the store commit, so a change reaches routing only once it is durable;
// call Apply after membership changes too.
//
// Counters: flow counts user traffic per listener and binding; the engine
// counts pass-through traffic and, apart from both, probe bytes. Status
// reports all of it.
//
// Concurrency: Read and Write follow transport.PacketIO (one goroutine
// each); Apply, Status and DNSOptions may be called from any goroutine.
// Close stops the host reads, the prober, the checker and the NAT and
// closes the host; it is idempotent. A new Engine on the same Registry
// starts with no bindings and the same configuration.
type Engine struct {
	o         EngineOptions
	reg       *Registry
	clock     transport.Clock
	host      transport.PacketIO
	self      NodeID
	selfAddr  netip.Addr
	prefix    netip.Prefix
	local4    uint32
	probePort uint16
	pathEvery time.Duration // +checklocksignore: immutable after NewEngine

	nat       *flow.NAT
	prober    *probe.Prober
	driver    *probe.Driver
	responder probe.Responder
	unreach   *probe.Unreachable
	checker   *probe.Checker
	selector  probe.Selector

	peers  atomic.Pointer[peerTable]
	routes atomic.Pointer[routeTable]

	// Selector scratch. flow calls the selector with the NAT's lock held,
	// which serializes its use (a lock of another package, which
	// checklocks cannot name).
	selStatus   []probe.Status
	selBackends []probe.Backend

	// cfgMu guards the applied configuration: Apply, the path poll and
	// Close take it.
	cfgMu syncx.Mutex
	// +checklocks:cfgMu
	peerIDs map[NodeID]flow.PeerID
	// +checklocks:cfgMu
	nextPeer flow.PeerID
	// +checklocks:cfgMu
	applied map[flow.Listener]*route
	// +checklocks:cfgMu
	draining map[flow.Listener]*route
	// +checklocks:cfgMu
	vips map[netip.Addr]bool // VIPs claimed in the NAT (flow.NAT.ClaimVIP), listeners or not
	// +checklocks:cfgMu
	subs map[subKey]*probe.Subscription
	// +checklocks:cfgMu
	used map[NodeID]bool // peers of configured backends
	// +checklocks:cfgMu
	probed map[NodeID]bool
	// +checklocks:cfgMu
	eligible map[NodeID]bool
	// +checklocks:cfgMu
	applyErr error
	// +checklocks:cfgMu
	closed bool

	// Packet path. On a host that is a transport.ReadInterrupter (direct
	// is set), the caller of Read (wireguard-go's one TUN reader) reads
	// the host straight into its own buffers and translates them there
	// (reflect, directPkts, directRes); engine-made packets set pending
	// and, while reading says a host Read may be blocked, interrupt it.
	// On any other host a pump goroutine reads ahead into batches of its
	// own (reflect; it fills batches from free into full) and Read copies
	// them out (readBatch, readPos). The caller of Write owns writeOut,
	// writeRun, writeRunBufs and writeResults (wireguard-go serializes
	// its writes). hostMu is taken around every Host.Write.
	mtu          int
	direct       transport.ReadInterrupter // the host, if it can interrupt its Read
	reading      atomic.Bool               // a direct Read is in, or about to enter, Host.Read
	pending      atomic.Int64              // packets in inject (counted after the send, so briefly < 0)
	directPkts   [][]byte                  // Read's goroutine, direct: the NAT batch call's views
	directRes    []flow.Result             // Read's goroutine, direct: its results
	free         chan *batch
	full         chan *batch
	readBatch    *batch                       // Read's goroutine, pumped
	readPos      int                          // Read's goroutine, pumped
	inject       chan []byte                  // engine-made packets toward the overlay
	hostQ        chan []byte                  // engine-made packets toward the host (flow's Emit)
	hostMu       syncx.Mutex                  // serializes Host.Write; guards no field
	writeOut     [][]byte                     // Write's goroutine: its scratch
	writeRun     [][]byte                     // Write's goroutine: a run of one peer's packets (views)
	writeRunBufs [][]byte                     // Write's goroutine: the same run's whole buffers
	writeResults []flow.Result                // Write's goroutine: the NAT's results for a run
	replyBuckets map[flow.PeerID]*replyBucket // Write's goroutine: probe replies per peer (engine_probe.go)
	reflect      [][]byte                     // the host reader's goroutine (pump or direct Read): hairpinned packets of a batch
	done         chan struct{}
	pumpDone     chan struct{}
	hostErr      atomic.Pointer[error]
	hostDead     chan struct{}
	deadOnce     sync.Once
	once         sync.Once

	// The path tick's scratch: only the tick (one at a time, from the
	// path timer) uses them.
	pathIDs []NodeID // +checklocksignore: the path tick's own
	pathUps []bool   // +checklocksignore: the path tick's own

	pathMu syncx.Mutex
	// +checklocks:pathMu
	pathTimer transport.Timer

	// Per-VIP totals (status.go). totalsMu is a leaf lock: it is taken inside
	// the NAT's lock (listenerGone), so nothing holding it calls the NAT.
	totalsMu syncx.Mutex
	// +checklocks:totalsMu
	listenerService map[flow.Listener]ServiceID // the service of every listener the NAT has
	// +checklocks:totalsMu
	carried map[ServiceID]*vipCarry // counts of the services' listeners the NAT forgot
	// services is only touched with both cfgMu and totalsMu held.
	// +checklocks:cfgMu
	// +checklocks:totalsMu
	services  map[ServiceID]bool // the services of the last Apply
	totalsGen atomic.Uint64      // counts listenerGone calls: Status retries across one

	counters engineCounters
}

var (
	_ transport.PacketIO = (*Engine)(nil)
	_ flow.Selector      = (*engineSelector)(nil)
)

type engineCounters struct {
	passOutPkts, passOutBytes   atomic.Uint64 // host → overlay, not NAT traffic
	passInPkts, passInBytes     atomic.Uint64 // overlay → host, not NAT traffic
	probeOutPkts, probeOutBytes atomic.Uint64 // probe requests and replies this engine sent
	probeInPkts, probeInBytes   atomic.Uint64 // probe packets received
	probeBad                    atomic.Uint64 // probe packets refused (malformed, unknown peer, late, over a peer's reply rate)
	hostProbe                   atomic.Uint64 // host packets to an overlay address's probe port, dropped
	queueFull                   atomic.Uint64 // engine-made packets dropped: queue full
	tooBig                      atomic.Uint64 // packets larger than wireguard-go's buffer
	unknownPeer                 atomic.Uint64 // packets from a source that is no member's address
	hostWriteErr                atomic.Uint64 // host writes that failed
	malformed                   atomic.Uint64 // packets from peers that are neither IPv4 nor IPv6
}

// batch is one read from the host.
type batch struct {
	bufs  [][]byte
	sizes []int
	n     int
	// pkts and res are the NAT batch call's views and results, kept with
	// the batch so that the packet path allocates nothing.
	pkts [][]byte
	res  []flow.Result
}

// peerTable maps overlay addresses to the compact peer ids the NAT uses.
type peerTable struct {
	byAddr map[uint32]flow.PeerID
	node   map[flow.PeerID]NodeID
	addr   map[NodeID]netip.Addr
	name   map[NodeID]string // members', and departed nodes' former names
	member map[NodeID]bool
}

// unknownPeer is the peer id of packets whose source is no member's address.
const unknownPeer = flow.PeerID(^uint64(0))

// route is one listener as applied to the NAT.
type route struct {
	svc      ServiceID
	name     string
	key      PortKey
	gen      uint64
	fl       flow.Listener
	cfg      []Backend      // the configured backends that resolved
	backends []flow.Backend // aligned with cfg
	pbs      []probe.Backend
	missing  []Backend // configured backends whose node has no address
	idle     time.Duration
	err      error
}

type routeTable struct {
	m map[flow.Listener]*route
}

type subKey struct {
	fl  flow.Listener
	b   flow.Backend
	cfg probe.CheckConfig
}

// NewEngine starts an engine: the NAT, the prober and its driver, the
// connect checker, the path poll and (when the engine reads ahead, see
// EngineOptions.ReadAhead) the host pump, and applies the
// Registry's current configuration. Hand the engine to wg.NewDevice as its
// PacketIO.
func NewEngine(o EngineOptions) (*Engine, error) {
	if o.Registry == nil || o.Host == nil {
		return nil, fmt.Errorf("%w: Registry and Host are required", ErrInvalidOptions)
	}
	if o.PathInterval < 0 || o.UnreachableHold < 0 || o.CheckTick < 0 || o.Queue < 0 {
		return nil, fmt.Errorf("%w: negative duration or queue", ErrInvalidOptions)
	}
	var selfAddr netip.Addr
	for _, n := range o.Registry.Nodes() {
		if n.ID == o.Self {
			selfAddr = n.Addr
		}
	}
	if !selfAddr.Is4() {
		return nil, fmt.Errorf("%w: self %s is not a member with an IPv4 overlay address", ErrInvalidOptions, o.Self.String()[:12])
	}
	if o.ProbePort == 0 {
		o.ProbePort = probe.DefaultPort
	}
	if o.Queue == 0 {
		o.Queue = DefaultEngineQueue
	}
	e := &Engine{
		o: o, reg: o.Registry, clock: transport.Or(o.Clock), host: o.Host,
		self: o.Self, selfAddr: selfAddr, prefix: o.Registry.Prefix().Masked(), probePort: o.ProbePort,
		peerIDs: map[NodeID]flow.PeerID{}, nextPeer: 1,
		applied: map[flow.Listener]*route{}, draining: map[flow.Listener]*route{},
		subs: map[subKey]*probe.Subscription{}, probed: map[NodeID]bool{}, eligible: map[NodeID]bool{},
		listenerService: map[flow.Listener]ServiceID{}, carried: map[ServiceID]*vipCarry{}, services: map[ServiceID]bool{},
		mtu:    o.Host.MTU(),
		inject: make(chan []byte, o.Queue), hostQ: make(chan []byte, o.Queue),
		done: make(chan struct{}), pumpDone: make(chan struct{}), hostDead: make(chan struct{}),
	}
	a4 := selfAddr.As4()
	e.local4 = binary.BigEndian.Uint32(a4[:])
	e.responder.Port = o.ProbePort
	e.routes.Store(&routeTable{m: map[flow.Listener]*route{}})
	e.peers.Store(&peerTable{byAddr: map[uint32]flow.PeerID{}, node: map[flow.PeerID]NodeID{}, addr: map[NodeID]netip.Addr{}, name: map[NodeID]string{}})

	var err error
	if e.prober, err = probe.NewProber(o.Prober); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	e.pathEvery = o.PathInterval
	if e.pathEvery == 0 {
		e.pathEvery = e.prober.Config().Interval
	}
	if e.unreach, err = probe.NewUnreachable(probe.UnreachableConfig{Hold: o.UnreachableHold, MaxEntries: o.Registry.Limits().FlowReservations}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	e.selector = probe.Selector{Prober: e.prober, Unreachable: e.unreach}
	lim := o.Registry.Limits()
	fo := flow.Options{
		LocalAddr:          selfAddr,
		Selector:           (*engineSelector)(e),
		Reserver:           o.Reserver,
		Clock:              e.clock,
		Emit:               e.emit,
		OnPortUnreachable:  e.portUnreachable,
		MTU:                e.mtu,
		Capacity:           lim.FlowReservations,
		MaxFragDatagrams:   lim.IncompleteDatagrams,
		MaxBackends:        lim.BackendsPerListener,
		MaxListenersPerVIP: lim.Listeners,
		Admit:              e.admit,
		OnListenerGone:     e.listenerGone,
	}
	if o.Flow != nil {
		o.Flow(&fo)
	}
	if e.nat, err = flow.New(fo); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	dialer := o.Dialer
	if dialer == nil {
		dialer = &net.Dialer{}
	}
	if e.checker, err = probe.NewChecker(probe.CheckerConfig{Clock: e.clock, Dialer: dialer, MaxChecks: lim.ActiveTCPChecks, Tick: o.CheckTick}); err != nil {
		e.nat.Close()
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}

	bsize := o.Host.BatchSize()
	if ri, ok := o.Host.(transport.ReadInterrupter); ok && !o.ReadAhead {
		e.direct = ri
		e.directPkts, e.directRes = make([][]byte, bsize), make([]flow.Result, bsize)
	} else {
		e.free = make(chan *batch, engineBatches)
		e.full = make(chan *batch, engineBatches)
		for range engineBatches {
			b := &batch{bufs: make([][]byte, bsize), sizes: make([]int, bsize), pkts: make([][]byte, bsize), res: make([]flow.Result, bsize)}
			for i := range b.bufs {
				b.bufs[i] = make([]byte, e.mtu)
			}
			e.free <- b
		}
	}
	e.writeOut = make([][]byte, 0, bsize)
	e.reflect = make([][]byte, 0, bsize)

	e.Apply()
	e.driver = e.prober.Drive(e.clock, e.sendProbe)
	e.pathMu.Lock()
	e.pathTimer = e.clock.AfterFunc(e.pathEvery, e.pathTick)
	e.pathMu.Unlock()
	if e.direct != nil {
		close(e.pumpDone)
	} else {
		go e.pump()
	}
	return e, nil
}

// LocalAddr returns this node's overlay address (the NAT's local address).
func (e *Engine) LocalAddr() netip.Addr { return e.selfAddr }

// ProbePort returns the UDP probe port the engine makes and answers probes
// on. Proxies into the overlay refuse it: a host process sending there
// would speak as this node, and the engine drops what they send anyway.
func (e *Engine) ProbePort() uint16 { return e.probePort }

// Registry returns the engine's Registry.
func (e *Engine) Registry() *Registry { return e.reg }

// NAT returns the engine's flow table, for inspection (bindings, stats).
// Do not configure it directly: Apply owns its listeners.
func (e *Engine) NAT() *flow.NAT { return e.nat }

// Prober returns the engine's RTT prober, for inspection.
func (e *Engine) Prober() *probe.Prober { return e.prober }

// BatchSize implements transport.PacketIO: the host's batch size.
func (e *Engine) BatchSize() int { return e.host.BatchSize() }

// MTU implements transport.PacketIO: the host's MTU.
func (e *Engine) MTU() int { return e.mtu }

// Close stops the engine and releases its state and sockets: the path
// poll, the prober's driver, the connect checker and its subscriptions,
// every NAT binding and shadow port, and the host (which ends the pump, or
// unblocks a Read waiting in the host).
// It is idempotent and safe to call concurrently with Read and Write, which
// then return ErrEngineClosed.
func (e *Engine) Close() error {
	e.once.Do(func() {
		close(e.done)
		e.pathMu.Lock()
		e.pathTimer.Stop()
		e.pathMu.Unlock()
		e.driver.Close()
		e.cfgMu.Lock()
		e.closed = true
		for k, s := range e.subs {
			s.Release()
			delete(e.subs, k)
		}
		e.cfgMu.Unlock()
		e.checker.Close()
		e.nat.Close()
		e.host.Close()
		<-e.pumpDone
	})
	return nil
}

func (e *Engine) isClosed() bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// DNSOptions returns the options of the network's DNS responder: the
// network's domain, Lookup resolving node names to their overlay addresses
// (they take precedence) and the names of routable services without a
// name conflict to their effective VIP address, and Allow admitting only
// sources in the overlay range.
func (e *Engine) DNSOptions() DNSOptions {
	prefix := e.reg.Prefix()
	return DNSOptions{
		Domain: e.reg.Network(),
		Lookup: e.reg.Lookup,
		Allow:  func(src netip.Addr) bool { return prefix.Contains(src.Unmap()) },
	}
}
