//go:build linux

package flow

import (
	"fmt"
	"net/netip"
	"syscall"

	"github.com/vipkit/vipkit/internal/syncx"
)

// OSReserver is the PortReserver for a real host: each shadow port is a
// socket really bound on the node's overlay address (a TCP socket bound but
// never listening, or a UDP socket never read), so no local application can
// take the port while the binding or its quarantine lasts, and the kernel
// picks it from its ephemeral range. A shadow port is therefore unique per
// protocol on that address. It is safe for concurrent use; Close releases
// every socket.
type OSReserver struct {
	addr netip.Addr // +checklocksignore: immutable after NewOSReserver

	mu syncx.Mutex
	// +checklocks:mu
	fds map[osKey]int // the bound socket of every reserved port
	// +checklocks:mu
	done bool // Close ran
}

type osKey struct {
	proto Proto
	port  uint16
}

var _ PortReserver = (*OSReserver)(nil)

// NewOSReserver returns a reserver binding on addr, which must be an IPv4
// address of this host (the overlay address on the TUN). It checks that
// binding works by reserving and releasing one port.
func NewOSReserver(addr netip.Addr) (*OSReserver, error) {
	if !addr.Is4() {
		return nil, fmt.Errorf("%w: OSReserver address %v is not IPv4", ErrInvalidOptions, addr)
	}
	r := &OSReserver{addr: addr, fds: make(map[osKey]int)}
	p, err := r.Reserve(ProtoUDP, netip.AddrPort{})
	if err != nil {
		return nil, err
	}
	r.Release(ProtoUDP, netip.AddrPort{}, p)
	return r, nil
}

// Reserve implements PortReserver: it binds a socket to (addr, 0) and keeps
// it. The backend does not matter.
func (r *OSReserver) Reserve(proto Proto, _ netip.AddrPort) (uint16, error) {
	typ := syscall.SOCK_DGRAM
	if proto == ProtoTCP {
		typ = syscall.SOCK_STREAM
	} else if proto != ProtoUDP {
		return 0, fmt.Errorf("%w: OSReserver cannot reserve %v ports", ErrUnsupported, proto)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return 0, ErrClosed
	}
	fd, err := syscall.Socket(syscall.AF_INET, typ|syscall.SOCK_CLOEXEC|syscall.SOCK_NONBLOCK, 0)
	if err != nil {
		return 0, fmt.Errorf("flow: reserve %v port: socket: %w", proto, err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: r.addr.As4()}); err != nil {
		syscall.Close(fd)
		if err == syscall.EADDRINUSE {
			return 0, fmt.Errorf("%w: %v on %v: %v", ErrPortsExhausted, proto, r.addr, err)
		}
		return 0, fmt.Errorf("flow: reserve %v port on %v: bind: %w", proto, r.addr, err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return 0, fmt.Errorf("flow: reserve %v port: getsockname: %w", proto, err)
	}
	port := uint16(sa.(*syscall.SockaddrInet4).Port)
	r.fds[osKey{proto, port}] = fd
	return port, nil
}

// Release implements PortReserver: it closes the port's socket.
func (r *OSReserver) Release(proto Proto, _ netip.AddrPort, port uint16) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := osKey{proto, port}
	if fd, ok := r.fds[k]; ok {
		syscall.Close(fd)
		delete(r.fds, k)
	}
}

// InUse returns the number of ports held.
func (r *OSReserver) InUse() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.fds)
}

// Close releases every port; later Reserve calls fail with ErrClosed.
func (r *OSReserver) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, fd := range r.fds {
		syscall.Close(fd)
		delete(r.fds, k)
	}
	r.done = true
	return nil
}
