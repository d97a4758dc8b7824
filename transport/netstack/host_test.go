package netstack_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/netstack"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testTimeout bounds every blocking step of a test, so that a bug fails
// the test instead of hanging it.
const testTimeout = 30 * time.Second

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(time.Millisecond)
	}
}

type family struct {
	name   string
	a, b   netip.Addr
	tcpNet string
	udpNet string
}

var families = []family{
	{"IPv4", v4A, v4B, "tcp4", "udp4"},
	{"IPv6", v6A, v6B, "tcp6", "udp6"},
}

// TestTCPTransfer sends 1 MiB each way over real TCP between two hosts and
// checks both directions end to end with SHA-256.
func TestTCPTransfer(t *testing.T) {
	seed := testenv.Seed(t, 1)
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			a, b := hostPair(t, []netip.Addr{f.a}, []netip.Addr{f.b}, nil)
			tcpEcho(t, a, b, f, 1<<20, seed)
			// Every packet one side sent reaches the other (the last ACKs
			// may still be in the pump).
			var sa, sb netstack.Stats
			eventually(t, testTimeout, "the hosts' stats to agree", func() bool {
				sa, sb = a.Stats(), b.Stats()
				return sa.OutPackets > 0 && sa.OutPackets == sb.InPackets && sb.OutPackets == sa.InPackets
			})
			if sa.OutBytes < 1<<20 || sb.OutBytes < 1<<20 {
				t.Errorf("fewer bytes out than sent: a %d, b %d", sa.OutBytes, sb.OutBytes)
			}
		})
	}
}

// TestTCPUnderLoss runs the 1 MiB echo over a pump that loses 2% of the
// packets each way, and over hosts whose outbound queue overflows.
func TestTCPUnderLoss(t *testing.T) {
	seed := testenv.Seed(t, 7)
	for _, f := range families {
		t.Run(f.name+"/loss=2%", func(t *testing.T) {
			a, b, p := lossyHostPair(t, []netip.Addr{f.a}, []netip.Addr{f.b}, nil, 0.02, seed)
			tcpEcho(t, a, b, f, 1<<20, seed)
			if p.dropped.Load() == 0 {
				t.Error("the pump dropped nothing")
			}
			if r := a.Stack().Stats().TCP.Retransmits.Value() + b.Stack().Stats().TCP.Retransmits.Value(); r == 0 {
				t.Error("no retransmissions under loss")
			}
		})
		t.Run(f.name+"/queue=8", func(t *testing.T) {
			if !testenv.Long() {
				// About 1 run in 20 of this case stalled for good with the
				// pinned gVisor (reno, no data in flight, no timer): a
				// gVisor TCP bug under local drops that this package
				// cannot fix. It runs with VIPKIT_LONG=1.
				t.Skip("known rare gVisor stall; set VIPKIT_LONG=1")
			}
			a, b := hostPair(t, []netip.Addr{f.a}, []netip.Addr{f.b}, func(o *netstack.Options) { o.Queue = 8; o.BatchSize = 1 })
			tcpEcho(t, a, b, f, 1<<20, seed)
			if d := a.Stats().OutQueueFull + b.Stats().OutQueueFull; d == 0 {
				t.Log("the 8-packet queue never overflowed") // possible on a fast pump
			}
		})
	}
}

