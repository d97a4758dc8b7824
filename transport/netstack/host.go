package netstack

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// Defaults applied by New to zero fields of Options.
const (
	DefaultMTU       = 1420 // bytes; WireGuard's usual overlay MTU
	DefaultBatchSize = 64   // packets per Read or Write
	DefaultQueue     = 1024 // packets queued towards Read
	DefaultBacklog   = 1024 // pending connections per TCP listener

	// MinMTU is the smallest MTU a Host accepts (IPv4's minimum, RFC 791).
	// A Host with an IPv6 address needs at least MinMTUv6.
	MinMTU = 68
	// MinMTUv6 is IPv6's minimum link MTU (RFC 8200).
	MinMTUv6 = 1280
	// MaxMTU is the largest MTU a Host accepts: the largest IP packet.
	MaxMTU = 65535
	// MaxBatchSize bounds Options.BatchSize.
	MaxBatchSize = 4096
	// MaxQueue bounds Options.Queue.
	MaxQueue = 1 << 20
)

// Errors returned by this package. Dial and listen errors from the stack are
// returned as *net.OpError wrapping a syscall.Errno (ECONNREFUSED, ETIMEDOUT,
// EADDRINUSE, ...), so errors.Is(err, syscall.ECONNREFUSED) works as it does
// with the kernel's sockets. After Close, operations return an error that
// matches transport.ErrClosed (and net.ErrClosed).
var (
	// ErrInvalidOptions means New was given an option out of range (a negative
	// size, an MTU outside [MinMTU, MaxMTU], an IPv6 address with an MTU
	// below MinMTUv6, an unusable address).
	ErrInvalidOptions = errors.New("netstack: invalid options")

	// ErrInvalidAddress means an address or prefix is invalid, unspecified,
	// multicast, or of the wrong family for the network asked for.
	ErrInvalidAddress = errors.New("netstack: invalid address")

	// ErrAddressExists means AddAddress was given an address the host already
	// has.
	ErrAddressExists = errors.New("netstack: address already assigned")

	// ErrNoSuchAddress means RemoveAddress was given an address the host does
	// not have.
	ErrNoSuchAddress = errors.New("netstack: no such address")

	// ErrUnsupportedNetwork means DialContext or ReservePort was given a
	// network other than tcp, tcp4, tcp6, udp, udp4, udp6.
	ErrUnsupportedNetwork = errors.New("netstack: unsupported network")

	// ErrNotReserved means ReleasePort was given a port that ReservePort did
	// not reserve (or that was already released).
	ErrNotReserved = errors.New("netstack: port not reserved")

	// ErrPromiscuousLocal reports SetPromiscuous(true) on a host without
	// Options.DisableHandleLocal. gVisor, when it handles local traffic
	// itself, drops every packet whose source address it would accept as
	// its own as a martian, and in promiscuous mode it would accept every
	// address: the host would drop all inbound traffic.
	ErrPromiscuousLocal = errors.New("netstack: promiscuous mode needs Options.DisableHandleLocal")

	// ErrBadOffset means Read or Write was given a negative offset.
	ErrBadOffset = errors.New("netstack: negative offset")
)

// nicID is the only NIC of a Host's stack.
const nicID tcpip.NICID = 1

