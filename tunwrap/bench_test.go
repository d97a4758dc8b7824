package tunwrap_test

import (
	"context"
	"io"
	"net/netip"
	"testing"
	"time"
)

// BenchmarkMiddleware compares the throughput of a TCP stream between two
// wireguard-go devices (netstack TUNs, loopback UDP) whose client TUN is
// bare, wrapped with a NAT whose traffic passes through (overlay address to
// overlay address), and wrapped with the stream going to a VIP (translated
// both ways). Each sub-benchmark writes b.N 64 KiB chunks and waits for the
// backend to have read them all. The goal is wrapped ≥ 0.95 × bare.
//
// Run it interleaved (-count=1, repeated) and compare medians: the
// machine's load moves every sub-benchmark. netstack's TUN hands each
// outbound packet over an unbuffered channel, so bare, gVisor's TCP sender
// waits for wireguard-go's TUN reader on every packet; wrapped, the
// Wrapper's read-ahead ring takes the packets at once, which is why the
// wrapped runs can be faster than bare here.
func BenchmarkMiddleware(b *testing.B) {
	for _, c := range []struct {
		name    string
		wrapped bool
		dst     netip.AddrPort
	}{
		{"bare", false, netip.AddrPortFrom(beAddr, 8443)},
		{"wrapped-pass", true, netip.AddrPortFrom(beAddr, 8443)},
		{"wrapped-vip", true, netip.AddrPortFrom(vipAddr, 443)},
	} {
		b.Run(c.name, func(b *testing.B) {
			var cli *node
			if c.wrapped {
				cli = newNode(b, cliAddr, addVIPs)
			} else {
				cli = newNode(b, cliAddr, nil)
			}
			be := newNode(b, beAddr, nil)
			cli.addPeer(b, be, beAddr)
			be.addPeer(b, cli, cliAddr)
			ln, err := be.net.ListenTCPAddrPort(netip.AddrPortFrom(beAddr, 8443))
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			const chunk = 64 << 10
			read := make(chan int64, 1)
			go func() {
				s, err := ln.Accept()
				if err != nil {
					read <- 0
					return
				}
				defer s.Close()
				n, _ := io.Copy(io.Discard, s)
				read <- n
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			conn, err := cli.net.DialContextTCPAddrPort(ctx, c.dst)
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, chunk)
			b.SetBytes(chunk)
			b.ResetTimer()
			for range b.N {
				if _, err := conn.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			conn.Close()
			if n := <-read; n != int64(b.N)*chunk {
				b.Fatalf("backend read %d bytes of %d", n, int64(b.N)*chunk)
			}
		})
	}
}
