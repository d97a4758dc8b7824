package wg

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vipkit/vipkit/transport"
)

// Errors. Every error the package returns for bad input wraps one of these
// (match with errors.Is); the message around it names the peer or value.
var (
	// ErrBadKey means a key's text is not 32 bytes of base64 (ParseKey) or hex
	// (the UAPI).
	ErrBadKey = errors.New("wg: bad key")
	// ErrInvalidOptions is returned by NewDevice for arguments it cannot
	// use (no PacketIO). A bad Config is bad input instead: its errors are
	// the others of this block.
	ErrInvalidOptions = errors.New("wg: invalid options")
	// ErrZeroKey means a private key or a peer's public key is the zero key,
	// or a preshared key is given as a pointer to the zero key (use nil).
	ErrZeroKey = errors.New("wg: zero key")
	// ErrSelfPeer means a peer has the device's own public key. WireGuard
	// ignores such a peer silently; vipkit refuses it.
	ErrSelfPeer = errors.New("wg: peer has the device's own public key")
	// ErrDuplicatePeer means two peers of one Config have the same public key.
	ErrDuplicatePeer = errors.New("wg: duplicate peer")
	// ErrTooManyPeers means a Config has more than MaxPeers peers.
	ErrTooManyPeers = errors.New("wg: too many peers")
	// ErrBadPrefix means an allowed IP is not a valid prefix, or has bits set
	// past its length (10.0.0.1/24: WireGuard would silently mask it).
	ErrBadPrefix = errors.New("wg: bad allowed IP prefix")
	// ErrDuplicateAllowedIP means one prefix is listed twice, by one peer or by
	// two. WireGuard would silently give it to the last peer; move it with
	// MoveAllowedIP instead. Nested prefixes (10.0.0.0/24 on one peer,
	// 10.0.0.7/32 on another) are allowed: the longest match wins.
	ErrDuplicateAllowedIP = errors.New("wg: allowed IP listed twice")
	// ErrTooManyAllowedIPs means a peer has more than MaxAllowedIPs prefixes.
	ErrTooManyAllowedIPs = errors.New("wg: too many allowed IPs")
	// ErrNotHostPrefix means MoveAllowedIP was given a prefix that is not a /32
	// or a /128.
	ErrNotHostPrefix = errors.New("wg: not a /32 or /128 prefix")
	// ErrBadEndpoint means a peer's endpoint has no address, an unspecified or
	// multicast address, port 0, or is refused by the Bind.
	ErrBadEndpoint = errors.New("wg: bad endpoint")
	// ErrBadKeepalive means a persistent keepalive is negative, not a whole
	// number of seconds, or longer than MaxPersistentKeepalive.
	ErrBadKeepalive = errors.New("wg: bad persistent keepalive")
	// ErrNoSuchPeer means the device has no peer with that public key.
	ErrNoSuchPeer = errors.New("wg: no such peer")
	// ErrUAPI means the device's UAPI text could not be parsed (a bug in
	// wireguard-go or in this package, never bad user input).
	ErrUAPI = errors.New("wg: malformed UAPI text")
	// ErrDevice means wireguard-go refused an operation (for example the listen
	// port is in use); the underlying error is wrapped too.
	ErrDevice = errors.New("wg: device error")
	// ErrDeviceClosed means the Device is closed. It matches
	// transport.ErrClosed and net.ErrClosed as well.
	ErrDeviceClosed = fmt.Errorf("wg: device closed: %w", transport.ErrClosed)
)

// Limits enforced by Config validation.
const (
	// MaxPeers is wireguard-go's limit on the peers of one device.
	MaxPeers = 1 << 16
	// MaxAllowedIPs bounds the prefixes of one peer, so that one bad
	// configuration cannot grow the routing trie without limit.
	MaxAllowedIPs = 1 << 16
	// MaxPersistentKeepalive is the longest keepalive interval the UAPI
	// carries (a 16-bit number of seconds).
	MaxPersistentKeepalive = 65535 * time.Second
)

// PeerConfig is one peer of a device.
type PeerConfig struct {
	// PublicKey identifies the peer. Required.
	PublicKey Key
	// Endpoint is where to send the peer's packets first. The zero value
	// means "unknown": the device waits for the peer to reach it and then
	// roams to the peer's source address, and an update with no Endpoint
	// keeps whatever endpoint the device has learned.
	Endpoint netip.AddrPort
	// AllowedIPs are the prefixes routed to this peer and accepted from it.
	// They must be masked (10.0.0.0/24, not 10.0.0.1/24), and no prefix may
	// appear twice in a Config.
	AllowedIPs []netip.Prefix
	// PersistentKeepalive sends a keepalive this often when nothing else was
	// sent; 0 disables it. Whole seconds, at most MaxPersistentKeepalive.
	PersistentKeepalive time.Duration
	// PresharedKey adds a symmetric key to the handshake; nil means none.
	PresharedKey *Key
}

// Config is a whole device configuration.
type Config struct {
	// PrivateKey is the device's static private key. Required.
	PrivateKey Key
	// ListenPort is the UDP port (or the simulated network's port) to listen
	// on. 0 lets the Bind choose at NewDevice, and leaves the port as it is
	// in Configure. Config() reports the port actually in use.
	ListenPort uint16
	// Peers are the device's peers; their order does not matter.
	Peers []PeerConfig
}

// PeerStats is the run-time state of one peer.
type PeerStats struct {
	// LastHandshake is when the last handshake completed; zero if never.
	LastHandshake time.Time
	// RxBytes and TxBytes count the bytes received from and sent to the
	// peer, WireGuard overhead included.
	RxBytes, TxBytes uint64
	// Endpoint is the peer's current endpoint (it roams), zero if unknown.
	Endpoint netip.AddrPort
}

