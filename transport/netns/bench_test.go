//go:build linux

package netns

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
)

// BenchmarkDo measures one trip of a goroutine into a namespace and back.
func BenchmarkDo(b *testing.B) {
	h := NewHostT(b, "bench-do")
	b.ReportAllocs()
	for b.Loop() {
		if err := h.Do(func() error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNewHost measures creating and removing a namespace.
func BenchmarkNewHost(b *testing.B) {
	NewHostT(b, "bench-warm") // root check and sweep
	b.ReportAllocs()
	for b.Loop() {
		h, err := NewHost(context.Background(), "")
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// streamTCP sends b.N writes of size bytes from host from to dst (a
// listener it opens in host to) and reports MB/s.
func streamTCP(b *testing.B, from, to *Host, dst netip.Addr, size int) {
	var ln net.Listener
	if err := to.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(dst, 0).String())
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	recv := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			recv <- -1
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		recv <- n
	}()
	var c net.Conn
	if err := from.Do(func() error {
		var err error
		c, err = net.Dial("tcp", ln.Addr().String())
		return err
	}); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	c.Close()
	if n := <-recv; n != int64(b.N*size) {
		b.Fatalf("received %d bytes, sent %d", n, b.N*size)
	}
}

// BenchmarkTCP compares TCP throughput between two namespaces over the
// plain veth underlay with the same traffic through kernel TUNs and
// wireguard-go (encrypted, over that veth), by write size.
func BenchmarkTCP(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("path=veth/write=%dKiB", size>>10), func(b *testing.B) {
			ha := NewHostT(b, "bench-a")
			hb := NewHostT(b, "bench-b")
			l := ConnectT(b, ha, hb, LinkOptions{})
			streamTCP(b, ha, hb, l.B.Addr4(), size)
		})
		b.Run(fmt.Sprintf("path=wireguard-tun/write=%dKiB", size>>10), func(b *testing.B) {
			a, wb, _ := wgPair(b)
			streamTCP(b, a.Host, wb.Host, OverlayAddr4(2).Addr(), size)
		})
	}
}
