package tsng

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.zx2c4.com/wireguard/conn"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/crdt/pebblestore"
	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/probe"
	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/netstack"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/vip"
)

// DaemonOptions configures a Daemon beyond its config file.
type DaemonOptions struct {
	Logger *slog.Logger
	// Bind, when set, makes the WireGuard Bind of a network (tests and the
	// demo use it to impair or simulate links); nil means real UDP sockets.
	Bind func(network string) conn.Bind
	// NoAPI skips the local API socket (the demo drives the daemons
	// directly).
	NoAPI bool
	// ConfigPath is the config file that Reload re-reads (RunDaemon sets
	// it); empty refuses a reload from the file.
	ConfigPath string
	// httpLimits replaces the limits of the named local HTTP servers
	// (tests shorten the timeouts).
	httpLimits map[string]httpLimits
	// reloadHook, when set, runs in each reload after its plan is made
	// and before anything is applied (tests hold a reload there).
	reloadHook func()
}

// Daemon is the agent: it joins the networks of a config file, runs
// wireguard-go, the vip engine, the control channel, pebble state and DNS
// for each, and serves the local API and metrics.
type Daemon struct {
	cfg  *Config
	o    DaemonOptions
	log  *slog.Logger
	nets []*netRuntime
	// agentPorts are the agent's own ports by the config it started with
	// (Config.agentPorts); read-only.
	agentPorts map[vip.PortKey]string

	apiLn     net.Listener
	apiSrv    *http.Server
	metrics   *http.Server
	metricsLn net.Listener
	ui        *UIServer
	// uiPort is the editor's TCP port once it listens (0: none), which
	// the backend relay refuses.
	uiPort atomic.Uint32
	// heldMu guards heldPorts, the host ports the agent took at run time
	// and holds now, each with what holds it (one entry per holder): the
	// ports chosen at start (metrics, socks5 and http_proxy on port 0,
	// WireGuard's listen_port 0) and those of `vip forward` listeners.
	// The backend relay refuses them. It is taken on the packet path, so
	// never held while blocking.
	heldMu syncx.Mutex
	// +checklocks:heldMu
	heldPorts map[vip.PortKey][]string
	lock      *os.File
	wg        sync.WaitGroup

	// reloading is set while a reload runs; a second one is refused
	// (ErrReloadBusy) rather than queued.
	reloading atomic.Bool
	// opMu serializes a reload with Close: Close waits for a reload in
	// progress, and a reload after Close is refused. It is taken only by
	// Reload and Close, never by anything they call.
	opMu syncx.Mutex
	// +checklocks:opMu
	closed bool
	// +checklocks:opMu
	running *Config // the config in force: the start's, then each reload's
}

// netRuntime is one network at this node.
type netRuntime struct {
	d *Daemon
	// cfg is the network's config as it started. A reload changes only
	// the peers, which are in the membership, never cfg (so it is read
	// without a lock); cfg.Peers is the start's list.
	cfg NetworkConfig
	id  crdt.NetworkID
	// mship is the member set in force, swapped whole by a reload.
	mship   atomic.Pointer[membership]
	key     ed25519.PrivateKey
	replica *crdt.Replica
	reg     *vip.Registry
	api     *Network
	// index is the network's place in the config in force (its
	// networks[i]), for errors that name a config field.
	index atomic.Int32

	// mu serializes starting and stopping the network (with up) and
	// guards its running parts, every field below up to collMu, and uapi.
	mu syncx.Mutex
	up atomic.Bool
	// live holds the engine and the replicator while the network runs,
	// for onChange. onChange must not take mu: it runs on the control
	// carrier's handlers, which stopLocked waits for with mu held.
	live atomic.Pointer[liveParts]
	// +checklocks:mu
	host *netstack.Host
	// +checklocks:mu
	engine *vip.Engine
	// +checklocks:mu
	dev *wg.Device
	// started is when engine started: its counters' zero.
	// +checklocks:mu
	started time.Time
	// +checklocks:mu
	control *Control
	// +checklocks:mu
	repl *vip.Replicator
	// +checklocks:mu
	dns *dnsServers
	// +checklocks:mu
	res flow.PortReserver
	// +checklocks:mu
	cancel context.CancelFunc
	// +checklocks:mu
	done chan struct{}
	// proxies and forwards carry host applications into the netstack
	// overlay (netstack mode only).
	// +checklocks:mu
	proxies []io.Closer
	// +checklocks:mu
	forwards []*forwarder
	// relay carries connections to the node's backend ports to the
	// host's loopback (netstack mode only).
	// +checklocks:mu
	relay *backendRelay
	// backendPorts is backend_ports as in force (nil: cfg's), which a
	// reload swaps whole; stored under mu, so that a start that makes a
	// relay and a reload that updates one see one another.
	backendPorts atomic.Pointer[[]string]
	// tunName is the TUN interface in tun mode.
	// +checklocks:mu
	tunName string
	// uapi is `wg show`'s socket, when served.
	// +checklocks:mu
	uapi *wg.UAPIServer
	// held are the host ports the network took at start and holds
	// (Daemon.heldPorts) until it stops.
	// +checklocks:mu
	held []heldPort

	// collMu guards collisions, the address collisions already logged.
	collMu syncx.Mutex
	// +checklocks:collMu
	collisions map[string]bool
}

