package tsng

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/internal/socks5"
	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport/netstack"
	"github.com/vipkit/vipkit/vip"
)

// In netstack mode no host application listens on the node's overlay
// address: it exists only inside the agent's stack. A node that hosts VIP
// backends lists, in its own config (backend_ports), the host loopback
// ports it serves; a TCP connection or UDP datagram arriving on its
// overlay address at such a port is relayed to 127.0.0.1 at the same
// port. The VIP configuration, which any member may edit, never chooses
// which of a node's loopback ports are reachable: a port not listed is
// answered as closed, and the agent's own ports are refused even when
// listed.
//
// A TCP connection is accepted (its handshake completed) only once the
// loopback connection is made, so a connect check fails, and the backend
// leaves rotation, as soon as the application stops listening.

// Limits of the backend relay, per network.
const (
	// backendTCPConns bounds the relayed TCP connections open at once;
	// attempts beyond it are refused (a reset) and counted.
	backendTCPConns = 1024
	// backendTCPPending bounds the TCP attempts waiting for their
	// loopback connection; SYNs beyond it are dropped (the sender
	// retransmits) and counted by the netstack host.
	backendTCPPending = 128
	// backendUDPFlows bounds the relayed UDP flows (one per remote
	// address and port); new flows beyond it are dropped and counted.
	backendUDPFlows = 256
	// backendUDPIdle ends a UDP flow after no datagram either way.
	backendUDPIdle = 2 * time.Minute
	// backendTCPIdle ends a relayed TCP connection after no byte either
	// way, as the HTTP proxy's tunnels (a peer that vanished, or a
	// half-closed connection, would otherwise hold its slot for good).
	backendTCPIdle = time.Hour
	// backendDialTimeout bounds the loopback connection of a TCP attempt.
	backendDialTimeout = 5 * time.Second
)

// BackendRelayStats counts a network's backend relay (netstack mode).
type BackendRelayStats struct {
	// Allowed lists backend_ports as in force ("tcp/8090").
	Allowed []string `json:"allowed"`
	// TCPActive and UDPFlows are the relayed connections and flows open.
	TCPActive int `json:"tcp_active"`
	UDPFlows  int `json:"udp_flows"`
	// TCPAccepted and UDPAccepted count the connections and flows relayed.
	TCPAccepted uint64 `json:"tcp_accepted"`
	UDPAccepted uint64 `json:"udp_accepted"`
	// NotAllowed counts TCP attempts and UDP datagrams to the node's
	// overlay address at a port no socket has and backend_ports does not
	// allow (answered as closed).
	NotAllowed uint64 `json:"not_allowed"`
	// DialFailed counts TCP attempts whose loopback connection failed
	// (no application listening: refused) and UDP flows whose loopback
	// socket could not be made. A UDP flow to a port where nothing
	// listens is relayed, and ends at its first datagram's refusal.
	DialFailed uint64 `json:"dial_failed"`
	// OverLimit counts TCP attempts and UDP flows refused at the limits
	// (TCPLimit, UDPLimit).
	OverLimit uint64 `json:"over_limit"`
	TCPLimit  int    `json:"tcp_limit"`
	UDPLimit  int    `json:"udp_limit"`
}

// parseBackendPorts parses backend_ports entries ("tcp/8090", "udp/53").
func parseBackendPorts(list []string) (map[vip.PortKey]bool, error) {
	out := make(map[vip.PortKey]bool, len(list))
	for i, s := range list {
		k, err := vip.ParsePortKey(s)
		if err != nil || k.Port == 0 {
			return nil, fmt.Errorf("[%d] %q: want tcp/PORT or udp/PORT, such as tcp/8080", i, s)
		}
		if out[k] {
			return nil, fmt.Errorf("[%d] %q: listed twice", i, s)
		}
		out[k] = true
	}
	return out, nil
}

