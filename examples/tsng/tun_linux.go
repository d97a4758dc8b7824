package tsng

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/transport/wg"
)

// startTUNLocked runs the network on a kernel TUN (root): the overlay
// address and range on the interface, real sockets on the overlay address
// for the control channel, checks and DNS, and shadow ports reserved by
// binding real sockets.
func (n *netRuntime) startTUNLocked(ctx context.Context) error {
	self := n.self()
	name := n.cfg.TUN
	if name == "" {
		name = "tsng-" + n.cfg.Name
		if len(name) > 15 {
			name = name[:15]
		}
	}
	dev, err := tun.CreateTUN(name, 1420)
	if err != nil {
		return fmt.Errorf("creating TUN %s: %w", name, err)
	}
	link, err := netlink.LinkByName(name)
	if err == nil {
		prefix, _ := netip.ParsePrefix(n.cfg.Overlay)
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: self.Addr.AsSlice(), Mask: net.CIDRMask(prefix.Bits(), 32)}}
		if err = netlink.AddrReplace(link, addr); err == nil {
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
