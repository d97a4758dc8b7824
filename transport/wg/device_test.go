package wg

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/transporttest"
	"github.com/vipkit/vipkit/transport/wg/wgtest"
)

const waitLong = 10 * time.Second

func newNet(t *testing.T) *transporttest.Network {
	t.Helper()
	n := transporttest.NewNetwork(nil, testenv.Seed(t, 1))
	t.Cleanup(func() { n.Close() })
	return n
}

// TestDeviceRawTunnel sends raw IPv4 packets through two devices over the
// simulated network, both ways, and reads the stats back.
func TestDeviceRawTunnel(t *testing.T) {
	n := newNet(t)
	a := newRawNode(t, n, "a", "10.0.0.1")
	b := newRawNode(t, n, "b", "10.0.0.2")
	a.start(t, b.peer("10.0.0.2/32"))
	b.start(t, a.peer("10.0.0.1/32"))

	ab := udp4(a.addr, b.addr, 1000, 2000, []byte("hello b"))
	pingUntil(t, a, b, ab, waitLong)
	ba := udp4(b.addr, a.addr, 2000, 1000, []byte("hello a"))
	b.send(t, ba)
	a.waitFor(t, ba, waitLong)

	st, err := a.dev.PeerStats(b.key.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	if st.LastHandshake.IsZero() || st.TxBytes == 0 || st.RxBytes == 0 {
		t.Fatalf("stats after traffic: %+v", st)
	}
	if st.Endpoint != b.bind.Addr() {
		t.Fatalf("endpoint %v, want %v", st.Endpoint, b.bind.Addr())
	}
	if _, err := a.dev.PeerStats(GeneratePrivateKey().PublicKey()); !errors.Is(err, ErrNoSuchPeer) {
		t.Fatalf("PeerStats(unknown) = %v", err)
	}

	// A packet to an address no peer has is dropped by the device, and
	// one from a peer with a source outside its allowed IPs is dropped by
	// the receiver.
	a.send(t, udp4(a.addr, netip.MustParseAddr("10.0.0.99"), 1, 2, []byte("nowhere")))
	b.send(t, udp4(netip.MustParseAddr("10.0.0.77"), a.addr, 1, 2, []byte("spoofed")))
	a.quiet(t, 200*time.Millisecond)
	b.quiet(t, 10*time.Millisecond)
}

// TestDeviceConfigRoundTrip configures a device from Go values and reads
// the same values back.
func TestDeviceConfigRoundTrip(t *testing.T) {
	n := newNet(t)
	a := newRawNode(t, n, "a", "10.0.0.1")
	psk := GeneratePresharedKey()
	want := Config{PrivateKey: a.key, ListenPort: 51820, Peers: []PeerConfig{
		{PublicKey: peerA, Endpoint: netip.MustParseAddrPort("198.18.0.50:51820"), PresharedKey: &psk, PersistentKeepalive: 25 * time.Second,
			AllowedIPs: []netip.Prefix{pfx("10.0.0.2/32"), pfx("10.1.0.0/16"), pfx("fd00::2/128")}},
		{PublicKey: peerB, AllowedIPs: []netip.Prefix{pfx("10.1.2.3/32"), pfx("0.0.0.0/0")}},
	}}
	d, err := NewDevice(a.io, want, Options{Bind: a.bind})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got, err := d.Config()
	if err != nil {
		t.Fatal(err)
	}
	if exp := want.Clone().Normalize(); !reflect.DeepEqual(got, exp) {
		t.Fatalf("Config() =\n%+v\nwant\n%+v", got, exp)
	}
}

// TestDeviceConfigureModel applies random configurations to a real device
// and checks that each reads back as the model says.
func TestDeviceConfigureModel(t *testing.T) {
	seed := testenv.Seed(t, 3)
	r := rand.New(rand.NewPCG(seed, 7))
	n := newNet(t)
	a := newRawNode(t, n, "a", "10.0.0.1")
	keys := testKeys(6)
	d, err := NewDevice(a.io, Config{PrivateKey: testPriv}, Options{Bind: a.bind})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for i := range 150 {
		cur, err := d.Config()
		if err != nil {
			t.Fatal(err)
		}
		want := randomConfig(r, keys, testPrefixes)
		if err := d.Configure(want); err != nil {
			t.Fatalf("step %d: Configure: %v", i, err)
		}
		got, err := d.Config()
		if err != nil {
			t.Fatal(err)
		}
		if exp := expectAfter(cur, want); !reflect.DeepEqual(got, exp) {
			t.Fatalf("step %d:\ngot  %+v\nwant %+v", i, got, exp)
		}
	}
}

// TestDeviceBadConfig checks that bad configurations fail with specific
// errors and change nothing.
func TestDeviceBadConfig(t *testing.T) {
	n := newNet(t)
	a := newRawNode(t, n, "a", "10.0.0.1")
	if _, err := NewDevice(a.io, Config{}, Options{Bind: a.bind}); !errors.Is(err, ErrZeroKey) {
		t.Fatalf("NewDevice(zero key) = %v", err)
	}
	good := Config{PrivateKey: a.key, Peers: []PeerConfig{
		{PublicKey: peerA, AllowedIPs: []netip.Prefix{pfx("10.0.0.2/32")}},
		{PublicKey: peerB, AllowedIPs: []netip.Prefix{pfx("10.0.0.3/32")}},
	}}
	d, err := NewDevice(a.io, good, Options{Bind: a.bind})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	before, _ := d.Config()

	bad := []struct {
		name string
		cfg  Config
		err  error
	}{
		{"zero key", Config{}, ErrZeroKey},
		{"duplicate peer", Config{PrivateKey: a.key, Peers: []PeerConfig{{PublicKey: peerA}, {PublicKey: peerA}}}, ErrDuplicatePeer},
		{"overlap", Config{PrivateKey: a.key, Peers: []PeerConfig{
			{PublicKey: peerA, AllowedIPs: []netip.Prefix{pfx("10.0.0.9/32")}},
			{PublicKey: peerB, AllowedIPs: []netip.Prefix{pfx("10.0.0.9/32")}},
		}}, ErrDuplicateAllowedIP},
		{"bad endpoint", Config{PrivateKey: a.key, Peers: []PeerConfig{{PublicKey: peerA, Endpoint: netip.MustParseAddrPort("198.18.0.9:0")}}}, ErrBadEndpoint},
		{"unmasked", Config{PrivateKey: a.key, Peers: []PeerConfig{{PublicKey: peerA, AllowedIPs: []netip.Prefix{pfx("10.0.0.1/8")}}}}, ErrBadPrefix},
		{"self", Config{PrivateKey: a.key, Peers: []PeerConfig{{PublicKey: a.key.PublicKey()}}}, ErrSelfPeer},
	}
	for _, tc := range bad {
		if err := d.Configure(tc.cfg); !errors.Is(err, tc.err) {
			t.Errorf("%s: Configure = %v, want %v", tc.name, err, tc.err)
		}
	}
	if err := d.UpsertPeer(PeerConfig{PublicKey: GeneratePrivateKey().PublicKey(), AllowedIPs: []netip.Prefix{pfx("10.0.0.2/32")}}); !errors.Is(err, ErrDuplicateAllowedIP) {
		t.Errorf("UpsertPeer taking another peer's prefix = %v", err)
	}
	if err := d.UpsertPeer(PeerConfig{PublicKey: a.key.PublicKey()}); !errors.Is(err, ErrSelfPeer) {
		t.Errorf("UpsertPeer(self) = %v", err)
	}
	if err := d.MoveAllowedIP(pfx("10.0.0.0/24"), peerA); !errors.Is(err, ErrNotHostPrefix) {
		t.Errorf("MoveAllowedIP(/24) = %v", err)
	}
	if err := d.MoveAllowedIP(pfx("10.0.0.3/32"), GeneratePrivateKey().PublicKey()); !errors.Is(err, ErrNoSuchPeer) {
		t.Errorf("MoveAllowedIP(unknown peer) = %v", err)
	}
	if err := d.RemovePeer(GeneratePrivateKey().PublicKey()); !errors.Is(err, ErrNoSuchPeer) {
		t.Errorf("RemovePeer(unknown) = %v", err)
	}
	after, _ := d.Config()
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("bad input changed the device:\nbefore %+v\nafter  %+v", before, after)
	}

	// The good operations, for contrast.
	if err := d.MoveAllowedIP(pfx("10.0.0.3/32"), peerA); err != nil {
		t.Fatal(err)
	}
	if err := d.RemovePeer(peerB); err != nil {
		t.Fatal(err)
	}
	got, _ := d.Config()
	want := Config{PrivateKey: a.key, ListenPort: a.bind.Addr().Port(), Peers: []PeerConfig{{PublicKey: peerA, AllowedIPs: []netip.Prefix{pfx("10.0.0.2/32"), pfx("10.0.0.3/32")}}}}
	if !reflect.DeepEqual(got, want.Normalize()) {
		t.Fatalf("after move and remove:\n%+v\nwant\n%+v", got, want)
	}

	d.Close()
	if err := d.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	for name, err := range map[string]error{
		"Configure":     d.Configure(good),
		"UpsertPeer":    d.UpsertPeer(PeerConfig{PublicKey: peerA}),
		"RemovePeer":    d.RemovePeer(peerA),
		"MoveAllowedIP": d.MoveAllowedIP(pfx("10.0.0.3/32"), peerA),
	} {
		if !errors.Is(err, ErrDeviceClosed) || !errors.Is(err, net.ErrClosed) {
			t.Errorf("%s after Close = %v", name, err)
		}
	}
	if _, err := d.Config(); !errors.Is(err, ErrDeviceClosed) {
		t.Errorf("Config after Close = %v", err)
	}
}

