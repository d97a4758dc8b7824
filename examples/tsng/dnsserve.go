package tsng

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/vip"
)

// DNS: the agent answers its network's names (vip.DNSServer) on the
// overlay address over UDP and TCP. Other names are REFUSED unless the
// network names upstream resolvers (dns_upstreams); then they are
// forwarded, over the protocol the query came in on.

// maxForwardDepth bounds identical forwarded questions in flight at once.
// An upstream that sends the agent's own queries back to it (such as
// 127.0.0.53 routing every name to the TUN) makes them pile up; the one
// over the bound is REFUSED, which unwinds the loop.
const maxForwardDepth = 3

// dnsForwardTimeout bounds one exchange with an upstream.
const dnsForwardTimeout = 2 * time.Second

// dnsHandler answers a network's DNS queries.
type dnsHandler struct {
	own       *vip.DNSServer
	suffix    string // ".home."
	allow     func(netip.Addr) bool
	upstreams []netip.AddrPort
	log       *slog.Logger

	// mu guards inflight, the upstream queries under way, and loops.
	mu syncx.Mutex
	// +checklocks:mu
	inflight map[dns.Question]int
	// +checklocks:mu
	loops uint64
}

func newDNSHandler(own *vip.DNSServer, o vip.DNSOptions, upstreams []netip.AddrPort, log *slog.Logger) *dnsHandler {
	return &dnsHandler{own: own, suffix: "." + strings.ToLower(o.Domain) + ".", allow: o.Allow, upstreams: upstreams, log: log,
		inflight: map[dns.Question]int{}}
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
	if h.allow != nil && !h.allow(remoteAddr(w)) {
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
	h.mu.Lock()
	if h.inflight[key] >= maxForwardDepth {
		h.loops++
		h.mu.Unlock()
		h.log.Warn("DNS forwarding loop: an upstream sent the agent's own query back; refused", "name", q.Name, "upstreams", fmt.Sprint(h.upstreams))
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeRefused)
		_ = w.WriteMsg(m)
		return
	}
	h.inflight[key]++
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		if h.inflight[key]--; h.inflight[key] == 0 {
			delete(h.inflight, key)
		}
		h.mu.Unlock()
	}()
	netw := "udp"
	if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
		netw = "tcp"
	}
	c := &dns.Client{Net: netw, Timeout: dnsForwardTimeout}
	var lastErr error
	for _, up := range h.upstreams {
		ctx, cancel := context.WithTimeout(context.Background(), dnsForwardTimeout)
		resp, _, err := c.ExchangeContext(ctx, req.Copy(), up.String())
		cancel()
		if err == nil && resp != nil {
			resp.Id = req.Id
			_ = w.WriteMsg(resp)
			return
		}
		lastErr = err
	}
	h.log.Debug("DNS forward failed", "name", q.Name, "err", lastErr)
	m := new(dns.Msg)
	m.SetRcode(req, dns.RcodeServerFailure)
	_ = w.WriteMsg(m)
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
	srvs []*dns.Server
	wg   sync.WaitGroup
}

// serve starts a DNS server on pc and ln (either may be nil).
func serveDNS(h dns.Handler, pc net.PacketConn, ln net.Listener) (*dnsServers, error) {
	s := &dnsServers{}
	start := func(srv *dns.Server) error {
		started := make(chan struct{})
		errc := make(chan error, 1)
		srv.NotifyStartedFunc = func() { close(started) }
		s.wg.Add(1)
		go func() { defer s.wg.Done(); errc <- srv.ActivateAndServe() }()
		select {
		case <-started:
			s.srvs = append(s.srvs, srv)
			return nil
		case err := <-errc:
			return err
		}
	}
	if pc != nil {
		if err := start(&dns.Server{PacketConn: pc, Handler: h}); err != nil {
			return nil, err
		}
	}
	if ln != nil {
		if err := start(&dns.Server{Listener: ln, Handler: h, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, IdleTimeout: func() time.Duration { return 10 * time.Second }}); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// Close stops the servers and waits for them.
func (s *dnsServers) Close() error {
	var errs []error
	for _, srv := range s.srvs {
		if err := srv.Shutdown(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	s.wg.Wait()
	return errors.Join(errs...)
}
