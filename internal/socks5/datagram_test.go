package socks5

import (
	"net"
	"testing"
	"time"
)

// peerConn is an unconnected UDP socket used as one connected to peer.
type peerConn struct {
	*net.UDPConn
	peer *net.UDPAddr
}

func (c peerConn) Read(p []byte) (int, error) {
	n, _, err := c.ReadFromUDP(p)
	return n, err
}

func (c peerConn) Write(p []byte) (int, error) { return c.WriteToUDP(p, c.peer) }

// udpPair is two UDP sockets on loopback, each sending to the other.
func udpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	x, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	y, err := net.DialUDP("udp", nil, x.LocalAddr().(*net.UDPAddr))
	if err != nil {
		x.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close(); y.Close() })
	return peerConn{x, y.LocalAddr().(*net.UDPAddr)}, y
}

// TestRelayDatagramsWhole: datagrams up to the largest UDP payload cross
// the relay whole, each as one datagram, both ways.
func TestRelayDatagramsWhole(t *testing.T) {
	client, a := udpPair(t)
	b, server := udpPair(t)
	done := make(chan error, 1)
	go func() { done <- RelayDatagramsIdle(a, b, time.Minute, nil) }()
	pass := func(from, to net.Conn, size int) {
		t.Helper()
		msg := make([]byte, size)
		for i := range msg {
			msg[i] = byte(i * 7)
		}
		if _, err := from.Write(msg); err != nil {
			t.Fatalf("send %d bytes: %v", size, err)
		}
		got := make([]byte, maxDatagram+1)
		_ = to.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := to.Read(got)
		if err != nil || n != size || string(got[:n]) != string(msg) {
			t.Fatalf("a %d-byte datagram arrived as %d bytes (%v)", size, n, err)
		}
	}
	for _, size := range []int{1, 1400, 32 << 10, 32<<10 + 1, 60000, 65507} {
		pass(client, server, size)
		pass(server, client, size)
	}
	a.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the relay did not end when one side closed")
	}
}
