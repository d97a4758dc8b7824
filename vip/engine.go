package vip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/packet"
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
	// Prober tunes the RTT prober (zero: the spec's 1 s / 3 s / 2 misses /
	// 10 s).
	Prober probe.ProberConfig
	// ProbePort is the reserved UDP probe port; 0 means probe.DefaultPort.
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
//   - Its Read side is what wireguard-go encrypts: a pump goroutine reads
//     the host in batches and passes each packet through flow's FromHost;
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
// Close stops the pump, the prober, the checker and the NAT and closes the
// host; it is idempotent. A new Engine on the same Registry starts with no
// bindings and the same configuration.
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
	pathEvery time.Duration

	nat       *flow.NAT
	prober    *probe.Prober
	driver    *probe.Driver
	responder probe.Responder
	unreach   *probe.Unreachable
	checker   *probe.Checker
	sel       probe.Selector

	peers  atomic.Pointer[peerTable]
	routes atomic.Pointer[routeTable]

	// Selector scratch, used only under the NAT's lock.
	selStatus   []probe.Status
	selBackends []probe.Backend

	cfgMu    sync.Mutex
	peerIDs  map[NodeID]flow.PeerID
	nextPeer flow.PeerID
	applied  map[flow.Listener]*route
	draining map[flow.Listener]*route
	vips     map[netip.Addr]bool // VIPs claimed in the NAT (flow.NAT.ClaimVIP), listeners or not
	subs     map[subKey]*probe.Subscription
	used     map[NodeID]bool // peers of configured backends
	probed   map[NodeID]bool
	eligible map[NodeID]bool
	applyErr error
	closed   bool

	// Packet path.
	mtu      int
	free     chan *batch
	full     chan *batch
	cur      *batch
	curPos   int
	inject   chan []byte   // engine-made packets toward the overlay
	hostQ    chan []byte   // engine-made packets toward the host (flow's Emit)
	hostMu   sync.Mutex    // serializes Host.Write
	wout     [][]byte      // Write's scratch
	wrun     [][]byte      // Write's run of one peer's packets (views)
	wrunBufs [][]byte      // the same run's whole buffers
	wres     []flow.Result // the NAT's results for a run
	reflect  [][]byte      // the pump's scratch
	done     chan struct{}
	pumpDone chan struct{}
	hostErr  atomic.Pointer[error]
	hostDead chan struct{}
	deadOnce sync.Once
	once     sync.Once

	pathMu    sync.Mutex
	pathTimer transport.Timer

	// Per-VIP totals (status.go). totMu is a leaf lock: it is taken inside
	// the NAT's lock (listenerGone), so nothing holding it calls the NAT.
	totMu    sync.Mutex
	flSvc    map[flow.Listener]ServiceID // the service of every listener the NAT has
	carried  map[ServiceID]*vipCarry     // counts of the services' listeners the NAT forgot
	services map[ServiceID]bool          // the services of the last Apply
	totGen   atomic.Uint64               // counts listenerGone calls: Status retries across one

	c engineCounters
}

var (
	_ transport.PacketIO = (*Engine)(nil)
	_ flow.Selector      = (*engineSelector)(nil)
)

