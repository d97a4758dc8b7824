//go:build linux

package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vipkit/vipkit/internal/syncx"
)

// Address plan. Every address lives only inside this package's namespaces,
// never on the machine's own interfaces, so tests cannot collide with real
// networks. The ranges are reserved for benchmarking (RFC 2544), shared
// address space (RFC 6598) and unique local IPv6 (RFC 4193).
var (
	// LinkPrefix4 holds the point-to-point underlay subnets that Connect
	// allocates: one /24 per link, 198.18.K.1 on end A and 198.18.K.2 on B.
	LinkPrefix4 = netip.MustParsePrefix("198.18.0.0/16")
	// LinkPrefix6 holds Connect's IPv6 subnets: fd00:18:0:K::/64, ::1 on A
	// and ::2 on B.
	LinkPrefix6 = netip.MustParsePrefix("fd00:18::/48")
	// LANPrefix4 holds the Switch subnets: one /24 per switch,
	// 198.19.K.N for the N-th attached host.
	LANPrefix4 = netip.MustParsePrefix("198.19.0.0/16")
	// LANPrefix6 holds the Switch IPv6 subnets: fd00:19:0:K::N/64.
	LANPrefix6 = netip.MustParsePrefix("fd00:19::/48")
	// OverlayPrefix4 and OverlayPrefix6 are for addresses inside tunnels
	// (the TUNs of StartWireGuard); callers pick from them, OverlayAddr4 and
	// OverlayAddr6 help.
	OverlayPrefix4 = netip.MustParsePrefix("100.64.0.0/10")
	OverlayPrefix6 = netip.MustParsePrefix("fd00:64::/48")
)

// maxSubnets is how many link (and, separately, LAN) subnets can be in use
// at once in a process: the /24s of LinkPrefix4 and LANPrefix4.
const maxSubnets = 256

// maxLANHosts is how many hosts one Switch can take (198.19.K.1–.254).
const maxLANHosts = 254

// ErrExhausted is returned by Connect, NewSwitch and Switch.Attach when all
// subnets (256 links or 256 switches in use at once in a process) or all host
// numbers of a switch (254) are taken.
var ErrExhausted = errors.New("netns: address pool exhausted")

// OverlayAddr4 returns 100.64.0.0 + n as a /32 (n from 1 to 2^22-2).
func OverlayAddr4(n int) netip.Prefix {
	a := OverlayPrefix4.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(n)
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 32)
}

// OverlayAddr6 returns fd00:64::n as a /128.
func OverlayAddr6(n int) netip.Prefix {
	a := OverlayPrefix6.Addr().As16()
	a[12], a[13], a[14], a[15] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	return netip.PrefixFrom(netip.AddrFrom16(a), 128)
}

// pool hands out subnet numbers 0..maxSubnets-1.
type pool struct {
	// mu guards used and next.
	mu syncx.Mutex
	// +checklocks:mu
	used [maxSubnets]bool
	// next is where the search for a free number starts.
	// +checklocks:mu
	next int
}

func (p *pool) get() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range maxSubnets {
		k := (p.next + i) % maxSubnets
		if !p.used[k] {
			p.used[k] = true
			p.next = k + 1
			return k, nil
		}
	}
	return 0, fmt.Errorf("%w: %d subnets in use", ErrExhausted, maxSubnets)
}

func (p *pool) put(k int) {
	p.mu.Lock()
	p.used[k] = false
	p.mu.Unlock()
}

var linkPool, lanPool pool

// subnet returns host number n of subnet k: base4.K.n/24 and base6:K::n/64.
func subnet(base4, base6 netip.Prefix, k, n int) (netip.Prefix, netip.Prefix) {
	a4 := base4.Addr().As4()
	a4[2], a4[3] = byte(k), byte(n)
	a6 := base6.Addr().As16()
	a6[6], a6[7] = byte(k>>8), byte(k)
	a6[14], a6[15] = byte(n>>8), byte(n)
	return netip.PrefixFrom(netip.AddrFrom4(a4), 24), netip.PrefixFrom(netip.AddrFrom16(a6), 64)
}