// NewDaemon opens every network's state (a corrupt store is a hard error)
// and starts the networks that are not marked stopped.
func NewDaemon(ctx context.Context, cfg *Config, o DaemonOptions) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	d := &Daemon{cfg: cfg, o: o, log: o.Logger, running: cfg, agentPorts: cfg.agentPorts()}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, err
	}
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	d.lock = lock
	for i, nc := range cfg.Networks {
		n, err := d.openNetwork(ctx, nc)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("tsng: network %s: %w", nc.Name, trimPrefix(err))
		}
		n.index.Store(int32(i))
		d.nets = append(d.nets, n)
		n.reportCollisions()
	}
	for _, n := range d.nets {
		if n.cfg.Stopped {
			continue
		}
		if err := n.start(ctx); err != nil {
			d.Close()
			return nil, fmt.Errorf("tsng: network %s: %w", n.cfg.Name, trimPrefix(err))
		}
	}
	if !o.NoAPI {
		sock := cfg.Socket
		if sock == "" {
			sock = DefaultSocket
		}
		ln, err := ListenUnix(sock)
		if err != nil {
			d.Close()
			return nil, err
		}
		lim := d.httpLimitsFor(serverAPI)
		d.apiLn = lim.listen(ln, serverAPI)
		d.apiSrv = lim.server(NewAPIServer(d))
		d.wg.Add(1)
		go func() { defer d.wg.Done(); _ = d.apiSrv.Serve(d.apiLn) }()
	}
	if cfg.UI != "off" {
		ui, err := NewUIServer(d, cfg.UI)
		if err != nil {
			d.Close()
			return nil, err
		}
		ui.setLogger(d.log)
		d.ui = ui
		if ap, err := netip.ParseAddrPort(ui.ln.Addr().String()); err == nil {
			d.uiPort.Store(uint32(ap.Port()))
		}
	}
	if cfg.Metrics != "" {
		ap, _ := cfg.metricsAddr() // validated
		ln, err := net.Listen("tcp", ap.String())
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("tsng: metrics: %w", err)
		}
		if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil {
			d.holdPort(vip.PortKey{Proto: vip.TCP, Port: ap.Port()}, "metrics", true) // for the agent's lifetime
		}
		lim := d.httpLimitsFor(serverMetrics)
		d.metricsLn = lim.listen(ln, serverMetrics)
		d.metrics = lim.server(d.metricsHandler())
		d.wg.Add(1)
		go func() { defer d.wg.Done(); _ = d.metrics.Serve(d.metricsLn) }()
	}
	return d, nil
}

// agentPortNow reports whether k is one of the agent's own ports, as
// configured or taken at run time (agentPortWhat).
func (d *Daemon) agentPortNow(k vip.PortKey) bool {
	_, ok := d.agentPortWhat(k)
	return ok
}

