package vip

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/vipkit/vipkit/internal/syncx"
)

// DNSTTL is the TTL of every answer: 30 s (docs/defaults.md). DNS does not
// migrate established connections or make applications drop cached
// addresses; existing NAT bindings keep their VIP address while they drain.
const DNSTTL = 30 * time.Second

// DNSOptions configures a DNSServer.
type DNSOptions struct {
	// Domain is the network's domain: VIP "api" of network "home" answers as
	// api.home. Required.
	Domain string
	// Lookup returns the address of a VIP or node name within the domain
	// (the label only, lowercase). Required. It is called for every query and
	// must be safe for concurrent use.
	Lookup func(name string) (netip.Addr, bool)
	// Allow, when set, reports whether a query's source may be answered;
	// others are dropped without a reply. The agent allows the overlay range
	// only, so the responder answers only on the overlay.
	Allow func(src netip.Addr) bool
}

// DNSServer answers A queries for VIP and node names of one network's
// domain, with a TTL of 30 s and NXDOMAIN for unknown names. Queries outside
// the domain are refused. It is safe for concurrent use.
type DNSServer struct {
	o      DNSOptions
	suffix string // ".home."

	mu syncx.Mutex
	// +checklocks:mu
	srv *dns.Server
}

// NewDNSServer returns a responder for o.Domain.
func NewDNSServer(o DNSOptions) (*DNSServer, error) {
	if o.Lookup == nil {
		return nil, fmt.Errorf("%w: DNSOptions.Lookup is required", ErrInvalidOptions)
	}
	if err := ValidName(strings.ToLower(o.Domain)); err != nil {
		// The domain is an option and a name: both sentinels match.
		return nil, fmt.Errorf("%w: domain: %w", ErrInvalidOptions, errors.Join(ErrInvalid, err))
	}
	return &DNSServer{o: o, suffix: "." + strings.ToLower(o.Domain) + "."}, nil
}

// Answer builds the reply to one DNS query message. It never panics on
// malformed input; a message that cannot be parsed gets an error and no
// reply.
func (s *DNSServer) Answer(query []byte) ([]byte, error) {
	req := new(dns.Msg)
	if err := req.Unpack(query); err != nil {
		return nil, err
	}
	return s.answer(req).Pack()
}

func (s *DNSServer) answer(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	m.RecursionAvailable = false
	if req.Opcode != dns.OpcodeQuery {
		m.SetRcode(req, dns.RcodeNotImplemented)
		return m
	}
	if len(req.Question) != 1 {
		m.SetRcode(req, dns.RcodeFormatError)
		return m
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	if q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY {
		m.SetRcode(req, dns.RcodeRefused)
		return m
	}
	if name == s.suffix[1:] { // the domain's apex: exists, no A record
		return m
	}
	label, ok := strings.CutSuffix(name, s.suffix)
	if !ok || label == "" {
		m.SetRcode(req, dns.RcodeRefused) // not our domain: no recursion
		return m
	}
	if strings.Contains(label, ".") {
		m.SetRcode(req, dns.RcodeNameError)
		return m
	}
	addr, ok := s.o.Lookup(label)
	if !ok {
		m.SetRcode(req, dns.RcodeNameError)
		return m
	}
	if (q.Qtype == dns.TypeA || q.Qtype == dns.TypeANY) && addr.Is4() {
		m.Answer = append(m.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: uint32(DNSTTL / time.Second)},
			A:   addr.AsSlice(),
		})
	}
	// Other types of a name that exists: NOERROR with no answer (NODATA).
	return m
}

// ServeDNS implements dns.Handler.
func (s *DNSServer) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	if s.o.Allow != nil {
		var src netip.Addr
		switch a := w.RemoteAddr().(type) {
		case *net.UDPAddr:
			src = a.AddrPort().Addr().Unmap()
		case *net.TCPAddr:
			src = a.AddrPort().Addr().Unmap()
		}
		if !s.o.Allow(src) {
			return // drop: not from the overlay
		}
	}
	_ = w.WriteMsg(s.answer(req))
}

// Serve answers queries arriving on pc (a UDP socket bound to the node's
// overlay address, or a netstack PacketConn) until ctx is done or Close is
// called. It returns nil after a clean stop.
func (s *DNSServer) Serve(ctx context.Context, pc net.PacketConn) error {
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, Handler: s, NotifyStartedFunc: func() { close(started) }}
	s.mu.Lock()
	if s.srv != nil {
		s.mu.Unlock()
		return errors.New("vip: DNS server already serving")
	}
	s.srv = srv
	s.mu.Unlock()
	errc := make(chan error, 1)
	go func() { errc <- srv.ActivateAndServe() }()
	select {
	case <-started:
	case err := <-errc:
		return err
	}
	select {
	case <-ctx.Done():
		s.Close()
		<-errc
		return nil
	case err := <-errc:
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		return err
	}
}

// Close stops a running Serve. It is idempotent.
func (s *DNSServer) Close() error {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Shutdown()
}
