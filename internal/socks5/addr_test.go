package socks5

import (
	"context"
	"net"
	"net/netip"
	"testing"
)

// closedConn is a dialled connection whose endpoint closed at once:
// gVisor's gonet reports nil addresses then.
type closedConn struct{ net.Conn }

func (closedConn) LocalAddr() net.Addr  { return nil }
func (closedConn) RemoteAddr() net.Addr { return nil }

// A destination connection that has lost its addresses by the time the
// reply is written gets a reply with an empty bound address, not a
// panic in the server.
func TestConnectReplyWithoutLocalAddr(t *testing.T) {
	s, addr := server(t)
	var peers []net.Conn
	s.Dial = func(context.Context, netip.AddrPort) (net.Conn, error) {
		a, b := net.Pipe()
		peers = append(peers, b)
		return closedConn{a}, nil
	}
	t.Cleanup(func() {
		for _, p := range peers {
			p.Close()
		}
	})
	c, code, bound := handshake(t, addr, cmdConnect, Addr{IP: netip.MustParseAddr("127.0.0.1"), Port: 9})
	defer c.Close()
	if code != replySucceeded || bound.Port() != 0 {
		t.Fatalf("reply %d, bound %v", code, bound)
	}
}

func TestAddrPort(t *testing.T) {
	for _, c := range []struct {
		in   net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 80}, "192.0.2.1:80"},
		{&net.UDPAddr{IP: net.ParseIP("2001:db8::1"), Port: 53}, "[2001:db8::1]:53"},
	} {
		got, err := addrPort(c.in)
		if err != nil || got.String() != c.want {
			t.Errorf("addrPort(%v) = %v, %v; want %s", c.in, got, err, c.want)
		}
	}
	if _, err := addrPort(nil); err == nil {
		t.Error("addrPort(nil) gave no error")
	}
}
