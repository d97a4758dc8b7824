package tsng

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/internal/socks5"
	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/probe"
	"github.com/vipkit/vipkit/transport/netstack"
	"github.com/vipkit/vipkit/vip"
)

// In netstack mode the overlay lives inside the agent's own stack, so host
// applications reach VIPs through the agent: a SOCKS5 proxy (CONNECT and
// UDP ASSOCIATE), an HTTP proxy (CONNECT and absolute-form requests), and
// `tsng vip forward` for applications that speak no proxy. All listen on
// loopback only, are off unless configured, and resolve names on the
// agent's side: api.home (or api) is the VIP, server1.home the node. Any
// local user can use a loopback listener, as with any local proxy.

// overlayNet dials and listens into one network's netstack host and
// resolves its names.
type overlayNet struct {
	n    *netRuntime
	host *netstack.Host
}

// resolve maps a host name or IP literal to an overlay address: a VIP or
// node name of the network's domain ("api.home", "api", with or without
// the final dot) or an address inside the overlay range.
func (o overlayNet) resolve(_ context.Context, name string) (netip.Addr, error) {
	prefix, _ := netip.ParsePrefix(o.n.cfg.Overlay)
	if a, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		if !prefix.Contains(a.Unmap()) {
			return netip.Addr{}, fmt.Errorf("%w: %v is outside the overlay %v", socks5.ErrNetworkUnreachable, a, prefix)
		}
		return a.Unmap(), nil
	}
	label := strings.ToLower(strings.TrimSuffix(name, "."))
	if rest, ok := strings.CutSuffix(label, "."+strings.ToLower(o.n.cfg.Name)); ok {
		label = rest
	} else if strings.Contains(label, ".") {
		return netip.Addr{}, fmt.Errorf("%w: %s is outside the network's domain .%s", socks5.ErrHostUnreachable, name, o.n.cfg.Name)
	}
	if a, ok := o.n.reg.Lookup(label); ok {
		return a, nil
	}
	return netip.Addr{}, fmt.Errorf("%w: no VIP or node %q in %s", socks5.ErrHostUnreachable, label, o.n.cfg.Name)
}

// agentProbePort is the engine's probe port (EngineOptions.ProbePort).
// The engine makes and answers probes itself, and peers take what reaches
// that port as this node's probes, so the proxies and forwards refuse it
// on every overlay address: a local user is not the node.
const agentProbePort = probe.DefaultPort

// errProbePort is the proxies' answer for the probe port.
var errProbePort = fmt.Errorf("%w: UDP and TCP port %d of overlay addresses is the agent's probe port", socks5.ErrNotAllowed, agentProbePort) // +checklocksignore: read-only

// dial connects into the overlay; addresses outside it are unreachable
// from the netstack host, and the probe port is refused.
func (o overlayNet) dial(ctx context.Context, to netip.AddrPort) (net.Conn, error) {
	if prefix, _ := netip.ParsePrefix(o.n.cfg.Overlay); !prefix.Contains(to.Addr().Unmap()) {
		return nil, fmt.Errorf("%w: %v is outside the overlay %v", socks5.ErrNetworkUnreachable, to.Addr(), prefix)
	}
	if to.Port() == agentProbePort {
		return nil, errProbePort
	}
	return o.host.DialTCP(ctx, to)
}

func (o overlayNet) dialHostPort(ctx context.Context, hostport string) (net.Conn, error) {
	h, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, err
	}
	a, err := o.resolve(ctx, h)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("%w: port %q", socks5.ErrHostUnreachable, p)
	}
	return o.dial(ctx, netip.AddrPortFrom(a, uint16(port)))
}

// listenPacket opens a UDP ASSOCIATE's socket in the overlay; it refuses
// datagrams to the probe port.
func (o overlayNet) listenPacket(context.Context) (net.PacketConn, error) {
	pc, err := o.host.ListenUDP(netip.AddrPortFrom(o.n.self().Addr, 0))
	if err != nil {
		return nil, err
	}
	return noProbePort{pc}, nil
}

