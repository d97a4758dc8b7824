package wg_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/vipkit/vipkit/transport/netstack"
	"github.com/vipkit/vipkit/transport/transporttest"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/transport/wg/wgtest"
)

// Two in-process nodes, each a gVisor netstack host with a wireguard-go
// device on it, talk TCP through the encrypted tunnel over a simulated
// network.
func ExampleNewDevice() {
	n := transporttest.NewNetwork(nil, 1) // real clock: wireguard-go runs in real time
	defer n.Close()
	bindA, bindB := wgtest.NewSimBind(n, "a"), wgtest.NewSimBind(n, "b")
	keyA, keyB := wg.GeneratePrivateKey(), wg.GeneratePrivateKey()
	addrA, addrB := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")

	hostA, _ := netstack.New(netstack.Options{Addrs: []netip.Addr{addrA}})
	hostB, _ := netstack.New(netstack.Options{Addrs: []netip.Addr{addrB}})
	devA, err := wg.NewDevice(hostA, wg.Config{PrivateKey: keyA, Peers: []wg.PeerConfig{{
		PublicKey:  keyB.PublicKey(),
		Endpoint:   bindB.Addr(),
		AllowedIPs: []netip.Prefix{netip.PrefixFrom(addrB, 32)},
	}}}, wg.Options{Bind: bindA})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer devA.Close() // closes hostA and bindA too
	devB, err := wg.NewDevice(hostB, wg.Config{PrivateKey: keyB, Peers: []wg.PeerConfig{{
		PublicKey:  keyA.PublicKey(),
		Endpoint:   bindA.Addr(),
		AllowedIPs: []netip.Prefix{netip.PrefixFrom(addrA, 32)},
	}}}, wg.Options{Bind: bindB})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer devB.Close()

	l, _ := hostB.ListenTCP(netip.AddrPortFrom(addrB, 80))
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Write([]byte("hello over wireguard"))
		c.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := hostA.DialContext(ctx, "tcp", "10.0.0.2:80")
	if err != nil {
		fmt.Println(err)
		return
	}
	msg, _ := io.ReadAll(c)
	c.Close()
	fmt.Println(string(msg))
	st, _ := devA.PeerStats(keyB.PublicKey())
	fmt.Println("handshake done:", !st.LastHandshake.IsZero())
	// Output:
	// hello over wireguard
	// handshake done: true
}

// A /32 moves from one peer to another at run time; Config reads the live
// device back.
func ExampleDevice_MoveAllowedIP() {
	n := transporttest.NewNetwork(nil, 1)
	defer n.Close()
	io, host := transporttest.NewChanPair(transporttest.ChanPairOptions{})
	defer host.Close()
	b, c := wg.GeneratePrivateKey().PublicKey(), wg.GeneratePrivateKey().PublicKey()
	name := map[wg.Key]string{b: "b", c: "c"}
	vip := netip.MustParsePrefix("10.0.0.100/32")
	dev, err := wg.NewDevice(io, wg.Config{PrivateKey: wg.GeneratePrivateKey(), Peers: []wg.PeerConfig{
		{PublicKey: b, AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.0.0.2/32"), vip}},
		{PublicKey: c, AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.0.0.3/32")}},
	}}, wg.Options{Bind: wgtest.NewSimBind(n, "a")})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	if err := dev.MoveAllowedIP(vip, c); err != nil {
		fmt.Println(err)
		return
	}
	cfg, _ := dev.Config()
	for _, want := range []wg.Key{b, c} {
		for _, p := range cfg.Peers {
			if p.PublicKey == want {
				fmt.Println(name[p.PublicKey], p.AllowedIPs)
			}
		}
	}
	// Output:
	// b [10.0.0.2/32]
	// c [10.0.0.3/32 10.0.0.100/32]
}

// Bad configurations are refused before anything changes, with errors that
// match the package's sentinels.
func ExampleConfig_Validate() {
	k := wg.GeneratePrivateKey()
	p1, p2 := wg.GeneratePrivateKey().PublicKey(), wg.GeneratePrivateKey().PublicKey()
	cfg := wg.Config{PrivateKey: k, Peers: []wg.PeerConfig{
		{PublicKey: p1, AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.0.0.9/32")}},
		{PublicKey: p2, AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.0.0.9/32")}},
	}}
	err := cfg.Validate()
	fmt.Println(errors.Is(err, wg.ErrDuplicateAllowedIP))
	// Output: true
}

// A UDPBind impairs its own sends: here a partition, then a lossy link to
// one destination, with what it counted.
func ExampleUDPBind() {
	b := wg.NewUDPBind(wg.UDPBindOptions{Seed: 1})
	if _, _, err := b.Open(0); err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	dst := netip.MustParseAddrPort("127.0.0.1:9")
	ep, _ := b.ParseEndpoint(dst.String())
	b.Cut() // everything
	b.Send([][]byte{[]byte("a"), []byte("b")}, ep)
	b.Heal()
	b.SetPeer(dst, wg.Impairment{Loss: 1})
	b.Send([][]byte{[]byte("c")}, ep)
	s := b.Stats()
	fmt.Println("sent", s.Sent, "partition", s.Dropped[wg.UDPDropPartition], "loss", s.Dropped[wg.UDPDropLoss])
	// Output: sent 3 partition 2 loss 1
}

func ExampleKey_PublicKey() {
	priv, _ := wg.ParseKey("dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo=")
	fmt.Println(priv.PublicKey())
	// Output: hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=
}
