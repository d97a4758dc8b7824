package tunwrap_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	wgnetstack "golang.zx2c4.com/wireguard/tun/netstack"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/tunwrap"
)

// An existing wireguard-go program puts a VIP into its packet path: it
// wraps its TUN with a flow.NAT and hands the wrapper to device.NewDevice.
// Here the program's client connects to the VIP 100.100.0.10:443 and
// reaches the echo server on the backend device at 100.64.0.2:8443.
func Example() {
	client, backend, vip := netip.MustParseAddr("100.64.0.1"), netip.MustParseAddr("100.64.0.2"), netip.MustParseAddr("100.100.0.10")
	silent := device.NewLogger(device.LogLevelSilent, "")

	// The program's TUN, as before.
	tunDev, tnet, _ := wgnetstack.CreateNetTUN([]netip.Addr{client}, nil, 1420)

	// The glue: a NAT for the VIP's listener, and the wrapper around the TUN.
	var w *tunwrap.Wrapper
	nat, _ := flow.New(flow.Options{
		LocalAddr: client,
		Selector:  flow.SelectorFunc(func(flow.SelectRequest) int { return 0 }),
		Emit:      func(d flow.Direction, p []byte) { w.Emit(d, p) },
	})
	defer nat.Close()
	nat.SetListener(flow.Listener{VIP: vip, Proto: flow.ProtoTCP, Port: 443},
		flow.ListenerConfig{Backends: []flow.Backend{{Peer: 1, Addr: backend, Port: 8443}}})
	w = tunwrap.Wrap(tunDev, tunwrap.Options{
		Filter: tunwrap.FlowFilter{NAT: nat},
		PeerOf: func(src netip.Addr) (flow.PeerID, bool) { return 1, src == backend },
	})

	// The program's device, now over the wrapper.
	dev := device.NewDevice(w, conn.NewDefaultBind(), silent)
	defer dev.Close()

	// The backend: another wireguard-go device with an echo server.
	beTun, beNet, _ := wgnetstack.CreateNetTUN([]netip.Addr{backend}, nil, 1420)
	beDev := device.NewDevice(beTun, conn.NewDefaultBind(), silent)
	defer beDev.Close()
	ln, _ := beNet.ListenTCPAddrPort(netip.AddrPortFrom(backend, 8443))
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()

	// Keys, ports and peers, through wireguard-go's UAPI.
	kc, kb := wg.GeneratePrivateKey(), wg.GeneratePrivateKey()
	port := func(d *device.Device, k wg.Key) string {
		d.IpcSet("private_key=" + hex.EncodeToString(k[:]) + "\nlisten_port=0\n")
		d.Up()
		cfg, _ := d.IpcGet()
		_, p, _ := strings.Cut(cfg, "listen_port=")
		p, _, _ = strings.Cut(p, "\n")
		return p
	}
	pc, pb := port(dev, kc), port(beDev, kb)
	pubC, pubB := kc.PublicKey(), kb.PublicKey()
	dev.IpcSet("public_key=" + hex.EncodeToString(pubB[:]) + "\nendpoint=127.0.0.1:" + pb + "\nallowed_ip=100.64.0.2/32\n")
	beDev.IpcSet("public_key=" + hex.EncodeToString(pubC[:]) + "\nendpoint=127.0.0.1:" + pc + "\nallowed_ip=100.64.0.1/32\n")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := tnet.DialContextTCPAddrPort(ctx, netip.AddrPortFrom(vip, 443))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	c.Write([]byte("hello"))
	buf := make([]byte, 5)
	io.ReadFull(c, buf)
	fmt.Printf("%s from %v\n", buf, c.RemoteAddr())
	// Output: hello from 100.100.0.10:443
}
