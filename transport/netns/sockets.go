//go:build linux

package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// ErrNotLiteral is returned by Host.Dial, Host.Listen and Host.ListenPacket
// for an address whose host part is a name rather than an IP literal: name
// resolution would run on other goroutines, outside the namespace, against
// the machine's own resolver.
var ErrNotLiteral = errors.New("netns: address is not an IP literal")

// checkLiteral accepts "ip:port", "[ip6]:port" and ":port"; for the raw IP
// networks ("ip4:icmp"), which have no port, an IP or "".
func checkLiteral(network, address string, emptyHostOK bool) error {
	host := address
	if !strings.HasPrefix(network, "ip") {
		var err error
		if host, _, err = net.SplitHostPort(address); err != nil {
			return fmt.Errorf("netns: %w", err)
		}
	}
	if host == "" && emptyHostOK {
		return nil
	}
	// Zones ("fe80::1%eth0") are fine: the interface is looked up in the
	// namespace, by the thread that opens the socket.
	base, _, _ := strings.Cut(host, "%")
	if _, err := netip.ParseAddr(base); err != nil {
		return fmt.Errorf("%w: %q", ErrNotLiteral, address)
	}
	return nil
}

// Dial connects to address (an IP literal and port) from inside the
// namespace, like net.Dialer.DialContext, with Happy Eyeballs off so that
// every socket is opened by the thread in the namespace. The connection
// belongs to the namespace; use it from any goroutine.
func (h *Host) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	if err := checkLiteral(network, address, false); err != nil {
		return nil, err
	}
	var c net.Conn
	err := h.Do(func() error {
		var err error
		c, err = (&net.Dialer{FallbackDelay: -1}).DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Listen listens on address (an IP literal or empty host, and a port) inside
// the namespace, like net.ListenConfig.Listen.
func (h *Host) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	if err := checkLiteral(network, address, true); err != nil {
		return nil, err
	}
	var l net.Listener
	err := h.Do(func() error {
		var err error
		l, err = (&net.ListenConfig{}).Listen(ctx, network, address)
		return err
	})
	return l, err
}

// ListenPacket opens a packet socket (UDP, or IP with a protocol) on address
// inside the namespace, like net.ListenConfig.ListenPacket.
func (h *Host) ListenPacket(ctx context.Context, network, address string) (net.PacketConn, error) {
	if err := checkLiteral(network, address, true); err != nil {
		return nil, err
	}
	var c net.PacketConn
	err := h.Do(func() error {
		var err error
		c, err = (&net.ListenConfig{}).ListenPacket(ctx, network, address)
		return err
	})
	return c, err
}
