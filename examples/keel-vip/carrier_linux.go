//go:build linux

package keelvip

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/wg"
)

// LinkCarrier is the claim.Carrier of a node: it adds and drops the VIP
// /128 on the WireGuard interface with netlink (preferred_lft 0, so the
// address answers connections but is never chosen as a source; no DAD), and
// routes the VIP to its holder by moving the /128 between the peers'
// allowed IPs of the wireguard-go device (transport/wg: one step, never
// unrouted). Only the root helper holds one. Safe for concurrent use.
//
// It is a claim.LeasedCarrier: CarryUntil writes the address with
// valid_lft = floor(time left before the deadline) in seconds, so the
// kernel removes it by itself at the deadline even if every keel-vip
// process is frozen, and arms a CLOCK_BOOTTIME timer (claim.BootClock)
// that drops it at the deadline too. The kernel's address timers run on
// jiffies, which do not advance while the machine is suspended; the
// BootClock timer does count suspended time and fires within
// claim.BootTimerSlice of the resume, so an address whose deadline passed
// during a suspend is dropped right after the wake-up, before the lease
// could matter. With less than claim.MinCarryLeft left it drops instead.
// Carry (no deadline: the no-etcd mode) writes valid_lft forever.
type LinkCarrier struct {
	nl    *netlink.Handle
	link  string
	dev   *wg.Device
	mesh  *Mesh
	log   *EventLog
	clock transport.Clock // +checklocksignore: set by the constructor, read-only after

	// mu guards added, until and timers, and serializes the netlink
	// changes to the link's addresses.
	mu syncx.Mutex
	// +checklocks:mu
	added map[netip.Addr]bool
	// until and timers: the deadline of each address carried with one, and
	// the timer that drops it then.
	// +checklocks:mu
	until map[netip.Addr]time.Time
	// +checklocks:mu
	timers map[netip.Addr]transport.Timer
}

var _ claim.LeasedCarrier = (*LinkCarrier)(nil)

// NewLinkCarrier returns a carrier for the interface named link (in the
// namespace of nl; nil means the current one) and the device dev. log may
// be nil.
func NewLinkCarrier(nl *netlink.Handle, link string, dev *wg.Device, m *Mesh, log *EventLog) *LinkCarrier {
	if nl == nil {
		nl = &netlink.Handle{}
	}
	return &LinkCarrier{nl: nl, link: link, dev: dev, mesh: m, log: log, clock: claim.BootClock{},
		added: map[netip.Addr]bool{}, until: map[netip.Addr]time.Time{}, timers: map[netip.Addr]transport.Timer{}}
}

// vipAddr is the netlink form of vip/128 with valid_lft validLft seconds
// (math.MaxUint32: forever) and preferred_lft 0.
func vipAddr(vip netip.Addr, validLft int) *netlink.Addr {
	return &netlink.Addr{
		IPNet:       &net.IPNet{IP: vip.AsSlice(), Mask: net.CIDRMask(128, 128)},
		PreferedLft: 0,
		ValidLft:    validLft,
		Flags:       unix.IFA_F_NODAD,
	}
}

// Carry implements claim.Carrier: vip/128 with preferred_lft 0 and
// valid_lft forever.
func (c *LinkCarrier) Carry(ctx context.Context, vip netip.Addr) error {
	return c.carry(ctx, vip, time.Time{})
}

// CarryUntil implements claim.LeasedCarrier: deadline is a CLOCK_BOOTTIME
// instant (claim.BootClock).
func (c *LinkCarrier) CarryUntil(ctx context.Context, vip netip.Addr, deadline time.Time) error {
	if deadline.IsZero() {
		return fmt.Errorf("%w: carry %v with no deadline", claim.ErrMalformed, vip)
	}
	return c.carry(ctx, vip, deadline)
}