// Iface is one interface inside a Host.
type Iface struct {
	Host  *Host
	Name  string
	Index int
	MAC   net.HardwareAddr
	Addrs []netip.Prefix // the addresses this package put on it
}

// Addr4 returns the interface's first IPv4 address, or the zero Addr.
func (i Iface) Addr4() netip.Addr {
	for _, p := range i.Addrs {
		if p.Addr().Is4() {
			return p.Addr()
		}
	}
	return netip.Addr{}
}

// AddrPort4 returns the interface's first IPv4 address with port, such as a
// WireGuard endpoint.
func (i Iface) AddrPort4(port uint16) netip.AddrPort { return netip.AddrPortFrom(i.Addr4(), port) }

// AddrPort6 returns the interface's first IPv6 address with port.
func (i Iface) AddrPort6(port uint16) netip.AddrPort { return netip.AddrPortFrom(i.Addr6(), port) }

// Addr6 returns the interface's first IPv6 address, or the zero Addr.
func (i Iface) Addr6() netip.Addr {
	for _, p := range i.Addrs {
		if p.Addr().Is6() {
			return p.Addr()
		}
	}
	return netip.Addr{}
}

// LinkOptions configures Connect. The zero value gives MTU 1500 and one
// allocated IPv4 and IPv6 subnet.
type LinkOptions struct {
	MTU int // bytes; 0 means 1500

	// AddrsA and AddrsB replace the allocated addresses of each end when
	// either is set. NoAddrs leaves both ends without addresses.
	AddrsA, AddrsB []netip.Prefix
	NoAddrs        bool
}

// Link is a veth pair between two hosts, both ends up.
type Link struct {
	A, B Iface

	once   sync.Once
	subnet int // -1 when the addresses were not allocated
	err    error
}

// Connect creates a veth pair with one end in a and the other in b (named
// ethN in each, the next free N), sets the MTU and addresses and brings both
// ends up. The link is deleted by Link.Close or when either host closes.
// IPv6 addresses skip duplicate address detection so they are usable at once.
func Connect(ctx context.Context, a, b *Host, o LinkOptions) (*Link, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if a == b {
		return nil, errors.New("netns: Connect needs two different hosts")
	}
	if o.MTU == 0 {
		o.MTU = 1500
	}
	if o.MTU < 68 || o.MTU > 65535 {
		return nil, fmt.Errorf("netns: link MTU %d out of range 68–65535", o.MTU)
	}
	l := &Link{subnet: -1}
	addrsA, addrsB := o.AddrsA, o.AddrsB
	if !o.NoAddrs && addrsA == nil && addrsB == nil {
		k, err := linkPool.get()
		if err != nil {
			return nil, err
		}
		l.subnet = k
		a4, a6 := subnet(LinkPrefix4, LinkPrefix6, k, 1)
		b4, b6 := subnet(LinkPrefix4, LinkPrefix6, k, 2)
		addrsA, addrsB = []netip.Prefix{a4, a6}, []netip.Prefix{b4, b6}
	}
	var err error
	l.A, l.B, err = vethPair(a, b, o.MTU, "")
	if err != nil {
		l.release()
		return nil, err
	}
	if err := a.onClose(l.Close); err != nil {
		_ = l.Close()
		return nil, err
	}
	if err := b.onClose(l.Close); err != nil {
		_ = l.Close()
		return nil, err
	}
	for _, end := range []struct {
		i     *Iface
		addrs []netip.Prefix
	}{{&l.A, addrsA}, {&l.B, addrsB}} {
		for _, p := range end.addrs {
			if err := end.i.Host.AddAddr(end.i.Name, p); err != nil {
				_ = l.Close()
				return nil, err
			}
			end.i.Addrs = append(end.i.Addrs, p)
		}
		if err := end.i.Host.SetUp(end.i.Name); err != nil {
			_ = l.Close()
			return nil, err
		}
	}
	if err := seedNeighbors(l.A, l.B); err != nil {
		_ = l.Close()
		return nil, err
	}
	return l, nil
}

