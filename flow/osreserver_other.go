//go:build !linux

package flow

import (
	"fmt"
	"net/netip"
)

// OSReserver binds shadow ports as real sockets; it is implemented on Linux
// only. Elsewhere NewOSReserver fails with ErrUnsupported.
type OSReserver struct{}

var _ PortReserver = (*OSReserver)(nil)

// NewOSReserver fails with ErrUnsupported on this platform.
func NewOSReserver(addr netip.Addr) (*OSReserver, error) {
	return nil, fmt.Errorf("%w: OSReserver", ErrUnsupported)
}

// Reserve fails with ErrUnsupported.
func (*OSReserver) Reserve(Proto, netip.AddrPort) (uint16, error) { return 0, ErrUnsupported }

// Release does nothing.
func (*OSReserver) Release(Proto, netip.AddrPort, uint16) {}

// InUse returns 0.
func (*OSReserver) InUse() int { return 0 }

// Close does nothing.
func (*OSReserver) Close() error { return nil }
