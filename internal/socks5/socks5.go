// Package socks5 is a small SOCKS5 server (RFC 1928) for proxies that
// carry local applications into another network stack, such as tsng's
// netstack overlay. It speaks the "no authentication" method only (it is
// meant for loopback listeners), CONNECT and UDP ASSOCIATE; BIND is
// refused. The caller supplies the dialer, the UDP socket factory and the
// name resolver, so host names resolve on the proxy's side.
//
//	s := &socks5.Server{Dial: dial, ListenPacket: listen, Resolve: resolve}
//	go s.Serve(ln)
//	...
//	s.Close() // closes the listener and every connection, and waits
//
// A UDP association accepts datagrams only from the IP address of the
// client's TCP connection (and from the port the client named, or else
// the first one it sends from), and ends with that TCP connection.
package socks5

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// Protocol constants (RFC 1928).
const (
	version = 5

	methodNoAuth       = 0x00
	methodNoAcceptable = 0xff

	cmdConnect   = 1
	cmdBind      = 2
	cmdAssociate = 3

	atypIPv4   = 1
	atypDomain = 3
	atypIPv6   = 4
)

// Reply codes.
const (
	replySucceeded          = 0
	replyGeneralFailure     = 1
	replyNotAllowed         = 2
	replyNetworkUnreachable = 3
	replyHostUnreachable    = 4
	replyConnectionRefused  = 5
	replyTTLExpired         = 6
	replyCommandUnsupported = 7
	replyAddressUnsupported = 8
)

// Errors a Resolve or Dial function returns to pick the reply code.
var (
	// ErrNotAllowed means the ruleset refuses the destination; the client
	// gets reply 2 (connection not allowed by ruleset).
	ErrNotAllowed = errors.New("socks5: not allowed by the ruleset")
	// ErrNetworkUnreachable means no route leads to the destination's
	// network; the client gets reply 3 (network unreachable).
	ErrNetworkUnreachable = errors.New("socks5: network unreachable")
	// ErrHostUnreachable means the destination cannot be reached or its
	// name does not resolve; the client gets reply 4 (host unreachable).
	ErrHostUnreachable = errors.New("socks5: host unreachable")
	// ErrMalformed reports a request or datagram that is not SOCKS5.
	ErrMalformed = errors.New("socks5: malformed request")
)

// Addr is a request's destination: an IP address or a domain name, and a
// port.
type Addr struct {
	IP   netip.Addr
	Name string // set instead of IP for a domain name
	Port uint16
}

// String returns host:port.
func (a Addr) String() string {
	if a.Name != "" {
		return net.JoinHostPort(a.Name, fmt.Sprint(a.Port))
	}
	return netip.AddrPortFrom(a.IP, a.Port).String()
}

// Server is a SOCKS5 server. Its zero value refuses every request; set
// Dial for CONNECT, ListenPacket for UDP ASSOCIATE and Resolve for domain
// names.
type Server struct {
	// Dial connects to a CONNECT destination.
	Dial func(ctx context.Context, to netip.AddrPort) (net.Conn, error)
	// ListenPacket opens an association's socket toward its destinations.
	ListenPacket func(ctx context.Context) (net.PacketConn, error)
	// Resolve maps a domain name to an address.
	Resolve func(ctx context.Context, name string) (netip.Addr, error)
	// HandshakeTimeout bounds the greeting and request (10 s).
	HandshakeTimeout time.Duration
	// UDPIdleTimeout ends an association whose client sent no datagram
	// for that long (2 minutes); the client's TCP connection ending ends
	// it at once.
	UDPIdleTimeout time.Duration
	// MaxConns bounds concurrent client connections (256); more are
	// closed at once.
	MaxConns int
	Logger   *slog.Logger
	// Clock sets the connections' deadlines (RealClock when nil).
	Clock transport.Clock

	// mu guards the listeners, the connections and closed.
	mu syncx.Mutex
	// +checklocks:mu
	lns map[net.Listener]bool
	// +checklocks:mu
	conns map[io.Closer]bool
	// +checklocks:mu
	closed bool
	wg     sync.WaitGroup
	// ctx is set by init and cancelled by Close.
	ctx context.Context
	// +checklocks:mu
	cancel context.CancelFunc
}

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("socks5: server closed")