// agentPorts returns the ports the agent itself uses, on the host or on
// overlay addresses, by what uses them: no backend_ports entry may name
// one. The ports chosen at start (ui empty; metrics, socks5 or
// http_proxy at port 0; listen_port 0) are not known here; the relay
// refuses them at run time (Daemon.agentPortWhat).
func (c *Config) agentPorts() map[vip.PortKey]string {
	out := map[vip.PortKey]string{}
	add := func(proto vip.Proto, port uint16, what string) {
		k := vip.PortKey{Proto: proto, Port: port}
		if _, ok := out[k]; !ok && port != 0 {
			out[k] = what
		}
	}
	both := func(port uint16, what string) {
		add(vip.TCP, port, what)
		add(vip.UDP, port, what)
	}
	addr := func(s, what string) {
		if rest, ok := strings.CutPrefix(s, "localhost:"); ok {
			s = "127.0.0.1:" + rest
		}
		if ap, err := netip.ParseAddrPort(s); err == nil {
			add(vip.TCP, ap.Port(), what)
		}
	}
	both(agentProbePort, "the agent's probe port")
	addr(c.Metrics, "metrics")
	if c.UI != "off" {
		addr(c.UI, "ui")
	}
	for _, n := range c.Networks {
		addr(n.SOCKS5, "networks "+n.Name+" socks5")
		addr(n.HTTPProxy, "networks "+n.Name+" http_proxy")
		add(vip.TCP, nonZero(n.Control, DefaultControlPort), "networks "+n.Name+" control_port")
		if n.DNS == nil || *n.DNS {
			both(nonZero(n.DNSPort, 53), "networks "+n.Name+" dns_port")
		}
		add(vip.UDP, n.Node.ListenPort, "networks "+n.Name+" node.listen_port (WireGuard)")
	}
	return out
}

func nonZero(v, def uint16) uint16 {
	if v == 0 {
		return def
	}
	return v
}

// backendRelay relays the connections and datagrams arriving on a
// netstack node's overlay address at an allowed port to the host's
// loopback.
type backendRelay struct {
	self netip.Addr
	// allowed is backend_ports as in force, swapped whole by a reload
	// (setAllowed).
	allowed atomic.Pointer[map[vip.PortKey]bool]
	// agentPort reports the agent's own ports at run time (the editor's
	// chosen port included); they are refused even when allowed.
	agentPort func(vip.PortKey) bool
	log       *slog.Logger

	// Counters (BackendRelayStats).
	notAllowed  atomic.Uint64
	dialFailed  atomic.Uint64
	overLimit   atomic.Uint64
	tcpAccepted atomic.Uint64
	udpAccepted atomic.Uint64

	// mu guards conns (the relayed connections and flows open, to close,
	// with the port each was relayed to), tcpActive, udpFlows and closed.
	mu syncx.Mutex
	// +checklocks:mu
	conns map[io.Closer]vip.PortKey
	// +checklocks:mu
	tcpActive int
	// +checklocks:mu
	udpFlows int
	// +checklocks:mu
	closed bool
	wg     sync.WaitGroup
}

// newBackendRelay returns a relay for the node at self that takes the
// ports in allowed, except those agentPort reports; log may be nil.
func newBackendRelay(self netip.Addr, allowed map[vip.PortKey]bool, agentPort func(vip.PortKey) bool, log *slog.Logger) *backendRelay {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &backendRelay{self: self, agentPort: agentPort, log: log, conns: map[io.Closer]vip.PortKey{}}
	r.allowed.Store(&allowed)
	return r
}

// allowedNow returns backend_ports as in force.
func (r *backendRelay) allowedNow() map[vip.PortKey]bool { return *r.allowed.Load() }

// setAllowed puts allowed in force (a reload of backend_ports): a port
// no longer allowed is refused from now on, and the connections and
// flows relayed to it are closed.
func (r *backendRelay) setAllowed(allowed map[vip.PortKey]bool) {
	r.allowed.Store(&allowed)
	var gone []io.Closer
	r.mu.Lock()
	for c, k := range r.conns {
		if !allowed[k] {
			gone = append(gone, c)
		}
	}
	r.mu.Unlock()
	for _, c := range gone {
		c.Close()
	}
}