// seedNeighbors puts each interface's addresses and MAC into the other's
// neighbour table as STALE entries. Right after an interface comes up, the
// kernel joins its solicited-node multicast groups from a work queue, and a
// neighbour solicitation that arrives first is dropped: the first IPv6
// packet then waits a second or more for a retry. A STALE entry is used at
// once and confirmed by unicast, which needs no group; the kernel manages
// the entry from there as if it had learnt it.
func seedNeighbors(x, y Iface) error {
	for _, d := range [][2]Iface{{x, y}, {y, x}} {
		from, to := d[0], d[1]
		if len(to.MAC) == 0 {
			continue
		}
		for _, p := range to.Addrs {
			n := &netlink.Neigh{
				LinkIndex:    from.Index,
				Family:       netlink.FAMILY_V4,
				State:        netlink.NUD_STALE,
				IP:           net.IP(p.Addr().AsSlice()),
				HardwareAddr: to.MAC,
			}
			if p.Addr().Is6() {
				n.Family = netlink.FAMILY_V6
			}
			if err := from.Host.nl.NeighSet(n); err != nil {
				return fmt.Errorf("netns: neighbour %v on %s in %s: %w", p.Addr(), from.Name, from.Host.name, err)
			}
		}
	}
	return nil
}

// vethPair creates a veth with one end in a and the other in b. peerName
// names b's end ("" means b's next ethN).
func vethPair(a, b *Host, mtu int, peerName string) (Iface, Iface, error) {
	bfd, err := b.dupFD()
	if err != nil {
		return Iface{}, Iface{}, err
	}
	defer unix.Close(bfd)
	nameA := a.nextIfName()
	if peerName == "" {
		peerName = b.nextIfName()
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: nameA, MTU: mtu},
		PeerName:      peerName,
		PeerMTU:       uint32(mtu),
		PeerNamespace: netlink.NsFd(bfd),
	}
	if err := a.nl.LinkAdd(veth); err != nil {
		return Iface{}, Iface{}, fmt.Errorf("netns: veth %s/%s–%s/%s: %w", a.name, nameA, b.name, peerName, err)
	}
	la, err := a.nl.LinkByName(nameA)
	if err != nil {
		return Iface{}, Iface{}, fmt.Errorf("netns: veth %s/%s: %w", a.name, nameA, err)
	}
	lb, err := b.nl.LinkByName(peerName)
	if err != nil {
		_ = a.nl.LinkDel(la)
		return Iface{}, Iface{}, fmt.Errorf("netns: veth %s/%s: %w", b.name, peerName, err)
	}
	return Iface{Host: a, Name: nameA, Index: la.Attrs().Index, MAC: la.Attrs().HardwareAddr},
		Iface{Host: b, Name: peerName, Index: lb.Attrs().Index, MAC: lb.Attrs().HardwareAddr}, nil
}

// dupFD returns a new descriptor of the namespace, for the caller to close.
func (h *Host) dupFD() (int, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.closed {
		return -1, fmt.Errorf("%w: %s", ErrClosed, h.name)
	}
	fd, err := unix.FcntlInt(uintptr(h.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("netns: dup %s: %w", h.name, err)
	}
	return fd, nil
}

func (h *Host) nextIfName() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.ifSeq
	h.ifSeq++
	return fmt.Sprintf("eth%d", n)
}

// Close deletes the veth pair (both ends) and returns its subnet to the
// pool. It is idempotent; a pair already gone with its namespace is not an
// error.
func (l *Link) Close() error {
	l.once.Do(func() {
		for _, end := range []Iface{l.A, l.B} {
			if end.Host == nil {
				continue
			}
			err := end.Host.delLink(end.Index)
			if err == nil || errors.Is(err, ErrClosed) {
				// Deleting one end deletes both; a closed host's end is gone
				// or going with its namespace.
				if err == nil {
					break
				}
				continue
			}
			l.err = err
		}
		l.release()
	})
	return l.err
}

func (l *Link) release() {
	if l.subnet >= 0 {
		linkPool.put(l.subnet)
		l.subnet = -1
	}
}

