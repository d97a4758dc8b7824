package netstack_test

import (
	"errors"
	"io"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/netstack"
)

// TestInbound: a TCP attempt to a port where nothing listens reaches
// Inbound.TCP before the handshake, which accepts it (a connection both
// ways) or refuses it (the dialer sees connection refused); ports Want
// does not take stay refused by the stack; a new UDP flow reaches
// Inbound.UDP as a connected conn whose first read is its first datagram.
func TestInbound(t *testing.T) {
	a, b := hostPair(t, []netip.Addr{v4A}, []netip.Addr{v4B}, nil)
	seen := make(chan [2]netip.AddrPort, 4)
	err := b.SetInbound(netstack.Inbound{
		Want: func(proto string, local, _ netip.AddrPort) bool {
			return local.Port() == 7000 || local.Port() == 7001
		},
		TCP: func(r *netstack.InboundTCP) {
			seen <- [2]netip.AddrPort{r.Local(), r.Remote()}
			if r.Local().Port() == 7001 {
				r.Refuse()
				return
			}
			c, err := r.Accept()
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := r.Accept(); err == nil {
				t.Error("a second Accept succeeded")
			}
			defer c.Close()
			io.Copy(c, c)
		},
		UDP: func(c *netstack.UDPConn) {
			go func() {
				defer c.Close()
				buf := make([]byte, 1500)
				c.SetReadDeadline(time.Now().Add(testTimeout))
				n, err := c.Read(buf)
				if err != nil {
					t.Error(err)
					return
				}
				c.Write(append([]byte("re: "), buf[:n]...))
			}()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	c, err := a.DialContext(ctx, "tcp4", netip.AddrPortFrom(v4B, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := <-seen
	if got[0] != netip.AddrPortFrom(v4B, 7000) || got[1].Addr() != v4A {
		t.Errorf("attempt %v from %v", got[0], got[1])
	}
	c.SetDeadline(time.Now().Add(testTimeout))
	c.Write([]byte("hello"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo %q, %v", buf, err)
	}
	for _, port := range []uint16{7001, 7002} {
		_, err := a.DialContext(ctx, "tcp4", netip.AddrPortFrom(v4B, port).String())
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("port %d: %v; want connection refused", port, err)
		}
	}
	if got := <-seen; got[0].Port() != 7001 {
		t.Errorf("attempt at %v handed over; want only 7001", got[0])
	}
	u, err := a.DialContext(ctx, "udp4", netip.AddrPortFrom(v4B, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	u.SetDeadline(time.Now().Add(testTimeout))
	u.Write([]byte("ping"))
	ub := make([]byte, 64)
	n, err := u.Read(ub)
	if err != nil || string(ub[:n]) != "re: ping" {
		t.Fatalf("UDP answer %q, %v", ub[:n], err)
	}
	b.Close()
	if err := b.SetInbound(netstack.Inbound{}); err == nil {
		t.Error("SetInbound after Close succeeded")
	}
}
