package wg

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/netstack"
	"github.com/vipkit/vipkit/transport/transporttest"
	"github.com/vipkit/vipkit/transport/wg/wgtest"
)

// node is one in-process host: a gVisor netstack host whose PacketIO side
// runs a wireguard-go Device.
type node struct {
	name     string
	key      Key
	addr     netip.Addr // overlay address
	host     *netstack.Host
	dev      *Device
	endpoint netip.AddrPort // where peers reach its Bind
}

func newHost(t testing.TB, addr netip.Addr, opts ...func(*netstack.Options)) *netstack.Host {
	t.Helper()
	o := netstack.Options{Addrs: []netip.Addr{addr}}
	for _, f := range opts {
		f(&o)
	}
	h, err := netstack.New(o)
	if err != nil {
		t.Fatalf("netstack.New: %v", err)
	}
	return h
}

// newSimNode starts a node whose Bind is a SimBind on n.
func newSimNode(t testing.TB, n *transporttest.Network, name, addr string, opts ...func(*netstack.Options)) (*node, *wgtest.SimBind) {
	t.Helper()
	b := wgtest.NewSimBind(n, name)
	nd := startNode(t, name, addr, b, opts...)
	nd.endpoint = b.Addr()
	return nd, b
}

// newUDPNode starts a node whose Bind is b, a UDPBind on real sockets;
// peers reach it on 127.0.0.1 at the port it was given.
func newUDPNode(t testing.TB, name, addr string, b *UDPBind, opts ...func(*netstack.Options)) *node {
	t.Helper()
	nd := startNode(t, name, addr, b, opts...)
	cfg, err := nd.dev.Config()
	if err != nil {
		t.Fatal(err)
	}
	nd.endpoint = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), cfg.ListenPort)
	return nd
}

func startNode(t testing.TB, name, addr string, b interface {
	BatchSize() int
}, opts ...func(*netstack.Options)) *node {
	t.Helper()
	nd := &node{name: name, key: GeneratePrivateKey(), addr: netip.MustParseAddr(addr)}
	nd.host = newHost(t, nd.addr, opts...)
	var o Options
	switch b := b.(type) {
	case *wgtest.SimBind:
		o.Bind = b
	case *UDPBind:
		o.Bind = b
	}
	d, err := NewDevice(nd.host, Config{PrivateKey: nd.key}, o)
	if err != nil {
		nd.host.Close()
		t.Fatalf("NewDevice %s: %v", name, err)
	}
	nd.dev = d
	t.Cleanup(func() { d.Close() }) // closes the host and the bind too
	return nd
}

// connect makes b a peer of a, routing b's address and extra prefixes to it.
func connect(t testing.TB, a, b *node, extra ...string) {
	t.Helper()
	p := PeerConfig{PublicKey: b.key.PublicKey(), Endpoint: b.endpoint, AllowedIPs: []netip.Prefix{netip.PrefixFrom(b.addr, b.addr.BitLen())}}
	for _, e := range extra {
		p.AllowedIPs = append(p.AllowedIPs, netip.MustParsePrefix(e))
	}
	if err := a.dev.UpsertPeer(p); err != nil {
		t.Fatalf("%s.UpsertPeer(%s): %v", a.name, b.name, err)
	}
}

func pair(t testing.TB, a, b *node) { connect(t, a, b); connect(t, b, a) }

// tcpSink accepts one connection on l, hashes everything it reads (counting
// bytes in progress), then writes the SHA-256 back and closes.
func tcpSink(l net.Listener, progress *atomic.Int64) <-chan error {
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		h := sha256.New()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			h.Write(buf[:n])
			progress.Add(int64(n))
			if err == io.EOF {
				break
			}
			if err != nil {
				done <- fmt.Errorf("sink read: %w", err)
				return
			}
		}
		_, err = c.Write(h.Sum(nil))
		done <- err
	}()
	return done
}

