package netstack

import (
	"fmt"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/ports"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/vipkit/vipkit/transport"
)

type portKey struct {
	transport tcpip.TransportProtocolNumber
	addr      netip.Addr // the zero Addr for "every address"
	port      uint16
}

type reservation struct {
	res ports.Reservation
}

// ReservePort reserves a port in the stack's own port manager, so that no
// socket of the host binds it and the stack never picks it as an ephemeral
// port — what a NAT needs for the shadow ports it rewrites flows to.
// network is "tcp" or "udp" (a "4"/"6" suffix is accepted and ignored: a
// reservation covers both IPv4 and IPv6). addr is the local address to
// reserve on; the zero or unspecified address reserves on every address.
// port 0 picks a free ephemeral port. It returns the reserved port.
//
// It fails with an error matching syscall.EADDRINUSE when the port is taken
// (by a socket or another reservation), syscall.EAGAIN when no ephemeral
// port is free, ErrUnsupportedNetwork for another network, and
// transport.ErrClosed after Close. Reservations end with ReleasePort or
// Close.
func (h *Host) ReservePort(network string, addr netip.Addr, port uint16) (uint16, error) {
	proto, addr, err := reservationOf(network, addr)
	if err != nil {
		return 0, err
	}
	res := ports.Reservation{
		Networks:  []tcpip.NetworkProtocolNumber{ipv4.ProtocolNumber, ipv6.ProtocolNumber},
		Transport: proto,
		Port:      port,
	}
	if addr.IsValid() {
		res.Addr = tcpip.AddrFromSlice(addr.AsSlice())
	}
	h.resMu.Lock()
	defer h.resMu.Unlock()
	if h.isClosed() {
		return 0, transport.ErrClosed
	}
	got, e := h.stack.ReservePort(h.stack.SecureRNG(), res, nil)
	if e != nil {
		return 0, fmt.Errorf("netstack: reserve %s port %d on %v: %w", network, port, addr, errnoOf(e))
	}
	res.Port = got
	h.reservations[portKey{proto, addr, got}] = reservation{res: res}
	return got, nil
}

// ReleasePort releases a reservation made by ReservePort with the same
// network, address and (returned) port. It fails with ErrNotReserved when
// there is no such reservation.
func (h *Host) ReleasePort(network string, addr netip.Addr, port uint16) error {
	proto, addr, err := reservationOf(network, addr)
	if err != nil {
		return err
	}
	k := portKey{proto, addr, port}
	h.resMu.Lock()
	r, ok := h.reservations[k]
	if ok {
		delete(h.reservations, k)
		h.stack.ReleasePort(r.res)
	}
	h.resMu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s %v port %d", ErrNotReserved, network, addr, port)
	}
	return nil
}

// reservationOf is the transport protocol of network ("tcp" or "udp", with
// an optional "4"/"6") and addr as a reservation keys it: unmapped, and the
// zero address for any unspecified one.
func reservationOf(network string, addr netip.Addr) (tcpip.TransportProtocolNumber, netip.Addr, error) {
	_, isTCP, err := parseNetwork(network)
	if err != nil {
		return 0, addr, err
	}
	proto := tcpip.TransportProtocolNumber(udp.ProtocolNumber)
	if isTCP {
		proto = tcp.ProtocolNumber
	}
	addr = addr.Unmap()
	if addr.IsUnspecified() {
		addr = netip.Addr{}
	}
	return proto, addr, nil
}
