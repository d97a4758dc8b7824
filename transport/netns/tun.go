//go:build linux

package netns

import (
	"fmt"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun"
)

// TUN is a kernel TUN device inside a Host, made by Host.CreateTUN. It is a
// wireguard-go tun.Device (so package transport/wg's PacketIOFromTUN takes
// it), whose MTU and Name are answered from inside the namespace:
// wireguard-go's own NativeTun looks its MTU up by name from whatever thread
// calls it, which is outside the namespace.
//
// It is safe for concurrent use as tun.Device is. Close is idempotent; the
// Host closes it too.
type TUN struct {
	tun.Device
	host *Host
	name string
}

var _ tun.Device = (*TUN)(nil)

// CreateTUN creates a kernel TUN device called name (at most 15 bytes) with
// the given MTU inside the namespace, with wireguard-go's tun.CreateTUN run
// on a thread in the namespace (the device and its netlink listener belong
// to the namespace). The device is down and has no addresses: see
// Host.AddAddr, Host.SetUp and Host.AddRoute, or StartWireGuard, which does
// all of it.
func (h *Host) CreateTUN(name string, mtu int) (*TUN, error) {
	if name == "" || len(name) > 15 {
		return nil, fmt.Errorf("%w: TUN name %q (1 to 15 bytes)", ErrInvalidName, name)
	}
	if mtu < 576 || mtu > 65535 {
		return nil, fmt.Errorf("netns: TUN MTU %d out of range 576–65535", mtu)
	}
	var dev tun.Device
	err := h.Do(func() error {
		var err error
		dev, err = tun.CreateTUN(name, mtu)
		if err != nil {
			return fmt.Errorf("netns: create TUN %s in %s: %w", name, h.name, err)
		}
		return nil
	})
	if err != nil {
		if dev != nil {
			dev.Close()
		}
		return nil, err
	}
	t := &TUN{Device: dev, host: h, name: name}
	if err := h.onClose(t.Close); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// Host returns the host the TUN lives in.
func (t *TUN) Host() *Host { return t.host }

// Name returns the interface's name.
func (t *TUN) Name() (string, error) { return t.name, nil }

// MTU returns the interface's MTU as the namespace sees it.
func (t *TUN) MTU() (int, error) {
	lk, err := t.host.link(t.name)
	if err != nil {
		return 0, err
	}
	return lk.Attrs().MTU, nil
}

// Close closes the device; the kernel removes the interface with it. It is
// idempotent.
func (t *TUN) Close() error { return t.Device.Close() }

// Bind returns b with its Open run on a thread inside the host's namespace,
// so the UDP sockets it opens live in the namespace. wireguard-go opens its
// Bind from whichever goroutine brings the device up or changes its port, so
// every Bind of a device in a namespace must be wrapped this way. The other
// methods pass through.
func (h *Host) Bind(b conn.Bind) conn.Bind { return &nsBind{Bind: b, host: h} }

type nsBind struct {
	conn.Bind
	host *Host
}

func (b *nsBind) Open(port uint16) (fns []conn.ReceiveFunc, actual uint16, err error) {
	err = b.host.Do(func() error {
		var err error
		fns, actual, err = b.Bind.Open(port)
		return err
	})
	return fns, actual, err
}
