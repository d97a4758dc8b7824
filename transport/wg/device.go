package wg

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// pollInterval is how often WaitHandshake reads the device.
const pollInterval = 10 * time.Millisecond

// Options tunes NewDevice. The zero value uses real UDP sockets and logs
// nothing.
type Options struct {
	// Bind carries the encrypted UDP: a UDPBind, a wgtest.SimBind, or any
	// conn.Bind. nil means wireguard-go's default (real UDP sockets on all
	// interfaces). The Device owns it: Close closes it.
	Bind conn.Bind
	// Logger receives wireguard-go's log lines: errors at Error, the rest at
	// Debug. nil discards them. Nothing is ever written to stdout.
	Logger *slog.Logger
	// Clock times the handshake tie-break (nil: the real clock).
	// wireguard-go's own timers always run in real time.
	Clock transport.Clock
}

// Device is a wireguard-go device whose TUN side is a transport.PacketIO
// and whose configuration is read and written as Go values.
//
// All methods are safe for concurrent use; configuration changes are
// serialized. After Close, every method returns an error that matches
// ErrDeviceClosed.
type Device struct {
	dev      *device.Device
	tun      *tunAdapter
	bind     conn.Bind
	tiebreak *tieBreakBind // nil for wireguard-go's own StdNetBind
	log      *slog.Logger

	// mu serializes configuration changes and Close, and guards closed.
	mu syncx.Mutex
	// +checklocks:mu
	closed bool
	// closeDone is closed once wireguard-go's device is closed; a second
	// Close waits for it.
	closeDone chan struct{}
}

// NewDevice starts a wireguard-go device on io with the configuration cfg
// and returns it up: its Bind is open and peers with endpoints can be
// reached at once. The Device owns io and the Bind, and closes both on
// Close (closing io is the only way to unblock wireguard-go's reader).
//
// cfg is validated first (see Config.Validate); nothing is started for a
// bad configuration. An error from the Bind (a port in use) is wrapped in
// ErrDevice.
func NewDevice(io transport.PacketIO, cfg Config, o Options) (*Device, error) {
	if io == nil {
		return nil, fmt.Errorf("%w: NewDevice needs a PacketIO", ErrInvalidOptions)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bind := o.Bind
	if bind == nil {
		bind = conn.NewDefaultBind()
	}
	if err := checkEndpointsForBind(bind, cfg.Peers); err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Device{
		closeDone: make(chan struct{}),
		// No EventUp: NewDevice brings the device up itself, after its
		// configuration, so that the Bind opens once, on the right port.
		tun:  newTUNAdapter(io, false),
		bind: bind,
		log:  log,
	}
	wire := bind
	// Crossing handshake initiations are broken deterministically (see
	// tiebreak.go). wireguard-go's StdNetBind is left unwrapped: on Linux
	// wireguard-go starts its route listener only for that exact type.
	if _, std := bind.(*conn.StdNetBind); !std {
		d.tiebreak = newTieBreakBind(bind, o.Clock)
		wire = d.tiebreak
	}
	d.dev = device.NewDevice(d.tun, wire, newLogger(log))
	fail := func(err error) (*Device, error) {
		d.dev.Close()
		return nil, err
	}
	if cfg.ListenPort != 0 {
		if err := d.dev.IpcSet("listen_port=" + strconv.Itoa(int(cfg.ListenPort)) + "\n"); err != nil {
			return fail(fmt.Errorf("%w: listen port %d: %w", ErrDevice, cfg.ListenPort, err))
		}
	}
	if err := d.dev.IpcSet(diffUAPI(Config{}, cfg)); err != nil {
		return fail(fmt.Errorf("%w: configure: %w", ErrDevice, err))
	}
	if err := d.dev.Up(); err != nil {
		return fail(fmt.Errorf("%w: up: %w", ErrDevice, err))
	}
	return d, nil
}

// checkEndpointsForBind asks the Bind to parse every endpoint, so that a
// Bind's refusal is reported before any change is applied.
func checkEndpointsForBind(b conn.Bind, peers []PeerConfig) error {
	for _, p := range peers {
		if !p.Endpoint.IsValid() {
			continue
		}
		if _, err := b.ParseEndpoint(p.Endpoint.String()); err != nil {
			return fmt.Errorf("%w: peer %v: %v refused by the bind: %v", ErrBadEndpoint, p.PublicKey, p.Endpoint, err)
		}
	}
	return nil
}

// Configure replaces the device's whole configuration with cfg: peers not
// in cfg are removed, listed peers are added or updated, and each listed
// peer's allowed IPs become exactly the ones given. Peers that stay keep
// their sessions (no new handshake), and a prefix that changes peer moves
// atomically, never unrouted in between.
//
// ListenPort 0 keeps the current port; another port rebinds (if that fails,
// the previous port is restored when possible and nothing else changes). A
// peer without an Endpoint keeps the endpoint the device knows.
//
// cfg is validated first; a bad cfg changes nothing.
func (d *Device) Configure(cfg Config) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	cur, err := d.beginLocked(cfg.Validate(), cfg.Peers)
	if err != nil {
		return err
	}
	if cfg.ListenPort != 0 && cfg.ListenPort != cur.ListenPort {
		if err := d.dev.IpcSet("listen_port=" + strconv.Itoa(int(cfg.ListenPort)) + "\n"); err != nil {
			if cur.ListenPort != 0 {
				_ = d.dev.IpcSet("listen_port=" + strconv.Itoa(int(cur.ListenPort)) + "\n")
			}
			return fmt.Errorf("%w: listen port %d: %w", ErrDevice, cfg.ListenPort, err)
		}
	}
	return d.setLocked(diffUAPI(cur, cfg))
}