// tcpEcho connects a to an echo server on b, sends size seeded random
// bytes, and checks what the server received and what came back with
// SHA-256.
func tcpEcho(t *testing.T, a, b *netstack.Host, f family, size int, seed uint64) {
	t.Helper()
	ln, err := b.ListenTCP(netip.AddrPortFrom(f.b, 8080))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	payload := make([]byte, size)
	rng := rand.New(rand.NewPCG(seed, uint64(len(f.name))))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	want := sha256.Sum256(payload)

	// The server hashes what it receives and echoes it back.
	type result struct {
		sum [32]byte
		n   int64
		err error
	}
	srv := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srv <- result{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(testTimeout))
		h := sha256.New()
		n, err := io.Copy(io.MultiWriter(c, h), c)
		if err == nil {
			err = c.(interface{ CloseWrite() error }).CloseWrite()
		}
		var r result
		copy(r.sum[:], h.Sum(nil))
		r.n, r.err = n, err
		srv <- r
	}()

	c, err := a.DialContext(ctxT(t), f.tcpNet, netip.AddrPortFrom(f.b, 8080).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(testTimeout))
	if got := c.RemoteAddr().String(); got != netip.AddrPortFrom(f.b, 8080).String() {
		t.Errorf("RemoteAddr = %s", got)
	}
	if ap := netip.MustParseAddrPort(c.LocalAddr().String()); ap.Addr() != f.a {
		t.Errorf("LocalAddr = %s, want address %v", c.LocalAddr(), f.a)
	}
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		if err == nil {
			err = c.(interface{ CloseWrite() error }).CloseWrite()
		}
		werr <- err
	}()
	h := sha256.New()
	n, err := io.Copy(h, c)
	if err != nil {
		t.Fatalf("client read after %d bytes: %v", n, err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("client write: %v", err)
	}
	r := <-srv
	if r.err != nil {
		t.Fatalf("server: %v", r.err)
	}
	if r.n != int64(size) || r.sum != want {
		t.Errorf("server got %d bytes, hash %x; want %d, %x", r.n, r.sum, size, want)
	}
	if got := h.Sum(nil); n != int64(size) || !bytes.Equal(got, want[:]) {
		t.Errorf("client got %d bytes back, hash %x; want %d, %x", n, got, size, want)
	}
}

// TestUDPExchange sends numbered datagrams from a connected UDP socket to an
// unconnected one that echoes them, over IPv4 and IPv6.
func TestUDPExchange(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			a, b := hostPair(t, []netip.Addr{f.a}, []netip.Addr{f.b}, nil)
			srvAddr := netip.AddrPortFrom(f.b, 5353)
			pc, err := b.ListenUDP(srvAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close()
			echoed := make(chan error, 1)
			go func() {
				buf := make([]byte, 2048)
				for {
					pc.SetDeadline(time.Now().Add(testTimeout))
					n, from, err := pc.ReadFrom(buf)
					if err != nil {
						echoed <- err
						return
					}
					if _, err := pc.WriteTo(buf[:n], from); err != nil {
						echoed <- err
						return
					}
				}
			}()

			c, err := a.DialContext(ctxT(t), f.udpNet, srvAddr.String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(testTimeout))
			buf := make([]byte, 2048)
			// Sizes up to the largest datagram that fits the MTU unfragmented.
			maxPayload := netstack.DefaultMTU - 8 - 20
			if f.a.Is6() {
				maxPayload = netstack.DefaultMTU - 8 - 40
			}
			for i, size := range []int{1, 8, 100, 512, 1000, maxPayload} {
				msg := make([]byte, size)
				for j := range msg {
					msg[j] = byte(i + j)
				}
				if size >= 4 {
					binary.BigEndian.PutUint32(msg, uint32(i))
				}
				if _, err := c.Write(msg); err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
				n, err := c.Read(buf)
				if err != nil {
					t.Fatalf("read %d: %v", i, err)
				}
				if !bytes.Equal(buf[:n], msg) {
					t.Fatalf("datagram %d: got %d bytes, want %d", i, n, size)
				}
			}
			pc.Close()
			if err := <-echoed; !errors.Is(err, net.ErrClosed) && err.Error() != "endpoint is closed for receive" {
				t.Logf("echo server ended with %v", err)
			}
		})
	}
}

// TestDualStackListener checks that a listener on the zero address accepts
// IPv4 and IPv6 connections.
func TestDualStackListener(t *testing.T) {
	a, b := hostPair(t, []netip.Addr{v4A, v6A}, []netip.Addr{v4B, v6B}, nil)
	ln, err := b.ListenTCP(netip.AddrPortFrom(netip.Addr{}, 9000))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	for _, dst := range []netip.Addr{v4B, v6B} {
		c, err := a.DialTCP(ctxT(t), netip.AddrPortFrom(dst, 9000))
		if err != nil {
			t.Fatalf("dial %v: %v", dst, err)
		}
		c.SetDeadline(time.Now().Add(testTimeout))
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(got) != "hi" {
			t.Errorf("dial %v: read %q, %v", dst, got, err)
		}
	}
}

