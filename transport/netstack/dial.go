package netstack

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/vipkit/vipkit/transport"
)

// DialContext connects to address on the named network, like net.Dialer's
// DialContext: network is "tcp", "tcp4", "tcp6", "udp", "udp4" or "udp6",
// and address is a literal "ip:port" ("[v6]:port"); there is no name
// resolution. A "4" or "6" network requires an address of that family.
// TCP returns a *gonet.TCPConn and UDP a connected *UDPConn.
//
// The context bounds the TCP handshake; cancelling it after DialContext
// returns does not affect the connection. Errors are *net.OpError; those
// from the stack wrap a syscall.Errno (errors.Is(err,
// syscall.ECONNREFUSED)), a bad network ErrUnsupportedNetwork, a bad address
// ErrInvalidAddress, and a cancelled context ctx.Err().
func (h *Host) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	family, isTCP, err := parseNetwork(network)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("%w: %q: %w", ErrInvalidAddress, address, err)}
	}
	ap = unmapAddrPort(ap)
	if family != 0 && family != familyOf(ap.Addr()) {
		return nil, &net.OpError{Op: "dial", Net: network, Addr: netAddr(isTCP, ap), Err: fmt.Errorf("%w: %v is not an address for %s", ErrInvalidAddress, ap.Addr(), network)}
	}
	if isTCP {
		return h.DialTCP(ctx, ap)
	}
	if err := ctx.Err(); err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Addr: netAddr(false, ap), Err: err}
	}
	return h.DialUDP(netip.AddrPort{}, ap)
}

// DialTCP opens a TCP connection to addr from an address the stack picks.
// ctx bounds the handshake. Errors are as for DialContext.
func (h *Host) DialTCP(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	return h.DialTCPFrom(ctx, netip.AddrPort{}, addr)
}

// DialTCPFrom is DialTCP from a chosen local address and/or port: a zero
// laddr lets the stack pick both, a zero port in it picks the port. With
// SetSpoofing on, laddr may be an address the host does not own.
func (h *Host) DialTCPFrom(ctx context.Context, laddr, raddr netip.AddrPort) (net.Conn, error) {
	raddr = unmapAddrPort(raddr)
	laddr = unmapAddrPort(laddr)
	opErr := func(op string, err error) error {
		return &net.OpError{Op: op, Net: "tcp", Source: optTCPAddr(laddr), Addr: netAddr(true, raddr), Err: err}
	}
	if err := checkRemote(raddr); err != nil {
		return nil, opErr("dial", err)
	}
	if laddr.Addr().IsValid() && familyOf(laddr.Addr()) != familyOf(raddr.Addr()) {
		return nil, opErr("dial", fmt.Errorf("%w: local %v and remote %v differ in family", ErrInvalidAddress, laddr.Addr(), raddr.Addr()))
	}
	if err := ctx.Err(); err != nil {
		return nil, opErr("dial", err)
	}
	if h.isClosed() {
		return nil, opErr("dial", transport.ErrClosed)
	}
	var wq waiter.Queue
	ep, e := h.stack.NewEndpoint(tcp.ProtocolNumber, protoOf(raddr.Addr()), &wq)
	if e != nil {
		return nil, opErr("socket", errnoOf(e))
	}
	// Register before Connect: the handshake may complete at once.
	entry, notify := waiter.NewChannelEntry(waiter.WritableEvents)
	wq.EventRegister(&entry)
	defer wq.EventUnregister(&entry)
	if laddr.IsValid() || laddr.Port() != 0 {
		if e := ep.Bind(fullAddr(laddr)); e != nil {
			ep.Close()
			return nil, opErr("bind", errnoOf(e))
		}
	}
	e = ep.Connect(fullAddr(raddr))
	if _, ok := e.(*tcpip.ErrConnectStarted); ok {
		select {
		case <-ctx.Done():
			ep.Close()
			return nil, opErr("dial", ctx.Err())
		case <-notify:
		}
		e = ep.LastError()
	}
	if e != nil {
		ep.Close()
		return nil, opErr("dial", errnoOf(e))
	}
	return gonet.NewTCPConn(&wq, ep), nil
}