// startBackendRelayLocked installs the network's backend relay on host.
//
// +checklocks:n.mu
func (n *netRuntime) startBackendRelayLocked(host *netstack.Host) error {
	ports := n.backendPortsNow()
	allowed, err := parseBackendPorts(ports)
	if err != nil {
		return fmt.Errorf("backend_ports%v", err) // validated
	}
	r := newBackendRelay(n.self().Addr, allowed, n.d.agentPortNow, n.d.log.With("network", n.cfg.Name, "part", "backend-relay"))
	if err := host.SetInbound(netstack.Inbound{Want: r.want, TCP: r.tcp, UDP: r.udp, MaxPendingTCP: backendTCPPending}); err != nil {
		return err
	}
	n.relay = r
	if len(allowed) > 0 {
		r.log.Info("relaying backend ports to the host's loopback", "ports", ports)
	}
	return nil
}

// backendPortsNow returns the network's backend_ports as in force: the
// start's, then each reload's.
func (n *netRuntime) backendPortsNow() []string {
	if p := n.backendPorts.Load(); p != nil {
		return *p
	}
	return n.cfg.BackendPorts
}

// applyBackendPorts puts ports (validated) in force: the running relay
// takes them at once, and the network's next start uses them.
func (n *netRuntime) applyBackendPorts(ports []string) {
	allowed, _ := parseBackendPorts(ports) // validated
	n.mu.Lock()
	n.backendPorts.Store(&ports)
	relay := n.relay
	n.mu.Unlock()
	if relay != nil {
		relay.setAllowed(allowed)
	}
	n.d.log.Info("backend ports reloaded", "network", n.cfg.Name, "ports", ports)
}

// allows reports whether the relay takes k: listed, and not the agent's.
func (r *backendRelay) allows(k vip.PortKey) bool {
	return r.allowedNow()[k] && !r.agentPort(k)
}

// want is netstack.Inbound.Want: only the node's own address, at an
// allowed port.
func (r *backendRelay) want(proto string, local, _ netip.AddrPort) bool {
	k := vip.PortKey{Proto: vip.TCP, Port: local.Port()}
	if proto == "udp" {
		k.Proto = vip.UDP
	}
	if local.Addr() != r.self || !r.allows(k) {
		r.notAllowed.Add(1)
		return false
	}
	return true
}

// reserve counts a new connection (udp: a flow) against its limit; false
// when the relay is closed or at the limit. Each reserve that succeeds is
// matched by an unreserve.
func (r *backendRelay) reserve(udp bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return false
	case udp && r.udpFlows >= backendUDPFlows, !udp && r.tcpActive >= backendTCPConns:
		r.overLimit.Add(1)
		return false
	}
	if udp {
		r.udpFlows++
	} else {
		r.tcpActive++
	}
	r.wg.Add(1)
	return true
}

func (r *backendRelay) unreserve(udp bool) {
	r.mu.Lock()
	if udp {
		r.udpFlows--
	} else {
		r.tcpActive--
	}
	r.mu.Unlock()
	r.wg.Done()
}

// track keeps c, relayed to port k, for Close (and setAllowed) to close;
// false (c closed) when the relay is closed already, or k is no longer
// allowed.
func (r *backendRelay) track(c io.Closer, k vip.PortKey) bool {
	r.mu.Lock()
	closed := r.closed
	if !closed {
		r.conns[c] = k
	}
	r.mu.Unlock()
	if closed {
		c.Close()
		return false
	}
	// A reload that removed k since the SYN: setAllowed stores the new
	// set before it looks through conns, so either it saw c there or c
	// sees the new set here.
	if !r.allowedNow()[k] {
		r.forget(c)
		return false
	}
	return true
}

// forget closes c and drops it from the tracked ones.
func (r *backendRelay) forget(c io.Closer) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	c.Close()
}

func loopback(port uint16) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
}