// +checklocks:s.mu
func (s *Server) init() {
	if s.lns == nil {
		s.lns, s.conns = map[net.Listener]bool{}, map[io.Closer]bool{}
		s.ctx, s.cancel = context.WithCancel(context.Background())
	}
}

func (s *Server) log() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

// Serve accepts connections on ln until Close, then returns
// ErrServerClosed; it closes ln.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	s.init()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.lns[ln] = true
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	max := s.MaxConns
	if max <= 0 {
		max = 256
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		s.mu.Lock()
		if s.closed || len(s.conns) >= max {
			s.mu.Unlock()
			s.log().Warn("socks5: connection refused: too many connections", "limit", max)
			c.Close()
			continue
		}
		s.conns[c] = true
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer s.forget(c)
			defer c.Close()
			if err := s.handle(c); err != nil {
				s.log().Debug("socks5: request ended", "client", c.RemoteAddr(), "err", err)
			}
		}()
	}
}

func (s *Server) track(c io.Closer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = true
	return true
}

func (s *Server) forget(c io.Closer) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Close stops every Serve, closes all connections and associations, and
// waits for their goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	s.init()
	s.closed = true
	for ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.cancel()
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Server) handle(c net.Conn) error {
	hs := s.HandshakeTimeout
	if hs <= 0 {
		hs = 10 * time.Second
	}
	_ = c.SetDeadline(transport.Or(s.Clock).Now().Add(hs))
	if err := negotiate(c); err != nil {
		return err
	}
	cmd, dst, err := ReadRequest(c)
	if err != nil {
		if errors.Is(err, errAddrType) {
			writeReply(c, replyAddressUnsupported, netip.AddrPort{})
		}
		return err
	}
	ctx, cancel := context.WithTimeout(s.ctx, hs)
	defer cancel()
	switch cmd {
	case cmdConnect:
		return s.connect(ctx, c, dst)
	case cmdAssociate:
		return s.associate(ctx, c, dst)
	}
	writeReply(c, replyCommandUnsupported, netip.AddrPort{})
	return fmt.Errorf("%w: command %d", ErrMalformed, cmd)
}

// negotiate reads the greeting and picks "no authentication".
func negotiate(c net.Conn) error {
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return err
	}
	if hdr[0] != version {
		return fmt.Errorf("%w: version %d", ErrMalformed, hdr[0])
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(c, methods); err != nil {
		return err
	}
	for _, m := range methods {
		if m == methodNoAuth {
			_, err := c.Write([]byte{version, methodNoAuth})
			return err
		}
	}
	c.Write([]byte{version, methodNoAcceptable})
	return fmt.Errorf("%w: no acceptable authentication method", ErrMalformed)
}

var errAddrType = fmt.Errorf("%w: address type", ErrMalformed)

// ReadRequest reads a request (after the greeting): its command and
// destination.
func ReadRequest(r io.Reader) (cmd byte, dst Addr, err error) {
	var hdr [3]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, Addr{}, err
	}
	if hdr[0] != version || hdr[2] != 0 {
		return 0, Addr{}, fmt.Errorf("%w: header % x", ErrMalformed, hdr)
	}
	dst, err = readAddr(r)
	return hdr[1], dst, err
}

func readAddr(r io.Reader) (Addr, error) {
	var t [1]byte
	if _, err := io.ReadFull(r, t[:]); err != nil {
		return Addr{}, err
	}
	var a Addr
	switch t[0] {
	case atypIPv4:
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return Addr{}, err
		}
		a.IP = netip.AddrFrom4(b)
	case atypIPv6:
		var b [16]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return Addr{}, err
		}
		a.IP = netip.AddrFrom16(b)
	case atypDomain:
		var n [1]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return Addr{}, err
		}
		if n[0] == 0 {
			return Addr{}, fmt.Errorf("%w: empty domain name", ErrMalformed)
		}
		b := make([]byte, n[0])
		if _, err := io.ReadFull(r, b); err != nil {
			return Addr{}, err
		}
		a.Name = string(b)
	default:
		return Addr{}, fmt.Errorf("%w %d", errAddrType, t[0])
	}
	var p [2]byte
	if _, err := io.ReadFull(r, p[:]); err != nil {
		return Addr{}, err
	}
	a.Port = binary.BigEndian.Uint16(p[:])
	return a, nil
}