// noProbePort is a PacketConn that refuses to send to the probe port.
type noProbePort struct{ net.PacketConn }

// WriteTo implements net.PacketConn.
func (c noProbePort) WriteTo(b []byte, addr net.Addr) (int, error) {
	if ua, ok := addr.(*net.UDPAddr); !ok || ua.Port == int(agentProbePort) {
		return 0, errProbePort
	}
	return c.PacketConn.WriteTo(b, addr)
}

// listenPort returns the TCP port of a listener's address.
func listenPort(a net.Addr) vip.PortKey {
	ap, _ := netip.ParseAddrPort(a.String())
	return vip.PortKey{Proto: vip.TCP, Port: ap.Port()}
}

// startProxiesLocked starts the network's configured proxies on host.
//
// +checklocks:n.mu
func (n *netRuntime) startProxiesLocked(host *netstack.Host) error {
	o := overlayNet{n: n, host: host}
	log := n.d.log.With("network", n.cfg.Name)
	if n.cfg.SOCKS5 != "" {
		ln, err := net.Listen("tcp", n.cfg.SOCKS5)
		if err != nil {
			return fmt.Errorf("socks5 proxy: %w", err)
		}
		n.holdPortLocked(listenPort(ln.Addr()), "socks5")
		s := &socks5.Server{Dial: o.dial, ListenPacket: o.listenPacket, Resolve: o.resolve, Logger: log.With("part", "socks5")}
		go s.Serve(ln)
		n.proxies = append(n.proxies, s)
		log.Info("SOCKS5 proxy listening", "address", ln.Addr().String())
	}
	if n.cfg.HTTPProxy != "" {
		lim := n.d.httpLimitsFor(serverHTTPProxy)
		lim.log = log.With("part", "http-proxy")
		p, err := newHTTPProxy(n.cfg.HTTPProxy, o.dialHostPort, lim)
		if err != nil {
			return err
		}
		n.holdPortLocked(listenPort(p.ln.Addr()), "http_proxy")
		n.proxies = append(n.proxies, p)
		log.Info("HTTP proxy listening", "address", p.ln.Addr().String())
	}
	return nil
}

// httpProxy is an HTTP proxy into the overlay: CONNECT tunnels, and
// absolute-form requests (http://api.home/...) forwarded. It has the
// limits of serverHTTPProxy: the request timeouts apply until a tunnel is
// established or a request is forwarded; from then on the connection
// lasts until no byte has flowed either way for lim.tunnelIdle.
type httpProxy struct {
	// dial connects to a CONNECT's or a request's host:port.
	dial func(ctx context.Context, hostport string) (net.Conn, error)
	lim  httpLimits
	ln   *connLimiter
	srv  *http.Server
	rp   *httputil.ReverseProxy
	tr   *http.Transport

	// mu guards tunnel, the CONNECT tunnels open, and closed.
	mu syncx.Mutex
	// +checklocks:mu
	tunnel map[net.Conn]bool
	// +checklocks:mu
	closed bool
	wg     sync.WaitGroup
	// idleClosed counts tunnels and forwarded requests closed by the idle
	// rule.
	idleClosed atomic.Uint64
}

// newHTTPProxy listens on addr and serves the proxy with lim; dial
// connects to the host:port of each CONNECT and request.
func newHTTPProxy(addr string, dial func(ctx context.Context, hostport string) (net.Conn, error), lim httpLimits) (*httpProxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http proxy: %w", err)
	}
	p := &httpProxy{dial: dial, lim: lim, ln: lim.listen(ln, serverHTTPProxy), tunnel: map[net.Conn]bool{}}
	p.tr = &http.Transport{DialContext: func(ctx context.Context, _, hostport string) (net.Conn, error) { return p.dialTimeout(ctx, hostport) },
		MaxIdleConns: 16, IdleConnTimeout: 30 * time.Second}
	p.rp = &httputil.ReverseProxy{Transport: p.tr, Rewrite: func(pr *httputil.ProxyRequest) {
		pr.Out.URL = pr.In.URL
		pr.Out.Host = pr.In.Host
	}, ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
		http.Error(w, "tsng proxy: "+err.Error(), proxyStatus(err))
	}}
	p.srv = lim.server(p)
	go p.srv.Serve(p.ln)
	return p, nil
}