// agentPortWhat says what of the agent's uses k: by the config it started
// with, or at run time (the editor's port chosen at start, and the ports
// in heldPorts).
func (d *Daemon) agentPortWhat(k vip.PortKey) (string, bool) {
	if what, ok := d.agentPorts[k]; ok {
		return what, true
	}
	if k.Proto == vip.TCP && uint32(k.Port) == d.uiPort.Load() {
		return "ui", true
	}
	d.heldMu.Lock()
	defer d.heldMu.Unlock()
	if held := d.heldPorts[k]; len(held) > 0 {
		return held[0], true
	}
	return "", false
}

// holdPort counts what's hold of host port k in (add) or out.
func (d *Daemon) holdPort(k vip.PortKey, what string, add bool) {
	d.heldMu.Lock()
	defer d.heldMu.Unlock()
	if d.heldPorts == nil {
		d.heldPorts = map[vip.PortKey][]string{}
	}
	held := d.heldPorts[k]
	if add {
		d.heldPorts[k] = append(held, what)
		return
	}
	if i := slices.Index(held, what); i >= 0 {
		held = slices.Delete(held, i, i+1)
	}
	if len(held) == 0 {
		delete(d.heldPorts, k)
	} else {
		d.heldPorts[k] = held
	}
}

// holdPortLocked holds host port k for the network while it runs:
// stopLocked lets it go.
//
// +checklocks:n.mu
func (n *netRuntime) holdPortLocked(k vip.PortKey, what string) {
	if k.Port == 0 {
		return
	}
	what = "networks " + n.cfg.Name + " " + what
	n.d.holdPort(k, what, true)
	n.held = append(n.held, heldPort{k, what})
}

// releasePortsLocked lets go of the ports holdPortLocked held.
//
// +checklocks:n.mu
func (n *netRuntime) releasePortsLocked() {
	for _, h := range n.held {
		n.d.holdPort(h.k, h.what, false)
	}
	n.held = nil
}

// heldPort is a host port a network holds, and what holds it.
type heldPort struct {
	k    vip.PortKey
	what string
}

// UIAddr returns the editor's listen address ("" when off).
func (d *Daemon) UIAddr() string {
	if d.ui == nil {
		return ""
	}
	return d.ui.ln.Addr().String()
}

// UIURL returns the editor's address ("" when off); it carries no
// secret. It implements UIProvider.
func (d *Daemon) UIURL() string {
	if d.ui == nil {
		return ""
	}
	return d.ui.URL()
}

// MetricsAddr returns the metrics listener's address ("" when off).
func (d *Daemon) MetricsAddr() string {
	if d.metricsLn == nil {
		return ""
	}
	return d.metricsLn.Addr().String()
}

// Networks implements Manager.
func (d *Daemon) Networks() []*Network {
	out := make([]*Network, len(d.nets))
	for i, n := range d.nets {
		out[i] = n.api
	}
	return out
}

// Runtime returns the named network's running parts (nil when it is not
// known); the demo uses it to reach the node's netstack host.
func (d *Daemon) Runtime(name string) *netRuntime {
	for _, n := range d.nets {
		if n.cfg.Name == name {
			return n
		}
	}
	return nil
}

// Up starts a stopped network.
func (d *Daemon) Up(ctx context.Context, name string) error {
	n := d.Runtime(name)
	if n == nil {
		return fmt.Errorf("%w: network %q", vip.ErrNotFound, name)
	}
	return n.start(ctx)
}

// Down stops a running network; its saved configuration stays readable.
func (d *Daemon) Down(name string) error {
	n := d.Runtime(name)
	if n == nil {
		return fmt.Errorf("%w: network %q", vip.ErrNotFound, name)
	}
	n.stop()
	return nil
}

// Close stops every network and server and closes the stores. It waits
// for a reload in progress.
func (d *Daemon) Close() error {
	// Taking opMu waits for a reload in progress; once closed is set, no
	// reload starts. The components are closed after it is released, so
	// no Close of theirs runs under the daemon's lock.
	d.opMu.Lock()
	closed := d.closed
	d.closed = true
	d.opMu.Unlock()
	if closed {
		return nil
	}
	if d.apiSrv != nil {
		d.apiSrv.Close()
	}
	if d.metrics != nil {
		d.metrics.Close()
	}
	if d.ui != nil {
		d.ui.Close()
	}
	d.wg.Wait()
	var errs []error
	for _, n := range d.nets {
		n.stop()
		if n.replica != nil {
			errs = append(errs, n.replica.Close())
		}
	}
	if d.lock != nil {
		d.lock.Close()
		d.lock = nil
	}
	return errors.Join(errs...)
}