// TestAddRemoveAddress adds a VIP /32 at run time, connects to it, removes
// it, and checks that connections to it then fail.
func TestAddRemoveAddress(t *testing.T) {
	vip := netip.MustParseAddr("10.99.0.7")
	vip6 := netip.MustParseAddr("fd99::7")
	a, b := hostPair(t, []netip.Addr{v4A, v6A}, []netip.Addr{v4B, v6B}, nil)

	// Before the VIP is added, b cannot bind to it.
	if _, err := b.ListenTCP(netip.AddrPortFrom(vip, 80)); !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Fatalf("listen on a VIP not yet added: %v, want EADDRNOTAVAIL", err)
	}
	ln, err := b.ListenTCP(netip.AddrPortFrom(netip.Addr{}, 80))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "you reached %s", c.LocalAddr())
			c.Close()
		}
	}()
	dial := func(to netip.Addr, timeout time.Duration) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		c, err := a.DialTCP(ctx, netip.AddrPortFrom(to, 80))
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(testTimeout))
		got, err := io.ReadAll(c)
		return string(got), err
	}

	for _, v := range []netip.Addr{vip, vip6} {
		before := b.Stack().Stats().IP.InvalidDestinationAddressesReceived.Value()
		if _, err := dial(v, 200*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("dial %v before AddAddress: %v, want a timeout", v, err)
		}
		if after := b.Stack().Stats().IP.InvalidDestinationAddressesReceived.Value(); after <= before {
			t.Errorf("b did not count the SYNs to %v as invalid destinations (%d → %d)", v, before, after)
		}

		if err := b.AddAddress(netip.PrefixFrom(v, v.BitLen())); err != nil {
			t.Fatal(err)
		}
		if err := b.AddAddress(netip.PrefixFrom(v, v.BitLen())); !errors.Is(err, netstack.ErrAddressExists) {
			t.Errorf("second AddAddress: %v, want ErrAddressExists", err)
		}
		got, err := dial(v, testTimeout)
		if want := "you reached " + netip.AddrPortFrom(v, 80).String(); err != nil || got != want {
			t.Fatalf("dial %v after AddAddress: %q, %v; want %q", v, got, err, want)
		}
		if !hasPrefix(b.Addresses(), v) {
			t.Errorf("Addresses() = %v lacks %v", b.Addresses(), v)
		}

		if err := b.RemoveAddress(v); err != nil {
			t.Fatal(err)
		}
		if err := b.RemoveAddress(v); !errors.Is(err, netstack.ErrNoSuchAddress) {
			t.Errorf("second RemoveAddress: %v, want ErrNoSuchAddress", err)
		}
		if _, err := dial(v, 200*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("dial %v after RemoveAddress: %v, want a timeout", v, err)
		}
		if hasPrefix(b.Addresses(), v) {
			t.Errorf("Addresses() = %v still has %v", b.Addresses(), v)
		}
	}
	// The host's own addresses still work.
	if _, err := dial(v4B, testTimeout); err != nil {
		t.Errorf("dial own address after removing the VIP: %v", err)
	}
}

func hasPrefix(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Addr() == a {
			return true
		}
	}
	return false
}

func TestAddressErrors(t *testing.T) {
	h := newHost(t, netstack.Options{Addrs: []netip.Addr{v4A}})
	for _, p := range []netip.Prefix{
		{},
		netip.MustParsePrefix("0.0.0.0/32"),
		netip.MustParsePrefix("::/128"),
		netip.MustParsePrefix("224.0.0.1/32"),
		netip.MustParsePrefix("ff02::1/128"),
		netip.MustParsePrefix("255.255.255.255/32"),
	} {
		if err := h.AddAddress(p); !errors.Is(err, netstack.ErrInvalidAddress) {
			t.Errorf("AddAddress(%v) = %v, want ErrInvalidAddress", p, err)
		}
	}
	if err := h.AddAddress(netip.PrefixFrom(v4A, 32)); !errors.Is(err, netstack.ErrAddressExists) {
		t.Errorf("AddAddress(own) = %v, want ErrAddressExists", err)
	}
	if err := h.RemoveAddress(v4B); !errors.Is(err, netstack.ErrNoSuchAddress) {
		t.Errorf("RemoveAddress(absent) = %v, want ErrNoSuchAddress", err)
	}
	// A v4-mapped prefix is taken as the IPv4 address.
	if err := h.AddAddress(netip.MustParsePrefix("::ffff:10.1.1.1/128")); err != nil {
		t.Errorf("AddAddress(v4-mapped) = %v", err)
	}
	if !hasPrefix(h.Addresses(), netip.MustParseAddr("10.1.1.1")) {
		t.Errorf("Addresses() = %v lacks 10.1.1.1", h.Addresses())
	}
	small := newHost(t, netstack.Options{MTU: 1000, Addrs: []netip.Addr{v4A}})
	if err := small.AddAddress(netip.PrefixFrom(v6A, 128)); !errors.Is(err, netstack.ErrInvalidAddress) {
		t.Errorf("AddAddress(IPv6) with MTU 1000 = %v, want ErrInvalidAddress", err)
	}
}