// delLink deletes interface index; a missing interface is not an error.
func (h *Host) delLink(index int) error {
	h.mu.RLock()
	nl := h.nl
	h.mu.RUnlock()
	if nl == nil {
		return fmt.Errorf("%w: %s", ErrClosed, h.name)
	}
	lk, err := nl.LinkByIndex(index)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EBADF) {
			return nil
		}
		return fmt.Errorf("netns: link %d in %s: %w", index, h.name, err)
	}
	if err := nl.LinkDel(lk); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("netns: delete %s in %s: %w", lk.Attrs().Name, h.name, err)
	}
	return nil
}

// link returns the named interface.
func (h *Host) link(name string) (netlink.Link, error) {
	if h.isClosed() {
		return nil, fmt.Errorf("%w: %s", ErrClosed, h.name)
	}
	lk, err := h.nl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("netns: %s in %s: %w", name, h.name, err)
	}
	return lk, nil
}

func (h *Host) isClosed() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.closed
}

// AddAddr adds address p to interface ifname. IPv6 addresses skip duplicate
// address detection, so they can be bound at once.
func (h *Host) AddAddr(ifname string, p netip.Prefix) error {
	if !p.IsValid() {
		return fmt.Errorf("netns: invalid address %v for %s in %s", p, ifname, h.name)
	}
	lk, err := h.link(ifname)
	if err != nil {
		return err
	}
	addr := &netlink.Addr{IPNet: prefixNet(p)}
	if p.Addr().Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := h.nl.AddrAdd(lk, addr); err != nil {
		return fmt.Errorf("netns: add %v to %s in %s: %w", p, ifname, h.name, err)
	}
	return nil
}

// SetUp brings interface ifname up.
func (h *Host) SetUp(ifname string) error {
	lk, err := h.link(ifname)
	if err != nil {
		return err
	}
	if err := h.nl.LinkSetUp(lk); err != nil {
		return fmt.Errorf("netns: %s up in %s: %w", ifname, h.name, err)
	}
	return nil
}

// SetMTU sets interface ifname's MTU, in bytes.
func (h *Host) SetMTU(ifname string, mtu int) error {
	lk, err := h.link(ifname)
	if err != nil {
		return err
	}
	if err := h.nl.LinkSetMTU(lk, mtu); err != nil {
		return fmt.Errorf("netns: %s MTU %d in %s: %w", ifname, mtu, h.name, err)
	}
	return nil
}

// AddRoute routes dst through interface ifname, via gateway gw when gw is
// valid (otherwise dst is on-link).
func (h *Host) AddRoute(dst netip.Prefix, gw netip.Addr, ifname string) error {
	if !dst.IsValid() {
		return fmt.Errorf("netns: invalid route destination %v in %s", dst, h.name)
	}
	lk, err := h.link(ifname)
	if err != nil {
		return err
	}
	r := &netlink.Route{LinkIndex: lk.Attrs().Index, Dst: prefixNet(dst.Masked())}
	if gw.IsValid() {
		r.Gw = net.IP(gw.AsSlice())
	} else {
		r.Scope = netlink.SCOPE_LINK
	}
	if err := h.nl.RouteAdd(r); err != nil {
		return fmt.Errorf("netns: route %v via %v dev %s in %s: %w", dst, gw, ifname, h.name, err)
	}
	return nil
}

// Interfaces returns the names of the host's interfaces.
func (h *Host) Interfaces() ([]string, error) {
	if h.isClosed() {
		return nil, fmt.Errorf("%w: %s", ErrClosed, h.name)
	}
	links, err := h.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("netns: links of %s: %w", h.name, err)
	}
	names := make([]string, len(links))
	for i, l := range links {
		names[i] = l.Attrs().Name
	}
	return names, nil
}

