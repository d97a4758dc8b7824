package flow

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/vipkit/vipkit/packet"
	"github.com/vipkit/vipkit/transport"
)

// Defaults. docs/defaults.md gives each with its reason and the test that
// pins it.
const (
	DefaultCapacity          = 4096
	DefaultMTU               = 1420
	DefaultTCPIdleTimeout    = 7200 * time.Second
	DefaultUDPIdleTimeout    = 120 * time.Second
	DefaultTCPClosedTimeout  = 10 * time.Second  // after RST, like conntrack's CLOSE
	DefaultTCPFinTimeout     = 120 * time.Second // after FIN both ways, like conntrack's TIME_WAIT
	DefaultQuarantine        = 120 * time.Second
	DefaultMaxFragDatagrams  = 64
	DefaultMaxFragBytes      = 4 << 20
	DefaultMaxFragments      = 128
	DefaultFragTimeout       = 30 * time.Second
	DefaultSweepInterval     = time.Second
	DefaultMaxBackends       = 32
	DefaultMaxListenersPerIP = 16
	// DefaultReplyRate and DefaultReplyBurst are the token bucket of the
	// refusals (RST, ICMP port unreachable) an empty VIP or listener
	// sends: replies per second, and at most this many at once.
	DefaultReplyRate  = 100
	DefaultReplyBurst = 20
	// MaxReplyRate and MaxReplyBurst bound Options.ReplyRate and
	// ReplyBurst, so that the bucket's nanosecond arithmetic never
	// overflows.
	MaxReplyRate  = 1_000_000
	MaxReplyBurst = 1_000_000
)

// Options configures New. Zero fields take the defaults above.
type Options struct {
	// LocalAddr is this node's IPv4 overlay address: the source remote
	// backends see, and the address of local backends. Required.
	LocalAddr netip.Addr
	// Selector picks backends for new bindings. Required. It is called
	// with the NAT's lock held (see Selector for the contract).
	Selector Selector
	// Reserver reserves shadow ports, called with the NAT's lock held (see
	// PortReserver for the contract). nil means a MemReserver keyed per
	// protocol over the ephemeral range (32768–60999). Use an OSReserver on
	// a real host so that no local socket can take a shadow port.
	Reserver PortReserver
	// Clock drives idle expiry, quarantine and fragment expiry. nil means
	// the real clock. The now passed to FromHost and FromPeer must come from
	// the same clock.
	Clock transport.Clock
	// Emit receives packets the NAT produces besides in-place rewrites:
	// fragments, reassembled datagrams and ICMP errors it originates. pkt
	// is valid only during the call (copy it). Emit is called only from inside
	// FromHost and FromPeer (never from a timer), with the NAT's lock held:
	// it is on the packet path, where releasing the lock per emitted packet
	// would cost, so it must not block (queue the packet, dropping when the
	// queue is full) and must not call back into the NAT, or anything that
	// waits for a NAT call to finish. nil drops such output with
	// ReasonNoEmit.
	Emit func(dir Direction, pkt []byte)
	// Admit is the network/peer admission of traffic from peers, applied to
	// every IPv4 packet FromPeer sees for LocalAddr before reverse NAT: it
	// reports whether peer may send from src to dst. It is called with no
	// NAT lock held, from the goroutine calling FromPeer, once per packet,
	// so it should be quick. nil admits everything (the VIP source and
	// destination checks apply regardless).
	Admit func(peer PeerID, src, dst netip.Addr) bool
	// OnPortUnreachable is told when a backend answers a binding with ICMP
	// port unreachable (the engine excludes it, for UDP failover, and calls
	// HealthChanged). It is called after the NAT's lock is released, from
	// the goroutine calling FromPeer or FromHost.
	OnPortUnreachable func(l Listener, b Backend)
	// OnListenerGone is told the final counters of a removed listener when
	// the NAT forgets it: at RemoveListener (or RemoveVIP) when it has no
	// bindings, else when its last binding leaves quarantine. Its backends'
	// counters are part of the listener's. Whoever keeps totals above the
	// listener (the vip engine's per-VIP totals) folds them in here. It is
	// called with the NAT's lock held, from the control method, the packet
	// path or the expiry sweep (keeping the final counts and the listener's
	// removal one atomic step), so it must be quick, must not block and
	// must not call back into the NAT; a leaf lock of the receiver's own
	// is fine. Close forgets listeners without calling it.
	OnListenerGone func(ListenerStats)

	MTU     int // the overlay MTU (bytes); 0 means 1420
	HostMTU int // the host TUN's MTU; 0 means MTU

	Capacity int // active + quarantined bindings; 0 means 4096, at most MaxCapacity

	TCPIdleTimeout   time.Duration // 0 means 7200 s
	UDPIdleTimeout   time.Duration // 0 means 120 s
	TCPClosedTimeout time.Duration // retention after a RST; 0 means 10 s
	TCPFinTimeout    time.Duration // retention after FIN in both directions; 0 means 120 s
	Quarantine       time.Duration // shadow-port quarantine; 0 means 120 s

	MaxFragDatagrams          int           // incomplete datagrams held; 0 means 64
	MaxFragDatagramsPerSender int           // per authenticated sender; 0 means half of MaxFragDatagrams
	MaxFragBytes              int           // fragment payload bytes held; 0 means 4 MiB
	MaxFragments              int           // fragments per datagram; 0 means 128
	FragTimeout               time.Duration // idle expiry of an incomplete datagram; 0 means 30 s

	MaxBackends        int // per listener; 0 means 32
	MaxListenersPerVIP int // 0 means 16

	// ReplyRate and ReplyBurst bound the refusals sent for traffic to a
	// VIP port without a listener, or to a listener without backends: a
	// TCP RST or an ICMP port unreachable, from the VIP, toward the host
	// (Emit), counted as ReasonRefused and ReasonPortUnreachable. The
	// token bucket runs on Clock; past it the packet is dropped silently
	// with its cause (ReasonNoListener, ReasonNoBackend). ReplyRate is in
	// replies per second: 0 means DefaultReplyRate, negative sends none.
	// ReplyBurst 0 means DefaultReplyBurst.
	ReplyRate  int
	ReplyBurst int

	// SweepInterval is how often the clock-driven sweep expires bindings
	// and fragments while there are any; 0 means 1 s.
	SweepInterval time.Duration
}

