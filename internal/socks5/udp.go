package socks5

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// ParseDatagram splits a UDP ASSOCIATE datagram into its destination and
// payload. Fragments (FRAG != 0) are refused: this server does not
// reassemble.
func ParseDatagram(b []byte) (Addr, []byte, error) {
	if len(b) < 4 || b[0] != 0 || b[1] != 0 {
		return Addr{}, nil, fmt.Errorf("%w: datagram header", ErrMalformed)
	}
	if b[2] != 0 {
		return Addr{}, nil, fmt.Errorf("%w: fragment %d (not supported)", ErrMalformed, b[2])
	}
	r := &sliceReader{b: b[3:]}
	a, err := readAddr(r)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: short datagram", ErrMalformed)
		}
		return Addr{}, nil, err
	}
	return a, r.b, nil
}

// AppendDatagram appends a UDP ASSOCIATE datagram from (or to) a.
func AppendDatagram(b []byte, a Addr, payload []byte) []byte {
	b = AppendAddr(append(b, 0, 0, 0), a)
	return append(b, payload...)
}

type sliceReader struct{ b []byte }

func (r *sliceReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// associate runs a UDP association: a relay socket on the TCP
// connection's local address, bound to the client's IP (and port), until
// the TCP connection ends.
func (s *Server) associate(ctx context.Context, c net.Conn, want Addr) error {
	if s.ListenPacket == nil {
		writeReply(c, replyCommandUnsupported, netip.AddrPort{})
		return errors.New("socks5: UDP ASSOCIATE not offered")
	}
	local, err1 := addrPort(c.LocalAddr())
	client, err2 := addrPort(c.RemoteAddr())
	if err1 != nil || err2 != nil {
		writeReply(c, replyGeneralFailure, netip.AddrPort{})
		return errors.New("socks5: UDP ASSOCIATE needs an IP connection")
	}
	relayConn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(local.Addr(), 0)))
	if err != nil {
		writeReply(c, replyGeneralFailure, netip.AddrPort{})
		return err
	}
	out, err := s.ListenPacket(ctx)
	if err != nil {
		relayConn.Close()
		writeReply(c, replyFor(err), netip.AddrPort{})
		return err
	}
	if !s.track(relayConn) || !s.track(out) {
		relayConn.Close()
		out.Close()
		return ErrServerClosed
	}
	defer s.forget(relayConn)
	defer s.forget(out)
	defer relayConn.Close()
	defer out.Close()
	if err := writeReply(c, replySucceeded, relayConn.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
		return err
	}
	_ = c.SetDeadline(time.Time{})
	a := &association{s: s, ctrl: c, relay: relayConn, out: out, clientIP: client.Addr().Unmap()}
	if want.Name == "" && want.Port != 0 {
		a.setPeer(netip.AddrPortFrom(a.clientIP, want.Port))
	}
	idle := s.UDPIdleTimeout
	if idle <= 0 {
		idle = 2 * time.Minute
	}
	a.idle = idle
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); a.fromClient() }()
	go func() { defer wg.Done(); a.toClient() }()
	// The association lives as long as its TCP connection.
	io.Copy(io.Discard, c)
	relayConn.Close()
	out.Close()
	wg.Wait()
	return nil
}

type association struct {
	s        *Server
	ctrl     net.Conn // the client's TCP connection
	relay    *net.UDPConn
	out      net.PacketConn
	clientIP netip.Addr
	idle     time.Duration

	// mu guards peer.
	mu syncx.Mutex
	// peer is the client's UDP address, once known.
	// +checklocks:mu
	peer netip.AddrPort
}

func (a *association) setPeer(p netip.AddrPort) {
	a.mu.Lock()
	a.peer = p
	a.mu.Unlock()
}

func (a *association) getPeer() netip.AddrPort {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.peer
}

// fromClient forwards the client's datagrams to their destinations;
// datagrams from any other address are dropped. An idle association
// ends (with its TCP connection).
func (a *association) fromClient() {
	defer a.ctrl.Close()
	buf := make([]byte, 64<<10)
	for {
		_ = a.relay.SetReadDeadline(transport.Or(a.s.Clock).Now().Add(a.idle))
		n, from, err := a.relay.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		if from.Addr() != a.clientIP {
			continue
		}
		if p := a.getPeer(); p.IsValid() && p != from {
			continue
		} else if !p.IsValid() {
			a.setPeer(from)
		}
		dst, payload, err := ParseDatagram(buf[:n])
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(a.s.ctx, 5*time.Second)
		to, err := a.s.resolve(ctx, dst)
		cancel()
		if err != nil {
			a.s.log().Debug("socks5: UDP destination refused", "to", dst.String(), "err", err)
			continue
		}
		a.out.WriteTo(payload, net.UDPAddrFromAddrPort(to))
	}
}

// toClient returns replies to the client with their source address.
func (a *association) toClient() {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := a.out.ReadFrom(buf)
		if err != nil {
			return
		}
		p := a.getPeer()
		src, perr := netip.ParseAddrPort(from.String())
		if !p.IsValid() || perr != nil {
			continue
		}
		dg := AppendDatagram(make([]byte, 0, n+32), Addr{IP: src.Addr().Unmap(), Port: src.Port()}, buf[:n])
		a.relay.WriteToUDPAddrPort(dg, p)
	}
}
