package tsng

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/vip"
)

// DNS: the agent answers its network's names (vip.DNSServer) on the
// overlay address over UDP and TCP. Other names are REFUSED unless the
// network names upstream resolvers (dns_upstreams); then they are
// forwarded, over the protocol the query came in on.
//
// A forwarded query holds a goroutine and a socket to the upstream for up
// to dnsForwardTimeout per upstream tried. The bounds below cap how many
// are held at once, in all and per client, so that a flood of distinct
// names (from a local user, or a member) costs the agent a fixed number of
// goroutines and file descriptors; queries over a bound are answered at
// once and counted (dnsStats, tsng_dns_limited_total).

// maxForwardDepth bounds identical forwarded questions in flight at once.
// An upstream that sends the agent's own queries back to it (such as
// 127.0.0.53 routing every name to the TUN) makes them pile up; the one
// over the bound is REFUSED, which unwinds the loop.
const maxForwardDepth = 3

// maxForwardInflight bounds the forwarded queries in flight from all
// clients of a network. The one over it is answered SERVFAIL at once (the
// agent cannot resolve it now; a stub tries its next server) and counted in
// dnsStats.Busy. It is of the order of dnsmasq's dns-forward-max (150): at
// an upstream's usual tens of milliseconds it carries thousands of queries
// a second.
const maxForwardInflight = 128

// maxForwardPerClient bounds the forwarded queries in flight from one
// client, which is its IP address: a client picks its source ports freely,
// so a bound per port would bound nothing. The one over it is REFUSED at
// once and counted in dnsStats.ClientLimit. One client, however it floods,
// leaves three quarters of maxForwardInflight to the others. All local
// users of a node share the node's address, and so one share.
const maxForwardPerClient = 32

// udpHandlers bounds the UDP queries handled at once, and so the handler
// goroutines: at most maxForwardInflight waiting on an upstream, and 32
// more for answers that take no waiting (the network's own names,
// refusals). While all are busy the reader waits, queries wait in the
// socket's buffer (the kernel drops what does not fit), and each wait is
// counted in dnsStats.HandlerWaits. Handlers, once started, stay until the
// network stops: after a burst up to 160 idle goroutines (a few KiB each).
const udpHandlers = maxForwardInflight + 32

// dnsForwardTimeout bounds one exchange with an upstream.
const dnsForwardTimeout = 2 * time.Second

// dnsWarnEvery is how often a limit that keeps being met is logged; every
// time counts.
const dnsWarnEvery = time.Minute

// dnsStats counts the DNS queries of a network that met a bound.
type dnsStats struct {
	// Loops are identical questions over maxForwardDepth (REFUSED).
	Loops uint64
	// ClientLimit are a client's forwarded queries over
	// maxForwardPerClient (REFUSED).
	ClientLimit uint64
	// Busy are forwarded queries over maxForwardInflight (SERVFAIL).
	Busy uint64
	// HandlerWaits are the times the UDP reader waited for one of the
	// udpHandlers to end before reading the next query.
	HandlerWaits uint64
}

// dnsHandler answers a network's DNS queries.
type dnsHandler struct {
	own       *vip.DNSServer
	suffix    string // ".home."
	allow     func(netip.Addr) bool
	upstreams []netip.AddrPort
	log       *slog.Logger
	// ctx ends the forwards under way when the servers close (stop).
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards the forwards under way (inflight, clients, forwarding),
	// stats and warned.
	mu syncx.Mutex
	// +checklocks:mu
	inflight map[dns.Question]int
	// clients counts forwards in flight by client address.
	// +checklocks:mu
	clients map[netip.Addr]int
	// forwarding is the number of forwards in flight.
	// +checklocks:mu
	forwarding int
	// +checklocks:mu
	stats dnsStats
	// warned is when each limit was last logged.
	// +checklocks:mu
	warned map[string]time.Time
}

func newDNSHandler(own *vip.DNSServer, o vip.DNSOptions, upstreams []netip.AddrPort, log *slog.Logger) *dnsHandler {
	ctx, cancel := context.WithCancel(context.Background())
	return &dnsHandler{own: own, suffix: "." + strings.ToLower(o.Domain) + ".", allow: o.Allow, upstreams: upstreams, log: log,
		ctx: ctx, cancel: cancel,
		inflight: map[dns.Question]int{}, clients: map[netip.Addr]int{}, warned: map[string]time.Time{}}
}

// Stats returns the counts of queries that met a bound.
func (h *dnsHandler) Stats() dnsStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

// stop ends the forwards under way: their clients get SERVFAIL.
func (h *dnsHandler) stop() { h.cancel() }

// handlerWait counts a wait of the UDP reader for a free handler.
func (h *dnsHandler) handlerWait() {
	h.mu.Lock()
	h.stats.HandlerWaits++
	n := h.stats.HandlerWaits
	warn := h.warnLocked("handlers")
	h.mu.Unlock()
	if warn {
		h.log.Warn("DNS: every UDP handler busy; queries wait in the socket buffer", "handlers", udpHandlers, "waits", n)
	}
}