// Options configures New. The zero value is usable but gives a host with no
// address; a host normally has at least one.
type Options struct {
	// Addrs are the host's own addresses, IPv4 and/or IPv6. Each is added
	// with a full-length prefix (/32, /128); the first of each family is the
	// default source address. Default routes for both families always go
	// through the host's NIC, so AddAddress of a first IPv4 or IPv6 address
	// at run time works without further routing setup.
	Addrs []netip.Addr

	// MTU is the largest IP packet, in bytes, that the host sends or
	// accepts. 0 means DefaultMTU (1420). It must lie in [MinMTU, MaxMTU],
	// and be at least MinMTUv6 (1280) when any address is IPv6.
	MTU int

	// BatchSize is the most packets a Read returns at once and the batch
	// size reported to wireguard-go. 0 means DefaultBatchSize (64).
	BatchSize int

	// Queue is the outbound queue length, in packets, between the stack and
	// Read. When it is full, further packets are dropped and counted in
	// Stats.OutQueueFull (TCP recovers by retransmitting, as it would over a
	// full qdisc). 0 means DefaultQueue (1024).
	Queue int

	// ListenBacklog is the accept backlog of each TCP listener. 0 means
	// DefaultBacklog (1024).
	ListenBacklog int

	// TCPSendBuffer and TCPReceiveBuffer are the default TCP buffer sizes
	// in bytes. 0 means gVisor's defaults (1 MiB each, growing to 4 MiB with
	// receive-buffer auto-tuning). A value larger than gVisor's maximum
	// raises the maximum too.
	TCPSendBuffer    int
	TCPReceiveBuffer int

	// DisableSACK turns TCP selective acknowledgements off. SACK is on by
	// default (gVisor's own default is off), since it is what keeps TCP fast
	// over a lossy overlay.
	DisableSACK bool

	// DisableModerateReceiveBuffer turns off TCP receive-buffer auto-tuning,
	// which is on by default.
	DisableModerateReceiveBuffer bool

	// CongestionControl names the TCP congestion control algorithm, "reno"
	// or "cubic". Empty means "reno". With the pinned gVisor version, cubic
	// was seen to collapse a sender's congestion window to 0 after losses,
	// which stalls the connection for good (no data in flight, so no timer
	// to recover): in this package's 2%-loss tests, most 1 MiB transfers
	// stalled with cubic and none with reno. Choose cubic only knowingly.
	CongestionControl string

	// DisableHandleLocal stops the stack from delivering packets addressed
	// to its own addresses internally: with it set, a packet from the host
	// to itself goes out through Read like any other (so that a vip engine
	// between the host and the network sees hairpinned flows), and comes
	// back in only if something writes it back. By default it is delivered
	// internally, like the kernel's loopback. SetPromiscuous(true) requires
	// it (see ErrPromiscuousLocal).
	DisableHandleLocal bool

	// Clock times UDP write deadlines (see UDPConn). nil means the real
	// clock. gVisor's own timers (TCP retransmission and the like, read
	// deadlines) always run in real time.
	Clock transport.Clock

	// TCPProbe, when set, is called by the stack with a snapshot of a TCP
	// endpoint's state (windows, RTT, congestion state) every time it
	// processes a segment: for diagnostics and tests. It runs on the
	// stack's packet path and must be fast and must not block.
	TCPProbe func(*tcp.TCPEndpointState)
}

// withDefaults validates o and fills in defaults.
func (o Options) withDefaults() (Options, error) {
	if o.MTU == 0 {
		o.MTU = DefaultMTU
	}
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.Queue == 0 {
		o.Queue = DefaultQueue
	}
	if o.ListenBacklog == 0 {
		o.ListenBacklog = DefaultBacklog
	}
	if o.MTU < MinMTU || o.MTU > MaxMTU {
		return o, fmt.Errorf("%w: MTU %d outside [%d, %d]", ErrInvalidOptions, o.MTU, MinMTU, MaxMTU)
	}
	if o.BatchSize < 1 || o.BatchSize > MaxBatchSize {
		return o, fmt.Errorf("%w: BatchSize %d outside [1, %d]", ErrInvalidOptions, o.BatchSize, MaxBatchSize)
	}
	if o.Queue < 1 || o.Queue > MaxQueue {
		return o, fmt.Errorf("%w: Queue %d outside [1, %d]", ErrInvalidOptions, o.Queue, MaxQueue)
	}
	if o.ListenBacklog < 1 {
		return o, fmt.Errorf("%w: ListenBacklog %d < 1", ErrInvalidOptions, o.ListenBacklog)
	}
	if o.TCPSendBuffer < 0 || o.TCPReceiveBuffer < 0 {
		return o, fmt.Errorf("%w: negative TCP buffer size", ErrInvalidOptions)
	}
	if (o.TCPSendBuffer > 0 && o.TCPSendBuffer < tcp.MinBufferSize) || (o.TCPReceiveBuffer > 0 && o.TCPReceiveBuffer < tcp.MinBufferSize) {
		return o, fmt.Errorf("%w: TCP buffer size below %d bytes", ErrInvalidOptions, tcp.MinBufferSize)
	}
	switch o.CongestionControl {
	case "":
		o.CongestionControl = "reno"
	case "cubic", "reno":
	default:
		return o, fmt.Errorf("%w: CongestionControl %q (want reno or cubic)", ErrInvalidOptions, o.CongestionControl)
	}
	seen := make(map[netip.Addr]bool, len(o.Addrs))
	for _, a := range o.Addrs {
		if err := checkHostAddr(a); err != nil {
			return o, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
		}
		a = a.Unmap()
		if seen[a] {
			return o, fmt.Errorf("%w: address %v listed twice", ErrInvalidOptions, a)
		}
		seen[a] = true
		if a.Is6() && o.MTU < MinMTUv6 {
			return o, fmt.Errorf("%w: IPv6 address %v needs MTU ≥ %d, have %d", ErrInvalidOptions, a, MinMTUv6, o.MTU)
		}
	}
	return o, nil
}

