package tsng

import (
	"context"
	"net"
	"net/netip"
)

// KernelNet is ControlNet over the kernel's stack, with outgoing
// connections bound to the node's overlay address (TUN mode).
type KernelNet struct{ Self netip.Addr }

// DialContext dials from the overlay address.
func (k KernelNet) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: k.Self.AsSlice()}}
	return d.DialContext(ctx, network, address)
}

// Listen listens on addr.
func (k KernelNet) Listen(addr netip.AddrPort) (net.Listener, error) {
	return net.Listen("tcp", addr.String())
}