// tcp is netstack.Inbound.TCP: the loopback connection first, then the
// handshake, so that the attempt is refused when no application listens.
func (r *backendRelay) tcp(req *netstack.InboundTCP) {
	if !r.reserve(false) {
		req.Refuse()
		return
	}
	defer r.unreserve(false)
	port := req.Local().Port()
	k := vip.PortKey{Proto: vip.TCP, Port: port}
	ctx, cancel := context.WithTimeout(context.Background(), backendDialTimeout)
	var d net.Dialer
	out, err := d.DialContext(ctx, "tcp", loopback(port))
	cancel()
	if err != nil {
		r.dialFailed.Add(1)
		r.log.Debug("backend port: no application on the loopback", "port", port, "err", err)
		req.Refuse()
		return
	}
	if !r.track(out, k) {
		req.Refuse()
		return
	}
	defer r.forget(out)
	in, err := req.Accept()
	if err != nil || !r.track(in, k) {
		return
	}
	defer r.forget(in)
	r.tcpAccepted.Add(1)
	socks5.RelayIdle(in, out, backendTCPIdle, nil)
}

// udp is netstack.Inbound.UDP, on the packet path: the flow's relay runs
// in a goroutine of its own.
func (r *backendRelay) udp(in *netstack.UDPConn) {
	if !r.reserve(true) {
		in.Close()
		return
	}
	go func() {
		defer r.unreserve(true)
		port := uint16(0)
		if ua, ok := in.LocalAddr().(*net.UDPAddr); ok {
			port = uint16(ua.Port)
		}
		k := vip.PortKey{Proto: vip.UDP, Port: port}
		if !r.track(in, k) {
			return
		}
		defer r.forget(in)
		out, err := net.Dial("udp", loopback(port))
		if err != nil {
			r.dialFailed.Add(1)
			return
		}
		if !r.track(out, k) {
			return
		}
		defer r.forget(out)
		r.udpAccepted.Add(1)
		socks5.RelayDatagramsIdle(in, out, backendUDPIdle, nil)
	}()
}

// Backend reasons the relay adds to this node's status of its own
// backends (BackendStatus.Reason), in netstack mode.
const (
	// reasonNotAllowed: the port is not in this node's backend_ports.
	reasonNotAllowed = "not-allowed"
	// reasonAgentPort: the port is one of the agent's own.
	reasonAgentPort = "agent-port"
)

// annotate marks this node's own backends of ss that are not eligible and
// whose port the relay does not take: their Reason becomes
// reasonNotAllowed or reasonAgentPort, and CheckError says why. Other
// nodes see such a backend fail its checks (check-failed); only this node
// knows why. An eligible one is served by a socket of the node's own
// stack (an application embedding the agent, as the demo does), which
// takes precedence over the relay, and keeps its reason.
func (r *backendRelay) annotate(ss *vip.ServiceStatus) {
	allowed := r.allowedNow()
	for i := range ss.Listeners {
		l := &ss.Listeners[i]
		lk, err := vip.ParsePortKey(l.Listener)
		if err != nil {
			continue
		}
		for j := range l.Backends {
			b := &l.Backends[j]
			if !b.Local || b.Eligible || b.Drain || b.Departed {
				continue
			}
			k := vip.PortKey{Proto: lk.Proto, Port: b.Port}
			switch {
			case r.agentPort(k):
				b.Reason = reasonAgentPort
				b.CheckError = fmt.Sprintf("%s is a port of the agent itself: never relayed to a backend", k)
			case !allowed[k]:
				b.Reason = reasonNotAllowed
				b.CheckError = fmt.Sprintf("%s is not in this node's backend_ports: a netstack node relays only the loopback ports its own config lists", k)
			}
		}
	}
}

// Stats returns the relay's counters.
func (r *backendRelay) Stats() BackendRelayStats {
	st := BackendRelayStats{Allowed: []string{}, TCPLimit: backendTCPConns, UDPLimit: backendUDPFlows,
		TCPAccepted: r.tcpAccepted.Load(), UDPAccepted: r.udpAccepted.Load(),
		NotAllowed: r.notAllowed.Load(), DialFailed: r.dialFailed.Load(), OverLimit: r.overLimit.Load()}
	for k := range r.allowedNow() {
		st.Allowed = append(st.Allowed, k.String())
	}
	slices.Sort(st.Allowed)
	r.mu.Lock()
	st.TCPActive, st.UDPFlows = r.tcpActive, r.udpFlows
	r.mu.Unlock()
	return st
}