func TestOptionsValidation(t *testing.T) {
	bad := []netstack.Options{
		{MTU: 67},
		{MTU: 65536},
		{MTU: -1},
		{BatchSize: -1},
		{BatchSize: netstack.MaxBatchSize + 1},
		{Queue: -5},
		{ListenBacklog: -1},
		{TCPSendBuffer: -1},
		{TCPReceiveBuffer: 100},
		{CongestionControl: "bbr"},
		{Addrs: []netip.Addr{{}}},
		{Addrs: []netip.Addr{netip.IPv4Unspecified()}},
		{Addrs: []netip.Addr{v4A, v4A}},
		{Addrs: []netip.Addr{v6A}, MTU: 1279},
		{Addrs: []netip.Addr{netip.MustParseAddr("fe80::1%eth0")}},
	}
	for _, o := range bad {
		if h, err := netstack.New(o); !errors.Is(err, netstack.ErrInvalidOptions) {
			if h != nil {
				h.Close()
			}
			t.Errorf("New(%+v) = %v, want ErrInvalidOptions", o, err)
		}
	}
	h := newHost(t, netstack.Options{})
	if h.MTU() != netstack.DefaultMTU || h.BatchSize() != netstack.DefaultBatchSize {
		t.Errorf("defaults: MTU %d, BatchSize %d", h.MTU(), h.BatchSize())
	}
	if h.NICID() == 0 || !h.Stack().HasNIC(h.NICID()) {
		t.Errorf("NICID %d not in the stack", h.NICID())
	}
	h2 := newHost(t, netstack.Options{MTU: 9000, BatchSize: 1, Queue: 1, CongestionControl: "reno", TCPSendBuffer: 8 << 20, TCPReceiveBuffer: 64 << 10, DisableSACK: true})
	if h2.MTU() != 9000 || h2.BatchSize() != 1 {
		t.Errorf("MTU %d, BatchSize %d", h2.MTU(), h2.BatchSize())
	}
}

