//go:build linux

package netns_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/vipkit/vipkit/transport/netns"
	"github.com/vipkit/vipkit/transport/wg"
)

// Two hosts on a veth link; a server listens inside one and a client dials
// it from the other. Sockets are opened through Do so that they belong to
// the host's namespace. (Needs root, so it is compiled but not run.)
func ExampleConnect() {
	ctx := context.Background()
	a, err := netns.NewHost(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := netns.NewHost(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	l, err := netns.Connect(ctx, a, b, netns.LinkOptions{MTU: 1500})
	if err != nil {
		log.Fatal(err)
	}

	var ln net.Listener
	err = b.Do(func() error {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(l.B.Addr4(), 8080).String())
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Write([]byte("hello from " + b.Name()))
			c.Close()
		}
	}()

	var c net.Conn
	err = a.Do(func() error {
		c, err = net.Dial("tcp", ln.Addr().String())
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	n, _ := c.Read(buf)
	fmt.Println(string(buf[:n]))
}

// A kernel TUN with wireguard-go in each of two hosts: traffic to the
// overlay addresses is encrypted and carried over the veth underlay.
func ExampleHost_StartWireGuard() {
	ctx := context.Background()
	a, _ := netns.NewHost(ctx, "")
	defer a.Close()
	b, _ := netns.NewHost(ctx, "")
	defer b.Close()
	l, err := netns.Connect(ctx, a, b, netns.LinkOptions{})
	if err != nil {
		log.Fatal(err)
	}
	ka, kb := wg.GeneratePrivateKey(), wg.GeneratePrivateKey()
	_, err = a.StartWireGuard(ctx, netns.WireGuardConfig{
		Addrs: []netip.Prefix{netns.OverlayAddr4(1)},
		Device: wg.Config{PrivateKey: ka, ListenPort: 51820, Peers: []wg.PeerConfig{{
			PublicKey:  kb.PublicKey(),
			Endpoint:   netip.AddrPortFrom(l.B.Addr4(), 51820),
			AllowedIPs: []netip.Prefix{netns.OverlayAddr4(2)},
		}}},
	})
	if err != nil {
		log.Fatal(err)
	}
	_, err = b.StartWireGuard(ctx, netns.WireGuardConfig{
		Addrs: []netip.Prefix{netns.OverlayAddr4(2)},
		Device: wg.Config{PrivateKey: kb, ListenPort: 51820, Peers: []wg.PeerConfig{{
			PublicKey:  ka.PublicKey(),
			Endpoint:   netip.AddrPortFrom(l.A.Addr4(), 51820),
			AllowedIPs: []netip.Prefix{netns.OverlayAddr4(1)},
		}}},
	})
	if err != nil {
		log.Fatal(err)
	}
	// Now a process in a reaches 100.64.0.2 through the tunnel.
	p, err := a.Start(ctx, []string{"ip", "route", "get", "100.64.0.2"}, netns.ProcOptions{Output: os.Stdout})
	if err != nil {
		log.Fatal(err)
	}
	_ = p.Wait(ctx)
}

// Three hosts on one L2 segment.
func ExampleSwitch_Attach() {
	ctx := context.Background()
	sw, err := netns.NewSwitch(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer sw.Close()
	for range 3 {
		h, err := netns.NewHost(ctx, "")
		if err != nil {
			log.Fatal(err)
		}
		defer h.Close()
		iface, err := sw.Attach(ctx, h, netns.PortOptions{})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(h.Name(), iface.Name, iface.Addrs)
	}
}

func serve(ctx context.Context, args []string) error {
	<-ctx.Done() // until the parent stops or kills the child
	return nil
}

// A test binary re-executed inside a namespace. TestMain registers the
// child functions and dispatches to them in the child; a test then starts
// one with StartChildT, which kills it when the test ends.
func ExampleStartChildT() {
	// In the test package:
	//
	//	func TestMain(m *testing.M) {
	//		netns.RegisterChild("serve", serve)
	//		netns.DispatchChild()
	//		os.Exit(m.Run())
	//	}
	//
	//	func TestServer(t *testing.T) {
	//		h := netns.NewHostT(t, "srv")
	//		p := netns.StartChildT(t, h, "serve", "--port=80")
	//		...
	//	}
	var _ func(testing.TB, *netns.Host, string, ...string) *netns.Process = netns.StartChildT
	var _ netns.ChildFunc = serve
}

func ExampleOverlayAddr4() {
	fmt.Println(netns.OverlayAddr4(1), netns.OverlayAddr4(300), netns.OverlayAddr6(2))
	// Output: 100.64.0.1/32 100.64.1.44/32 fd00:64::2/128
}
