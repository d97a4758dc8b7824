//go:build linux

package netns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/conn"

	"github.com/vipkit/vipkit/transport/wg"
)

// WireGuardConfig configures Host.StartWireGuard. Device is required; the
// zero value of everything else gives a TUN "wg0" with MTU 1420 and no
// addresses, on a real UDP Bind (wg.UDPBind) inside the namespace.
type WireGuardConfig struct {
	// TUN names the kernel TUN device; "" means "wg0".
	TUN string
	// MTU of the TUN in bytes; 0 means 1420 (WireGuard's default: 1500 less
	// the IPv6, UDP and WireGuard headers).
	MTU int
	// Addrs go on the TUN, such as OverlayAddr4(1). A /32 or /128 is the
	// usual choice: the peers' AllowedIPs are routed into the TUN anyway.
	Addrs []netip.Prefix
	// Routes are routed into the TUN, besides every AllowedIPs prefix of
	// Device.Peers (as wg-quick does).
	Routes []netip.Prefix
	// Device is the wireguard-go configuration: private key, listen port
	// (each namespace has its own ports, so every host can use 51820) and
	// peers, whose endpoints are underlay addresses of other hosts.
	Device wg.Config
	// Bind carries the encrypted UDP. nil means wg.NewUDPBind with no
	// impairment; pass your own *wg.UDPBind to impair or cut this host's
	// sends. Either way it is wrapped with Host.Bind, so its sockets open
	// inside the namespace.
	Bind conn.Bind
	// Logger receives wireguard-go's log; nil discards it.
	Logger *slog.Logger
}

// WireGuard is a wireguard-go device on a kernel TUN inside a Host, made by
// Host.StartWireGuard. Applications in the host reach its peers' AllowedIPs
// through the kernel: sockets opened with Host.Do, or processes started in
// the host.
//
// Close (idempotent) closes the device, its Bind and the TUN; the Host
// closes it too.
type WireGuard struct {
	// Host is the namespace the device lives in.
	Host *Host
	// TUN is the kernel TUN device.
	TUN *TUN
	// Device is the wireguard-go device; reconfigure peers through it (and
	// route new prefixes with AddRoute).
	Device *wg.Device
	// Bind is the Bind the device was given, unwrapped: a *wg.UDPBind
	// unless WireGuardConfig.Bind said otherwise.
	Bind conn.Bind
	// PublicKey is the device's public key.
	PublicKey wg.Key
}

// StartWireGuard creates a kernel TUN in the host, puts cfg.Addrs on it,
// brings it up, starts a wg.Device on it (wg.PacketIOFromTUN) with its Bind
// opened inside the namespace, and routes cfg.Routes and the peers'
// AllowedIPs into the TUN. On error nothing is left behind.
func (h *Host) StartWireGuard(ctx context.Context, cfg WireGuardConfig) (*WireGuard, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if cfg.TUN == "" {
		cfg.TUN = "wg0"
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1420
	}
	if err := cfg.Device.Validate(); err != nil {
		return nil, err
	}
	t, err := h.CreateTUN(cfg.TUN, cfg.MTU)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*WireGuard, error) {
		_ = t.Close()
		return nil, err
	}
	for _, p := range cfg.Addrs {
		if err := h.AddAddr(cfg.TUN, p); err != nil {
			return fail(err)
		}
	}
	if err := h.SetUp(cfg.TUN); err != nil {
		return fail(err)
	}
	bind := cfg.Bind
	if bind == nil {
		bind = wg.NewUDPBind(wg.UDPBindOptions{})
	}
	dev, err := wg.NewDevice(wg.PacketIOFromTUN(t), cfg.Device, wg.Options{Bind: h.Bind(bind), Logger: cfg.Logger})
	if err != nil {
		return fail(fmt.Errorf("netns: wireguard in %s: %w", h.name, err))
	}
	w := &WireGuard{Host: h, TUN: t, Device: dev, Bind: bind, PublicKey: cfg.Device.PrivateKey.PublicKey()}
	if err := h.onClose(w.Close); err != nil {
		_ = w.Close()
		return nil, err
	}
	routes := append([]netip.Prefix(nil), cfg.Routes...)
	for _, p := range cfg.Device.Peers {
		routes = append(routes, p.AllowedIPs...)
	}
	for _, p := range routes {
		if err := w.AddRoute(p); err != nil {
			_ = w.Close()
			return nil, err
		}
	}
	return w, nil
}

// AddRoute routes p into the TUN, replacing any route to exactly p.
func (w *WireGuard) AddRoute(p netip.Prefix) error {
	if !p.IsValid() {
		return fmt.Errorf("netns: invalid route %v in %s", p, w.Host.name)
	}
	lk, err := w.Host.link(w.TUN.name)
	if err != nil {
		return err
	}
	r := &netlink.Route{LinkIndex: lk.Attrs().Index, Dst: prefixNet(p.Masked()), Scope: netlink.SCOPE_LINK}
	if err := w.Host.nl.RouteReplace(r); err != nil {
		return fmt.Errorf("netns: route %v dev %s in %s: %w", p, w.TUN.name, w.Host.name, err)
	}
	return nil
}

// ListenPort returns the UDP port the device listens on in its namespace.
func (w *WireGuard) ListenPort() (uint16, error) {
	c, err := w.Device.Config()
	if err != nil {
		return 0, err
	}
	return c.ListenPort, nil
}

// Close closes the device, its Bind and the TUN. It is idempotent.
func (w *WireGuard) Close() error {
	return errors.Join(w.Device.Close(), w.TUN.Close())
}

// StartWireGuardT starts WireGuard in h with StartWireGuard and fails t on
// error. It goes away with h.
func StartWireGuardT(t testing.TB, h *Host, cfg WireGuardConfig) *WireGuard {
	t.Helper()
	w, err := h.StartWireGuard(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