func (d *Daemon) openNetwork(ctx context.Context, nc NetworkConfig) (*netRuntime, error) {
	n := &netRuntime{d: d, cfg: nc}
	var err error
	if n.id, err = nc.NetworkID(); err != nil {
		return nil, err
	}
	members, err := nc.Members()
	if err != nil {
		return nil, err
	}
	if n.key, err = nc.identityKey(); err != nil {
		return nil, err
	}
	dir := filepath.Join(d.cfg.DataDir, nc.Name)
	store, err := pebblestore.Open(ctx, dir, nil)
	if err != nil {
		return nil, fmt.Errorf("opening state in %s: %w", dir, err)
	}
	authors := authorsOf(members)
	lim := crdt.Limits{}
	if nc.MaxFrame > 0 {
		lim.MaxSnapshotBytes = nc.MaxFrame
	}
	vl := nc.Limits.WithDefaults()
	lim.MaxServices, lim.MaxTombstones, lim.MaxFieldsPerService = vl.ActiveServices, vl.Tombstones, vl.FieldsPerService
	n.replica, err = crdt.Open(ctx, crdt.Config{Network: n.id, Signer: n.key, Members: authors, Store: store, Limits: lim, Obsolete: vip.Obsolete, Check: vip.CheckField, Rank: vip.Rank})
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("opening state in %s: %w", dir, err)
	}
	knownPath := knownNodesPath(d.cfg.DataDir, nc.Name)
	known, err := loadKnownNodes(knownPath)
	if err != nil {
		n.replica.Close()
		return nil, err
	}
	prefix, _ := netip.ParsePrefix(nc.Overlay)
	n.mship.Store(newMembership(members, nc.Peers, nil)) // the former members follow from the registry
	n.reg, err = vip.NewRegistry(vip.RegistryOptions{Network: nc.Name, Prefix: prefix, Replica: n.replica,
		Nodes: func() []vip.NodeInfo { return n.ms().members }, FormerNodes: func() []vip.NodeInfo { return n.ms().former },
		Limits: nc.Limits, OnChange: n.onChange})
	if err != nil {
		n.replica.Close()
		return nil, err
	}
	ms := newMembership(members, nc.Peers, formerNodes(known, members, n.reg.List()))
	n.mship.Store(ms)
	n.reg.Refresh()
	if err := saveKnownNodes(knownPath, ms.members, ms.former); err != nil {
		n.replica.Close()
		return nil, fmt.Errorf("tsng: writing %s: %w", knownPath, err)
	}
	n.api = &Network{Name: nc.Name, ID: fmt.Sprintf("%x", n.id[:]), Registry: n.reg, Up: n.up.Load, Status: n.status, CountersSince: n.countersSince,
		BackendWarnings: n.backendWarnings}
	return n, nil
}

// liveParts are the parts of a running network that onChange uses.
type liveParts struct {
	eng  *vip.Engine
	repl *vip.Replicator
}

// onChange runs after every committed change: routing follows, and local
// changes are published at once. While the network is down, starting or
// stopping it does neither: a start applies the whole state, and the
// replicator's rotation carries a change made meanwhile to the peers.
func (n *netRuntime) onChange(ids []vip.ServiceID, local bool) {
	if p := n.live.Load(); p != nil {
		if err := p.eng.Apply(); err != nil {
			n.d.log.Warn("routing update failed", "network", n.cfg.Name, "err", err)
		}
		if local {
			p.repl.Publish(context.Background(), ids)
		}
	}
	n.d.log.Info("configuration changed", "network", n.cfg.Name, "services", len(ids), "local", local)
	n.reportCollisions()
}