// Close ends every relayed connection and flow, and returns without
// waiting for them: a TCP attempt may be inside the netstack handshake,
// which only the host's own close cuts short (a SYN whose SYN-ACKs go
// unanswered retries for about two minutes). The host stops handing new
// ones over when it closes; Wait, after that, waits for the rest.
func (r *backendRelay) Close() error {
	r.mu.Lock()
	r.closed = true
	conns := make([]io.Closer, 0, len(r.conns))
	for c := range r.conns {
		conns = append(conns, c)
	}
	r.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return nil
}

// Wait waits for the relay's goroutines once Close has returned and the
// host is closed.
func (r *backendRelay) Wait() { r.wg.Wait() }

// refusedWhy says why a netstack node with allowed ports refuses backend
// port k ("" when it serves it); agent names the agent's own ports.
func refusedWhy(allowed map[vip.PortKey]bool, agent func(vip.PortKey) (string, bool), k vip.PortKey, field string) string {
	if what, ok := agent(k); ok {
		return fmt.Sprintf("%s is a port of the agent itself (%s): it is never relayed", k, what)
	}
	if !allowed[k] {
		return fmt.Sprintf("%s does not list %s: this netstack node refuses its connections", field, k)
	}
	return ""
}

// backendWarnings is Network.BackendWarnings: svc's backends on this
// node that it will not serve.
func (n *netRuntime) backendWarnings(svc vip.Service) []string {
	if n.cfg.Mode == "tun" {
		return nil
	}
	self := n.self()
	allowed, _ := parseBackendPorts(n.backendPortsNow()) // validated
	agent := n.d.agentPortWhat
	field := fmt.Sprintf("networks[%d] (%s).backend_ports", n.index.Load(), n.cfg.Name)
	var out []string
	for _, l := range svc.Listeners {
		for _, b := range l.Backends {
			if b.Node != self.ID {
				continue
			}
			if why := refusedWhy(allowed, agent, vip.PortKey{Proto: l.Proto, Port: b.Port}, field); why != "" {
				out = append(out, fmt.Sprintf("%s backend %s:%d is on this node, but %s", vip.PortKey{Proto: l.Proto, Port: l.Port}, self.Name, b.Port, why))
			}
		}
	}
	return out
}

// backendPortWarnings lists the backends on this node of network i's
// known VIPs (k) that the node would not serve: in netstack mode, those
// whose port backend_ports does not list or that is one of the agent's
// own. Without known VIPs there is nothing to compare (the node's status
// still shows such a backend).
func (c *Config) backendPortWarnings(i int, k knownState) []string {
	n := &c.Networks[i]
	if n.Mode == "tun" || k.services == nil {
		return nil
	}
	self, err := n.Self()
	if err != nil {
		return nil
	}
	allowed, _ := parseBackendPorts(n.BackendPorts) // validated
	ports := c.agentPorts()
	agent := func(k vip.PortKey) (string, bool) { what, ok := ports[k]; return what, ok }
	var out []string
	for _, svc := range k.services {
		for _, l := range svc.Listeners {
			for _, b := range l.Backends {
				if b.Node != self.ID {
					continue
				}
				pk := vip.PortKey{Proto: l.Proto, Port: b.Port}
				if why := refusedWhy(allowed, agent, pk, fmt.Sprintf("networks[%d].backend_ports", i)); why != "" {
					out = append(out, fmt.Sprintf("networks[%d] (%s): VIP %s %s has a backend on this node (%s:%d), known from %s, but %s",
						i, n.Name, svc.Name, vip.PortKey{Proto: l.Proto, Port: l.Port}, n.Node.Name, b.Port, k.source, why))
				}
			}
		}
	}
	return out
}
