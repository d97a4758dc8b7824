package netstack_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"

	"golang.zx2c4.com/wireguard/tun"
	wgnetstack "golang.zx2c4.com/wireguard/tun/netstack"

	"github.com/vipkit/vipkit/transport"
)

// wgTUN adapts wireguard-go's tun.Device to transport.PacketIO, so that
// the same pump drives wireguard-go's own netstack for comparison.
type wgTUN struct{ tun.Device }

func (w wgTUN) MTU() int {
	m, _ := w.Device.MTU()
	return m
}

func (w wgTUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n, err := w.Device.Read(bufs, sizes, offset)
	if errors.Is(err, os.ErrClosed) {
		err = transport.ErrClosed
	}
	return n, err
}

// BenchmarkPeerWireGuardNetstack is BenchmarkHostPair's TCP case over
// wireguard-go's tun/netstack (batch size 1, hidden stack), the peer this
// package replaces, in the same binary and over the same pump.
func BenchmarkPeerWireGuardNetstack(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("TCP/write=%dKiB", size>>10), func(b *testing.B) {
			ta, na, err := wgnetstack.CreateNetTUN([]netip.Addr{v4A}, nil, 1420)
			if err != nil {
				b.Fatal(err)
			}
			tb, nb, err := wgnetstack.CreateNetTUN([]netip.Addr{v4B}, nil, 1420)
			if err != nil {
				b.Fatal(err)
			}
			p := startLossyPump(wgTUN{ta}, wgTUN{tb}, 0, 0)
			defer func() {
				ta.Close()
				tb.Close()
				p.Wait(b)
			}()
			ln, err := nb.ListenTCPAddrPort(netip.AddrPortFrom(v4B, 5001))
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			benchTCPConn(b, ln, func(ctx context.Context) (net.Conn, error) {
				return na.DialContextTCPAddrPort(ctx, netip.AddrPortFrom(v4B, 5001))
			}, size)
		})
	}
}

// benchTCPConn writes b.N chunks of size bytes over a connection from dial
// to a discarding server on ln, and waits until all of it has arrived.
func benchTCPConn(b *testing.B, ln net.Listener, dial func(context.Context) (net.Conn, error), size int) {
	want := int64(b.N) * int64(size)
	done := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer conn.Close()
		n, err := io.CopyN(io.Discard, conn, want)
		if err == nil && n != want {
			err = fmt.Errorf("received %d of %d bytes", n, want)
		}
		done <- err
	}()
	conn, err := dial(ctxT(b))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := conn.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
}