func (n *netRuntime) status(id vip.ServiceID) any {
	n.mu.Lock()
	eng, relay := n.engine, n.relay
	n.mu.Unlock()
	if eng == nil {
		return nil
	}
	st := eng.Status()
	for i := range st.Services {
		if st.Services[i].ID == id {
			if relay != nil {
				relay.annotate(&st.Services[i])
			}
			return st.Services[i]
		}
	}
	return nil
}

// countersSince is when the running engine, and so its counters, started.
func (n *netRuntime) countersSince() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.started
}

func (n *netRuntime) self() vip.NodeInfo { return n.ms().members[0] }

// ms returns the member set in force.
func (n *netRuntime) ms() *membership { return n.mship.Load() }

// peerOf maps an overlay address to its member (not this node).
func (n *netRuntime) peerOf(a netip.Addr) (vip.NodeID, bool) {
	ms := n.ms()
	if i, ok := ms.byAddr[a]; ok && i > 0 {
		return ms.members[i].ID, true
	}
	return vip.NodeID{}, false
}

// addrOf maps a member to its overlay address.
func (n *netRuntime) addrOf(id vip.NodeID) (netip.Addr, bool) {
	ms := n.ms()
	if i, ok := ms.byID[id]; ok {
		return ms.members[i].Addr, true
	}
	return netip.Addr{}, false
}

// Host returns the network's netstack host while it runs in netstack mode.
func (n *netRuntime) Host() *netstack.Host {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.host
}

// Engine returns the network's engine while it runs.
func (n *netRuntime) Engine() *vip.Engine {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.engine
}

// Registry returns the network's configuration.
func (n *netRuntime) Registry() *vip.Registry { return n.reg }

func (n *netRuntime) start(ctx context.Context) (err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.up.Load() {
		return nil
	}
	if n.cfg.Mode == "tun" {
		return n.startTUNLocked(ctx)
	}
	self := n.self()
	host, err := netstack.New(netstack.Options{Addrs: []netip.Addr{self.Addr}})
	if err != nil {
		return err
	}
	if err := n.startOnLocked(ctx, host, host, netstackNet{host}, &netstackReserver{h: host, addr: self.Addr}, func(ap netip.AddrPort) (net.PacketConn, error) { return host.ListenUDP(ap) }); err != nil {
		return err
	}
	if err := n.startBackendRelayLocked(host); err != nil {
		n.stopLocked()
		return err
	}
	if err := n.startProxiesLocked(host); err != nil {
		n.stopLocked()
		return err
	}
	return nil
}

