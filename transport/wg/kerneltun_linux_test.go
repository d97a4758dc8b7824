package wg

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/transporttest"
	"github.com/vipkit/vipkit/transport/wg/wgtest"
)

// TestKernelTUN runs a device on a real kernel TUN (PacketIOFromTUN) in a
// private network namespace: a UDP datagram sent by the kernel's stack goes
// into the TUN, through wireguard-go and a SimBind, and out of a second
// device into a netstack host.
func TestKernelTUN(t *testing.T) {
	testenv.NeedRoot(t)
	n := newNet(t)
	b, _ := newSimNode(t, n, "b", "10.9.0.2")
	keyA := GeneratePrivateKey()
	bindA := wgtest.NewSimBind(n, "a")
	connect(t, b, &node{name: "a", key: keyA, addr: netip.MustParseAddr("10.9.0.1"), endpoint: bindA.Addr()})

	srv, err := b.host.ListenUDP(netip.MustParseAddrPort("10.9.0.2:9000"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	// The namespace lives on a locked thread that is never unlocked: the
	// thread ends with the goroutine, and the namespace with the TUN.
	errc := make(chan error, 1)
	stop := make(chan struct{})
	devc := make(chan *Device, 1)
	go func() {
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return err
			}
			td, err := tun.CreateTUN("wgt0", 1420)
			if err != nil {
				return err
			}
			p := PacketIOFromTUN(td)
			if m := p.MTU(); m != 1420 {
				p.Close()
				return fmt.Errorf("kernel TUN MTU %d, want 1420", m)
			}
			d, err := NewDevice(p, Config{PrivateKey: keyA, Peers: []PeerConfig{{
				PublicKey: b.key.PublicKey(), Endpoint: b.endpoint,
				AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.9.0.2/32")},
			}}}, Options{Bind: bindA})
			if err != nil {
				p.Close()
				return err
			}
			devc <- d
			c, err := upAndDial("wgt0", "10.9.0.1/24", net.IPv4(10, 9, 0, 2))
			if err != nil {
				return err
			}
			defer c.Close()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				if _, err := c.Write([]byte("from the kernel")); err != nil {
					return err
				}
				select {
				case <-stop:
					return nil
				case <-tick.C:
				}
			}
		}()
	}()
	var devA *Device
	defer func() {
		close(stop)
		if err := <-errc; err != nil {
			t.Errorf("namespace side: %v", err)
		}
		if devA != nil {
			devA.Close()
		}
	}()
	select {
	case devA = <-devc:
	case err := <-errc:
		errc <- err
		t.Fatalf("setting up the kernel TUN: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 100)
	k, from, err := srv.ReadFrom(buf)
	if err != nil {
		t.Fatalf("nothing from the kernel TUN through the tunnel: %v", err)
	}
	if string(buf[:k]) != "from the kernel" || from.(*net.UDPAddr).IP.String() != "10.9.0.1" {
		t.Fatalf("got %q from %v", buf[:k], from)
	}
	if err := devA.WaitHandshake(ctx, b.key.PublicKey()); err != nil {
		t.Fatal(err)
	}
}

// TestKernelTUNInterruptRead: PacketIOFromTUN over a kernel TUN is a
// transport.ReadInterrupter that keeps the contract. The TUN is down (so
// idle) until the check's send brings it up and sends a datagram into it.
func TestKernelTUNInterruptRead(t *testing.T) {
	testenv.NeedRoot(t)
	type made struct {
		p   transport.PacketIO
		err error
	}
	madec := make(chan made, 1)
	send := make(chan struct{})
	stop := make(chan struct{})
	sent := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the namespace ends with the thread
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			madec <- made{err: err}
			return
		}
		td, err := tun.CreateTUN("wgt1", 1420)
		if err != nil {
			madec <- made{err: err}
			return
		}
		madec <- made{p: PacketIOFromTUN(td)}
		select {
		case <-send:
		case <-stop:
			return
		}
		sent <- func() error {
			c, err := upAndDial("wgt1", "10.9.1.1/24", net.IPv4(10, 9, 1, 2))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("after the interrupt"))
			return err
		}()
	}()
	defer close(stop)
	m := <-madec
	if m.err != nil {
		t.Fatalf("kernel TUN: %v", m.err)
	}
	transporttest.CheckReadInterrupter(t, m.p, func(t testing.TB) {
		close(send)
		if err := <-sent; err != nil {
			t.Fatalf("sending into the TUN: %v", err)
		}
	})
}

// upAndDial gives the TUN link name the address cidr, brings it up and
// returns a UDP socket connected to dst:9000 through it. It runs on the
// namespace's thread.
func upAndDial(name, cidr string, dst net.IP) (*net.UDPConn, error) {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return nil, err
	}
	addr, err := netlink.ParseAddr(cidr)
	if err != nil {
		return nil, err
	}
	if err := netlink.AddrAdd(link, addr); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, err
	}
	return net.DialUDP("udp4", nil, &net.UDPAddr{IP: dst, Port: 9000})
}