// checkHostAddr reports whether a can be one of a host's own addresses.
func checkHostAddr(a netip.Addr) error {
	if !a.IsValid() {
		return fmt.Errorf("%w: zero address", ErrInvalidAddress)
	}
	a = a.Unmap()
	if a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" || a == ipv4Broadcast {
		return fmt.Errorf("%w: %v cannot be a host address", ErrInvalidAddress, a)
	}
	return nil
}

// Host is a gVisor netstack TCP/IP host whose only interface is the
// transport.PacketIO it implements. Create one with New; the zero value is
// not usable.
//
// All methods are safe for concurrent use. Read may be called from several
// goroutines (they are serialised); Write may be called from several
// goroutines at once. Close may be called at any time, any number of times:
// it unblocks Read, aborts every connection and listener of the host, stops
// the stack's goroutines and releases port reservations.
type Host struct {
	opts  Options
	stack *stack.Stack
	link  *link

	// closeMu guards closed. Write holds it for reading for a whole batch
	// and Close for writing, so that no packet is injected into a stack
	// being torn down.
	closeMu syncx.RWMutex
	// +checklocks:closeMu
	closed bool
	once   sync.Once

	// resMu guards reservations, the host's port reservations.
	resMu syncx.Mutex
	// +checklocks:resMu
	reservations map[portKey]reservation

	// counters for Write (inbound); those for Read are in link.
	inPackets, inBytes, inMalformed, inTooBig atomic.Uint64

	// inbound is the Inbound in force (SetInbound); nil takes nothing.
	inbound atomic.Pointer[inboundState]
	// inboundUDPFailed counts new inbound UDP flows whose socket could not
	// be made.
	inboundUDPFailed atomic.Uint64
}

var (
	_ transport.PacketIO        = (*Host)(nil)
	_ transport.ReadInterrupter = (*Host)(nil)
)

// New creates a host with o's addresses on a single NIC, default routes for
// IPv4 and IPv6 through it, and TCP, UDP and ICMP (v4 and v6).
func New(o Options) (*Host, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcpFactory(o.TCPProbe), udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
		HandleLocal:        !o.DisableHandleLocal,
	})
	h := &Host{
		opts:         o,
		stack:        s,
		link:         newLink(o.MTU, o.Queue, o.BatchSize),
		reservations: make(map[portKey]reservation),
	}
	fail := func(err error) (*Host, error) {
		s.Destroy()
		h.link.Close()
		return nil, err
	}
	if err := h.setTCPOptions(); err != nil {
		return fail(err)
	}
	h.installInbound()
	if e := s.CreateNIC(nicID, h.link); e != nil {
		return fail(fmt.Errorf("netstack: create NIC: %s", e))
	}
	s.AddRoute(tcpip.Route{Destination: header.IPv4EmptySubnet, NIC: nicID})
	s.AddRoute(tcpip.Route{Destination: header.IPv6EmptySubnet, NIC: nicID})
	for _, a := range o.Addrs {
		a = a.Unmap()
		if err := h.addAddress(netip.PrefixFrom(a, a.BitLen()), true); err != nil {
			return fail(err)
		}
	}
	return h, nil
}