// startOnLocked starts everything on a host stack.
//
// +checklocks:n.mu
// +checklocksignore: its body is not checked. The cleanups, closures kept
// in a slice and run on failure by the deferred unwinding with n.mu held,
// touch guarded fields, and the analyzer does not follow a lock into a
// closure that is not called where it is made.
func (n *netRuntime) startOnLocked(ctx context.Context, host transport.PacketIO, dialer probe.Dialer, cn ControlNet, res flow.PortReserver, listenUDP func(netip.AddrPort) (net.PacketConn, error)) (err error) {
	self := n.self()
	cleanup := []func(){}
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()
	if h, ok := host.(*netstack.Host); ok {
		n.host = h
		cleanup = append(cleanup, func() { n.host = nil })
	}
	var dev *wg.Device
	pathUp := n.pathUp(func() *wg.Device { return dev })
	eo := vip.EngineOptions{Registry: n.reg, Self: self.ID, Host: host, Dialer: dialer, PathUp: pathUp, Reserver: res, ProbePort: agentProbePort}
	if n.cfg.ProbeFast {
		eo.Prober = probe.ProberConfig{Interval: 250 * time.Millisecond, Timeout: 750 * time.Millisecond}
	}
	eng, err := vip.NewEngine(eo)
	if err != nil {
		host.Close()
		return err
	}
	cleanup = append(cleanup, func() { eng.Close() })
	wcfg := n.ms().wgConfig(n.cfg.Node, nil)
	wcfg.ListenPort = n.cfg.Node.ListenPort
	var bind conn.Bind
	if n.d.o.Bind != nil {
		bind = n.d.o.Bind(n.cfg.Name)
	} else {
		bind = wg.NewUDPBind(wg.UDPBindOptions{})
	}
	dev, err = wg.NewDevice(eng, wcfg, wg.Options{Bind: bind, Logger: n.d.log.With("network", n.cfg.Name, "part", "wireguard")})
	if err != nil {
		return err
	}
	cleanup = append(cleanup, func() { dev.Close() })
	// WireGuard's port, chosen at start when listen_port is 0.
	if live, err := dev.Config(); err == nil {
		n.holdPortLocked(vip.PortKey{Proto: vip.UDP, Port: live.ListenPort}, "node.listen_port (WireGuard)")
		cleanup = append(cleanup, func() { n.releasePortsLocked() })
	}
	if err := n.startUAPILocked(dev); err != nil {
		return err
	}
	cleanup = append(cleanup, func() {
		if n.uapi != nil {
			n.uapi.Close()
			n.uapi = nil
		}
	})
	rctx, cancel := context.WithCancel(context.Background())
	cleanup = append(cleanup, cancel)
	var repl *vip.Replicator
	auth, err := ParseControlAuth(n.cfg.ControlAuth)
	if err != nil {
		return fmt.Errorf("control_auth: %w", err)
	}
	control, err := NewControl(rctx, ControlOptions{Net: cn, Self: self.Addr, Port: n.cfg.Control, Key: n.key, Auth: auth, Peer: n.peerOf, Addr: n.addrOf,
		MaxFrame: n.replica.Limits().MaxSnapshotBytes + 3, Logger: n.d.log.With("network", n.cfg.Name, "part", "control"),
		Handle: func(ctx context.Context, from vip.NodeID, f []byte) error { return repl.HandleFrame(ctx, from, f) }})
	if err != nil {
		return err
	}
	cleanup = append(cleanup, func() { control.Close() })
	repl, err = vip.NewReplicator(vip.ReplicatorOptions{Registry: n.reg, Carrier: control, Peers: func() []vip.NodeID { return n.ms().peerIDs }})
	if err != nil {
		return err
	}
	n.done = make(chan struct{})
	if n.cfg.DNS == nil || *n.cfg.DNS {
		port := n.cfg.DNSPort
		if port == 0 {
			port = 53
		}
		prefix, _ := netip.ParsePrefix(n.cfg.Overlay)
		ups, err := parseUpstreams(n.cfg.DNSUpstreams, prefix)
		if err != nil {
			return fmt.Errorf("dns_upstreams: %w", err)
		}
		opts := eng.DNSOptions()
		own, err := vip.NewDNSServer(opts)
		if err != nil {
			return err
		}
		pc, err := listenUDP(netip.AddrPortFrom(self.Addr, port))
		if err != nil {
			return fmt.Errorf("DNS on %v:%d: %w", self.Addr, port, err)
		}
		ln, err := cn.Listen(netip.AddrPortFrom(self.Addr, port))
		if err != nil {
			pc.Close()
			return fmt.Errorf("DNS over TCP on %v:%d: %w", self.Addr, port, err)
		}
		srvs, err := serveDNS(newDNSHandler(own, opts, ups, n.d.log.With("network", n.cfg.Name, "part", "dns")), pc, ln)
		if err != nil {
			pc.Close()
			ln.Close()
			return fmt.Errorf("DNS on %v:%d: %w", self.Addr, port, err)
		}
		n.dns = srvs
		cleanup = append(cleanup, func() { srvs.Close(); n.dns = nil })
	}
	close(n.done)
	n.engine, n.dev, n.control, n.repl, n.cancel, n.res = eng, dev, control, repl, cancel, res
	n.live.Store(&liveParts{eng: eng, repl: repl})
	n.started = time.Now()
	repl.Start()
	if err := eng.Apply(); err != nil {
		n.d.log.Warn("routing", "err", err)
	}
	n.up.Store(true)
	n.d.log.Info("network up", "network", n.cfg.Name, "node", self.Name, "address", self.Addr, "mode", n.mode(),
		"identity", base64.StdEncoding.EncodeToString(self.ID[:]), "wireguard_public_key", n.cfg.Node.WireGuardKey.PublicKey().String())
	return nil
}