// TestDeviceConfigureKeepsSessions checks that Configure touches only what
// changes: adding a peer does not make the device handshake again with the
// peers it keeps.
func TestDeviceConfigureKeepsSessions(t *testing.T) {
	n := newNet(t)
	a := newRawNode(t, n, "a", "10.0.0.1")
	b := newRawNode(t, n, "b", "10.0.0.2")
	a.start(t, b.peer("10.0.0.2/32"))
	b.start(t, a.peer("10.0.0.1/32"))
	pingUntil(t, a, b, udp4(a.addr, b.addr, 1, 2, []byte("x")), waitLong)
	st0, _ := a.dev.PeerStats(b.key.PublicKey())

	cfg, _ := a.dev.Config()
	cfg.Peers = append(cfg.Peers, PeerConfig{PublicKey: peerA, AllowedIPs: []netip.Prefix{pfx("10.0.0.3/32")}})
	if err := a.dev.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	if err := a.dev.UpsertPeer(PeerConfig{PublicKey: peerB, AllowedIPs: []netip.Prefix{pfx("10.0.0.4/32")}}); err != nil {
		t.Fatal(err)
	}
	pkt := udp4(a.addr, b.addr, 1, 2, []byte("y"))
	a.send(t, pkt)
	b.waitFor(t, pkt, waitLong)
	st1, _ := a.dev.PeerStats(b.key.PublicKey())
	if !st1.LastHandshake.Equal(st0.LastHandshake) {
		t.Fatalf("handshake redone: %v then %v", st0.LastHandshake, st1.LastHandshake)
	}
}