func tcpFactory(probe func(*tcp.TCPEndpointState)) stack.TransportProtocolFactory {
	if probe == nil {
		return tcp.NewProtocol
	}
	return tcp.NewProtocolProbe(probe)
}

func (h *Host) setTCPOptions() error {
	set := func(name string, opt tcpip.SettableTransportProtocolOption) error {
		if e := h.stack.SetTransportProtocolOption(tcp.ProtocolNumber, opt); e != nil {
			return fmt.Errorf("%w: TCP option %s: %s", ErrInvalidOptions, name, e)
		}
		return nil
	}
	sack := tcpip.TCPSACKEnabled(!h.opts.DisableSACK)
	if err := set("SACK", &sack); err != nil {
		return err
	}
	mod := tcpip.TCPModerateReceiveBufferOption(!h.opts.DisableModerateReceiveBuffer)
	if err := set("moderate receive buffer", &mod); err != nil {
		return err
	}
	cc := tcpip.CongestionControlOption(h.opts.CongestionControl)
	if err := set("congestion control", &cc); err != nil {
		return err
	}
	if n := h.opts.TCPSendBuffer; n > 0 {
		r := tcpip.TCPSendBufferSizeRangeOption{Min: tcp.MinBufferSize, Default: n, Max: max(n, tcp.MaxBufferSize)}
		if err := set("send buffer", &r); err != nil {
			return err
		}
	}
	if n := h.opts.TCPReceiveBuffer; n > 0 {
		r := tcpip.TCPReceiveBufferSizeRangeOption{Min: tcp.MinBufferSize, Default: n, Max: max(n, tcp.MaxBufferSize)}
		if err := set("receive buffer", &r); err != nil {
			return err
		}
	}
	return nil
}

// Stack returns the underlying gVisor stack, for what this package does not
// wrap: iptables (NAT) rules, extra routes, protocol options, detailed
// statistics. Changes made through it are the caller's responsibility; the
// host's NIC is NICID.
func (h *Host) Stack() *stack.Stack { return h.stack }

// NICID returns the ID of the host's only NIC in Stack.
func (h *Host) NICID() tcpip.NICID { return nicID }

// BatchSize implements transport.PacketIO: Options.BatchSize.
func (h *Host) BatchSize() int { return h.opts.BatchSize }

// MTU implements transport.PacketIO: Options.MTU, in bytes.
func (h *Host) MTU() int { return h.opts.MTU }

func protoOf(a netip.Addr) tcpip.NetworkProtocolNumber {
	if a.Is4() {
		return ipv4.ProtocolNumber
	}
	return ipv6.ProtocolNumber
}

// AddAddress assigns p.Addr() to the host at run time, with p's prefix
// length (a VIP is normally a /32 or /128). The host then accepts packets
// and connections for it, and sockets may bind to it.
//
// An address added while the host already has one of the same family is
// never chosen by the stack as the source of the host's own outbound
// traffic (a VIP should not become the source of unrelated connections,
// which IPv6's longest-matching-prefix rule would otherwise do); replies on
// connections to it and sockets bound to it still use it. A first address
// of its family is a normal source address.
//
// It fails with ErrInvalidAddress for an invalid prefix or an address that
// cannot be a host address, with ErrAddressExists when the host already has
// the address, and with transport.ErrClosed after Close.
func (h *Host) AddAddress(p netip.Prefix) error {
	return h.addAddress(p, false)
}

