package tsng

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/transport/wg"
)

// startTUNLocked runs the network on a kernel TUN (root): the overlay
// address and range on the interface, real sockets on the overlay address
// for the control channel, checks and DNS, and shadow ports reserved by
// binding real sockets.
//
// +checklocks:n.mu
func (n *netRuntime) startTUNLocked(ctx context.Context) error {
	self := n.self()
	name := n.cfg.TUN
	if name == "" {
		name = "tsng-" + n.cfg.Name
		if len(name) > 15 {
			// Interface names hold 15 bytes: keep a prefix and a hash of the
			// whole network name, so two long names never collide.
			h := crc32.ChecksumIEEE([]byte(n.cfg.Name))
			name = fmt.Sprintf("tsng-%.4s%06x", n.cfg.Name, h&0xffffff)
		}
	}
	n.tunName = name
	dev, err := tun.CreateTUN(name, 1420)
	if err != nil {
		return fmt.Errorf("creating TUN %s: %w", name, err)
	}
	link, err := netlink.LinkByName(name)
	if err == nil {
		prefix, _ := netip.ParsePrefix(n.cfg.Overlay)
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: self.Addr.AsSlice(), Mask: net.CIDRMask(prefix.Bits(), 32)}}
		if err = netlink.AddrReplace(link, addr); err == nil {
			// Before the link is up, so that no IPv6 link-local address,
			// router solicitation or MLD report ever enters the tunnel.
			err = disableIPv6(name)
		}
		if err == nil {
			err = netlink.LinkSetUp(link)
		}
	}
	if err != nil {
		dev.Close()
		return fmt.Errorf("configuring TUN %s: %w", name, err)
	}
	res, err := flow.NewOSReserver(self.Addr)
	if err != nil {
		dev.Close()
		return err
	}
	kn := KernelNet{Self: self.Addr}
	return n.startOnLocked(ctx, wg.PacketIOFromTUN(dev), kn, kn, res, func(ap netip.AddrPort) (net.PacketConn, error) {
		return net.ListenPacket("udp4", ap.String())
	})
}

// disableIPv6 turns IPv6 off on interface ifname: the overlay carries IPv4
// only. A kernel without IPv6 has nothing to turn off.
func disableIPv6(ifname string) error {
	err := os.WriteFile("/proc/sys/net/ipv6/conf/"+ifname+"/disable_ipv6", []byte("1\n"), 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("disabling IPv6 on %s: %w", ifname, err)
	}
	return nil
}