// Clone returns a deep copy of c.
func (c Config) Clone() Config {
	c.Peers = slices.Clone(c.Peers)
	for i := range c.Peers {
		c.Peers[i] = c.Peers[i].Clone()
	}
	return c
}

// Clone returns a deep copy of p.
func (p PeerConfig) Clone() PeerConfig {
	p.AllowedIPs = slices.Clone(p.AllowedIPs)
	if p.PresharedKey != nil {
		k := *p.PresharedKey
		p.PresharedKey = &k
	}
	return p
}

// Normalize puts c in the form Device.Config reports, and returns it: the
// private key clamped (as WireGuard stores it; the public key is the same),
// peers sorted by public key, each peer's allowed IPs sorted, empty lists
// nil. Peers and allowed IPs are sorted in place (Clone first to keep c).
// Two normalized configurations are equal (reflect.DeepEqual) when they
// configure the same device.
func (c Config) Normalize() Config {
	c.PrivateKey = c.PrivateKey.clamped()
	slices.SortFunc(c.Peers, func(a, b PeerConfig) int { return a.PublicKey.compare(b.PublicKey) })
	for i := range c.Peers {
		slices.SortFunc(c.Peers[i].AllowedIPs, comparePrefix)
		if len(c.Peers[i].AllowedIPs) == 0 {
			c.Peers[i].AllowedIPs = nil
		}
	}
	if len(c.Peers) == 0 {
		c.Peers = nil
	}
	return c
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// Validate checks c without touching any device: keys, duplicate peers,
// allowed IPs (masked, none listed twice), endpoints and keepalives. The
// error wraps one of the package's sentinel errors.
func (c Config) Validate() error {
	if c.PrivateKey.IsZero() {
		return fmt.Errorf("%w: private key is required", ErrZeroKey)
	}
	if len(c.Peers) > MaxPeers {
		return fmt.Errorf("%w: %d peers, at most %d", ErrTooManyPeers, len(c.Peers), MaxPeers)
	}
	self := c.PrivateKey.PublicKey()
	peers := make(map[Key]int, len(c.Peers))
	owner := make(map[netip.Prefix]Key)
	for i, p := range c.Peers {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("peer %d: %w", i, err)
		}
		if p.PublicKey == self {
			return fmt.Errorf("peer %d (%v): %w", i, p.PublicKey, ErrSelfPeer)
		}
		if j, ok := peers[p.PublicKey]; ok {
			return fmt.Errorf("peers %d and %d: %w: %v", j, i, ErrDuplicatePeer, p.PublicKey)
		}
		peers[p.PublicKey] = i
		for _, a := range p.AllowedIPs {
			if o, ok := owner[a]; ok && o != p.PublicKey {
				return fmt.Errorf("%w: %v on peers %v and %v", ErrDuplicateAllowedIP, a, o, p.PublicKey)
			}
			owner[a] = p.PublicKey
		}
	}
	return nil
}

// Validate checks one peer on its own (see Config.Validate).
func (p PeerConfig) Validate() error {
	if p.PublicKey.IsZero() {
		return fmt.Errorf("%w: peer public key is required", ErrZeroKey)
	}
	if p.PresharedKey != nil && p.PresharedKey.IsZero() {
		return fmt.Errorf("%w: preshared key of %v is zero (use nil for none)", ErrZeroKey, p.PublicKey)
	}
	if err := checkEndpoint(p.Endpoint); err != nil {
		return fmt.Errorf("peer %v: %w", p.PublicKey, err)
	}
	if k := p.PersistentKeepalive; k < 0 || k > MaxPersistentKeepalive || k%time.Second != 0 {
		return fmt.Errorf("%w: %v for peer %v (whole seconds, 0 to %v)", ErrBadKeepalive, k, p.PublicKey, MaxPersistentKeepalive)
	}
	if len(p.AllowedIPs) > MaxAllowedIPs {
		return fmt.Errorf("%w: peer %v has %d, at most %d", ErrTooManyAllowedIPs, p.PublicKey, len(p.AllowedIPs), MaxAllowedIPs)
	}
	seen := make(map[netip.Prefix]struct{}, len(p.AllowedIPs))
	for _, a := range p.AllowedIPs {
		if err := checkPrefix(a); err != nil {
			return fmt.Errorf("peer %v: %w", p.PublicKey, err)
		}
		if _, ok := seen[a]; ok {
			return fmt.Errorf("%w: %v twice on peer %v", ErrDuplicateAllowedIP, a, p.PublicKey)
		}
		seen[a] = struct{}{}
	}
	return nil
}

func checkPrefix(a netip.Prefix) error {
	if !a.IsValid() {
		return fmt.Errorf("%w: %v is not a valid prefix", ErrBadPrefix, a)
	}
	if a.Masked() != a {
		return fmt.Errorf("%w: %v has bits set past /%d (did you mean %v?)", ErrBadPrefix, a, a.Bits(), a.Masked())
	}
	return nil
}

func checkEndpoint(e netip.AddrPort) error {
	if e == (netip.AddrPort{}) {
		return nil // unknown endpoint
	}
	a := e.Addr()
	switch {
	case !a.IsValid():
		return fmt.Errorf("%w: %v has no address", ErrBadEndpoint, e)
	case a.IsUnspecified():
		return fmt.Errorf("%w: %v has an unspecified address", ErrBadEndpoint, e)
	case a.IsMulticast():
		return fmt.Errorf("%w: %v is multicast", ErrBadEndpoint, e)
	case e.Port() == 0:
		return fmt.Errorf("%w: %v has port 0", ErrBadEndpoint, e)
	}
	return nil
}