// trimPrefix drops a leading "tsng: " from err's message, for errors
// wrapped into another tsng error.
func trimPrefix(err error) error {
	if m, ok := strings.CutPrefix(err.Error(), "tsng: "); ok {
		return prefixless{m, err}
	}
	return err
}

type prefixless struct {
	msg string
	err error
}

func (p prefixless) Error() string { return p.msg }
func (p prefixless) Unwrap() error { return p.err }

func (n *netRuntime) mode() string {
	if n.cfg.Mode == "" {
		return "netstack"
	}
	return n.cfg.Mode
}

// pathUp reports a data path to a peer: a WireGuard handshake within the
// last 180 s (WireGuard's reject-after time). Device stats are read at
// most every 500 ms.
func (n *netRuntime) pathUp(dev func() *wg.Device) func(vip.NodeID) bool {
	var mu syncx.Mutex
	var at time.Time
	var stats map[wg.Key]wg.PeerStats
	return func(id vip.NodeID) bool {
		ms := n.ms()
		i, ok := ms.byID[id]
		if !ok || i == 0 {
			return false
		}
		key := ms.peers[i-1].WireGuardKey
		mu.Lock()
		defer mu.Unlock()
		d := dev()
		if d == nil {
			return false
		}
		if time.Since(at) > 500*time.Millisecond {
			if s, err := d.Stats(); err == nil {
				stats, at = s, time.Now()
			}
		}
		st, ok := stats[key]
		return ok && !st.LastHandshake.IsZero() && time.Since(st.LastHandshake) < 180*time.Second
	}
}

func (n *netRuntime) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stopLocked()
}

// +checklocks:n.mu
func (n *netRuntime) stopLocked() {
	if !n.up.Load() {
		return
	}
	n.up.Store(false)
	n.live.Store(nil)
	for _, p := range n.proxies {
		p.Close()
	}
	for _, f := range n.forwards {
		f.Close()
	}
	n.proxies, n.forwards = nil, nil
	n.releasePortsLocked()
	relay := n.relay
	if relay != nil {
		relay.Close()
		n.relay = nil
	}
	n.repl.Stop()
	n.cancel()
	if n.dns != nil {
		n.dns.Close()
	}
	<-n.done
	n.control.Close()
	if n.uapi != nil {
		n.uapi.Close()
		n.uapi = nil
	}
	n.dev.Close()
	n.engine.Close() // and its host, which ends the relay's handshakes
	if relay != nil {
		relay.Wait()
	}
	if c, ok := n.res.(interface{ Close() error }); ok {
		c.Close() // an OSReserver's sockets (the NAT released every port)
	}
	n.engine, n.dev, n.control, n.repl, n.dns, n.host, n.res = nil, nil, nil, nil, nil, nil, nil
	n.d.log.Info("network down", "network", n.cfg.Name)
}

// netstackNet is ControlNet over a netstack host.
type netstackNet struct{ h *netstack.Host }

func (s netstackNet) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return s.h.DialContext(ctx, network, address)
}

func (s netstackNet) Listen(addr netip.AddrPort) (net.Listener, error) { return s.h.ListenTCP(addr) }

// netstackReserver reserves shadow ports in the netstack host's own port
// manager, so no local socket can take one.
type netstackReserver struct {
	h     *netstack.Host
	addr  netip.Addr
	inUse atomic.Int64
}

func (r *netstackReserver) Reserve(proto flow.Proto, _ netip.AddrPort) (uint16, error) {
	p, err := r.h.ReservePort(protoName(proto), r.addr, 0)
	if err == nil {
		r.inUse.Add(1)
	}
	return p, err
}

func (r *netstackReserver) Release(proto flow.Proto, _ netip.AddrPort, port uint16) {
	if r.h.ReleasePort(protoName(proto), r.addr, port) == nil {
		r.inUse.Add(-1)
	}
}

func (r *netstackReserver) InUse() int { return int(r.inUse.Load()) }

func protoName(p flow.Proto) string {
	if p == flow.ProtoTCP {
		return "tcp"
	}
	return "udp"
}