// tcpTransfer sends size bytes of seeded random data from one node to the
// other's port over TCP and checks the SHA-256 the receiver computed.
// progress counts the bytes the receiver has read.
func tcpTransfer(ctx context.Context, t testing.TB, from, to *node, port uint16, size int, seed uint64, progress *atomic.Int64) {
	t.Helper()
	if err := tcpTransferErr(ctx, from, to, port, size, seed, progress); err != nil {
		t.Fatal(err)
	}
}

// tcpTransferErr is tcpTransfer for any goroutine: it returns what failed.
func tcpTransferErr(ctx context.Context, from, to *node, port uint16, size int, seed uint64, progress *atomic.Int64) error {
	dst := netip.AddrPortFrom(to.addr, port)
	l, err := to.host.ListenTCP(dst)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer l.Close()
	if progress == nil {
		progress = new(atomic.Int64)
	}
	sunk := tcpSink(l, progress)

	c, err := from.host.DialContext(ctx, "tcp", dst.String())
	if err != nil {
		return fmt.Errorf("dial %v: %w", dst, err)
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	r := rand.NewChaCha8(seedBytes(seed))
	h := sha256.New()
	buf := make([]byte, 32<<10)
	for left := size; left > 0; {
		n := min(left, len(buf))
		r.Read(buf[:n])
		h.Write(buf[:n])
		if _, err := c.Write(buf[:n]); err != nil {
			return fmt.Errorf("write after %d bytes: %w", size-left, err)
		}
		left -= n
	}
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		return fmt.Errorf("close write: %w", err)
	}
	got := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("reading the receiver's hash: %w (received %d of %d bytes)", err, progress.Load(), size)
	}
	if want := h.Sum(nil); !bytes.Equal(got, want) {
		return fmt.Errorf("end-to-end hash mismatch: receiver %x, sender %x", got, want)
	}
	select {
	case err := <-sunk:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func seedBytes(seed uint64) [32]byte {
	var b [32]byte
	for i := range 4 {
		for j := range 8 {
			b[i*8+j] = byte(seed >> (8 * j))
		}
		seed = seed*6364136223846793005 + 1442695040888963407
	}
	return b
}

// udpEcho checks UDP both ways: to's echo server returns every datagram,
// of sizes up to the largest that fits the overlay MTU, unchanged.
func udpEcho(ctx context.Context, t testing.TB, from, to *node, port uint16) {
	t.Helper()
	srv, err := to.host.ListenUDP(netip.AddrPortFrom(to.addr, port))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			n, a, err := srv.ReadFrom(buf)
			if err != nil {
				return
			}
			srv.WriteTo(buf[:n], a)
		}
	}()
	defer wg.Wait()
	defer srv.Close()

	c, err := from.host.DialUDP(netip.AddrPort{}, netip.AddrPortFrom(to.addr, port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	maxPayload := from.host.MTU() - 28
	r := rand.New(rand.NewPCG(1, 2))
	in := make([]byte, 2048)
	for i, size := range []int{1, 100, 512, 1000, maxPayload, 0, 1400 - 28} {
		if size == 0 {
			size = 1 + r.IntN(maxPayload)
		}
		msg := make([]byte, size)
		for j := range msg {
			msg[j] = byte(r.Uint32())
		}
		msg[0] = byte(i)
		ok := false
		for try := 0; try < 20 && !ok; try++ { // the first may wait for a handshake
			if _, err := c.Write(msg); err != nil {
				t.Fatalf("udp write: %v", err)
			}
			c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			for {
				n, err := c.Read(in)
				if err != nil {
					break // timeout: send again
				}
				if bytes.Equal(in[:n], msg) {
					ok = true
					break
				}
			}
			if ctx.Err() != nil {
				t.Fatal(ctx.Err())
			}
		}
		if !ok {
			t.Fatalf("no echo of a %d-byte datagram", size)
		}
	}
}

// TestTunnelTCPUDP runs real TCP (1 MiB, hash checked end to end) and UDP
// between two netstack hosts through wireguard-go, over real UDP sockets on
// loopback and over the simulated network on the real clock.
func TestTunnelTCPUDP(t *testing.T) {
	const size = 1 << 20
	seed := testenv.Seed(t, 11)
	run := func(t *testing.T, a, b *node) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		udpEcho(ctx, t, a, b, 9000)
		tcpTransfer(ctx, t, a, b, 8080, size, seed, nil)
		tcpTransfer(ctx, t, b, a, 8081, size, seed+1, nil)
		for _, x := range [][2]*node{{a, b}, {b, a}} {
			st, err := x[0].dev.PeerStats(x[1].key.PublicKey())
			if err != nil {
				t.Fatal(err)
			}
			if st.TxBytes < size || st.RxBytes < size || st.LastHandshake.IsZero() {
				t.Fatalf("%s's stats of %s: %+v", x[0].name, x[1].name, st)
			}
		}
	}
	t.Run("UDPBind", func(t *testing.T) {
		ba, bb := NewUDPBind(UDPBindOptions{Seed: seed}), NewUDPBind(UDPBindOptions{Seed: seed + 1})
		a := newUDPNode(t, "a", "10.0.0.1", ba)
		b := newUDPNode(t, "b", "10.0.0.2", bb)
		pair(t, a, b)
		run(t, a, b)
		if ba.Stats().Passed == 0 || ba.Stats().TotalDropped() != 0 {
			t.Fatalf("UDPBind stats: %+v", ba.Stats())
		}
	})
	t.Run("SimBind", func(t *testing.T) {
		n := transporttest.NewNetwork(nil, seed)
		defer n.Close()
		a, ba := newSimNode(t, n, "a", "10.0.0.1")
		b, _ := newSimNode(t, n, "b", "10.0.0.2")
		pair(t, a, b)
		run(t, a, b)
		if s := n.LinkStats(ba.Node(), b.devBindNode(t)); s.Delivered == 0 {
			t.Fatalf("nothing went through the simulated network: %+v", s)
		}
	})
}

