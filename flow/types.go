package flow

import (
	"errors"
	"net/netip"
	"strconv"
	"time"

	"github.com/vipkit/vipkit/packet"
	"github.com/vipkit/vipkit/transport"
)

// Errors of the control API. Packet problems are never errors: they are
// Drop verdicts with a DropReason.
var (
	// ErrClosed is returned by control methods after Close. It matches
	// transport.ErrClosed.
	ErrClosed = transport.ErrClosed
	// ErrInvalidOptions means New was given options it cannot use (no
	// LocalAddr, no Selector, a capacity or MTU out of range, ...).
	ErrInvalidOptions = errors.New("flow: invalid options")
	// ErrInvalidListener reports a listener that is not an IPv4 VIP with TCP
	// or UDP and a nonzero port, or a VIP equal to the local address.
	ErrInvalidListener = errors.New("flow: invalid listener")
	// ErrInvalidBackend reports a backend without an IPv4 address and port,
	// or whose peer does not match its address (the local address belongs to
	// LocalPeer and only to it).
	ErrInvalidBackend = errors.New("flow: invalid backend")
	// ErrLimit means a configuration exceeds Options.MaxBackends or
	// Options.MaxListenersPerVIP.
	ErrLimit = errors.New("flow: limit exceeded")
	// ErrPortsExhausted is returned by a PortReserver that has no free
	// port; the packet path turns it into ReasonNoPort.
	ErrPortsExhausted = errors.New("flow: no free shadow port")
	// ErrUnsupported is returned by a PortReserver that cannot work on this
	// platform.
	ErrUnsupported = errors.New("flow: unsupported on this platform")
)

// PeerID names an authenticated overlay peer. The engine assigns compact ids
// to its peers (for example their index in its peer table); LocalPeer is this
// node itself.
type PeerID uint64

// LocalPeer is this node: the peer of a local backend (hairpin) and the
// sender of packets handed to FromHost.
const LocalPeer PeerID = 0

// Listener is one (VIP, protocol, port) of a service.
type Listener struct {
	VIP   netip.Addr
	Proto Proto // ProtoTCP or ProtoUDP
	Port  uint16
}

// String returns "tcp/100.64.0.10:443".
func (l Listener) String() string {
	return l.Proto.String() + "/" + netip.AddrPortFrom(l.VIP, l.Port).String()
}

// Backend is one target of a listener: a node's overlay address and an
// application port. A backend whose Addr is Options.LocalAddr is local (its
// Peer must be LocalPeer): traffic to it is hairpinned back into the host.
type Backend struct {
	Peer PeerID
	Addr netip.Addr
	Port uint16
}

// AddrPort returns the backend's address and port.
func (b Backend) AddrPort() netip.AddrPort { return netip.AddrPortFrom(b.Addr, b.Port) }

// ListenerConfig configures a listener with SetListener.
type ListenerConfig struct {
	// Backends are the candidates new bindings may use; the Selector picks
	// among them. Empty is valid: the listener exists (its VIP is claimed)
	// but refuses new flows with a RST or an ICMP port unreachable
	// (ReasonRefused, ReasonPortUnreachable; see Options.ReplyRate).
	Backends []Backend
	// IdleTimeout is the idle expiry of this listener's bindings;
	// 0 means Options.TCPIdleTimeout or Options.UDPIdleTimeout. A change
	// applies to bindings created afterwards.
	IdleTimeout time.Duration
}

// SelectReason says why the NAT asks the Selector for a backend.
type SelectReason uint8

const (
	// SelectNew: a new flow.
	SelectNew SelectReason = iota
	// SelectSYNRetry: a retransmitted empty SYN before any SYN-ACK; the
	// selector may return another backend (the flow is then retargeted) or
	// the current one.
	SelectSYNRetry
	// SelectFailover: the bound UDP backend was reported unavailable.
	// Returning the current backend, or -1, keeps the binding.
	SelectFailover
)

// SelectRequest is what the NAT tells the Selector.
type SelectRequest struct {
	Listener Listener
	// Candidates are the listener's configured backends. Read-only, valid
	// only during the call.
	Candidates []Backend
	Reason     SelectReason
	// Prev is the current backend for SelectSYNRetry and SelectFailover.
	Prev Backend
	Now  time.Time
}