// DialUDP returns a UDP socket bound to laddr and connected to raddr. A
// zero laddr (or a laddr with only a port, or only an address) lets the
// stack pick what is missing. A zero raddr leaves the socket unconnected;
// then use its WriteTo and ReadFrom. The result is a *UDPConn, which is
// also a net.PacketConn.
func (h *Host) DialUDP(laddr, raddr netip.AddrPort) (net.Conn, error) {
	c, err := h.udp("dial", laddr, raddr)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// ListenUDP returns an unconnected UDP socket bound to addr. An
// unspecified or zero address receives on every address of the host (an
// IPv6 or zero one on IPv4 addresses too); a zero port picks one. The
// result is a *UDPConn.
func (h *Host) ListenUDP(addr netip.AddrPort) (net.PacketConn, error) {
	c, err := h.udp("listen", addr, netip.AddrPort{})
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (h *Host) udp(op string, laddr, raddr netip.AddrPort) (*UDPConn, error) {
	laddr = unmapAddrPort(laddr)
	raddr = unmapAddrPort(raddr)
	opErr := func(op string, err error) error {
		return &net.OpError{Op: op, Net: "udp", Source: optUDPAddr(laddr), Addr: optUDPAddr(raddr), Err: err}
	}
	if raddr.IsValid() {
		if err := checkRemote(raddr); err != nil {
			return nil, opErr(op, err)
		}
		if laddr.Addr().IsValid() && !laddr.Addr().IsUnspecified() && familyOf(laddr.Addr()) != familyOf(raddr.Addr()) {
			return nil, opErr(op, fmt.Errorf("%w: local %v and remote %v differ in family", ErrInvalidAddress, laddr.Addr(), raddr.Addr()))
		}
	}
	if h.isClosed() {
		return nil, opErr(op, transport.ErrClosed)
	}
	proto := ipv6.ProtocolNumber // dual stack unless an address says IPv4
	switch {
	case raddr.IsValid():
		proto = protoOf(raddr.Addr())
	case laddr.Addr().IsValid():
		proto = protoOf(laddr.Addr())
	}
	var wq waiter.Queue
	ep, e := h.stack.NewEndpoint(udp.ProtocolNumber, proto, &wq)
	if e != nil {
		return nil, opErr("socket", errnoOf(e))
	}
	if laddr.Addr().IsValid() || laddr.Port() != 0 {
		if e := ep.Bind(fullAddr(laddr)); e != nil {
			ep.Close()
			return nil, opErr("bind", errnoOf(e))
		}
	} else if !raddr.IsValid() {
		// An unconnected socket needs a port to receive on.
		if e := ep.Bind(tcpip.FullAddress{}); e != nil {
			ep.Close()
			return nil, opErr("bind", errnoOf(e))
		}
	}
	if raddr.IsValid() {
		if e := ep.Connect(fullAddr(raddr)); e != nil {
			ep.Close()
			return nil, opErr("connect", errnoOf(e))
		}
	}
	return newUDPConn(&wq, ep, transport.Or(h.opts.Clock)), nil
}

// ListenTCP returns a TCP listener on addr with Options.ListenBacklog. An
// unspecified or zero address listens on every address of the host (an
// IPv6 or zero one on IPv4 addresses too; with SetPromiscuous on, on every
// address at all); a zero port picks one. The listener is a
// *gonet.TCPListener; Accept returns *gonet.TCPConn.
func (h *Host) ListenTCP(addr netip.AddrPort) (net.Listener, error) {
	addr = unmapAddrPort(addr)
	opErr := func(op string, err error) error {
		return &net.OpError{Op: op, Net: "tcp", Addr: optTCPAddr(addr), Err: err}
	}
	if h.isClosed() {
		return nil, opErr("listen", transport.ErrClosed)
	}
	proto := ipv6.ProtocolNumber
	if addr.Addr().IsValid() {
		proto = protoOf(addr.Addr())
	}
	var wq waiter.Queue
	ep, e := h.stack.NewEndpoint(tcp.ProtocolNumber, proto, &wq)
	if e != nil {
		return nil, opErr("socket", errnoOf(e))
	}
	if e := ep.Bind(fullAddr(addr)); e != nil {
		ep.Close()
		return nil, opErr("bind", errnoOf(e))
	}
	if e := ep.Listen(h.opts.ListenBacklog); e != nil {
		ep.Close()
		return nil, opErr("listen", errnoOf(e))
	}
	return gonet.NewTCPListener(h.stack, &wq, ep), nil
}

// parseNetwork returns the address family a network requires (4, 6, or 0
// for either) and whether it is TCP.
func parseNetwork(network string) (family int, isTCP bool, err error) {
	switch network {
	case "tcp":
		return 0, true, nil
	case "tcp4":
		return 4, true, nil
	case "tcp6":
		return 6, true, nil
	case "udp":
		return 0, false, nil
	case "udp4":
		return 4, false, nil
	case "udp6":
		return 6, false, nil
	}
	return 0, false, fmt.Errorf("%w: %q", ErrUnsupportedNetwork, network)
}

func familyOf(a netip.Addr) int {
	if a.Is4() {
		return 4
	}
	return 6
}

func unmapAddrPort(ap netip.AddrPort) netip.AddrPort {
	if ap.Addr().Is4In6() {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return ap
}

func checkRemote(ap netip.AddrPort) error {
	a := ap.Addr()
	if !a.IsValid() || a.IsUnspecified() {
		return fmt.Errorf("%w: no remote address", ErrInvalidAddress)
	}
	if ap.Port() == 0 {
		return fmt.Errorf("%w: remote port 0", ErrInvalidAddress)
	}
	return nil
}

// fullAddr converts ap for the stack. An invalid or unspecified address
// becomes the empty address, which binds to all. The NIC is left unset so
// that the routing table decides.
func fullAddr(ap netip.AddrPort) tcpip.FullAddress {
	fa := tcpip.FullAddress{Port: ap.Port()}
	if a := ap.Addr(); a.IsValid() && !a.IsUnspecified() {
		fa.Addr = tcpip.AddrFromSlice(a.AsSlice())
	}
	return fa
}

func netAddr(isTCP bool, ap netip.AddrPort) net.Addr {
	if isTCP {
		return net.TCPAddrFromAddrPort(ap)
	}
	return net.UDPAddrFromAddrPort(ap)
}

func optTCPAddr(ap netip.AddrPort) net.Addr {
	if !ap.Addr().IsValid() && ap.Port() == 0 {
		return nil
	}
	return net.TCPAddrFromAddrPort(ap)
}

func optUDPAddr(ap netip.AddrPort) net.Addr {
	if !ap.Addr().IsValid() && ap.Port() == 0 {
		return nil
	}
	return net.UDPAddrFromAddrPort(ap)
}

// errnoOf maps a stack error to the errno the kernel would return, so that
// callers match it with errors.Is(err, syscall.ECONNREFUSED) and friends.
// Errors without a close equivalent are returned as a tcpipError carrying
// the stack's message.
func errnoOf(e tcpip.Error) error {
	switch e.(type) {
	case *tcpip.ErrConnectionRefused:
		return syscall.ECONNREFUSED
	case *tcpip.ErrConnectionReset:
		return syscall.ECONNRESET
	case *tcpip.ErrConnectionAborted, *tcpip.ErrAborted:
		return syscall.ECONNABORTED
	case *tcpip.ErrTimeout:
		return syscall.ETIMEDOUT
	case *tcpip.ErrHostUnreachable, *tcpip.ErrHostDown:
		return syscall.EHOSTUNREACH
	case *tcpip.ErrNetworkUnreachable, *tcpip.ErrNoNet:
		return syscall.ENETUNREACH
	case *tcpip.ErrPortInUse, *tcpip.ErrDuplicateAddress:
		return syscall.EADDRINUSE
	case *tcpip.ErrBadLocalAddress:
		return syscall.EADDRNOTAVAIL
	case *tcpip.ErrNoPortAvailable:
		return syscall.EAGAIN
	case *tcpip.ErrAddressFamilyNotSupported:
		return syscall.EAFNOSUPPORT
	case *tcpip.ErrAlreadyBound, *tcpip.ErrInvalidEndpointState, *tcpip.ErrInvalidOptionValue:
		return syscall.EINVAL
	case *tcpip.ErrAlreadyConnected:
		return syscall.EISCONN
	case *tcpip.ErrAlreadyConnecting:
		return syscall.EALREADY
	case *tcpip.ErrNotConnected:
		return syscall.ENOTCONN
	case *tcpip.ErrNoBufferSpace:
		return syscall.ENOBUFS
	case *tcpip.ErrMessageTooLong:
		return syscall.EMSGSIZE
	case *tcpip.ErrNotPermitted:
		return syscall.EPERM
	case *tcpip.ErrClosedForSend, *tcpip.ErrClosedForReceive:
		return transport.ErrClosed
	}
	return tcpipError{e}
}

// tcpipError is a stack error with no errno equivalent.
type tcpipError struct{ e tcpip.Error }

func (t tcpipError) Error() string { return "netstack: " + t.e.String() }