// UpsertPeer adds the peer p, or updates it: its endpoint (when given),
// keepalive, preshared key, and its allowed IPs, which become exactly
// p.AllowedIPs without a gap in routing. A prefix that another peer already
// has is refused with ErrDuplicateAllowedIP; use MoveAllowedIP to move it.
func (d *Device) UpsertPeer(p PeerConfig) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	cur, err := d.beginLocked(p.Validate(), []PeerConfig{p})
	if err != nil {
		return err
	}
	if p.PublicKey == cur.PrivateKey.PublicKey() {
		return fmt.Errorf("%w: %v", ErrSelfPeer, p.PublicKey)
	}
	want := cur.Clone()
	found := false
	for i, q := range want.Peers {
		if q.PublicKey == p.PublicKey {
			want.Peers[i] = p
			found = true
			continue
		}
		for _, a := range p.AllowedIPs {
			if slices.Contains(q.AllowedIPs, a) {
				return fmt.Errorf("%w: %v is on peer %v; move it with MoveAllowedIP", ErrDuplicateAllowedIP, a, q.PublicKey)
			}
		}
	}
	if !found {
		if len(want.Peers) >= MaxPeers {
			return fmt.Errorf("%w: the device has %d", ErrTooManyPeers, len(want.Peers))
		}
		want.Peers = append(want.Peers, p)
	}
	return d.setLocked(diffUAPI(cur, want))
}

// beginLocked starts a change under d.mu: it returns valid (the change's
// own validation) if that is an error, then any endpoint in peers that the
// Bind refuses, then ErrDeviceClosed after Close; otherwise the live
// configuration the change applies to. Nothing is changed on an error.
//
// +checklocks:d.mu
func (d *Device) beginLocked(valid error, peers []PeerConfig) (Config, error) {
	if valid != nil {
		return Config{}, valid
	}
	if err := checkEndpointsForBind(d.bind, peers); err != nil {
		return Config{}, err
	}
	return d.liveLocked()
}

// liveLocked reads the live configuration under d.mu, or fails with
// ErrDeviceClosed after Close.
//
// +checklocks:d.mu
func (d *Device) liveLocked() (Config, error) {
	if d.closed {
		return Config{}, ErrDeviceClosed
	}
	c, _, err := d.readLocked()
	return c, err
}

// RemovePeer removes the peer with public key pub, its allowed IPs and its
// sessions. It fails with ErrNoSuchPeer if there is none.
func (d *Device) RemovePeer(pub Key) error {
	return d.updatePeer(pub, func(w *uapiWriter) { w.line("remove", "true") })
}

// updatePeer writes one UAPI update for the existing peer pub (its
// public_key line, then what body adds), under the device's lock. It fails
// with ErrDeviceClosed after Close and ErrNoSuchPeer without such a peer.
func (d *Device) updatePeer(pub Key, body func(w *uapiWriter)) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	cur, err := d.liveLocked()
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(cur.Peers, func(p PeerConfig) bool { return p.PublicKey == pub }) {
		return fmt.Errorf("%w: %v", ErrNoSuchPeer, pub)
	}
	var w uapiWriter
	w.key("public_key", pub)
	body(&w)
	return d.setLocked(w.String())
}

// MoveAllowedIP routes the host prefix p (a /32 or a /128) to the peer to,
// taking it from whichever peer has it (if any). The move is one update of
// wireguard-go's routing table, under its lock: every packet is routed
// either to the old peer or to the new one, never dropped for want of a
// route. Sessions are untouched.
//
// It fails with ErrNotHostPrefix for any other prefix, ErrBadPrefix for an
// invalid one and ErrNoSuchPeer if to is not a peer.
func (d *Device) MoveAllowedIP(p netip.Prefix, to Key) error {
	if err := checkPrefix(p); err != nil {
		return err
	}
	if p.Bits() != p.Addr().BitLen() {
		return fmt.Errorf("%w: %v", ErrNotHostPrefix, p)
	}
	return d.updatePeer(to, func(w *uapiWriter) {
		w.line("update_only", "true")
		w.line("allowed_ip", p.String())
	})
}