// TestDialErrors checks that the stack's errors come back as errnos and
// bad arguments as this package's sentinels.
func TestDialErrors(t *testing.T) {
	a, _ := hostPair(t, []netip.Addr{v4A, v6A}, []netip.Addr{v4B, v6B}, nil)
	ctx := ctxT(t)
	if _, err := a.DialContext(ctx, "tcp", "10.0.0.2:81"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial closed port: %v, want ECONNREFUSED", err)
	}
	if _, err := a.DialContext(ctx, "tcp6", "[fd00::2]:81"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial closed IPv6 port: %v, want ECONNREFUSED", err)
	}
	var opErr *net.OpError
	if _, err := a.DialContext(ctx, "tcp", "10.0.0.2:81"); !errors.As(err, &opErr) || opErr.Op != "dial" {
		t.Errorf("dial error %v is not a *net.OpError", err)
	}
	for _, c := range []struct{ network, addr string }{
		{"tcp4", "[fd00::2]:80"},
		{"udp6", "10.0.0.2:80"},
		{"tcp", "example.com:80"},
		{"tcp", "10.0.0.2"},
		{"tcp", "10.0.0.2:0"},
		{"tcp", "0.0.0.0:80"},
	} {
		if _, err := a.DialContext(ctx, c.network, c.addr); !errors.Is(err, netstack.ErrInvalidAddress) {
			t.Errorf("DialContext(%s, %s) = %v, want ErrInvalidAddress", c.network, c.addr, err)
		}
	}
	for _, n := range []string{"ip", "unix", "sctp", ""} {
		if _, err := a.DialContext(ctx, n, "10.0.0.2:80"); !errors.Is(err, netstack.ErrUnsupportedNetwork) {
			t.Errorf("DialContext(%q) = %v, want ErrUnsupportedNetwork", n, err)
		}
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.DialContext(cancelled, "tcp", "10.0.0.2:80"); !errors.Is(err, context.Canceled) {
		t.Errorf("dial with a cancelled context: %v", err)
	}
	// A SYN into the void: the context bounds the handshake.
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, err := a.DialContext(short, "tcp", "10.0.0.77:80"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("dial to nowhere: %v, want DeadlineExceeded", err)
	}
	// Binding to an address the host lacks.
	if _, err := a.DialTCPFrom(ctx, netip.MustParseAddrPort("10.5.5.5:1000"), netip.MustParseAddrPort("10.0.0.2:81")); !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Errorf("dial from a foreign address: %v, want EADDRNOTAVAIL", err)
	}
	if _, err := a.ListenUDP(netip.MustParseAddrPort("10.5.5.5:53")); !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Errorf("ListenUDP on a foreign address: %v, want EADDRNOTAVAIL", err)
	}
	l1, err := a.ListenTCP(netip.MustParseAddrPort("10.0.0.1:7000"))
	if err != nil {
		t.Fatal(err)
	}
	defer l1.Close()
	if _, err := a.ListenTCP(netip.MustParseAddrPort("10.0.0.1:7000")); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("second listener on a port: %v, want EADDRINUSE", err)
	}
}

// TestUDPUnconnected uses DialUDP with a zero remote (an unconnected
// socket) and ListenUDP on the zero address with a picked port.
func TestUDPUnconnected(t *testing.T) {
	a, b := hostPair(t, []netip.Addr{v4A, v6A}, []netip.Addr{v4B, v6B}, nil)
	srv, err := b.ListenUDP(netip.AddrPort{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	port := uint16(srv.LocalAddr().(*net.UDPAddr).Port)
	if port == 0 {
		t.Fatalf("ListenUDP picked no port: %v", srv.LocalAddr())
	}
	c, err := a.DialUDP(netip.AddrPortFrom(netip.Addr{}, 4444), netip.AddrPort{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc := c.(net.PacketConn)
	for _, dst := range []netip.Addr{v4B, v6B} {
		to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, port))
		if _, err := pc.WriteTo([]byte("ping "+dst.String()), to); err != nil {
			t.Fatalf("WriteTo %v: %v", to, err)
		}
		srv.SetReadDeadline(time.Now().Add(testTimeout))
		buf := make([]byte, 100)
		n, from, err := srv.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		if string(buf[:n]) != "ping "+dst.String() {
			t.Errorf("got %q", buf[:n])
		}
		if ap := from.(*net.UDPAddr).AddrPort(); ap.Port() != 4444 || ap.Addr().Unmap().Is4() != dst.Is4() {
			t.Errorf("from %v, want port 4444 of the family of %v", from, dst)
		}
	}
}

// TestLocalLoopback checks that a host reaches its own address without the
// packet leaving (HandleLocal).
func TestLocalLoopback(t *testing.T) {
	h := newHost(t, netstack.Options{Addrs: []netip.Addr{v4A}})
	ln, err := h.ListenTCP(netip.AddrPortFrom(v4A, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Write([]byte("self"))
			c.Close()
		}
	}()
	c, err := h.DialTCP(ctxT(t), netip.AddrPortFrom(v4A, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(testTimeout))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "self" {
		t.Fatalf("read %q, %v", got, err)
	}
	if s := h.Stats(); s.OutPackets != 0 || s.OutQueued != 0 {
		t.Errorf("local traffic left through the PacketIO: %+v", s)
	}
}

func TestReservePort(t *testing.T) {
	h := newHost(t, netstack.Options{Addrs: []netip.Addr{v4A, v6A}})
	p, err := h.ReservePort("tcp", netip.Addr{}, 8080)
	if err != nil || p != 8080 {
		t.Fatalf("ReservePort(8080) = %d, %v", p, err)
	}
	if _, err := h.ListenTCP(netip.AddrPortFrom(v4A, 8080)); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("listen on a reserved port: %v, want EADDRINUSE", err)
	}
	if _, err := h.ListenTCP(netip.AddrPortFrom(v6A, 8080)); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("listen on a reserved port (IPv6): %v, want EADDRINUSE", err)
	}
	if _, err := h.ReservePort("tcp", netip.Addr{}, 8080); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("second reservation: %v, want EADDRINUSE", err)
	}
	// UDP is a separate space.
	if ln, err := h.ListenUDP(netip.AddrPortFrom(v4A, 8080)); err != nil {
		t.Errorf("UDP on a TCP-reserved port: %v", err)
	} else {
		ln.Close()
	}
	if err := h.ReleasePort("tcp", netip.Addr{}, 8080); err != nil {
		t.Fatal(err)
	}
	if err := h.ReleasePort("tcp", netip.Addr{}, 8080); !errors.Is(err, netstack.ErrNotReserved) {
		t.Errorf("second release: %v, want ErrNotReserved", err)
	}
	ln, err := h.ListenTCP(netip.AddrPortFrom(v4A, 8080))
	if err != nil {
		t.Fatalf("listen after release: %v", err)
	}
	ln.Close()

	// An ephemeral reservation on one address.
	ep, err := h.ReservePort("udp4", v4A, 0)
	if err != nil || ep == 0 {
		t.Fatalf("ephemeral reservation: %d, %v", ep, err)
	}
	if _, err := h.ListenUDP(netip.AddrPortFrom(v4A, ep)); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("listen on reserved ephemeral port %d: %v", ep, err)
	}
	// An already bound port cannot be reserved.
	ln2, err := h.ListenTCP(netip.AddrPortFrom(v4A, 9999))
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	if _, err := h.ReservePort("tcp", v4A, 9999); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("reserve a bound port: %v, want EADDRINUSE", err)
	}
	if _, err := h.ReservePort("sctp", v4A, 1); !errors.Is(err, netstack.ErrUnsupportedNetwork) {
		t.Errorf("reserve sctp: %v", err)
	}
	h.Close()
	if _, err := h.ReservePort("tcp", v4A, 1); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("reserve after Close: %v", err)
	}
}