// dialTimeout dials hostport within httpProxyDialTimeout.
func (p *httpProxy) dialTimeout(ctx context.Context, hostport string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, httpProxyDialTimeout)
	defer cancel()
	return p.dial(ctx, hostport)
}

// forward forwards an absolute-form request. The server's request
// timeouts end here: the request lasts as long as bytes flow either way
// (a download, a stream), and ends once none has for lim.tunnelIdle.
func (p *httpProxy) forward(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	watch := socks5.NewIdleWatch(p.lim.tunnelIdle, p.lim.clock, func() {
		cancel()
		_ = rc.SetReadDeadline(time.Unix(1, 0))
		_ = rc.SetWriteDeadline(time.Unix(1, 0))
	})
	defer func() {
		if watch.Stop() {
			p.idleClosed.Add(1)
			p.lim.logger().Debug("forwarded request closed: idle", "url", r.URL.Redacted(), "idle", p.lim.tunnelIdle)
		}
	}()
	r = r.WithContext(ctx)
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = activeBody{ReadCloser: r.Body, w: watch}
	}
	p.rp.ServeHTTP(&activeWriter{ResponseWriter: w, w: watch}, r)
}

// activeBody is a request body whose bytes are activity for an IdleWatch.
type activeBody struct {
	io.ReadCloser
	w *socks5.IdleWatch
}

// Read implements io.Reader.
func (b activeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.w.Touch()
	}
	return n, err
}

// activeWriter is a ResponseWriter whose bytes are activity for an
// IdleWatch, as are those of the connection it hijacks (an upgrade).
type activeWriter struct {
	http.ResponseWriter
	w *socks5.IdleWatch
}

// Write implements http.ResponseWriter. Like the watch's own connections,
// it reports activity before the bytes can reach the client.
func (a *activeWriter) Write(p []byte) (int, error) {
	if len(p) > 0 {
		a.w.Touch()
	}
	return a.ResponseWriter.Write(p)
}

// Hijack implements http.Hijacker.
func (a *activeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(a.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return a.w.Conn(c), rw, nil
}

// Unwrap lets http.ResponseController reach the server's writer.
func (a *activeWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// ServeHTTP implements http.Handler.
func (p *httpProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		if !r.URL.IsAbs() || r.URL.Scheme != "http" {
			http.Error(w, "tsng proxy: send CONNECT, or an absolute http:// URL", http.StatusBadRequest)
			return
		}
		p.forward(w, r)
		return
	}
	out, err := p.dialTimeout(r.Context(), r.Host)
	if err != nil {
		http.Error(w, "tsng proxy: "+err.Error(), proxyStatus(err))
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		out.Close()
		http.Error(w, "tsng proxy: cannot tunnel", http.StatusInternalServerError)
		return
	}
	in, rw, err := hj.Hijack()
	if err != nil {
		out.Close()
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		in.Close()
		out.Close()
		return
	}
	p.tunnel[in], p.tunnel[out] = true, true
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.tunnel, in)
		delete(p.tunnel, out)
		p.mu.Unlock()
		in.Close()
		out.Close()
	}()
	_ = in.SetDeadline(time.Time{})
	if _, err := io.WriteString(in, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Bytes the client sent after the request are in rw's buffer.
	if n := rw.Reader.Buffered(); n > 0 {
		b, _ := rw.Reader.Peek(n)
		if _, err := out.Write(b); err != nil {
			return
		}
	}
	if err := socks5.RelayIdle(in, out, p.lim.tunnelIdle, p.lim.clock); errors.Is(err, socks5.ErrIdle) {
		p.idleClosed.Add(1)
		p.lim.logger().Debug("tunnel closed: idle", "to", r.Host, "idle", p.lim.tunnelIdle)
	}
}