// TestMoveAllowedIPRaw moves a /32 between two peers, back and forth, while
// packets to it flow, and checks that every packet reached one of them.
func TestMoveAllowedIPRaw(t *testing.T) {
	n := newNet(t)
	a := newRawNode(t, n, "a", "10.0.0.1")
	b := newRawNode(t, n, "b", "10.0.0.2")
	c := newRawNode(t, n, "c", "10.0.0.3")
	const vip = "10.0.0.100"
	a.start(t, b.peer("10.0.0.2/32", vip+"/32"), c.peer("10.0.0.3/32"))
	b.start(t, a.peer("10.0.0.1/32"))
	c.start(t, a.peer("10.0.0.1/32"))
	pingUntil(t, a, b, udp4(a.addr, b.addr, 1, 2, []byte("b")), waitLong)
	pingUntil(t, a, c, udp4(a.addr, c.addr, 1, 2, []byte("c")), waitLong)
	vipAddr := netip.MustParseAddr(vip)

	toVIP := udp4(a.addr, vipAddr, 1, 2, []byte("vip 1"))
	a.send(t, toVIP)
	b.waitFor(t, toVIP, waitLong)

	if err := a.dev.MoveAllowedIP(pfx(vip+"/32"), c.key.PublicKey()); err != nil {
		t.Fatal(err)
	}
	toVIP = udp4(a.addr, vipAddr, 1, 2, []byte("vip 2"))
	a.send(t, toVIP)
	c.waitFor(t, toVIP, waitLong)
	b.quiet(t, 100*time.Millisecond)
	cfg, _ := a.dev.Config()
	for _, p := range cfg.Peers {
		has := false
		for _, x := range p.AllowedIPs {
			has = has || x == pfx(vip+"/32")
		}
		if has != (p.PublicKey == c.key.PublicKey()) {
			t.Fatalf("after the move the /32 is on the wrong peer: %+v", cfg.Peers)
		}
	}

	// Moves while packets flow: none is left unrouted. Packets go in
	// windows small enough for every queue on the way. The mover runs
	// freely, so moves land at any point of a window; but how many land in
	// one depends on the scheduler, and on a loaded machine the mover may
	// not run at all for a whole run. So each window waits for a move made
	// since the one before, which guarantees moves between windows without
	// pacing them.
	var moves atomic.Int64
	moved := make(chan struct{}, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		to := []Key{b.key.PublicKey(), c.key.PublicKey()}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := a.dev.MoveAllowedIP(pfx(vip+"/32"), to[i%2]); err != nil {
				t.Error(err)
				return
			}
			moves.Add(1)
			select {
			case moved <- struct{}{}:
			default:
			}
		}
	}()
	const total, window = 600, 8
	got := 0
	count := func(deadline time.Time, want int) {
		for got < want {
			select {
			case <-b.rx:
				got++
			case <-c.rx:
				got++
			case <-time.After(time.Until(deadline)):
				close(stop)
				wg.Wait()
				t.Fatalf("%d of %d packets arrived (%d moves)", got, want, moves.Load())
			}
		}
	}
	for sent := 0; sent < total; {
		for range window {
			a.send(t, udp4(a.addr, vipAddr, 1, 2, fmt.Appendf(nil, "seq %d", sent)))
			sent++
		}
		count(time.Now().Add(waitLong), sent)
		select {
		case <-moved:
		case <-time.After(waitLong):
			close(stop)
			wg.Wait()
			t.Fatalf("no move in %v after %d packets (%d moves)", waitLong, sent, moves.Load())
		}
	}
	close(stop)
	wg.Wait()
	if moves.Load() < 2 {
		t.Fatalf("only %d moves happened", moves.Load())
	}
	t.Logf("%d packets, all delivered, across %d moves", total, moves.Load())
}

