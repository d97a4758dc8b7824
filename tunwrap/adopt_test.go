package tunwrap_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
	wgnetstack "golang.zx2c4.com/wireguard/tun/netstack"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/tunwrap"
)

var (
	cliAddr = netip.MustParseAddr("100.64.0.1")
	beAddr  = netip.MustParseAddr("100.64.0.2")
	vipAddr = netip.MustParseAddr("100.100.0.10")
)

// addVIPs is the glue an existing wireguard-go program adds to put a VIP
// into its packet path: a flow.NAT for the VIP's listeners and the Wrapper
// around its TUN, which it then hands to device.NewDevice instead of the
// TUN. Peer 1 is the backend's device; its overlay address names it.
func addVIPs(t testing.TB, tunDev tun.Device) *tunwrap.Wrapper {
	var w *tunwrap.Wrapper
	nat, err := flow.New(flow.Options{
		LocalAddr: cliAddr,
		Selector:  flow.SelectorFunc(func(flow.SelectRequest) int { return 0 }),
		Emit:      func(d flow.Direction, p []byte) { w.Emit(d, p) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nat.Close() })
	backend := func(port uint16) flow.ListenerConfig {
		return flow.ListenerConfig{Backends: []flow.Backend{{Peer: 1, Addr: beAddr, Port: port}}}
	}
	if err := nat.SetListener(flow.Listener{VIP: vipAddr, Proto: flow.ProtoTCP, Port: 443}, backend(8443)); err != nil {
		t.Fatal(err)
	}
	if err := nat.SetListener(flow.Listener{VIP: vipAddr, Proto: flow.ProtoUDP, Port: 53}, backend(5353)); err != nil {
		t.Fatal(err)
	}
	w = tunwrap.Wrap(tunDev, tunwrap.Options{
		Filter: tunwrap.FlowFilter{NAT: nat},
		PeerOf: func(src netip.Addr) (flow.PeerID, bool) { return 1, src == beAddr },
	})
	return w
}

// node is one wireguard-go program: a device over a netstack TUN on
// loopback UDP.
type node struct {
	dev  *device.Device
	net  *wgnetstack.Net
	key  wg.Key
	port int
}

func newNode(t testing.TB, addr netip.Addr, wrap func(testing.TB, tun.Device) *tunwrap.Wrapper) *node {
	t.Helper()
	tunDev, tnet, err := wgnetstack.CreateNetTUN([]netip.Addr{addr}, nil, 1420)
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		tunDev = wrap(t, tunDev)
	}
	n := &node{net: tnet, key: wg.GeneratePrivateKey()}
	n.dev = device.NewDevice(tunDev, conn.NewDefaultBind(), device.NewLogger(device.LogLevelSilent, ""))
	t.Cleanup(n.dev.Close)
	if err := n.dev.IpcSet("private_key=" + hex.EncodeToString(n.key[:]) + "\nlisten_port=0\n"); err != nil {
		t.Fatal(err)
	}
	if err := n.dev.Up(); err != nil {
		t.Fatal(err)
	}
	cfg, err := n.dev.IpcGet()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(cfg, "\n") {
		if p, ok := strings.CutPrefix(l, "listen_port="); ok {
			fmt.Sscan(p, &n.port)
		}
	}
	return n
}

func (n *node) addPeer(t testing.TB, o *node, allowed netip.Addr) {
	t.Helper()
	pub := o.key.PublicKey()
	if err := n.dev.IpcSet(fmt.Sprintf("public_key=%s\nendpoint=127.0.0.1:%d\nallowed_ip=%s/32\n", hex.EncodeToString(pub[:]), o.port, allowed)); err != nil {
		t.Fatal(err)
	}
}

// TestAdoptInWireGuardGoProgram runs the Wrapper the way an existing
// wireguard-go program adopts it (device.NewDevice over the wrapped TUN,
// the glue in addVIPs): real TCP and UDP from the client's stack to the
// VIP reach the backend on the other device and come back from the VIP.
func TestAdoptInWireGuardGoProgram(t *testing.T) {
	cli := newNode(t, cliAddr, addVIPs)
	be := newNode(t, beAddr, nil)
	cli.addPeer(t, be, beAddr)
	be.addPeer(t, cli, cliAddr)

	// The backend: a TCP echo on 8443 and a UDP echo on 5353.
	ln, err := be.net.ListenTCPAddrPort(netip.AddrPortFrom(beAddr, 8443))
	if err != nil {
		t.Fatal(err)
	}
	// The echo goroutines end before the devices close (Cleanup):
	// netstack's TUN must not be closed while a write is in flight.
	echoes := make(chan struct{}, 2)
	defer func() { <-echoes; <-echoes }()
	defer ln.Close()
	seen := make(chan net.Addr, 1)
	go func() {
		defer func() { echoes <- struct{}{} }()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		seen <- c.RemoteAddr()
		io.Copy(c, c)
	}()
	uc, err := be.net.ListenUDPAddrPort(netip.AddrPortFrom(beAddr, 5353))
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	go func() {
		defer func() { echoes <- struct{}{} }()
		buf := make([]byte, 2048)
		for {
			n, from, err := uc.ReadFrom(buf)
			if err != nil {
				return
			}
			uc.WriteTo(append([]byte("echo "), buf[:n]...), from)
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cli.net.DialContextTCPAddrPort(ctx, netip.AddrPortFrom(vipAddr, 443))
	if err != nil {
		t.Fatalf("TCP to the VIP: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	msg := strings.Repeat("through the VIP ", 1000) // several segments
	go c.Write([]byte(msg))
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
		t.Fatalf("TCP echo: %v (%d bytes match: %v)", err, len(got), string(got) == msg)
	}
	if ra := (<-seen).(*net.TCPAddr); ra.AddrPort().Addr() != cliAddr {
		t.Fatalf("the backend saw %v, want the client's overlay address", ra)
	}
	if ra := c.RemoteAddr().(*net.TCPAddr).AddrPort(); ra != netip.AddrPortFrom(vipAddr, 443) {
		t.Fatalf("the client's connection is to %v, want the VIP", ra)
	}

	u, err := cli.net.DialUDPAddrPort(netip.AddrPort{}, netip.AddrPortFrom(vipAddr, 53))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	buf := make([]byte, 2048)
	// UDP may lose the first datagram while the handshake settles: poll
	// with a deadline.
	deadline := time.Now().Add(30 * time.Second)
	for {
		u.Write([]byte("query"))
		u.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		n, err := u.Read(buf)
		if err == nil {
			if string(buf[:n]) != "echo query" {
				t.Fatalf("UDP reply %q", buf[:n])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no UDP reply through the VIP: %v", err)
		}
	}
}