// Sysctl writes value to the namespace's sysctl key (dotted, such as
// "net.ipv4.ip_forward"). Only per-namespace keys (net.*) are accepted.
func (h *Host) Sysctl(key, value string) error {
	if !strings.HasPrefix(key, "net.") || strings.Contains(key, "..") || strings.Contains(key, "/") {
		return fmt.Errorf("netns: sysctl %q is not a per-namespace net.* key", key)
	}
	path := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
	// /proc/sys/net resolves against the namespace of the opening thread.
	return h.Do(func() error {
		if err := os.WriteFile(path, []byte(value), 0); err != nil {
			return fmt.Errorf("netns: sysctl %s=%s in %s: %w", key, value, h.name, err)
		}
		return nil
	})
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Switch is one L2 segment (a Linux bridge in a namespace of its own) that
// joins any number of hosts, up to 254: each Attach adds a veth from the host
// to the bridge with the host's address in the switch's subnet.
//
// Make one with NewSwitch; it has no useful zero value. Its methods are safe
// for concurrent use. Close deletes the bridge namespace and with it every
// port; the hosts stay.
type Switch struct {
	host   *Host
	subnet int

	// mu guards next and members.
	mu syncx.Mutex
	// next is the next host number.
	// +checklocks:mu
	next int
	// members are the attached hosts.
	// +checklocks:mu
	members []member
}

// NewSwitch creates a bridge "br0" in a new namespace (name "" means
// UniqueName("sw")) and allocates the switch's subnets: 198.19.K.0/24 and
// fd00:19:0:K::/64.
func NewSwitch(ctx context.Context, name string) (*Switch, error) {
	if name == "" {
		var err error
		if name, err = UniqueName("sw"); err != nil {
			return nil, err
		}
	}
	k, err := lanPool.get()
	if err != nil {
		return nil, err
	}
	h, err := NewHost(ctx, name)
	if err != nil {
		lanPool.put(k)
		return nil, err
	}
	s := &Switch{host: h, subnet: k, next: 1}
	if err := h.onClose(func() error { lanPool.put(k); return nil }); err != nil {
		lanPool.put(k)
		_ = h.Close()
		return nil, err
	}
	off := false
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}, MulticastSnooping: &off}
	if err := h.nl.LinkAdd(br); err != nil {
		_ = h.Close()
		return nil, fmt.Errorf("netns: bridge in %s: %w", name, err)
	}
	if err := h.SetUp("br0"); err != nil {
		_ = h.Close()
		return nil, err
	}
	return s, nil
}

// Host returns the switch's own namespace (for capture or impairment).
func (s *Switch) Host() *Host { return s.host }

// Prefix4 returns the switch's IPv4 subnet.
func (s *Switch) Prefix4() netip.Prefix {
	p, _ := subnet(LANPrefix4, LANPrefix6, s.subnet, 0)
	return p
}

// Prefix6 returns the switch's IPv6 subnet.
func (s *Switch) Prefix6() netip.Prefix {
	_, p := subnet(LANPrefix4, LANPrefix6, s.subnet, 0)
	return p
}

// member is one attachment: the host's end and the bridge port.
type member struct {
	iface, port Iface
}

// PortOptions configures Switch.Attach. The zero value gives MTU 1500 and
// the next host number's addresses.
type PortOptions struct {
	MTU   int            // bytes; 0 means 1500
	Addrs []netip.Prefix // replaces the allocated addresses when set
}