// Config reads the live device back: its private key, the listen port in
// use, and every peer with its current endpoint (which roams), keepalive,
// preshared key and allowed IPs, normalized (see Config.Normalize).
func (d *Device) Config() (Config, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.liveLocked()
}

// PeerStats returns the run-time state of the peer pub, or ErrNoSuchPeer.
func (d *Device) PeerStats(pub Key) (PeerStats, error) {
	all, err := d.Stats()
	if err != nil {
		return PeerStats{}, err
	}
	s, ok := all[pub]
	if !ok {
		return PeerStats{}, fmt.Errorf("%w: %v", ErrNoSuchPeer, pub)
	}
	return s, nil
}

// Stats returns the run-time state of every peer, by public key.
func (d *Device) Stats() (map[Key]PeerStats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrDeviceClosed
	}
	c, st, err := d.readLocked()
	if err != nil {
		return nil, err
	}
	for _, p := range c.Peers {
		if _, ok := st[p.PublicKey]; !ok {
			st[p.PublicKey] = PeerStats{}
		}
	}
	return st, nil
}

// WaitHandshake blocks until the peer pub has completed a handshake, or ctx
// ends. It polls the device every 10 ms (on the real clock: wireguard-go
// runs in real time). It fails with ErrNoSuchPeer if pub is not a peer.
func (d *Device) WaitHandshake(ctx context.Context, pub Key) error {
	for {
		s, err := d.PeerStats(pub)
		if err != nil {
			return err
		}
		if !s.LastHandshake.IsZero() {
			return nil
		}
		if !transport.Sleep(nil, pollInterval, ctx.Done()) {
			return fmt.Errorf("wg: waiting for a handshake with %v: %w", pub, ctx.Err())
		}
	}
}

// CrossedInitiations returns how many handshake initiations the device has
// dropped to resolve crossing handshakes: when this node and a peer send
// each other an initiation at the same moment, both sides keep only the one
// with the smaller ephemeral key, so that one handshake completes at once
// instead of both failing and retrying 5 s later (in lockstep, with
// persistent keepalives, possibly forever). It is always 0 on wireguard-go's
// StdNetBind (the default Bind), which the device does not wrap.
func (d *Device) CrossedInitiations() uint64 {
	if d.tiebreak == nil {
		return 0
	}
	return d.tiebreak.dropped.Load()
}

// Bind returns the device's Bind.
func (d *Device) Bind() conn.Bind { return d.bind }

// Close brings the device down and releases everything: wireguard-go's
// goroutines, the Bind, and the PacketIO. It is idempotent and returns
// once wireguard-go's Close has returned, a concurrent second Close too;
// wireguard-go's worker goroutines exit right after, asynchronously. It
// holds no lock while wireguard-go closes the PacketIO, so the PacketIO's
// Close may run callbacks that ask this Device (they get ErrDeviceClosed); it
// must not call Close itself, which would wait for its own return.
func (d *Device) Close() error {
	// Closed is marked under the lock, and wireguard-go's device closed
	// after it is released: that Close closes the TUN adapter, whose owner
	// (a vip.Engine, say) may be inside a callback that asks this Device
	// (PeerStats from PathUp). Every method checks closed under the lock,
	// so none reaches wireguard-go's device once this returns from Unlock.
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		<-d.closeDone
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	d.dev.Close()
	close(d.closeDone)
	return nil
}

// +checklocks:d.mu
func (d *Device) readLocked() (Config, map[Key]PeerStats, error) {
	text, err := d.dev.IpcGet()
	if err != nil {
		return Config{}, nil, fmt.Errorf("%w: read configuration: %w", ErrDevice, err)
	}
	c, st, err := applyUAPI(text, Config{})
	if err != nil {
		return Config{}, nil, err
	}
	return c.Normalize(), st, nil
}

// +checklocks:d.mu
func (d *Device) setLocked(text string) error {
	if text == "" {
		return nil
	}
	if err := d.dev.IpcSet(text); err != nil {
		return fmt.Errorf("%w: configure: %w", ErrDevice, err)
	}
	return nil
}

// newLogger routes wireguard-go's printf-style logging to l.
func newLogger(l *slog.Logger) *device.Logger {
	return &device.Logger{
		Verbosef: func(format string, args ...any) {
			if l.Enabled(context.Background(), slog.LevelDebug) {
				l.Debug(fmt.Sprintf(format, args...), "component", "wireguard")
			}
		},
		Errorf: func(format string, args ...any) {
			if l.Enabled(context.Background(), slog.LevelError) {
				l.Error(fmt.Sprintf(format, args...), "component", "wireguard")
			}
		},
	}
}