// AppendAddr appends a's wire form (ATYP, address, port).
func AppendAddr(b []byte, a Addr) []byte {
	switch {
	case a.Name != "":
		b = append(b, atypDomain, byte(len(a.Name)))
		b = append(b, a.Name[:min(len(a.Name), 255)]...)
	case a.IP.Is4():
		v := a.IP.As4()
		b = append(b, atypIPv4)
		b = append(b, v[:]...)
	case a.IP.Is6():
		v := a.IP.As16()
		b = append(b, atypIPv6)
		b = append(b, v[:]...)
	default:
		b = append(b, atypIPv4, 0, 0, 0, 0)
	}
	return binary.BigEndian.AppendUint16(b, a.Port)
}

func writeReply(w io.Writer, code byte, bound netip.AddrPort) error {
	b := AppendAddr([]byte{version, code, 0}, Addr{IP: bound.Addr(), Port: bound.Port()})
	_, err := w.Write(b)
	return err
}

func replyFor(err error) byte {
	var ne net.Error
	switch {
	case errors.Is(err, ErrNotAllowed):
		return replyNotAllowed
	case errors.Is(err, ErrNetworkUnreachable), errors.Is(err, syscall.ENETUNREACH):
		return replyNetworkUnreachable
	case errors.Is(err, ErrHostUnreachable), errors.Is(err, syscall.EHOSTUNREACH):
		return replyHostUnreachable
	case errors.Is(err, syscall.ECONNREFUSED):
		return replyConnectionRefused
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return replyTTLExpired
	}
	return replyGeneralFailure
}

func (s *Server) resolve(ctx context.Context, a Addr) (netip.AddrPort, error) {
	if a.Name == "" {
		return netip.AddrPortFrom(a.IP.Unmap(), a.Port), nil
	}
	if s.Resolve == nil {
		return netip.AddrPort{}, fmt.Errorf("%w: no name resolution", ErrHostUnreachable)
	}
	ip, err := s.Resolve(ctx, a.Name)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return netip.AddrPortFrom(ip.Unmap(), a.Port), nil
}

func (s *Server) connect(ctx context.Context, c net.Conn, dst Addr) error {
	if s.Dial == nil {
		writeReply(c, replyCommandUnsupported, netip.AddrPort{})
		return errors.New("socks5: CONNECT not offered")
	}
	to, err := s.resolve(ctx, dst)
	var out net.Conn
	if err == nil {
		out, err = s.Dial(ctx, to)
	}
	if err != nil {
		writeReply(c, replyFor(err), netip.AddrPort{})
		return fmt.Errorf("CONNECT %v: %w", dst, err)
	}
	if !s.track(out) {
		out.Close()
		return ErrServerClosed
	}
	defer s.forget(out)
	defer out.Close()
	bound, _ := addrPort(out.LocalAddr())
	if err := writeReply(c, replySucceeded, bound); err != nil {
		return err
	}
	_ = c.SetDeadline(time.Time{})
	return relay(c, out)
}

// relay copies both ways until either side ends, then closes both.
func relay(a, b net.Conn) error {
	errc := make(chan error, 2)
	cp := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && err == nil {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
		errc <- err
	}
	go cp(a, b)
	go cp(b, a)
	err := <-errc
	if err2 := <-errc; err == nil {
		err = err2
	}
	return err
}

// Relay copies both ways between two connections until both directions
// end (a half-close passes through where the connections support it).
func Relay(a, b net.Conn) error { return relay(a, b) }

// addrPort returns a connection endpoint's IP address and port. A nil
// address (gVisor's gonet reports one once the endpoint has closed) or
// one that is not IP:port is an error.
func addrPort(a net.Addr) (netip.AddrPort, error) {
	switch a := a.(type) {
	case nil:
		return netip.AddrPort{}, errors.New("socks5: endpoint has no address (closed)")
	case *net.TCPAddr:
		return unmap(a.AddrPort()), nil
	case *net.UDPAddr:
		return unmap(a.AddrPort()), nil
	}
	return netip.ParseAddrPort(a.String())
}

func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