// proxyStatus is the HTTP proxy's status for a failed dial: 404 for a name
// or address it cannot reach, 403 for a refused one (the probe port), 502
// otherwise.
func proxyStatus(err error) int {
	switch {
	case errors.Is(err, socks5.ErrNotAllowed):
		return http.StatusForbidden
	case errors.Is(err, socks5.ErrHostUnreachable), errors.Is(err, socks5.ErrNetworkUnreachable):
		return http.StatusNotFound
	}
	return http.StatusBadGateway
}

// Close stops the proxy and every tunnel, and waits for them.
func (p *httpProxy) Close() error {
	err := p.srv.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.tunnel {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	p.tr.CloseIdleConnections()
	return err
}

// ForwardRequest is the body of POST /v1/networks/{net}/forward.
type ForwardRequest struct {
	VIP      string `json:"vip"`
	Listener string `json:"listener"`         // "tcp/443"
	Listen   string `json:"listen,omitempty"` // loopback IP:port; default 127.0.0.1:0
}

// ForwardDoc is the first line of the answer: where the forward listens.
type ForwardDoc struct {
	Listen   string `json:"listen"`
	VIP      string `json:"vip"`
	Network  string `json:"network"`
	Listener string `json:"listener"`
}

// errForwardMode: forwards exist in netstack mode only.
var errForwardMode = fmt.Errorf("%w: network is in tun mode; host applications reach its VIPs directly", vip.ErrInvalid) // +checklocksignore: read-only

// forward starts a loopback listener that carries TCP connections or UDP
// datagrams to a VIP's listener through the overlay. It runs until ctx
// ends or the network stops; the address the VIP has when each connection
// or UDP session starts is used, so an address move is followed.
func (n *netRuntime) forward(ctx context.Context, req ForwardRequest) (ForwardDoc, <-chan struct{}, error) {
	k, err := vip.ParsePortKey(req.Listener)
	if err != nil {
		return ForwardDoc{}, nil, fmt.Errorf("%w: %v", vip.ErrInvalid, err)
	}
	v, err := n.reg.Get(req.VIP)
	if err != nil {
		return ForwardDoc{}, nil, err
	}
	if _, ok := v.Listener(k); !ok {
		return ForwardDoc{}, nil, fmt.Errorf("%w: %s.%s has no listener %s", vip.ErrNotFound, v.Name, n.cfg.Name, k)
	}
	if k.Port == agentProbePort {
		return ForwardDoc{}, nil, fmt.Errorf("%w: %s.%s %s: %v", vip.ErrInvalid, v.Name, n.cfg.Name, k, errProbePort)
	}
	listen := req.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	ap, err := netip.ParseAddrPort(listen)
	if err != nil || !ap.Addr().IsLoopback() {
		return ForwardDoc{}, nil, fmt.Errorf("%w: --listen %q: want a loopback IP:port", vip.ErrInvalid, listen)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.up.Load() {
		return ForwardDoc{}, nil, fmt.Errorf("%w: network %s is stopped on this node", vip.ErrNetworkDown, n.cfg.Name)
	}
	if n.host == nil {
		return ForwardDoc{}, nil, errForwardMode
	}
	o := overlayNet{n: n, host: n.host}
	id := v.ID.String()
	target := func() (netip.AddrPort, error) {
		cur, err := n.reg.Get(id)
		if err != nil {
			return netip.AddrPort{}, err
		}
		return netip.AddrPortFrom(cur.Addr, k.Port), nil
	}
	f := &forwarder{o: o, target: target, done: make(chan struct{}), log: n.d.log.With("network", n.cfg.Name, "part", "forward", "vip", v.Name, "listener", k.String())}
	var laddr string
	if k.Proto == vip.TCP {
		ln, err := net.Listen("tcp", ap.String())
		if err != nil {
			return ForwardDoc{}, nil, err
		}
		f.closer, laddr = ln, ln.Addr().String()
		f.wg.Add(1)
		go f.serveTCP(ln)
	} else {
		pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
		if err != nil {
			return ForwardDoc{}, nil, err
		}
		f.closer, laddr = pc, pc.LocalAddr().String()
		f.wg.Add(1)
		go f.serveUDP(pc)
	}
	n.forwards = append(n.forwards, f)
	// The backend relay refuses the forward's port while it is open: a
	// VIP's traffic never loops back into the agent.
	lap, _ := netip.ParseAddrPort(laddr)
	hostPort := vip.PortKey{Proto: k.Proto, Port: lap.Port()}
	n.d.holdPort(hostPort, "vip forward", true)
	stop := context.AfterFunc(ctx, func() { f.Close() })
	go func() {
		<-f.done
		n.d.holdPort(hostPort, "vip forward", false)
		stop()
		n.mu.Lock()
		for i, x := range n.forwards {
			if x == f {
				n.forwards = append(n.forwards[:i], n.forwards[i+1:]...)
				break
			}
		}
		n.mu.Unlock()
	}()
	f.log.Info("forwarding", "listen", laddr)
	return ForwardDoc{Listen: laddr, VIP: v.Name, Network: n.cfg.Name, Listener: k.String()}, f.done, nil
}

// forwarder is one `tsng vip forward`.
type forwarder struct {
	o      overlayNet
	target func() (netip.AddrPort, error)
	closer io.Closer
	log    *slog.Logger

	// mu guards conns, the connections open, and closed.
	mu syncx.Mutex
	// +checklocks:mu
	conns map[io.Closer]bool
	// +checklocks:mu
	closed bool
	once   sync.Once
	done   chan struct{}
	wg     sync.WaitGroup
}

func (f *forwarder) track(c io.Closer) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	if f.conns == nil {
		f.conns = map[io.Closer]bool{}
	}
	f.conns[c] = true
	return true
}

func (f *forwarder) forget(c io.Closer) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// Close stops the forward and its connections, and waits for them.
func (f *forwarder) Close() error {
	f.once.Do(func() {
		f.mu.Lock()
		f.closed = true
		f.closer.Close()
		for c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
		close(f.done)
	})
	return nil
}

func (f *forwarder) serveTCP(ln net.Listener) {
	defer f.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if !f.track(c) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.forget(c)
			defer c.Close()
			to, err := f.target()
			if err != nil {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			out, err := f.o.dial(ctx, to)
			cancel()
			if err != nil {
				f.log.Debug("forward dial failed", "to", to.String(), "err", err)
				return
			}
			if !f.track(out) {
				out.Close()
				return
			}
			defer f.forget(out)
			defer out.Close()
			socks5.Relay(c, out)
		}()
	}
}