// TestSpoofingAndPromiscuous covers the hairpin case: a client sends from a
// VIP it does not own (spoofing), and a host accepts a connection to an
// address it does not own (promiscuous).
func TestSpoofingAndPromiscuous(t *testing.T) {
	vip := netip.MustParseAddr("10.99.0.1")
	noLocal := func(o *netstack.Options) { o.DisableHandleLocal = true }
	a, b := hostPair(t, []netip.Addr{v4A}, []netip.Addr{v4B}, noLocal)

	// b accepts connections to any address when promiscuous.
	ln, err := b.ListenTCP(netip.AddrPortFrom(netip.IPv4Unspecified(), 443))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s→%s", c.RemoteAddr(), c.LocalAddr())
			c.Close()
		}
	}()
	other := netip.MustParseAddrPort("10.77.0.1:443")
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	if _, err := a.DialTCP(short(), other); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial a nonlocal address of b: %v, want a timeout", err)
	}
	if err := b.SetPromiscuous(true); err != nil {
		t.Fatal(err)
	}
	// Promiscuous alone accepts the SYN, but the reply comes from an
	// address b does not own: that takes spoofing too.
	if _, err := a.DialTCP(short(), other); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial a nonlocal address of a promiscuous but not spoofing b: %v, want a timeout", err)
	}
	if err := b.SetSpoofing(true); err != nil {
		t.Fatal(err)
	}
	c, err := a.DialTCP(ctxT(t), other)
	if err != nil {
		t.Fatalf("dial a nonlocal address of a promiscuous b: %v", err)
	}
	c.SetDeadline(time.Now().Add(testTimeout))
	got, _ := io.ReadAll(c)
	c.Close()
	if want := fmt.Sprintf("%s→%s", c.LocalAddr(), other); string(got) != want {
		t.Errorf("got %q, want %q", got, want)
	}

	// a sends from the VIP only with spoofing on.
	from := netip.AddrPortFrom(vip, 3000)
	if _, err := a.DialTCPFrom(ctxT(t), from, netip.AddrPortFrom(v4B, 443)); !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Fatalf("dial from a nonlocal VIP without spoofing: %v, want EADDRNOTAVAIL", err)
	}
	if err := a.SetSpoofing(true); err != nil {
		t.Fatal(err)
	}
	// Replies to the VIP must come back to a: it accepts them when promiscuous.
	if err := a.SetPromiscuous(true); err != nil {
		t.Fatal(err)
	}
	c, err = a.DialTCPFrom(ctxT(t), from, netip.AddrPortFrom(v4B, 443))
	if err != nil {
		t.Fatalf("dial from a nonlocal VIP with spoofing: %v", err)
	}
	c.SetDeadline(time.Now().Add(testTimeout))
	got, _ = io.ReadAll(c)
	c.Close()
	if want := fmt.Sprintf("%s→%s", from, netip.AddrPortFrom(v4B, 443)); string(got) != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestClosedHost(t *testing.T) {
	h := newHost(t, netstack.Options{Addrs: []netip.Addr{v4A}})
	ln, err := h.ListenTCP(netip.AddrPortFrom(v4A, 80))
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		accepted <- err
	}()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select {
	case err := <-accepted:
		if err == nil {
			t.Error("Accept on a closed host succeeded")
		}
	case <-time.After(testTimeout):
		t.Fatal("Close did not unblock Accept")
	}
	ln.Close()
	ctx := ctxT(t)
	checks := map[string]error{
		"Write":       func() error { _, err := h.Write([][]byte{make([]byte, 20)}, 0); return err }(),
		"Read":        func() error { _, err := h.Read([][]byte{make([]byte, 100)}, []int{0}, 0); return err }(),
		"DialContext": func() error { _, err := h.DialContext(ctx, "tcp", "10.0.0.2:80"); return err }(),
		"DialUDP": func() error {
			_, err := h.DialUDP(netip.AddrPort{}, netip.MustParseAddrPort("10.0.0.2:53"))
			return err
		}(),
		"ListenTCP":      func() error { _, err := h.ListenTCP(netip.AddrPortFrom(v4A, 80)); return err }(),
		"ListenUDP":      func() error { _, err := h.ListenUDP(netip.AddrPortFrom(v4A, 80)); return err }(),
		"AddAddress":     h.AddAddress(netip.MustParsePrefix("10.1.0.1/32")),
		"RemoveAddress":  h.RemoveAddress(v4A),
		"SetForwarding":  h.SetForwarding(true),
		"SetSpoofing":    h.SetSpoofing(true),
		"SetPromiscuous": h.SetPromiscuous(true),
	}
	for name, err := range checks {
		if !errors.Is(err, transport.ErrClosed) || !errors.Is(err, net.ErrClosed) {
			t.Errorf("%s after Close: %v, want transport.ErrClosed", name, err)
		}
	}
	_ = h.Stats() // still answers
}