// warnLocked reports whether the limit what is to be logged now: at most
// once every dnsWarnEvery.
//
// +checklocks:h.mu
func (h *dnsHandler) warnLocked(what string) bool {
	now := time.Now()
	if last, ok := h.warned[what]; ok && now.Sub(last) < dnsWarnEvery {
		return false
	}
	h.warned[what] = now
	return true
}

// admit takes a forwarding slot for question key from client. When a
// bound is met it counts it and returns the rcode to answer instead.
func (h *dnsHandler) admit(key dns.Question, client netip.Addr) (rcode int, ok bool) {
	h.mu.Lock()
	var what string
	var count uint64
	switch {
	case h.inflight[key] >= maxForwardDepth:
		h.stats.Loops++
		what, count, rcode = "loop", h.stats.Loops, dns.RcodeRefused
	case h.clients[client] >= maxForwardPerClient:
		h.stats.ClientLimit++
		what, count, rcode = "client", h.stats.ClientLimit, dns.RcodeRefused
	case h.forwarding >= maxForwardInflight:
		h.stats.Busy++
		what, count, rcode = "total", h.stats.Busy, dns.RcodeServerFailure
	default:
		h.inflight[key]++
		h.clients[client]++
		h.forwarding++
		h.mu.Unlock()
		return dns.RcodeSuccess, true
	}
	warn := h.warnLocked(what)
	h.mu.Unlock()
	if warn {
		switch what {
		case "loop":
			h.log.Warn("DNS forwarding loop: an upstream sent the agent's own query back, or a client repeats a question; refused",
				"name", key.Name, "upstreams", fmt.Sprint(h.upstreams), "depth", maxForwardDepth, "refused", count)
		case "client":
			h.log.Warn("DNS: a client's forwarded queries in flight are at the limit; refused", "client", client, "limit", maxForwardPerClient, "refused", count)
		default:
			h.log.Warn("DNS: forwarded queries in flight are at the limit; SERVFAIL", "client", client, "limit", maxForwardInflight, "answered", count)
		}
	}
	return rcode, false
}

// release gives back the slot admit took.
func (h *dnsHandler) release(key dns.Question, client netip.Addr) {
	h.mu.Lock()
	if h.inflight[key]--; h.inflight[key] == 0 {
		delete(h.inflight, key)
	}
	if h.clients[client]--; h.clients[client] == 0 {
		delete(h.clients, client)
	}
	h.forwarding--
	h.mu.Unlock()
}

func remoteAddr(w dns.ResponseWriter) netip.Addr {
	switch a := w.RemoteAddr().(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// ServeDNS implements dns.Handler.
func (h *dnsHandler) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	client := remoteAddr(w)
	if h.allow != nil && !h.allow(client) {
		return // not from the overlay: no answer at all
	}
	if len(h.upstreams) == 0 || len(req.Question) != 1 || req.Opcode != dns.OpcodeQuery {
		h.own.ServeDNS(w, req)
		return
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	if name == h.suffix[1:] || strings.HasSuffix(name, h.suffix) {
		h.own.ServeDNS(w, req)
		return
	}
	key := dns.Question{Name: name, Qtype: q.Qtype, Qclass: q.Qclass}
	if rcode, ok := h.admit(key, client); !ok {
		m := new(dns.Msg)
		m.SetRcode(req, rcode)
		_ = w.WriteMsg(m)
		return
	}
	defer h.release(key, client)
	netw := "udp"
	if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
		netw = "tcp"
	}
	var lastErr error
	for _, up := range h.upstreams {
		resp, err := h.exchange(netw, req, up)
		if err == nil && resp != nil {
			resp.Id = req.Id
			_ = w.WriteMsg(resp)
			return
		}
		lastErr = err
		if h.ctx.Err() != nil {
			break
		}
	}
	h.log.Debug("DNS forward failed", "name", q.Name, "err", lastErr)
	m := new(dns.Msg)
	m.SetRcode(req, dns.RcodeServerFailure)
	_ = w.WriteMsg(m)
}

// exchange asks up, over netw, within dnsForwardTimeout (the socket's
// deadlines: a context's timer would start a goroutine as it fires); it
// ends at once when the servers close (stop).
func (h *dnsHandler) exchange(netw string, req *dns.Msg, up netip.AddrPort) (*dns.Msg, error) {
	c := &dns.Client{Net: netw, Timeout: dnsForwardTimeout}
	co, err := c.DialContext(h.ctx, up.String())
	if err != nil {
		return nil, err
	}
	defer co.Close()
	// The exchange heeds no context; closing the socket ends it.
	unwatch := context.AfterFunc(h.ctx, func() { co.Close() })
	defer unwatch()
	resp, _, err := c.ExchangeWithConn(req.Copy(), co)
	return resp, err
}

// parseUpstreams reads dns_upstreams: IP or IP:port (53), none inside the
// overlay (the agent would ask itself).
func parseUpstreams(list []string, overlay netip.Prefix) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, s := range list {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("%q: want IP or IP:port", s)
			}
			ap = netip.AddrPortFrom(a, 53)
		}
		if overlay.Contains(ap.Addr().Unmap()) {
			return nil, fmt.Errorf("%q is inside the overlay %v: the agent would forward to itself", s, overlay)
		}
		out = append(out, ap)
	}
	return out, nil
}

