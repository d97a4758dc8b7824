package netstack_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"

	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/netstack"
)

// copyPackets moves packets from one PacketIO to another in batches until
// either is closed: the simplest possible "network" between two hosts. In
// real use a wireguard-go device sits here.
func copyPackets(from, to transport.PacketIO) {
	const offset = 16 // headroom, as wireguard-go asks for
	bufs := make([][]byte, from.BatchSize())
	sizes := make([]int, len(bufs))
	for i := range bufs {
		bufs[i] = make([]byte, offset+from.MTU())
	}
	out := make([][]byte, len(bufs))
	for {
		n, err := from.Read(bufs, sizes, offset)
		if err != nil {
			return
		}
		for i := range n {
			out[i] = bufs[i][:offset+sizes[i]]
		}
		if _, err := to.Write(out[:n], offset); err != nil {
			return
		}
	}
}

// Two hosts joined back to back talk TCP.
func Example() {
	a, err := netstack.New(netstack.Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
	if err != nil {
		panic(err)
	}
	defer a.Close()
	b, err := netstack.New(netstack.Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}})
	if err != nil {
		panic(err)
	}
	defer b.Close()
	go copyPackets(a, b)
	go copyPackets(b, a)

	ln, err := b.ListenTCP(netip.MustParseAddrPort("10.0.0.2:80"))
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintf(c, "hello %v", c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr())
	}()

	c, err := a.DialContext(context.Background(), "tcp", "10.0.0.2:80")
	if err != nil {
		panic(err)
	}
	defer c.Close()
	reply, err := io.ReadAll(c)
	fmt.Printf("%s %v\n", reply, err)
	// Output: hello 10.0.0.1 <nil>
}

// A VIP added at run time accepts connections; ReservePort keeps a port
// out of the stack's hands, as a NAT needs for its shadow ports.
func ExampleHost_AddAddress() {
	h, err := netstack.New(netstack.Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}})
	if err != nil {
		panic(err)
	}
	defer h.Close()

	vip := netip.MustParsePrefix("10.99.0.1/32")
	_, err = h.ListenTCP(netip.AddrPortFrom(vip.Addr(), 443))
	fmt.Println("listen before AddAddress:", errors.Is(err, syscall.EADDRNOTAVAIL))

	if err := h.AddAddress(vip); err != nil {
		panic(err)
	}
	ln, err := h.ListenTCP(netip.AddrPortFrom(vip.Addr(), 443))
	fmt.Println("listen after AddAddress:", err)
	ln.Close()

	port, err := h.ReservePort("tcp", netip.Addr{}, 40000)
	fmt.Println("reserved", port, err)
	_, err = h.ListenTCP(netip.AddrPortFrom(vip.Addr(), 40000))
	fmt.Println("listen on a reserved port:", errors.Is(err, syscall.EADDRINUSE))
	// Output:
	// listen before AddAddress: true
	// listen after AddAddress: <nil>
	// reserved 40000 <nil>
	// listen on a reserved port: true
}