func TestPromiscuousNeedsNoHandleLocal(t *testing.T) {
	h := newHost(t, netstack.Options{Addrs: []netip.Addr{v4A}})
	if err := h.SetPromiscuous(true); !errors.Is(err, netstack.ErrPromiscuousLocal) {
		t.Errorf("SetPromiscuous(true) with HandleLocal: %v, want ErrPromiscuousLocal", err)
	}
	if err := h.SetPromiscuous(false); err != nil {
		t.Errorf("SetPromiscuous(false): %v", err)
	}
}

// TestVIPIsNotASource checks that an address added at run time next to the
// host's own is not picked as the source of the host's outbound
// connections, even where IPv6's longest-matching-prefix rule would prefer
// it, while a first address of a family is.
func TestVIPIsNotASource(t *testing.T) {
	for _, c := range []struct{ own, vip, dst string }{
		{"10.0.0.2", "10.99.0.7", "10.99.0.1"},
		{"fd00::2", "fd99::7", "fd99::1"},
	} {
		own, vip := netip.MustParseAddr(c.own), netip.MustParseAddr(c.vip)
		h := newHost(t, netstack.Options{Addrs: []netip.Addr{own}})
		if err := h.AddAddress(netip.PrefixFrom(vip, vip.BitLen())); err != nil {
			t.Fatal(err)
		}
		if !hasPrefix(h.Addresses(), vip) {
			t.Fatalf("Addresses() = %v lacks the VIP", h.Addresses())
		}
		if got := synSource(t, h, netip.MustParseAddr(c.dst)); got != own {
			t.Errorf("SYN to %s left from %v, want %v", c.dst, got, own)
		}
	}
	// A first address of its family, added at run time, is a source.
	h := newHost(t, netstack.Options{Addrs: []netip.Addr{v6A}})
	if err := h.AddAddress(netip.MustParsePrefix("10.0.0.9/32")); err != nil {
		t.Fatal(err)
	}
	if got := synSource(t, h, v4B); got != netip.MustParseAddr("10.0.0.9") {
		t.Errorf("SYN left from %v, want the run-time address 10.0.0.9", got)
	}
}