// addAddress implements AddAddress; source makes the address a candidate
// source address even when the host has others of its family.
func (h *Host) addAddress(p netip.Prefix, source bool) error {
	if !p.IsValid() {
		return fmt.Errorf("%w: prefix %v", ErrInvalidAddress, p)
	}
	a := p.Addr()
	if err := checkHostAddr(a); err != nil {
		return err
	}
	bits := p.Bits()
	if a.Is4In6() {
		a = a.Unmap()
		bits -= 96
		if bits < 0 {
			return fmt.Errorf("%w: prefix %v", ErrInvalidAddress, p)
		}
	}
	if a.Is6() && h.opts.MTU < MinMTUv6 {
		return fmt.Errorf("%w: IPv6 address %v needs MTU ≥ %d, have %d", ErrInvalidAddress, a, MinMTUv6, h.opts.MTU)
	}
	if h.isClosed() {
		return transport.ErrClosed
	}
	pa := tcpip.ProtocolAddress{
		Protocol:          protoOf(a),
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFromSlice(a.AsSlice()), PrefixLen: bits},
	}
	props := stack.AddressProperties{PEB: stack.CanBePrimaryEndpoint}
	if !source && h.hasFamily(a.Is4()) {
		props.PEB = stack.NeverPrimaryEndpoint
	}
	if e := h.stack.AddProtocolAddress(nicID, pa, props); e != nil {
		if _, ok := e.(*tcpip.ErrDuplicateAddress); ok {
			return fmt.Errorf("%w: %v", ErrAddressExists, a)
		}
		return fmt.Errorf("netstack: add address %v: %s", p, e)
	}
	return nil
}

// hasFamily reports whether the host has an IPv4 (is4) or IPv6 address.
func (h *Host) hasFamily(is4 bool) bool {
	for _, p := range h.Addresses() {
		if p.Addr().Is4() == is4 {
			return true
		}
	}
	return false
}

// RemoveAddress removes a from the host. Connections bound to it stop
// receiving packets, and new ones to it are refused (the stack no longer
// considers it local). It fails with ErrNoSuchAddress when the host does not
// have a, and with transport.ErrClosed after Close.
func (h *Host) RemoveAddress(a netip.Addr) error {
	if !a.IsValid() {
		return fmt.Errorf("%w: zero address", ErrInvalidAddress)
	}
	a = a.Unmap()
	if h.isClosed() {
		return transport.ErrClosed
	}
	if e := h.stack.RemoveAddress(nicID, tcpip.AddrFromSlice(a.AsSlice())); e != nil {
		if _, ok := e.(*tcpip.ErrBadLocalAddress); ok {
			return fmt.Errorf("%w: %v", ErrNoSuchAddress, a)
		}
		return fmt.Errorf("netstack: remove address %v: %s", a, e)
	}
	return nil
}

var ipv4Broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// Addresses returns the host's current addresses with their prefix lengths,
// in the order the stack keeps them.
func (h *Host) Addresses() []netip.Prefix {
	var out []netip.Prefix
	for _, pa := range h.stack.AllAddresses()[nicID] {
		a, ok := netip.AddrFromSlice(pa.AddressWithPrefix.Address.AsSlice())
		if !ok || a == ipv4Broadcast {
			continue // gVisor's IPv4 endpoint lists the broadcast address
		}
		out = append(out, netip.PrefixFrom(a, pa.AddressWithPrefix.PrefixLen))
	}
	return out
}

// SetForwarding turns IP forwarding on or off for IPv4 and IPv6: with it on,
// packets written into the host for addresses that are not its own are
// routed (back out through Read, the host's only NIC) instead of dropped.
func (h *Host) SetForwarding(on bool) error {
	if h.isClosed() {
		return transport.ErrClosed
	}
	for _, p := range []tcpip.NetworkProtocolNumber{ipv4.ProtocolNumber, ipv6.ProtocolNumber} {
		if e := h.stack.SetForwardingDefaultAndAllNICs(p, on); e != nil {
			return fmt.Errorf("netstack: set forwarding for protocol %d: %s", p, e)
		}
	}
	return nil
}

// SetSpoofing lets sockets send from addresses that are not the host's own
// (a nonlocal VIP as the source of a hairpinned connection, say).
func (h *Host) SetSpoofing(on bool) error {
	if h.isClosed() {
		return transport.ErrClosed
	}
	if e := h.stack.SetSpoofing(nicID, on); e != nil {
		return fmt.Errorf("netstack: set spoofing: %s", e)
	}
	return nil
}