// Selector chooses backends. The vip engine implements it on top of its
// health and RTT state. The NAT calls it with its lock held, from the
// goroutine calling FromHost: it is on the packet path (every
// new binding asks Select), and the lock also serializes the calls, so an
// implementation may use scratch state without a lock of its own. The
// contract: it must be quick, must not block, and must not call back into
// the NAT or into anything that waits for a NAT call to finish.
type Selector interface {
	// Select returns the index in req.Candidates of the backend to use, or
	// -1 when none is eligible (the packet is then dropped with
	// ReasonNoBackend, or, for retries and failovers, the binding stays).
	Select(req SelectRequest) int
	// Available reports whether a backend bound to a UDP flow is still
	// usable. It is asked at most once per binding after each HealthChanged
	// call (and after a reported port unreachable), never per packet.
	Available(l Listener, b Backend, now time.Time) bool
}

// SelectorFunc adapts a function to a Selector whose Available is always
// true (no UDP failover).
type SelectorFunc func(req SelectRequest) int

// Select calls f.
func (f SelectorFunc) Select(req SelectRequest) int { return f(req) }

// Available returns true.
func (SelectorFunc) Available(Listener, Backend, time.Time) bool { return true }

// PortReserver reserves the shadow source ports of bindings. Reserve is
// called with the NAT's lock held when a binding is created; Release, also
// with the NAT's lock held, when it leaves quarantine, is refused, or the
// NAT closes. Both are on the packet path: they must be quick, must not
// block and must not call back into the NAT (a leaf lock of their own, as
// MemReserver and OSReserver take, is fine). Implementations must be safe
// for concurrent use (several NATs may share one).
type PortReserver interface {
	// Reserve returns a port not in use for proto toward backend. It returns
	// an error matching ErrPortsExhausted when there is none.
	Reserve(proto Proto, backend netip.AddrPort) (uint16, error)
	// Release returns a port obtained from Reserve with the same arguments.
	Release(proto Proto, backend netip.AddrPort, port uint16)
}

// Direction is where a packet given to Options.Emit goes.
type Direction uint8

const (
	// ToOverlay: toward the overlay (wireguard-go), routed by destination.
	ToOverlay Direction = iota
	// ToHost: into the host's stack (write it to the TUN).
	ToHost
)

// String returns "overlay" or "host".
func (d Direction) String() string {
	if d == ToHost {
		return "host"
	}
	return "overlay"
}

// Verdict is what the caller does with a packet after FromHost or FromPeer.
type Verdict uint8

const (
	// Pass: not NAT traffic. The packet is untouched; handle it as usual.
	Pass Verdict = iota
	// Forward: translated in place (same length); send it on in its
	// direction: FromHost → overlay (Result.Peer is the backend's peer),
	// FromPeer → host.
	Forward
	// Reflect: translated in place; write it back into the host (hairpin to
	// a local backend, or a local backend's reply to its client). FromHost
	// only.
	Reflect
	// Drop: discard the packet; Result.Reason says why, and it is counted.
	Drop
	// Consumed: the NAT took the packet's content (a fragment awaiting
	// reassembly, or a packet it replaced with fragments or an ICMP error
	// given to Options.Emit). The caller's buffer is free again.
	Consumed
)

var verdictNames = [...]string{"pass", "forward", "reflect", "drop", "consumed"}

// String returns the verdict's name.
func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "verdict(" + strconv.Itoa(int(v)) + ")"
}

// Result is the outcome of FromHost or FromPeer.
type Result struct {
	Verdict Verdict
	Reason  DropReason // set for Drop
	Peer    PeerID     // for Forward from FromHost: the backend's peer
}

// DropReason says why a packet was dropped. Every drop is counted by
// reason: globally (Stats), per listener and, where one is known, per
// binding.
type DropReason uint8

// The drop reasons.
const (
	ReasonNone            DropReason = iota
	ReasonTruncated                  // a header shorter than its minimum or than its length field
	ReasonBadIHL                     // IPv4 IHL < 5 or beyond the packet
	ReasonBadLength                  // IPv4 total length ≠ packet length, bad UDP length, TCP data offset, fragment size
	ReasonBadChecksum                // IPv4 header checksum does not verify
	ReasonUnsupported                // a protocol or ICMP type to a VIP that the NAT does not translate
	ReasonNoListener                 // to a VIP port/protocol with no (or a removed) listener
	ReasonNoBackend                  // the listener has no eligible backend
	ReasonCapacity                   // the binding capacity (active + quarantined) is full
	ReasonNoPort                     // the PortReserver has no free port
	ReasonNoFlow                     // a TCP segment other than SYN, or an ICMP error, with no binding
	ReasonVIPSource                  // a peer sent a packet with a VIP source
	ReasonVIPDestination             // a peer sent a packet to a VIP
	ReasonAdmission                  // Options.Admit refused the packet
	ReasonPeerMismatch               // a reply from a peer other than the binding's backend peer
	ReasonQuarantined                // a late reply to a retired (quarantined) shadow port
	ReasonFragLimit                  // the fragment cache's datagram, per-sender or byte limit
	ReasonFragOverlap                // overlapping or inconsistent fragments (RFC 5722): the datagram is discarded
	ReasonFragTooBig                 // fragments of a datagram beyond 65535 bytes
	ReasonFragTooMany                // more fragments in one datagram than Options.MaxFragments
	ReasonFragDuplicate              // an exact duplicate of a fragment already held
	ReasonFragTimeout                // an incomplete datagram expired (counted once per datagram)
	ReasonFragNeeded                 // too big for the MTU with DF set; ICMP fragmentation-needed sent
	ReasonICMPQuote                  // an ICMP error quoting garbage (short, not IPv4, not TCP/UDP, not a first fragment)
	ReasonNoEmit                     // output needed Options.Emit, which is nil
	ReasonClosed                     // the NAT is closed
	ReasonRefused                    // TCP to a VIP port without a listener, or to a listener without backends: answered with a RST
	ReasonPortUnreachable            // UDP to a VIP port without a listener, or to a listener without backends: answered with ICMP port unreachable
	NumDropReasons                   // the number of reasons (array size)
)