func (c *LinkCarrier) carry(ctx context.Context, vip netip.Addr, deadline time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	lk, err := c.nl.LinkByName(c.link)
	if err != nil {
		return fmt.Errorf("keelvip: carry %v: %w", vip, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	lft := math.MaxUint32 // forever
	if !deadline.IsZero() {
		left := deadline.Sub(c.clock.Now())
		if left < claim.MinCarryLeft {
			if err := c.dropLocked(lk, vip); err != nil {
				return err
			}
			return fmt.Errorf("%w: %v left for %v", claim.ErrDeadlinePassed, left, vip)
		}
		lft = int(left / time.Second)
	}
	if !c.added[vip] {
		c.log.Record("add", vip) // stamped before the address exists
	}
	if err := c.nl.AddrReplace(lk, vipAddr(vip, lft)); err != nil {
		return fmt.Errorf("keelvip: carry %v on %s: %w", vip, c.link, err)
	}
	c.added[vip] = true
	c.stopTimerLocked(vip)
	if !deadline.IsZero() {
		c.until[vip] = deadline
		c.timers[vip] = c.clock.AfterFunc(deadline.Sub(c.clock.Now()), func() { c.expire(vip, deadline) })
	}
	return nil
}

// expire drops vip if its deadline is still the one the timer was armed
// for.
func (c *LinkCarrier) expire(vip netip.Addr, deadline time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.until[vip]; !ok || !d.Equal(deadline) {
		return
	}
	// On an error the kernel's valid_lft removes it at the same deadline.
	if lk, err := c.nl.LinkByName(c.link); err == nil {
		_ = c.dropLocked(lk, vip)
	}
}

// +checklocks:c.mu
func (c *LinkCarrier) stopTimerLocked(vip netip.Addr) {
	if t := c.timers[vip]; t != nil {
		t.Stop()
	}
	delete(c.timers, vip)
	delete(c.until, vip)
}

// Until returns the deadline vip is carried until (zero: not carried, or
// carried forever).
func (c *LinkCarrier) Until(vip netip.Addr) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.until[vip]
}

// Drop implements claim.Carrier. Dropping an address that is not there
// succeeds.
func (c *LinkCarrier) Drop(ctx context.Context, vip netip.Addr) error {
	lk, err := c.nl.LinkByName(c.link)
	if err != nil {
		return fmt.Errorf("keelvip: drop %v: %w", vip, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropLocked(lk, vip)
}

// +checklocks:c.mu
func (c *LinkCarrier) dropLocked(lk netlink.Link, vip netip.Addr) error {
	err := c.nl.AddrDel(lk, vipAddr(vip, 0))
	if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENOENT) && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("keelvip: drop %v on %s: %w", vip, c.link, err)
	}
	if c.added[vip] || err == nil {
		c.log.Record("remove", vip) // stamped after the address is gone
	}
	delete(c.added, vip)
	c.stopTimerLocked(vip)
	return nil
}

// Carried reports whether the interface carries vip, read back live.
func (c *LinkCarrier) Carried(vip netip.Addr) (bool, error) {
	lk, err := c.nl.LinkByName(c.link)
	if err != nil {
		return false, err
	}
	as, err := c.nl.AddrList(lk, netlink.FAMILY_V6)
	if err != nil {
		return false, err
	}
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == vip {
			return true, nil
		}
	}
	return false, nil
}

// Route implements claim.Carrier: vip/128 moves to the allowed IPs of the
// peer at holder; the zero holder removes it from every peer.
func (c *LinkCarrier) Route(ctx context.Context, vip, holder netip.Addr) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	pfx := netip.PrefixFrom(vip, 128)
	if holder.IsValid() && holder != c.mesh.Self.Addr {
		p, ok := c.mesh.PeerByAddr(holder)
		if !ok {
			return fmt.Errorf("%w: %v is not a peer", claim.ErrUnknownNode, holder)
		}
		return c.dev.MoveAllowedIP(pfx, p.WGKey)
	}
	cfg, err := c.dev.Config()
	if err != nil {
		return err
	}
	for _, p := range cfg.Peers {
		if slices.Contains(p.AllowedIPs, pfx) {
			p.AllowedIPs = slices.DeleteFunc(p.AllowedIPs, func(q netip.Prefix) bool { return q == pfx })
			p.Endpoint = netip.AddrPort{}
			if err := c.dev.UpsertPeer(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// RoutedTo returns the peer the device routes vip/128 to, read back live.
func (c *LinkCarrier) RoutedTo(vip netip.Addr) (Peer, bool, error) {
	cfg, err := c.dev.Config()
	if err != nil {
		return Peer{}, false, err
	}
	pfx := netip.PrefixFrom(vip, 128)
	for _, p := range cfg.Peers {
		if slices.Contains(p.AllowedIPs, pfx) {
			q, ok := c.mesh.peerByWGKey(p.PublicKey)
			return q, ok, nil
		}
	}
	return Peer{}, false, nil
}

// DropAll removes every VIP address from the interface: the declared VIP
// and any deprecated (preferred_lft 0) /128 other than the node's own
// address. It is what stopping the helper (and ExecStopPost) does, so a
// dead controller never leaves an unrenewed VIP behind.
func (c *LinkCarrier) DropAll(ctx context.Context) error {
	lk, err := c.nl.LinkByName(c.link)
	if err != nil {
		if _, ok := err.(netlink.LinkNotFoundError); ok {
			return nil
		}
		return err
	}
	as, err := c.nl.AddrList(lk, netlink.FAMILY_V6)
	if err != nil {
		return err
	}
	var errs []error
	for _, a := range as {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		ones, _ := a.Mask.Size()
		vip := ip == c.mesh.VIP || (ones == 128 && ip != c.mesh.Self.Addr && a.PreferedLft == 0 && a.Flags&unix.IFA_F_DEPRECATED != 0)
		if vip {
			errs = append(errs, c.Drop(ctx, ip))
		}
	}
	return errors.Join(errs...)
}