// UDP sessions: one overlay socket per local client address, ending after
// udpForwardIdle without a reply; at most udpForwardSessions at once.
const (
	udpForwardIdle     = 2 * time.Minute
	udpForwardSessions = 256
)

func (f *forwarder) serveUDP(pc *net.UDPConn) {
	defer f.wg.Done()
	sessions := map[netip.AddrPort]net.Conn{}
	var smu syncx.Mutex
	buf := make([]byte, 64<<10)
	for {
		n, from, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		smu.Lock()
		out := sessions[from]
		if out == nil {
			if len(sessions) >= udpForwardSessions {
				smu.Unlock()
				f.log.Warn("UDP forward sessions at the limit; datagram dropped", "limit", udpForwardSessions)
				continue
			}
			to, err := f.target()
			if err == nil {
				out, err = f.o.host.DialUDP(netip.AddrPort{}, to)
			}
			if err != nil || !f.track(out) {
				smu.Unlock()
				if out != nil {
					out.Close()
				}
				continue
			}
			sessions[from] = out
			f.wg.Add(1)
			go func(from netip.AddrPort, out net.Conn) {
				defer f.wg.Done()
				defer func() {
					smu.Lock()
					delete(sessions, from)
					smu.Unlock()
					f.forget(out)
					out.Close()
				}()
				rb := make([]byte, 64<<10)
				for {
					_ = out.SetReadDeadline(time.Now().Add(udpForwardIdle))
					n, err := out.Read(rb)
					if err != nil {
						return
					}
					pc.WriteToUDPAddrPort(rb[:n], from)
				}
			}(from, out)
		}
		smu.Unlock()
		out.Write(buf[:n])
	}
}