// Attach connects h to the switch: a veth whose switch end is a bridge port
// and whose host end (ethN) gets 198.19.K.N/24 and fd00:19:0:K::N/64, where
// N counts attachments from 1. It returns ErrExhausted after 254 hosts. The
// port goes away with the switch or with h.
func (s *Switch) Attach(ctx context.Context, h *Host, o PortOptions) (Iface, error) {
	if err := ctx.Err(); err != nil {
		return Iface{}, err
	}
	if o.MTU == 0 {
		o.MTU = 1500
	}
	if o.MTU < 68 || o.MTU > 65535 {
		return Iface{}, fmt.Errorf("netns: port MTU %d out of range 68–65535", o.MTU)
	}
	s.mu.Lock()
	if s.next > maxLANHosts {
		s.mu.Unlock()
		return Iface{}, fmt.Errorf("%w: switch %s has %d hosts", ErrExhausted, s.host.name, maxLANHosts)
	}
	n := s.next
	s.next++
	s.mu.Unlock()

	addrs := o.Addrs
	if addrs == nil {
		a4, a6 := subnet(LANPrefix4, LANPrefix6, s.subnet, n)
		addrs = []netip.Prefix{a4, a6}
	}
	sw, hi, err := vethPair(s.host, h, o.MTU, "")
	if err != nil {
		return Iface{}, err
	}
	l := &Link{A: sw, B: hi, subnet: -1}
	if err := h.onClose(l.Close); err != nil {
		_ = l.Close()
		return Iface{}, err
	}
	if err := s.host.onClose(l.Close); err != nil {
		_ = l.Close()
		return Iface{}, err
	}
	br, err := s.host.link("br0")
	if err != nil {
		_ = l.Close()
		return Iface{}, err
	}
	swl, err := s.host.link(sw.Name)
	if err != nil {
		_ = l.Close()
		return Iface{}, err
	}
	if err := s.host.nl.LinkSetMaster(swl, br); err != nil {
		_ = l.Close()
		return Iface{}, fmt.Errorf("netns: enslave %s to br0 in %s: %w", sw.Name, s.host.name, err)
	}
	if err := s.host.SetUp(sw.Name); err != nil {
		_ = l.Close()
		return Iface{}, err
	}
	for _, p := range addrs {
		if err := h.AddAddr(hi.Name, p); err != nil {
			_ = l.Close()
			return Iface{}, err
		}
		hi.Addrs = append(hi.Addrs, p)
	}
	if err := h.SetUp(hi.Name); err != nil {
		_ = l.Close()
		return Iface{}, err
	}
	s.mu.Lock()
	members := slices.Clone(s.members)
	s.members = append(s.members, member{iface: hi, port: sw})
	s.mu.Unlock()
	for _, m := range members {
		if m.iface.Host.isClosed() {
			continue
		}
		if err := seedNeighbors(hi, m.iface); err != nil && !errors.Is(err, unix.ENODEV) {
			_ = l.Close()
			return Iface{}, err
		}
	}
	return hi, nil
}

// Close deletes the switch's namespace, its bridge and all its ports.
func (s *Switch) Close() error { return s.host.Close() }

// Linux bridge port states (include/uapi/linux/if_bridge.h).
// DISABLED, not BLOCKING: without STP the kernel recomputes every port
// that is not disabled back to forwarding.
const (
	brStateDisabled   = 0
	brStateForwarding = 3
)

// ErrNotAttached is returned by Switch.Cut and Switch.Heal for a host that
// was never attached to the switch.
var ErrNotAttached = errors.New("netns: host not attached to the switch")

// Cut partitions h from the switch: its bridge ports stop forwarding, so no
// frame of any protocol passes to or from h, while h's interface stays up
// with its addresses, routes and carrier (as when a cable is cut beyond the
// host's switch port). Heal undoes it. Cutting twice is harmless.
func (s *Switch) Cut(h *Host) error { return s.setPortState(h, brStateDisabled) }

// Heal reconnects a host cut by Cut.
func (s *Switch) Heal(h *Host) error { return s.setPortState(h, brStateForwarding) }

func (s *Switch) setPortState(h *Host, state byte) error {
	s.mu.Lock()
	var ports []Iface
	for _, m := range s.members {
		if m.iface.Host == h {
			ports = append(ports, m.port)
		}
	}
	s.mu.Unlock()
	if len(ports) == 0 {
		return fmt.Errorf("%w: %s on %s", ErrNotAttached, h.name, s.host.name)
	}
	for _, p := range ports {
		// RTM_SETLINK for the bridge family: IFLA_PROTINFO{IFLA_BRPORT_STATE}.
		// The request opens its own netlink socket, so it runs inside the
		// switch's namespace.
		err := s.host.Do(func() error {
			req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
			msg := nl.NewIfInfomsg(unix.AF_BRIDGE)
			msg.Index = int32(p.Index)
			req.AddData(msg)
			attr := nl.NewRtAttr(unix.IFLA_PROTINFO|unix.NLA_F_NESTED, nil)
			attr.AddRtAttr(nl.IFLA_BRPORT_STATE, []byte{state})
			req.AddData(attr)
			_, err := req.Execute(unix.NETLINK_ROUTE, 0)
			return err
		})
		if err != nil {
			return fmt.Errorf("netns: port %s of %s state %d in %s: %w", p.Name, h.name, state, s.host.name, err)
		}
	}
	return nil
}