// synSource starts a TCP dial from h to dst and returns the source address
// of the SYN that comes out of Read.
func synSource(t *testing.T, h *netstack.Host, dst netip.Addr) netip.Addr {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.DialTCP(ctx, netip.AddrPortFrom(dst, 80))
	}()
	defer func() { cancel(); <-done }()
	buf := make([]byte, 1500)
	read := make(chan error, 1)
	go func() {
		_, err := h.Read([][]byte{buf}, []int{0}, 0)
		read <- err
	}()
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testTimeout):
		h.Close() // unblocks the Read
		<-read
		t.Fatalf("no SYN to %v came out", dst)
	}
	var src []byte
	if buf[0]>>4 == 4 {
		src = buf[12:16]
	} else {
		src = buf[8:24]
	}
	a, _ := netip.AddrFromSlice(src)
	return a
}

// TestUDPBlast writes datagrams as fast as possible through a pumped pair:
// a full send buffer must block Write only until the pump drains it
// (gonet's own UDP WriteTo could miss that wake-up and hang for good).
func TestUDPBlast(t *testing.T) {
	a, b := hostPair(t, []netip.Addr{v4A}, []netip.Addr{v4B}, nil)
	srv, err := b.ListenUDP(netip.AddrPortFrom(v4B, 9))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		buf := make([]byte, 2000)
		for {
			if _, _, err := srv.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	c, err := a.DialUDP(netip.AddrPort{}, netip.AddrPortFrom(v4B, 9))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := make([]byte, 512)
	const n = 20000
	for i := range n {
		// The deadline bounds each Write, not the run: a missed wake-up
		// blocks one Write for good, while a busy machine only slows
		// them all (under -race on 2 loaded cores the 20,000 take 10-40 s).
		if i%100 == 0 {
			if err := c.SetWriteDeadline(time.Now().Add(testTimeout)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.Write(msg); err != nil {
			t.Fatalf("write %d of %d: %v (stats %+v)", i, n, err, a.Stats())
		}
	}
	// Every datagram is read out, queued or dropped (a Read in progress
	// holds a batch that is briefly neither queued nor counted).
	var s netstack.Stats
	eventually(t, testTimeout, "the stats to account for every datagram", func() bool {
		s = a.Stats()
		return s.OutPackets+s.OutQueueFull+uint64(s.OutQueued) == n
	})
}

func TestUDPWriteDeadline(t *testing.T) {
	h := newHost(t, netstack.Options{Addrs: []netip.Addr{v4A}})
	c, err := h.DialUDP(netip.AddrPort{}, netip.AddrPortFrom(v4B, 9))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Nobody reads h: the queue and then the send buffer fill, and Write
	// blocks until the deadline.
	if err := c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 1000)
	var werr error
	for i := 0; i < 100000 && werr == nil; i++ {
		_, werr = c.Write(msg)
	}
	var ne net.Error
	if !errors.As(werr, &ne) || !ne.Timeout() || !errors.Is(werr, os.ErrDeadlineExceeded) {
		t.Fatalf("Write with a full buffer ended with %v, want a timeout", werr)
	}
	if _, err := c.(net.PacketConn).WriteTo(msg, &net.TCPAddr{}); !errors.Is(err, netstack.ErrInvalidAddress) {
		t.Errorf("WriteTo a TCP address: %v", err)
	}
}