func (o *Options) normalize() error {
	if !o.LocalAddr.Is4() {
		return fmt.Errorf("%w: LocalAddr %v is not an IPv4 address", ErrInvalidOptions, o.LocalAddr)
	}
	if o.Selector == nil {
		return fmt.Errorf("%w: no Selector", ErrInvalidOptions)
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.MTU, DefaultMTU)
	def(&o.HostMTU, o.MTU)
	def(&o.Capacity, DefaultCapacity)
	def(&o.MaxFragDatagrams, DefaultMaxFragDatagrams)
	def(&o.MaxFragDatagramsPerSender, (o.MaxFragDatagrams+1)/2)
	def(&o.MaxFragBytes, DefaultMaxFragBytes)
	def(&o.MaxFragments, DefaultMaxFragments)
	def(&o.MaxBackends, DefaultMaxBackends)
	def(&o.MaxListenersPerVIP, DefaultMaxListenersPerIP)
	def(&o.ReplyRate, DefaultReplyRate)
	def(&o.ReplyBurst, DefaultReplyBurst)
	defd(&o.TCPIdleTimeout, DefaultTCPIdleTimeout)
	defd(&o.UDPIdleTimeout, DefaultUDPIdleTimeout)
	defd(&o.TCPClosedTimeout, DefaultTCPClosedTimeout)
	defd(&o.TCPFinTimeout, DefaultTCPFinTimeout)
	defd(&o.Quarantine, DefaultQuarantine)
	defd(&o.FragTimeout, DefaultFragTimeout)
	defd(&o.SweepInterval, DefaultSweepInterval)
	switch {
	case o.MTU < 68 || o.MTU > packet.IPv4MaxPacketLen || o.HostMTU < 68 || o.HostMTU > packet.IPv4MaxPacketLen:
		return fmt.Errorf("%w: MTU %d / HostMTU %d outside 68..65535", ErrInvalidOptions, o.MTU, o.HostMTU)
	case o.Capacity < 1 || o.Capacity > MaxCapacity:
		return fmt.Errorf("%w: Capacity %d outside 1..%d", ErrInvalidOptions, o.Capacity, MaxCapacity)
	case o.MaxFragDatagrams < 0 || o.MaxFragDatagramsPerSender < 0 || o.MaxFragBytes < 0 || o.MaxFragments < 1:
		return fmt.Errorf("%w: negative fragment limit", ErrInvalidOptions)
	case o.ReplyRate > MaxReplyRate || o.ReplyBurst < 0 || o.ReplyBurst > MaxReplyBurst:
		return fmt.Errorf("%w: ReplyRate %d / ReplyBurst %d outside ..%d / 0..%d", ErrInvalidOptions, o.ReplyRate, o.ReplyBurst, MaxReplyRate, MaxReplyBurst)
	case o.MaxBackends < 1 || o.MaxListenersPerVIP < 1:
		return fmt.Errorf("%w: MaxBackends and MaxListenersPerVIP must be positive", ErrInvalidOptions)
	case o.TCPIdleTimeout < 0 || o.UDPIdleTimeout < 0 || o.TCPClosedTimeout < 0 || o.TCPFinTimeout < 0 ||
		o.Quarantine < 0 || o.FragTimeout < 0 || o.SweepInterval < 0:
		return fmt.Errorf("%w: negative timeout", ErrInvalidOptions)
	}
	return nil
}
