//go:build linux

package netns

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/wg"
)

// wgPair starts WireGuard in two hosts joined by a veth underlay: a has
// 100.64.0.1 and fd00:64::1, b has .2 and ::2, both listen on 51820.
func wgPair(t testing.TB) (a, b *WireGuard, l *Link) {
	t.Helper()
	ha := NewHostT(t, "wg-a")
	hb := NewHostT(t, "wg-b")
	l = ConnectT(t, ha, hb, LinkOptions{})
	ka, kb := wg.GeneratePrivateKey(), wg.GeneratePrivateKey()
	a = StartWireGuardT(t, ha, WireGuardConfig{
		Addrs: []netip.Prefix{OverlayAddr4(1), OverlayAddr6(1)},
		Device: wg.Config{PrivateKey: ka, ListenPort: 51820, Peers: []wg.PeerConfig{{
			PublicKey:  kb.PublicKey(),
			Endpoint:   netip.AddrPortFrom(l.B.Addr4(), 51820),
			AllowedIPs: []netip.Prefix{OverlayAddr4(2), OverlayAddr6(2)},
		}}},
	})
	b = StartWireGuardT(t, hb, WireGuardConfig{
		Addrs: []netip.Prefix{OverlayAddr4(2), OverlayAddr6(2)},
		Device: wg.Config{PrivateKey: kb, ListenPort: 51820, Peers: []wg.PeerConfig{{
			PublicKey:  ka.PublicKey(),
			Endpoint:   netip.AddrPortFrom(l.A.Addr6(), 51820),
			AllowedIPs: []netip.Prefix{OverlayAddr4(1), OverlayAddr6(1)},
		}}},
	})
	return a, b, l
}

// TestWireGuardTCP sends 1 MiB over TCP from one namespace to another
// through kernel TUNs and wireguard-go, over a veth underlay, and checks it
// by hash.
func TestWireGuardTCP(t *testing.T) {
	seed := testenv.Seed(t, 2)
	a, b, l := wgPair(t)

	const size = 1 << 20
	payload := make([]byte, size)
	rng := rand.New(rand.NewPCG(seed, seed))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	want := sha256.Sum256(payload)

	for _, dst := range []netip.Addr{OverlayAddr4(2).Addr(), OverlayAddr6(2).Addr()} {
		t.Run(dst.String(), func(t *testing.T) {
			var ln net.Listener
			if err := b.Host.Do(func() error {
				var err error
				ln, err = net.Listen("tcp", netip.AddrPortFrom(dst, 0).String())
				return err
			}); err != nil {
				t.Fatal(err)
			}
			type result struct {
				sum  [32]byte
				n    int64
				peer string
				err  error
			}
			got := make(chan result, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					got <- result{err: err}
					return
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				h := sha256.New()
				n, err := io.Copy(h, c)
				var r result
				copy(r.sum[:], h.Sum(nil))
				r.n, r.err, r.peer = n, err, c.RemoteAddr().String()
				got <- r
			}()
			defer ln.Close()

			var c net.Conn
			if err := a.Host.Do(func() error {
				var err error
				c, err = (&net.Dialer{Timeout: 10 * time.Second}).Dial("tcp", ln.Addr().String())
				return err
			}); err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := c.Write(payload); err != nil {
				t.Fatal(err)
			}
			c.Close()
			r := <-got
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.n != size || r.sum != want {
				t.Fatalf("received %d bytes with sha256 %x; sent %d with %x", r.n, r.sum, size, want)
			}
			from := netip.MustParseAddrPort(r.peer).Addr()
			if !OverlayPrefix4.Contains(from) && !OverlayPrefix6.Contains(from) {
				t.Errorf("connection came from %v, not an overlay address", from)
			}
		})
	}

	// The bytes went through the encrypted tunnel over the veth: the
	// device counted them, and the peer's endpoint is b's veth address.
	st, err := a.Device.PeerStats(b.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if st.TxBytes < 2*size || st.LastHandshake.IsZero() {
		t.Errorf("a→b WireGuard stats %+v: want ≥ %d bytes sent after a handshake", st, 2*size)
	}
	if st.Endpoint != netip.AddrPortFrom(l.B.Addr4(), 51820) {
		t.Errorf("a's endpoint for b = %v, want %v", st.Endpoint, netip.AddrPortFrom(l.B.Addr4(), 51820))
	}
	ub, ok := a.Bind.(*wg.UDPBind)
	if !ok {
		t.Fatalf("default Bind is %T, want *wg.UDPBind", a.Bind)
	}
	if s := ub.Stats(); s.Sent == 0 {
		t.Errorf("a's UDPBind sent nothing: %+v", s)
	}
	if p, err := a.ListenPort(); err != nil || p != 51820 {
		t.Errorf("ListenPort = %d, %v", p, err)
	}

	// Cutting a's sends stalls the tunnel; healing resumes it.
	ub.Cut()
	if err := echoOverlay(a, b, 300*time.Millisecond); err == nil {
		t.Error("echo succeeded with a's underlay sends cut")
	}
	ub.Heal()
	if err := echoOverlay(a, b, 10*time.Second); err != nil {
		t.Errorf("after heal: %v", err)
	}
}

// echoOverlay checks a one-message TCP echo from a to b's overlay address
// within d.
func echoOverlay(a, b *WireGuard, d time.Duration) error {
	var ln net.Listener
	if err := b.Host.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(OverlayAddr4(2).Addr(), 0).String())
		return err
	}); err != nil {
		return err
	}
	defer ln.Close()
	done := echoOnce(ln, d)
	defer func() { ln.Close(); <-done }()
	var c net.Conn
	err := a.Host.Do(func() error {
		var err error
		c, err = (&net.Dialer{Timeout: d}).Dial("tcp", ln.Addr().String())
		return err
	})
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "ping" {
		return errors.New("bad echo")
	}
	return nil
}

func TestStartWireGuardErrors(t *testing.T) {
	h := NewHostT(t, "wg-err")
	if _, err := h.StartWireGuard(context.Background(), WireGuardConfig{}); !errors.Is(err, wg.ErrZeroKey) {
		t.Errorf("zero key: %v, want wg.ErrZeroKey", err)
	}
	if _, err := h.StartWireGuard(context.Background(), WireGuardConfig{TUN: "way-too-long-name", Device: wg.Config{PrivateKey: wg.GeneratePrivateKey()}}); !errors.Is(err, ErrInvalidName) {
		t.Errorf("long TUN name: %v, want ErrInvalidName", err)
	}
	// Nothing is left behind by the failures.
	ifs, err := h.Interfaces()
	if err != nil || len(ifs) != 1 {
		t.Errorf("interfaces after failed starts: %v, %v", ifs, err)
	}
}

// TestWireGuardChildServer runs a multi-goroutine server as a child process
// in one namespace (the pattern for an etcd member) and reaches it from the
// other namespace through WireGuard, with several connections at once.
func TestWireGuardChildServer(t *testing.T) {
	a, b, _ := wgPair(t)
	p := StartChildT(t, b.Host, "echo-server", netip.AddrPortFrom(OverlayAddr4(2).Addr(), 7000).String())
	out := readyOutput(t, p)
	if field(out, "listening") != "100.64.0.2:7000" {
		t.Fatalf("server: %q", out)
	}
	errs := make(chan error, 4)
	for i := range 4 {
		go func() {
			errs <- dialEcho(a.Host, netip.MustParseAddrPort("100.64.0.2:7000"), bytes.Repeat([]byte{byte(i)}, 64<<10))
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if err := p.Stop(context.Background()); err != nil {
		t.Errorf("server exit after SIGTERM: %v", err)
	}
}