// SetPromiscuous makes the host accept packets addressed to any address, as
// if every address were its own: listeners and sockets bound to the
// unspecified address then receive traffic for any destination (a
// transparent proxy, or replies to a spoofed VIP source). Replying from
// such an address also takes SetSpoofing(true). Turning it on fails with
// ErrPromiscuousLocal unless the host was created with
// Options.DisableHandleLocal.
func (h *Host) SetPromiscuous(on bool) error {
	if h.isClosed() {
		return transport.ErrClosed
	}
	if on && !h.opts.DisableHandleLocal {
		return ErrPromiscuousLocal
	}
	if e := h.stack.SetPromiscuousMode(nicID, on); e != nil {
		return fmt.Errorf("netstack: set promiscuous mode: %s", e)
	}
	return nil
}

func (h *Host) isClosed() bool {
	h.closeMu.RLock()
	defer h.closeMu.RUnlock()
	return h.closed
}

// Close shuts the host down: Read returns transport.ErrClosed, Write and
// the other methods fail with it, every connection and listener of the host
// is aborted, port reservations are released and the stack's goroutines
// stop before Close returns. It is idempotent and always returns nil.
func (h *Host) Close() error {
	h.once.Do(func() {
		h.closeMu.Lock()
		h.closed = true
		h.closeMu.Unlock()
		h.link.Close()
		h.resMu.Lock()
		for k, r := range h.reservations {
			h.stack.ReleasePort(r.res)
			delete(h.reservations, k)
		}
		h.resMu.Unlock()
		h.stack.Destroy()
		h.link.Close() // anything the teardown queued
	})
	return nil
}

// Stats counts the packets that crossed the host's PacketIO side. Counters
// only grow.
type Stats struct {
	// InPackets and InBytes count packets written into the host (Write)
	// and handed to the stack.
	InPackets, InBytes uint64
	// InMalformed counts packets Write dropped before the stack saw them:
	// empty, not IPv4 or IPv6, or with an inconsistent header.
	InMalformed uint64
	// InTooBig counts packets Write dropped for being larger than the MTU.
	InTooBig uint64

	// OutPackets and OutBytes count packets returned by Read.
	OutPackets, OutBytes uint64
	// OutQueueFull counts packets the stack sent while the outbound queue
	// was full; they were dropped.
	OutQueueFull uint64
	// OutTooBig counts packets Read dropped because they did not fit the
	// caller's buffer after the offset.
	OutTooBig uint64
	// OutQueued is how many packets wait for Read right now (a batch that
	// a Read is copying out is in neither OutQueued nor OutPackets).
	OutQueued int

	// StackMalformed counts packets the stack itself rejected as malformed
	// (bad IP header checksum, inconsistent lengths, bad fragments), and
	// StackChecksumErrors TCP and UDP segments with a bad checksum.
	StackMalformed, StackChecksumErrors uint64

	// InboundPendingDropped counts TCP attempts for Inbound.TCP dropped
	// beyond Inbound.MaxPendingTCP, and InboundUDPFailed new inbound UDP
	// flows dropped because their socket could not be made.
	InboundPendingDropped, InboundUDPFailed uint64
}

// Stats returns the host's packet counters. It may be called at any time,
// also after Close.
func (h *Host) Stats() Stats {
	ss := h.stack.Stats()
	l := h.link
	return Stats{
		InPackets:           h.inPackets.Load(),
		InBytes:             h.inBytes.Load(),
		InMalformed:         h.inMalformed.Load(),
		InTooBig:            h.inTooBig.Load(),
		OutPackets:          l.outPackets.Load(),
		OutBytes:            l.outBytes.Load(),
		OutQueueFull:        l.outQueueFull.Load(),
		OutTooBig:           l.outTooBig.Load(),
		OutQueued:           l.queued(),
		StackMalformed:      ss.IP.MalformedPacketsReceived.Value() + ss.IP.MalformedFragmentsReceived.Value(),
		StackChecksumErrors: ss.TCP.ChecksumErrors.Value() + ss.UDP.ChecksumErrors.Value(),

		InboundPendingDropped: ss.TCP.ForwardMaxInFlightDrop.Value(),
		InboundUDPFailed:      h.inboundUDPFailed.Load(),
	}
}