type engineCounters struct {
	passOutPkts, passOutBytes atomic.Uint64 // host → overlay, not NAT traffic
	passInPkts, passInBytes   atomic.Uint64 // overlay → host, not NAT traffic
	probeOutPkts, probeOutB   atomic.Uint64 // probe requests and replies this engine sent
	probeInPkts, probeInB     atomic.Uint64 // probe packets received
	probeBad                  atomic.Uint64 // probe packets refused (malformed, unknown peer, late)
	queueFull                 atomic.Uint64 // engine-made packets dropped: queue full
	tooBig                    atomic.Uint64 // packets larger than wireguard-go's buffer
	unknownPeer               atomic.Uint64 // packets from a source that is no member's address
	hostWriteErr              atomic.Uint64 // host writes that failed
	malformed                 atomic.Uint64 // packets from peers that are neither IPv4 nor IPv6
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
// connect checker, the path poll and the host pump, and applies the
// Registry's current configuration. Hand the engine to wg.NewDevice as its
// PacketIO.
func NewEngine(o EngineOptions) (*Engine, error) {
	if o.Registry == nil || o.Host == nil {
		return nil, fmt.Errorf("%w: Registry and Host are required", ErrEngineOptions)
	}
	if o.PathInterval < 0 || o.UnreachableHold < 0 || o.CheckTick < 0 || o.Queue < 0 {
		return nil, fmt.Errorf("%w: negative duration or queue", ErrEngineOptions)
	}
	var selfAddr netip.Addr
	for _, n := range o.Registry.Nodes() {
		if n.ID == o.Self {
			selfAddr = n.Addr
		}
	}
	if !selfAddr.Is4() {
		return nil, fmt.Errorf("%w: self %s is not a member with an IPv4 overlay address", ErrEngineOptions, o.Self.String()[:12])
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
		flSvc: map[flow.Listener]ServiceID{}, carried: map[ServiceID]*vipCarry{}, services: map[ServiceID]bool{},
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
		return nil, fmt.Errorf("%w: %w", ErrEngineOptions, err)
	}
	e.pathEvery = o.PathInterval
	if e.pathEvery == 0 {
		e.pathEvery = e.prober.Config().Interval
	}
	if e.unreach, err = probe.NewUnreachable(probe.UnreachableConfig{Hold: o.UnreachableHold, MaxEntries: o.Registry.Limits().FlowReservations}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEngineOptions, err)
	}
	e.sel = probe.Selector{Prober: e.prober, Unreachable: e.unreach}
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
		return nil, fmt.Errorf("%w: %w", ErrEngineOptions, err)
	}
	dialer := o.Dialer
	if dialer == nil {
		dialer = &net.Dialer{}
	}
	if e.checker, err = probe.NewChecker(probe.CheckerConfig{Clock: e.clock, Dialer: dialer, MaxChecks: lim.ActiveTCPChecks, Tick: o.CheckTick}); err != nil {
		e.nat.Close()
		return nil, fmt.Errorf("%w: %w", ErrEngineOptions, err)
	}

	bsize := o.Host.BatchSize()
	e.free = make(chan *batch, engineBatches)
	e.full = make(chan *batch, engineBatches)
	for range engineBatches {
		b := &batch{bufs: make([][]byte, bsize), sizes: make([]int, bsize), pkts: make([][]byte, bsize), res: make([]flow.Result, bsize)}
		for i := range b.bufs {
			b.bufs[i] = make([]byte, e.mtu)
		}
		e.free <- b
	}
	e.wout = make([][]byte, 0, bsize)
	e.reflect = make([][]byte, 0, bsize)

	e.Apply()
	e.driver = e.prober.Drive(e.clock, e.sendProbe)
	e.pathMu.Lock()
	e.pathTimer = e.clock.AfterFunc(e.pathEvery, e.pathTick)
	e.pathMu.Unlock()
	go e.pump()
	return e, nil
}

// LocalAddr returns this node's overlay address (the NAT's local address).
func (e *Engine) LocalAddr() netip.Addr { return e.selfAddr }

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
// every NAT binding and shadow port, and the host (which ends the pump).
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

// ---- configuration ----