// dnsServers runs the UDP and TCP servers of one handler.
type dnsServers struct {
	h   dns.Handler
	udp *udpServer
	// srvs is set by serveDNS before s is returned, and read-only after.
	srvs []*dns.Server
	wg   sync.WaitGroup
}

// serve starts a DNS server on pc and ln (either may be nil).
func serveDNS(h dns.Handler, pc net.PacketConn, ln net.Listener) (*dnsServers, error) {
	s := &dnsServers{h: h}
	if pc != nil {
		s.udp = &udpServer{pc: pc, h: h}
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.udp.serve() }()
	}
	if ln != nil {
		srv := &dns.Server{Listener: ln, Handler: h, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, IdleTimeout: func() time.Duration { return 10 * time.Second }}
		started := make(chan struct{})
		errc := make(chan error, 1)
		srv.NotifyStartedFunc = func() { close(started) }
		s.wg.Add(1)
		go func() { defer s.wg.Done(); errc <- srv.ActivateAndServe() }()
		select {
		case <-started:
			s.srvs = append(s.srvs, srv)
		case err := <-errc:
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// Stats returns the handler's counts of queries that met a bound (zero for
// a handler other than the agent's).
func (s *dnsServers) Stats() dnsStats {
	if h, ok := s.h.(*dnsHandler); ok {
		return h.Stats()
	}
	return dnsStats{}
}

// Close ends the forwards under way, stops the servers and waits for them.
func (s *dnsServers) Close() error {
	if st, ok := s.h.(interface{ stop() }); ok {
		st.stop()
	}
	var errs []error
	if s.udp != nil {
		s.udp.close()
	}
	for _, srv := range s.srvs {
		if err := srv.Shutdown(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	s.wg.Wait()
	return errors.Join(errs...)
}

// udpServer answers DNS queries arriving on pc with a reader and at most
// udpHandlers handler goroutines. A handler is started when a query finds
// none idle and stays, taking the next queries, until the server closes:
// handlers never exit under load, so the goroutines never outnumber the
// bound. Messages that are not queries (unparsable, or responses) get no
// answer, which could only amplify.
type udpServer struct {
	pc     net.PacketConn
	h      dns.Handler
	closed atomic.Bool
}

// udpQuery is one datagram to handle.
type udpQuery struct {
	msg  []byte
	from net.Addr
}

// serve reads and dispatches queries until pc is closed, then waits for
// its handlers.
func (u *udpServer) serve() {
	var wg sync.WaitGroup
	queries := make(chan udpQuery) // taken only by an idle handler
	defer wg.Wait()
	defer close(queries)
	waited, _ := u.h.(interface{ handlerWait() })
	handlers := 0
	buf := make([]byte, dns.MaxMsgSize)
	for {
		n, from, err := u.pc.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if !u.closed.Load() && errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed, or a socket error that ends the server
		}
		q := udpQuery{msg: bytes.Clone(buf[:n]), from: from}
		select {
		case queries <- q:
			continue
		default:
		}
		if handlers < udpHandlers {
			handlers++
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ok := true; ok; q, ok = <-queries {
					u.handle(q)
				}
			}()
			continue
		}
		if waited != nil {
			waited.handlerWait()
		}
		queries <- q
	}
}

// handle answers one datagram.
func (u *udpServer) handle(q udpQuery) {
	req := new(dns.Msg)
	if req.Unpack(q.msg) != nil || req.Response {
		return
	}
	u.h.ServeDNS(&udpWriter{pc: u.pc, remote: q.from}, req)
}

func (u *udpServer) close() {
	u.closed.Store(true)
	u.pc.Close()
}

// udpWriter is the dns.ResponseWriter of one UDP query.
type udpWriter struct {
	pc     net.PacketConn
	remote net.Addr
}

func (w *udpWriter) LocalAddr() net.Addr  { return w.pc.LocalAddr() }
func (w *udpWriter) RemoteAddr() net.Addr { return w.remote }
func (w *udpWriter) WriteMsg(m *dns.Msg) error {
	b, err := m.Pack()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}
func (w *udpWriter) Write(b []byte) (int, error) { return w.pc.WriteTo(b, w.remote) }
func (w *udpWriter) Close() error                { return nil }
func (w *udpWriter) TsigStatus() error           { return nil }
func (w *udpWriter) TsigTimersOnly(bool)         {}
func (w *udpWriter) Hijack()                     {}