var reasonNames = [NumDropReasons]string{
	"none", "truncated", "bad-ihl", "bad-length", "bad-checksum", "unsupported",
	"no-listener", "no-backend", "capacity", "no-port", "no-flow", "vip-source",
	"vip-destination", "admission", "peer-mismatch", "quarantined", "frag-limit",
	"frag-overlap", "frag-too-big", "frag-too-many", "frag-duplicate",
	"frag-timeout", "frag-needed", "icmp-quote", "no-emit", "closed",
	"refused", "port-unreachable",
}

// String returns the reason's name, as used in counters.
func (r DropReason) String() string {
	if r < NumDropReasons {
		return reasonNames[r]
	}
	return "reason(" + strconv.Itoa(int(r)) + ")"
}

func reasonFor(err error) DropReason {
	switch err {
	case packet.ErrTruncated:
		return ReasonTruncated
	case packet.ErrBadIHL:
		return ReasonBadIHL
	case packet.ErrBadLength:
		return ReasonBadLength
	case packet.ErrBadChecksum:
		return ReasonBadChecksum
	}
	return ReasonUnsupported
}

// Counters are a binding's or listener's user traffic: IP packets and bytes
// toward the backend (Out) and back toward the client (In), and drops by
// reason. A listener counts every drop it can be blamed for; a binding
// counts the reasons that concern an existing binding (quarantined,
// peer-mismatch, frag-needed, no-emit). Probe traffic never matches a
// listener, so it is never counted here. Counters are cumulative and reset
// only with the NAT.
type Counters struct {
	PacketsOut, BytesOut uint64
	PacketsIn, BytesIn   uint64
	Drops                [NumDropReasons]uint64
}

// BindingState is a binding's phase.
type BindingState uint8

const (
	// Active bindings translate traffic.
	Active BindingState = iota + 1
	// Quarantined bindings are retired: their shadow port stays reserved
	// and late replies to it are dropped until the quarantine ends.
	Quarantined
)

// String returns "active" or "quarantined".
func (s BindingState) String() string {
	switch s {
	case Active:
		return "active"
	case Quarantined:
		return "quarantined"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// BindingInfo is a snapshot of one binding.
type BindingInfo struct {
	Listener Listener
	Backend  Backend
	Client   netip.AddrPort // the client's source
	Shadow   netip.AddrPort // the translated source the backend sees (the VIP for hairpin)
	State    BindingState
	Hairpin  bool
	Expires  time.Time // idle expiry (Active) or end of quarantine (Quarantined)
	Counters
}

// ListenerStats is a snapshot of one listener.
type ListenerStats struct {
	Listener    Listener
	Removed     bool // removed, draining its bindings
	Backends    int  // configured backends
	Active      int  // active bindings
	Quarantined int  // quarantined bindings
	Created     uint64
	Retargets   uint64 // TCP bindings moved by a retransmitted SYN
	Failovers   uint64 // UDP failovers
	Counters
}

// Stats is a snapshot of the whole NAT.
type Stats struct {
	Capacity    int
	Active      int
	Quarantined int
	Created     uint64
	Failovers   uint64
	Retargets   uint64
	Refused     uint64 // new flows refused for capacity (also in Drops[ReasonCapacity])
	FragPending int    // incomplete datagrams held
	FragBytes   int    // fragment payload bytes held
	Reassembled uint64
	Fragmented  uint64 // packets split into fragments
	ICMPSent    uint64 // ICMP errors generated (fragmentation needed, port unreachable)
	Drops       [NumDropReasons]uint64
}