// Apply brings routing in line with the Registry: the peer table from
// Registry.Nodes, and every listener of every Routable service from
// Registry.List. Every routed VIP address is claimed in the NAT, so that
// one without listeners, like a listener without backends, refuses new
// flows at once (a RST or an ICMP port unreachable, see docs/empty-vips.md)
// instead of dropping them silently. Listeners, backends and VIP addresses that went away stop
// taking new bindings; their existing bindings drain until idle expiry with
// their original VIP address. Connect-check subscriptions and probed peers
// follow the backends in use. Call it from RegistryOptions.OnChange (it
// reads the Registry and never calls its mutating methods) and after
// membership changes. It returns the problems of listeners the NAT or the
// checker refused (also reported in Status), or ErrEngineClosed after
// Close.
func (e *Engine) Apply() error {
	e.cfgMu.Lock()
	defer e.cfgMu.Unlock()
	if e.closed {
		return ErrEngineClosed
	}
	now := e.clock.Now()
	pt := e.buildPeers()
	e.peers.Store(pt)

	desired := map[flow.Listener]*route{}
	usedPeers := map[NodeID]bool{}
	newSubs := map[subKey]*probe.Subscription{}
	services := map[ServiceID]bool{}
	vips := map[netip.Addr]bool{}
	var errs []error
	for _, v := range e.reg.List() {
		services[v.ID] = true
		if !v.Routable || !v.Addr.Is4() {
			continue
		}
		vips[v.Addr] = true
		for _, l := range v.Listeners {
			fl := flow.Listener{VIP: v.Addr, Proto: flow.Proto(l.Proto), Port: l.Port}
			r := &route{svc: v.ID, name: v.Name, key: l.Key(), gen: l.Generation, fl: fl, idle: time.Duration(l.IdleTimeout)}
			chk := l.Check.Effective()
			for _, b := range l.Backends {
				addr, ok := pt.addr[b.Node]
				if !ok || !addr.Is4() {
					r.missing = append(r.missing, b)
					continue
				}
				local := b.Node == e.self
				fb := flow.Backend{Peer: flow.LocalPeer, Addr: e.selfAddr, Port: b.Port}
				if !local {
					fb = flow.Backend{Peer: e.peerIDs[b.Node], Addr: addr, Port: b.Port}
					usedPeers[b.Node] = true
				}
				// A draining backend stays a NAT candidate (configured: its
				// counters go on), but the selector never picks it for a new
				// binding; Available ignores the flag, so bindings it has go
				// on (docs/backend-drain.md).
				pb := probe.Backend{Node: probe.NodeID(b.Node), Local: local, Proto: uint8(l.Proto), Addr: fb.AddrPort(), Disabled: l.Draining(b)}
				if l.Proto == TCP && l.Check.Enabled() {
					cc := probe.CheckConfig{Interval: time.Duration(chk.Interval), Timeout: time.Duration(chk.Timeout), Failures: chk.Failures, Successes: chk.Successes}
					k := subKey{fl: fl, b: fb, cfg: cc}
					sub := newSubs[k]
					if sub == nil {
						sub = e.subs[k]
					}
					if sub == nil {
						var err error
						sub, err = e.checker.Acquire(probe.CheckKey{Network: e.reg.Network(), Node: probe.NodeID(b.Node), Addr: fb.AddrPort()}, cc)
						if err != nil {
							r.err = errors.Join(r.err, fmt.Errorf("vip: connect check of %s on %s: %w", b, l.Key(), err))
						}
					}
					if sub != nil {
						newSubs[k] = sub
						pb.Check = sub
					}
				}
				r.cfg = append(r.cfg, b)
				r.backends = append(r.backends, fb)
				r.pbs = append(r.pbs, pb)
			}
			desired[fl] = r
		}
	}
	// The totals' listener → service map gains the new listeners before
	// the NAT has them (a removed listener keeps its entry until the NAT
	// forgets it: listenerGone).
	e.totMu.Lock()
	for fl, r := range desired {
		e.flSvc[fl] = r.svc
	}
	e.services = services
	e.totMu.Unlock()
	// Publish the new selection state first, so that the NAT's next Select
	// sees the new backends' health inputs, then the listeners.
	e.routes.Store(&routeTable{m: desired})
	// Remove first, so that a listener replaced on the same VIP never
	// counts twice against the per-VIP listener limit.
	for fl, r := range e.applied {
		if _, ok := desired[fl]; !ok {
			e.nat.RemoveListener(fl)
			e.draining[fl] = r
		}
	}
	for fl, r := range desired {
		if err := e.nat.SetListener(fl, flow.ListenerConfig{Backends: r.backends, IdleTimeout: r.idle}); err != nil {
			r.err = errors.Join(r.err, err)
		}
		if r.err != nil {
			errs = append(errs, fmt.Errorf("vip: %s %s: %w", r.name, r.key, r.err))
		}
		delete(e.draining, fl)
	}
	e.applied = desired
	// Every routed VIP is claimed, so that an empty one (no listener)
	// refuses its traffic like a port without a listener.
	for a := range e.vips {
		if !vips[a] {
			e.nat.ReleaseVIP(a)
		}
	}
	for a := range vips {
		if err := e.nat.ClaimVIP(a); err != nil {
			errs = append(errs, fmt.Errorf("vip: VIP %v: %w", a, err))
			delete(vips, a)
		}
	}
	e.vips = vips
	for k, s := range e.subs {
		if newSubs[k] != s {
			s.Release()
		}
	}
	e.subs = newSubs
	e.used = usedPeers
	errs = append(errs, e.syncProbedLocked(now)...)
	e.pruneDrainingLocked()
	e.pruneTotals()
	e.applyErr = errors.Join(errs...)
	e.nat.HealthChanged()
	return e.applyErr
}

