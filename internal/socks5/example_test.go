package socks5_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"

	"golang.org/x/net/proxy"

	"github.com/vipkit/vipkit/internal/socks5"
)

// A proxy that resolves its own names: "hello.test" is a local listener.
func ExampleServer() {
	backend, _ := net.Listen("tcp", "127.0.0.1:0")
	defer backend.Close()
	go func() {
		c, err := backend.Accept()
		if err == nil {
			io.WriteString(c, "hello through SOCKS5\n")
			c.Close()
		}
	}()
	s := &socks5.Server{
		Dial: func(ctx context.Context, to netip.AddrPort) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", to.String())
		},
		Resolve: func(_ context.Context, name string) (netip.Addr, error) {
			if name == "hello.test" {
				return netip.MustParseAddr("127.0.0.1"), nil
			}
			return netip.Addr{}, socks5.ErrHostUnreachable
		},
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go s.Serve(ln)
	defer s.Close()

	d, _ := proxy.SOCKS5("tcp", ln.Addr().String(), nil, proxy.Direct)
	_, port, _ := net.SplitHostPort(backend.Addr().String())
	c, err := d.Dial("tcp", "hello.test:"+port)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	b, _ := io.ReadAll(c)
	fmt.Print(string(b))
	// Output: hello through SOCKS5
}