func (nd *node) devBindNode(t testing.TB) *transporttest.Node {
	b, ok := nd.dev.Bind().(*wgtest.SimBind)
	if !ok {
		t.Fatalf("%s has no SimBind", nd.name)
	}
	return b.Node()
}

// TestTunnelLossyLink: at 50 ms ± 5 ms one way and 2% loss each way, TCP
// through wireguard-go still completes, hash checked.
func TestTunnelLossyLink(t *testing.T) {
	seed := testenv.Seed(t, 12)
	n := transporttest.NewNetwork(nil, seed)
	defer n.Close()
	a, ba := newSimNode(t, n, "a", "10.0.0.1")
	b, bb := newSimNode(t, n, "b", "10.0.0.2")
	if err := n.SetLinkBoth(ba.Node(), bb.Node(), transporttest.LinkConfig{Latency: 50 * time.Millisecond, Jitter: 5 * time.Millisecond, Loss: 0.02}); err != nil {
		t.Fatal(err)
	}
	pair(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()
	tcpTransfer(ctx, t, a, b, 8080, 256<<10, seed, nil)
	s := n.Stats()
	t.Logf("256 KiB in %v; network: sent %d, delivered %d, lost %d", time.Since(start).Round(time.Millisecond), s.Sent, s.Delivered, s.Dropped[transporttest.DropLoss])
	if s.Dropped[transporttest.DropLoss] == 0 {
		t.Fatal("the link lost nothing: the test did not exercise loss")
	}
}

// partitionBody streams TCP from a to b, cuts the path, checks that progress
// stops for a whole observation window, heals, and checks that the transfer
// resumes and completes with the right hash. The same body runs over the
// simulated network and over impaired real sockets.
func partitionBody(t *testing.T, a, b *node, cut, heal func()) {
	const size = 4 << 20
	seed := testenv.Seed(t, 13)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var progress atomic.Int64
	done := make(chan error, 1)
	go func() { done <- tcpTransferErr(ctx, a, b, 8080, size, seed, &progress) }()
	finished := false
	defer func() { // on any failure, stop the transfer before returning
		cancel()
		if !finished {
			<-done
		}
	}()

	waitUntil(t, 30*time.Second, "transfer started", func() bool { return progress.Load() >= 256<<10 })
	cut()
	// Progress must stop within 10 s (what was in flight or buffered before
	// the cut drains), and then stay still for a whole 1.5 s window.
	const window = 1500 * time.Millisecond
	stalledAt := waitStill(t, &progress, window, 10*time.Second)
	if stalledAt >= size {
		t.Fatalf("the transfer finished before the partition took effect; make it longer")
	}
	heal()
	waitUntil(t, 30*time.Second, "progress after heal", func() bool { return progress.Load() > stalledAt })
	err := <-done
	finished = true
	if err != nil {
		t.Fatalf("transfer after heal: %v (%d of %d bytes)", err, progress.Load(), size)
	}
	if progress.Load() != size {
		t.Fatalf("received %d bytes, want %d", progress.Load(), size)
	}
	t.Logf("stalled at %d bytes under the partition, then completed", stalledAt)
}

// waitUntil polls cond every 10 ms until it holds or timeout passes.
func waitUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not a wait for state
	}
}