// buildPeers assigns stable compact peer ids to members and maps their
// overlay addresses. Called with cfgMu held.
func (e *Engine) buildPeers() *peerTable {
	pt := &peerTable{byAddr: map[uint32]flow.PeerID{}, node: map[flow.PeerID]NodeID{}, addr: map[NodeID]netip.Addr{}, name: map[NodeID]string{}, member: map[NodeID]bool{}}
	if e.reg.o.FormerNodes != nil {
		for _, n := range e.reg.o.FormerNodes() {
			pt.name[n.ID] = n.Name
		}
	}
	for _, n := range e.reg.Nodes() {
		pt.name[n.ID] = n.Name
		pt.member[n.ID] = true
		if n.ID == e.self {
			pt.addr[n.ID] = e.selfAddr
			continue
		}
		id, ok := e.peerIDs[n.ID]
		if !ok {
			id = e.nextPeer
			e.nextPeer++
			e.peerIDs[n.ID] = id
		}
		pt.node[id] = n.ID
		if n.Addr.Is4() {
			pt.addr[n.ID] = n.Addr
			a := n.Addr.As4()
			pt.byAddr[binary.BigEndian.Uint32(a[:])] = id
		}
	}
	return pt
}

// syncProbedLocked makes the prober track exactly the peers of configured
// backends and the peers that removed backends' active bindings still
// use: a draining UDP binding keeps its backend while the backend's path is
// healthy, which only probing tells. Called with cfgMu held.
func (e *Engine) syncProbedLocked(now time.Time) []error {
	want := make(map[NodeID]bool, len(e.used))
	for id := range e.used {
		want[id] = true
	}
	pt := e.peers.Load()
	for _, b := range e.nat.DrainingBackends() {
		if b.Backend.Peer == flow.LocalPeer {
			continue
		}
		if id, ok := pt.node[b.Backend.Peer]; ok {
			want[id] = true
		}
	}
	var errs []error
	for id := range want {
		if !e.probed[id] {
			if err := e.prober.AddPeer(probe.NodeID(id), now); err != nil {
				errs = append(errs, fmt.Errorf("vip: probe %s: %w", id.String()[:12], err))
				continue
			}
			e.probed[id] = true
		}
	}
	for id := range e.probed {
		if !want[id] {
			e.prober.RemovePeer(probe.NodeID(id))
			delete(e.probed, id)
			delete(e.eligible, id)
		}
	}
	return errs
}

// pruneDrainingLocked forgets removed listeners whose bindings are gone.
func (e *Engine) pruneDrainingLocked() {
	for fl := range e.draining {
		if _, ok := e.nat.ListenerStats(fl); !ok {
			delete(e.draining, fl)
		}
	}
}

// pathTick passes the data-path input to the prober and tells the NAT when
// a peer's eligibility changed, so that UDP bindings fail over.
func (e *Engine) pathTick() {
	if e.isClosed() {
		return
	}
	now := e.clock.Now()
	changed := false
	e.cfgMu.Lock()
	_ = e.syncProbedLocked(now) // no peer is added here: draining peers were probed
	e.pruneTotals()
	for id := range e.probed {
		if e.o.PathUp != nil {
			_ = e.prober.SetPath(probe.NodeID(id), e.o.PathUp(id))
		}
		el := e.prober.Health(probe.NodeID(id), now).Eligible()
		if prev, ok := e.eligible[id]; !ok || prev != el {
			e.eligible[id] = el
			changed = true
		}
	}
	e.pruneDrainingLocked()
	e.cfgMu.Unlock()
	if changed {
		e.nat.HealthChanged()
	}
	e.pathMu.Lock()
	if !e.isClosed() {
		e.pathTimer.Reset(e.pathEvery)
	}
	e.pathMu.Unlock()
}

// admit is flow's Admit: the source must be in the overlay range, then the
// caller's rule applies.
func (e *Engine) admit(peer flow.PeerID, src, dst netip.Addr) bool {
	if !e.prefix.Contains(src) {
		return false
	}
	if e.o.Admit == nil {
		return true
	}
	return e.o.Admit(e.peers.Load().node[peer], src, dst)
}

