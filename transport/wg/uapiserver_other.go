//go:build !linux

package wg

import (
	"errors"
	"fmt"
)

// ErrUAPIUnsupported means ServeUAPI needs Linux (it checks its peers with
// SO_PEERCRED).
var ErrUAPIUnsupported = errors.New("wg: the UAPI socket server needs Linux")

// UAPIServer answers the WireGuard configuration protocol's get operation
// for one Device on a Unix socket. On this system ServeUAPI always fails.
type UAPIServer struct {
	path string
}

// ServeUAPI fails with ErrUAPIUnsupported: the server checks each peer's
// credentials with SO_PEERCRED, which only Linux offers here.
func (d *Device) ServeUAPI(name string, o UAPIOptions) (*UAPIServer, error) {
	return nil, fmt.Errorf("%w (device %q)", ErrUAPIUnsupported, name)
}

// Path returns the socket's path.
func (s *UAPIServer) Path() string { return s.path }

// Close does nothing: no server runs on this system.
func (s *UAPIServer) Close() error { return nil }