// TestDeviceCloseNoLeak checks that a device and its SimBind leave no
// goroutine behind, and that Close closes the PacketIO.
func TestDeviceCloseNoLeak(t *testing.T) {
	base := goleak.IgnoreCurrent()
	n := transporttest.NewNetwork(nil, 1)
	io, host := transporttest.NewChanPair(transporttest.ChanPairOptions{})
	d, err := NewDevice(io, Config{PrivateKey: GeneratePrivateKey(), Peers: []PeerConfig{{PublicKey: peerA, Endpoint: netip.MustParseAddrPort("198.18.0.9:51820"), AllowedIPs: []netip.Prefix{pfx("10.0.0.2/32")}, PersistentKeepalive: time.Second}}}, Options{Bind: wgtest.NewSimBind(n, "x")})
	if err != nil {
		t.Fatal(err)
	}
	host.Write([][]byte{udp4(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), 1, 2, nil)}, 0)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Write([][]byte{{0x45}}, 0); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("PacketIO still open after Close: %v", err)
	}
	host.Close()
	n.Close()
	goleak.VerifyNone(t, base)
}

func TestWaitHandshake(t *testing.T) {
	n := newNet(t)
	a := newRawNode(t, n, "a", "10.0.0.1")
	b := newRawNode(t, n, "b", "10.0.0.2")
	a.start(t, b.peer("10.0.0.2/32"))
	pa := a.peer("10.0.0.1/32")
	pa.PersistentKeepalive = time.Second // starts a handshake at once
	b.start(t, pa)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := a.dev.WaitHandshake(ctx, b.key.PublicKey()); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := a.dev.WaitHandshake(ctx2, peerA); !errors.Is(err, ErrNoSuchPeer) {
		t.Fatalf("WaitHandshake(unknown) = %v", err)
	}
}