// ---- selection (flow.Selector) ----

// engineSelector is the Engine seen as flow's Selector: flow calls it with
// its lock held, which serializes the use of the scratch slices.
type engineSelector Engine

func (s *engineSelector) Select(req flow.SelectRequest) int {
	e := (*Engine)(s)
	bs := e.backendsFor(req.Listener, req.Candidates)
	var i int
	e.selStatus, i = e.sel.Select(bs, req.Now, e.selStatus[:0])
	return i
}

func (s *engineSelector) Available(l flow.Listener, b flow.Backend, now time.Time) bool {
	e := (*Engine)(s)
	pb := e.probeBackend(l, b)
	pb.Disabled = false // a draining backend keeps the bindings it has
	return e.sel.Evaluate(&pb, now).Eligible()
}

// backendsFor returns the probe view of cands: the route's own slice when
// the NAT's candidates are the applied ones (always, but for a change in
// flight), else one built in the scratch slice.
func (e *Engine) backendsFor(l flow.Listener, cands []flow.Backend) []probe.Backend {
	r := e.routes.Load().m[l]
	if r != nil && slices.Equal(r.backends, cands) {
		return r.pbs
	}
	e.selBackends = e.selBackends[:0]
	for _, c := range cands {
		e.selBackends = append(e.selBackends, e.probeBackend(l, c))
	}
	return e.selBackends
}

// probeBackend returns the probe view of backend b of listener l.
func (e *Engine) probeBackend(l flow.Listener, b flow.Backend) probe.Backend {
	if r := e.routes.Load().m[l]; r != nil {
		for i := range r.backends {
			if r.backends[i] == b {
				return r.pbs[i]
			}
		}
	}
	pb := probe.Backend{Local: b.Peer == flow.LocalPeer, Proto: uint8(l.Proto), Addr: b.AddrPort()}
	if b.Peer == flow.LocalPeer {
		pb.Node = probe.NodeID(e.self)
	} else {
		pb.Node = probe.NodeID(e.peers.Load().node[b.Peer])
	}
	return pb
}

// portUnreachable is flow's OnPortUnreachable: the backend is excluded for
// UnreachableHold (flow then re-asks Available of UDP bindings).
func (e *Engine) portUnreachable(l flow.Listener, b flow.Backend) {
	pb := e.probeBackend(l, b)
	_, _ = e.unreach.Report(probe.UnreachableKey{Node: pb.Node, Proto: pb.Proto, Addr: pb.Addr}, e.clock.Now())
}

// ---- packet path ----

// emit is flow's Emit: it copies the packet to the queue of its direction.
func (e *Engine) emit(dir flow.Direction, pkt []byte) {
	q := e.inject
	if dir == flow.ToHost {
		q = e.hostQ
	}
	select {
	case q <- append([]byte(nil), pkt...):
	default:
		e.c.queueFull.Add(1)
	}
}

// injectOverlay queues an engine-made packet for wireguard-go.
func (e *Engine) injectOverlay(pkt []byte) bool {
	select {
	case e.inject <- pkt:
		return true
	default:
		e.c.queueFull.Add(1)
		return false
	}
}

// sendProbe is the prober driver's send: a probe request through the
// tunnel to the peer's overlay address.
func (e *Engine) sendProbe(p probe.Probe) {
	addr, ok := e.peers.Load().addr[NodeID(p.Peer)]
	if !ok {
		return
	}
	pkt, err := p.AppendIPv4(make([]byte, 0, probe.PacketLen), e.selfAddr, addr, e.probePort)
	if err != nil {
		return
	}
	if e.injectOverlay(pkt) {
		e.c.probeOutPkts.Add(1)
		e.c.probeOutB.Add(uint64(len(pkt)))
	}
}

// pump reads the host in batches, runs each packet through the NAT and
// hands what goes to the overlay to Read.
func (e *Engine) pump() {
	defer close(e.pumpDone)
	for {
		var b *batch
		select {
		case b = <-e.free:
		case <-e.done:
			return
		}
		n, err := e.host.Read(b.bufs, b.sizes, 0)
		b.n = 0
		if n > 0 {
			e.fromHost(b, n)
		}
		if b.n > 0 {
			select {
			case e.full <- b:
			case <-e.done:
				return
			}
		} else {
			e.free <- b
		}
		if err != nil {
			// Like wireguard-go's TUN reader, a read error ends the
			// pump: Read then reports it.
			e.hostErr.Store(&err)
			e.deadOnce.Do(func() { close(e.hostDead) })
			return
		}
	}
}

// fromHost translates the n packets read into b: overlay-bound ones stay
// (compacted to the front), hairpinned ones are written back to the host.
func (e *Engine) fromHost(b *batch, n int) {
	now := e.clock.Now()
	k := 0
	var passPkts, passBytes uint64
	e.reflect = e.reflect[:0]
	// One batch call: at large flow tables the NAT overlaps the cache
	// misses of a batch's lookups (flow's BenchmarkTranslate *-batch64).
	if len(b.pkts) < n {
		b.pkts, b.res = make([][]byte, len(b.bufs)), make([]flow.Result, len(b.bufs))
	}
	for i := 0; i < n; i++ {
		b.pkts[i] = b.bufs[i][:b.sizes[i]]
	}
	e.nat.FromHostBatch(b.pkts[:n], now, b.res[:n])
	for i := 0; i < n; i++ {
		size := b.sizes[i]
		pkt := b.pkts[i]
		switch r := b.res[i]; r.Verdict {
		case flow.Pass:
			passPkts++
			passBytes += uint64(size)
			fallthrough
		case flow.Forward:
			b.bufs[k], b.bufs[i] = b.bufs[i], b.bufs[k]
			b.sizes[k] = size
			k++
		case flow.Reflect:
			e.reflect = append(e.reflect, pkt)
		}
	}
	b.n = k
	if passPkts > 0 {
		e.c.passOutPkts.Add(passPkts)
		e.c.passOutBytes.Add(passBytes)
	}
	if len(e.reflect) > 0 {
		e.writeHost(e.reflect, 0)
		clear(e.reflect)
	}
	e.flushHostQ()
}

// flushHostQ writes the NAT's host-bound output (reassembled and
// refragmented datagrams) to the host.
func (e *Engine) flushHostQ() {
	for {
		select {
		case p := <-e.hostQ:
			e.writeHost([][]byte{p}, 0)
		default:
			return
		}
	}
}

func (e *Engine) writeHost(bufs [][]byte, offset int) {
	e.hostMu.Lock()
	_, err := e.host.Write(bufs, offset)
	e.hostMu.Unlock()
	if err != nil {
		e.c.hostWriteErr.Add(1)
	}
}

// Read implements transport.PacketIO for wireguard-go: the packets to
// encrypt, translated host traffic and the engine's own packets. It blocks
// until at least one is available and returns ErrEngineClosed after Close,
// or the host's error if the host failed.
func (e *Engine) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n := 0
	for n == 0 {
		if e.cur == nil {
			select {
			case b := <-e.full:
				e.cur, e.curPos = b, 0
			case p := <-e.inject:
				n = e.put(bufs, sizes, offset, n, p)
			case <-e.done:
				return 0, ErrEngineClosed
			case <-e.hostDead:
				if p := e.hostErr.Load(); p != nil {
					return 0, fmt.Errorf("vip: engine host: %w", *p)
				}
				return 0, ErrEngineClosed
			}
		}
		if b := e.cur; b != nil {
			for e.curPos < b.n && n < len(bufs) {
				n = e.put(bufs, sizes, offset, n, b.bufs[e.curPos][:b.sizes[e.curPos]])
				e.curPos++
			}
			if e.curPos >= b.n {
				e.cur = nil
				e.free <- b
			}
		}
		for n < len(bufs) {
			select {
			case p := <-e.inject:
				n = e.put(bufs, sizes, offset, n, p)
				continue
			default:
			}
			break
		}
	}
	return n, nil
}

// put copies pkt into bufs[n] (dropping it if it does not fit) and returns
// the new count.
func (e *Engine) put(bufs [][]byte, sizes []int, offset, n int, pkt []byte) int {
	if len(bufs[n])-offset < len(pkt) {
		e.c.tooBig.Add(1)
		return n
	}
	sizes[n] = copy(bufs[n][offset:], pkt)
	return n + 1
}

// Write implements transport.PacketIO for wireguard-go: the packets it
// decrypted. Probes to this node are answered or measured; the rest goes
// through the NAT's peer path (admission, reverse NAT) into the host. It
// returns len(bufs): drops are counted, not errors.
func (e *Engine) Write(bufs [][]byte, offset int) (int, error) {
	if e.isClosed() {
		return 0, ErrEngineClosed
	}
	now := e.clock.Now()
	pt := e.peers.Load()
	out := e.wout[:0]
	if cap(e.wrun) < len(bufs) {
		e.wrun = make([][]byte, 0, len(bufs))
		e.wrunBufs = make([][]byte, 0, len(bufs))
		e.wres = make([]flow.Result, len(bufs))
	}
	// Packets go to the NAT in runs from one peer (a wireguard-go Write
	// carries one peer's packets), one batch call per run: at large flow
	// tables the NAT overlaps the runs' cache misses.
	run, runBufs := e.wrun[:0], e.wrunBufs[:0]
	runPeer := unknownPeer
	var passPkts, passBytes uint64
	for i := 0; i <= len(bufs); i++ {
		var pkt []byte
		peer := unknownPeer
		if i < len(bufs) {
			buf := bufs[i]
			if len(buf) < offset {
				continue
			}
			pkt = buf[offset:]
			v := packet.Version(pkt)
			if v != 4 && v != 6 {
				e.c.malformed.Add(1) // wireguard-go drops these too; never hand them on
				continue
			}
			if ip := packet.IPv4(pkt); v == 4 && len(pkt) >= packet.IPv4MinHeaderLen {
				if id, ok := pt.byAddr[ip.Src32()]; ok {
					peer = id
				} else {
					e.c.unknownPeer.Add(1)
				}
				if ip.Dst32() == e.local4 && probe.IsProbePacket(pkt, e.probePort) {
					e.handleProbe(pkt, pt, peer, now)
					continue
				}
			}
		}
		if len(run) > 0 && (i == len(bufs) || peer != runPeer) {
			res := e.wres[:len(run)]
			e.nat.FromPeerBatch(run, runPeer, now, res)
			for j := range run {
				switch res[j].Verdict {
				case flow.Pass:
					passPkts++
					passBytes += uint64(len(run[j]))
					out = append(out, runBufs[j])
				case flow.Forward:
					out = append(out, runBufs[j])
				}
			}
			clear(run)
			clear(runBufs)
			run, runBufs = run[:0], runBufs[:0]
		}
		if i < len(bufs) {
			run, runBufs, runPeer = append(run, pkt), append(runBufs, bufs[i]), peer
		}
	}
	e.wrun, e.wrunBufs = run, runBufs
	if passPkts > 0 {
		e.c.passInPkts.Add(passPkts)
		e.c.passInBytes.Add(passBytes)
	}
	if len(out) > 0 {
		e.writeHost(out, offset)
	}
	clear(out)
	e.wout = out[:0]
	e.flushHostQ()
	return len(bufs), nil
}

// handleProbe answers a probe request or measures a probe reply; probes
// never reach the host and never count as user traffic.
func (e *Engine) handleProbe(pkt []byte, pt *peerTable, peer flow.PeerID, now time.Time) {
	e.c.probeInPkts.Add(1)
	e.c.probeInB.Add(uint64(len(pkt)))
	_, dst, payload, err := probe.ParseIPv4UDP(pkt)
	if err != nil || len(payload) < 4 || dst.Port() != e.probePort {
		e.c.probeBad.Add(1)
		return
	}
	switch probe.MessageType(payload[3]) {
	case probe.TypeRequest:
		if peer == unknownPeer { // only members are answered
			e.c.probeBad.Add(1)
			return
		}
		reply, err := e.responder.RespondIPv4(pkt, make([]byte, 0, probe.PacketLen))
		if err != nil {
			e.c.probeBad.Add(1)
			return
		}
		if e.injectOverlay(reply) {
			e.c.probeOutPkts.Add(1)
			e.c.probeOutB.Add(uint64(len(reply)))
		}
	case probe.TypeReply:
		node, ok := pt.node[peer]
		if !ok {
			e.c.probeBad.Add(1)
			return
		}
		if e.prober.HandleReply(probe.NodeID(node), payload, now) != nil {
			e.c.probeBad.Add(1)
		}
	default:
		e.c.probeBad.Add(1)
	}
}

// ---- DNS ----

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