// waitStill polls v until it has not changed for a whole window, and
// returns its value; it fails if that does not happen within timeout.
func waitStill(t testing.TB, v *atomic.Int64, window, timeout time.Duration) int64 {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last, since := v.Load(), time.Now()
	for {
		time.Sleep(20 * time.Millisecond) // polling interval
		now := time.Now()
		if cur := v.Load(); cur != last {
			last, since = cur, now
		} else if now.Sub(since) >= window {
			return last
		}
		if now.After(deadline) {
			t.Fatalf("still progressing %v after the partition (at %d bytes)", timeout, last)
		}
	}
}

// smallBuffers keeps TCP's window, and so what a partition loses in
// flight, small: gVisor recovers from a large loss slowly, one segment at a
// time, which would only make the test long.
func smallBuffers(o *netstack.Options) {
	o.TCPSendBuffer = 128 << 10
	o.TCPReceiveBuffer = 128 << 10
	o.DisableModerateReceiveBuffer = true
}

func TestTunnelPartition(t *testing.T) {
	t.Run("SimBind", func(t *testing.T) {
		n := transporttest.NewNetwork(nil, testenv.Seed(t, 14))
		defer n.Close()
		a, ba := newSimNode(t, n, "a", "10.0.0.1", smallBuffers)
		b, bb := newSimNode(t, n, "b", "10.0.0.2", smallBuffers)
		if err := n.SetLinkBoth(ba.Node(), bb.Node(), transporttest.LinkConfig{Latency: 5 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		pair(t, a, b)
		partitionBody(t, a, b,
			func() { n.Partition([]*transporttest.Node{ba.Node()}, []*transporttest.Node{bb.Node()}) },
			n.Heal)
		t.Logf("network %+v; binds %+v %+v", n.Stats(), ba.Stats(), bb.Stats())
		if d := n.LinkStats(ba.Node(), bb.Node()).Dropped[transporttest.DropPartition]; d == 0 {
			t.Fatal("the partition dropped nothing")
		}
	})
	t.Run("UDPBind", func(t *testing.T) {
		seed := testenv.Seed(t, 15)
		ba := NewUDPBind(UDPBindOptions{Seed: seed})
		bb := NewUDPBind(UDPBindOptions{Seed: seed + 1})
		imp := Impairment{Latency: 5 * time.Millisecond}
		if err := errors.Join(ba.SetDefault(imp), bb.SetDefault(imp)); err != nil {
			t.Fatal(err)
		}
		a := newUDPNode(t, "a", "10.0.0.1", ba, smallBuffers)
		b := newUDPNode(t, "b", "10.0.0.2", bb, smallBuffers)
		pair(t, a, b)
		partitionBody(t, a, b,
			func() { ba.Cut(b.endpoint); bb.Cut() },
			func() { ba.Heal(); bb.Heal() })
		// b only acknowledges, and nothing reaches it to acknowledge while
		// cut, so only a's drops are certain.
		if ba.PeerStats(b.endpoint).Dropped[UDPDropPartition] == 0 {
			t.Fatalf("the partition dropped nothing: %+v / %+v", ba.Stats(), bb.Stats())
		}
	})
}

// TestUDPBindLatency: the latency a UDPBind adds to its sends shows in the
// round trip through the tunnel (both legs delayed).
func TestUDPBindLatency(t *testing.T) {
	ba := NewUDPBind(UDPBindOptions{Seed: 1})
	bb := NewUDPBind(UDPBindOptions{Seed: 2})
	a := newUDPNode(t, "a", "10.0.0.1", ba)
	b := newUDPNode(t, "b", "10.0.0.2", bb)
	pair(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	udpEcho(ctx, t, a, b, 9000) // handshake done
	rtt := func(port uint16) time.Duration {
		l, err := b.host.ListenTCP(netip.AddrPortFrom(b.addr, port))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go func() {
			if c, err := l.Accept(); err == nil {
				c.Close()
			}
		}()
		start := time.Now()
		c, err := a.host.DialContext(ctx, "tcp", netip.AddrPortFrom(b.addr, port).String())
		if err != nil {
			t.Fatal(err)
		}
		d := time.Since(start)
		c.Close()
		return d
	}
	base := rtt(7000)
	const lat = 40 * time.Millisecond
	ba.SetPeer(b.endpoint, Impairment{Latency: lat})
	bb.SetDefault(Impairment{Latency: lat})
	slow := rtt(7001)
	if slow < 2*lat || slow < base+lat {
		t.Fatalf("TCP connect took %v with %v each way (%v without)", slow, lat, base)
	}
	if ba.Stats().Delayed == 0 || bb.Stats().Delayed == 0 {
		t.Fatalf("nothing delayed: %+v %+v", ba.Stats(), bb.Stats())
	}
	t.Logf("TCP connect through the tunnel: %v, %v with %v each way", base, slow, lat)
}

// TestMoveAllowedIPNetstack: three nodes; a /32 VIP on b and c, routed by a
// to b, moves to c with MoveAllowedIP, and a's new TCP connections and UDP
// datagrams to the VIP then reach c.
func TestMoveAllowedIPNetstack(t *testing.T) {
	n := transporttest.NewNetwork(nil, testenv.Seed(t, 16))
	defer n.Close()
	a, _ := newSimNode(t, n, "a", "10.0.0.1")
	b, _ := newSimNode(t, n, "b", "10.0.0.2")
	c, _ := newSimNode(t, n, "c", "10.0.0.3")
	const vip = "10.0.0.100"
	vipAddr := netip.MustParseAddr(vip)
	connect(t, a, b, vip+"/32")
	connect(t, a, c)
	connect(t, b, a)
	connect(t, c, a)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, x := range []*node{b, c} {
		if err := x.host.AddAddress(netip.PrefixFrom(vipAddr, 32)); err != nil {
			t.Fatal(err)
		}
		l, err := x.host.ListenTCP(netip.AddrPortFrom(vipAddr, 80))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		u, err := x.host.ListenUDP(netip.AddrPortFrom(vipAddr, 53))
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		name := x.name
		wg.Add(2)
		go func() {
			defer wg.Done()
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				conn.Write([]byte(name))
				conn.Close()
			}
		}()
		go func() {
			defer wg.Done()
			buf := make([]byte, 1500)
			for {
				_, from, err := u.ReadFrom(buf)
				if err != nil {
					return
				}
				u.WriteTo([]byte(name), from)
			}
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	who := func() (tcp, udp string) {
		conn, err := a.host.DialContext(ctx, "tcp", vip+":80")
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(conn)
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		u, err := a.host.DialUDP(netip.AddrPort{}, netip.AddrPortFrom(vipAddr, 53))
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		buf := make([]byte, 64)
		for try := 0; ; try++ {
			u.Write([]byte("who"))
			u.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			if k, err := u.Read(buf); err == nil {
				return string(got), string(buf[:k])
			}
			if try == 20 {
				t.Fatal("no UDP answer from the VIP")
			}
		}
	}
	if tcp, udp := who(); tcp != "b" || udp != "b" {
		t.Fatalf("before the move the VIP answered tcp=%q udp=%q, want b", tcp, udp)
	}
	if err := a.dev.MoveAllowedIP(netip.PrefixFrom(vipAddr, 32), c.key.PublicKey()); err != nil {
		t.Fatal(err)
	}
	if tcp, udp := who(); tcp != "c" || udp != "c" {
		t.Fatalf("after the move the VIP answered tcp=%q udp=%q, want c", tcp, udp)
	}
	if err := a.dev.MoveAllowedIP(netip.PrefixFrom(vipAddr, 32), b.key.PublicKey()); err != nil {
		t.Fatal(err)
	}
	if tcp, udp := who(); tcp != "b" || udp != "b" {
		t.Fatalf("after moving back the VIP answered tcp=%q udp=%q, want b", tcp, udp)
	}
}

// TestUDPBindDeviceCloseNoLeak: a device on real sockets, with delayed
// packets pending in its UDPBind, leaves no goroutine after Close.
func TestUDPBindDeviceCloseNoLeak(t *testing.T) {
	base := goleak.IgnoreCurrent()
	func() {
		ba := NewUDPBind(UDPBindOptions{Seed: 1})
		ba.SetDefault(Impairment{Latency: time.Second})
		bb := NewUDPBind(UDPBindOptions{Seed: 2})
		a := newUDPNode(t, "a", "10.0.0.1", ba)
		b := newUDPNode(t, "b", "10.0.0.2", bb)
		pair(t, a, b)
		// The handshake initiation sits in ba's delay queue.
		c, err := a.host.DialUDP(netip.AddrPort{}, netip.AddrPortFrom(b.addr, 9))
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("x"))
		c.Close()
		waitUntil(t, 5*time.Second, "a delayed packet", func() bool { return ba.Delayed() > 0 })
		a.dev.Close()
		b.dev.Close()
		if ba.Delayed() != 0 || ba.Stats().Dropped[UDPDropClosed] == 0 {
			t.Fatalf("Close kept delayed packets: %d, %+v", ba.Delayed(), ba.Stats())
		}
	}()
	goleak.VerifyNone(t, base)
}

// TestConfigurePortInUse: a listen port that cannot be bound fails with
// ErrDevice, and the device keeps its previous port and peers.
func TestConfigurePortInUse(t *testing.T) {
	busy, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero})
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	port := uint16(busy.LocalAddr().(*net.UDPAddr).Port)
	a := newUDPNode(t, "a", "10.0.0.1", NewUDPBind(UDPBindOptions{}))
	connect(t, a, &node{name: "b", key: GeneratePrivateKey(), addr: netip.MustParseAddr("10.0.0.2"), endpoint: netip.MustParseAddrPort("127.0.0.1:9")})
	before, _ := a.dev.Config()
	want := before.Clone()
	want.ListenPort = port
	if err := a.dev.Configure(want); !errors.Is(err, ErrDevice) {
		t.Fatalf("Configure(port in use) = %v", err)
	}
	after, err := a.dev.Config()
	if err != nil {
		t.Fatal(err)
	}
	if after.ListenPort != before.ListenPort || len(after.Peers) != 1 {
		t.Fatalf("after a failed rebind: %+v, before %+v", after, before)
	}
	if _, err := NewDevice(newHost(t, netip.MustParseAddr("10.0.0.3")), Config{PrivateKey: GeneratePrivateKey(), ListenPort: port}, Options{Bind: NewUDPBind(UDPBindOptions{})}); !errors.Is(err, ErrDevice) {
		t.Fatalf("NewDevice(port in use) = %v", err)
	}
}

// TestDeviceLogger: wireguard-go's log lines go to the slog.Logger given,
// never to stdout.
func TestDeviceLogger(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	h := &recordHandler{add: func(s string) { mu.Lock(); lines = append(lines, s); mu.Unlock() }}
	n := transporttest.NewNetwork(nil, 1)
	defer n.Close()
	io, host := transporttest.NewChanPair(transporttest.ChanPairOptions{})
	defer host.Close()
	d, err := NewDevice(io, Config{PrivateKey: GeneratePrivateKey()}, Options{Bind: wgtest.NewSimBind(n, "a"), Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(lines) == 0 {
		t.Fatal("nothing logged")
	}
}

type recordHandler struct{ add func(string) }

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.add(r.Level.String() + " " + r.Message)
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }
