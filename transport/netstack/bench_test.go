package netstack_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/netstack"
)

// BenchmarkHostPair measures two hosts joined back to back by the batched
// test pump: TCP bulk throughput (MB/s via SetBytes, per write size and
// batch size; batch=1 is wireguard-go's own netstack's batch size) and UDP
// datagrams per second.
func BenchmarkHostPair(b *testing.B) {
	for _, batch := range []int{1, netstack.DefaultBatchSize} {
		for _, size := range []int{1 << 10, 64 << 10} {
			b.Run(fmt.Sprintf("TCP/batch=%d/write=%dKiB", batch, size>>10), func(b *testing.B) {
				benchTCP(b, batch, size)
			})
		}
	}
	for _, batch := range []int{1, netstack.DefaultBatchSize} {
		for _, size := range []int{64, 512, 1372} {
			b.Run(fmt.Sprintf("UDP/batch=%d/size=%d", batch, size), func(b *testing.B) {
				benchUDP(b, batch, size)
			})
		}
	}
}

func benchTCP(b *testing.B, batch, size int) {
	a, c := hostPair(b, []netip.Addr{v4A}, []netip.Addr{v4B}, func(o *netstack.Options) { o.BatchSize = batch })
	ln, err := c.ListenTCP(netip.AddrPortFrom(v4B, 5001))
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	benchTCPConn(b, ln, func(ctx context.Context) (net.Conn, error) {
		return a.DialTCP(ctx, netip.AddrPortFrom(v4B, 5001))
	}, size)
	s := a.Stats()
	b.ReportMetric(float64(s.OutPackets)/b.Elapsed().Seconds(), "pkts/s")
}

func benchUDP(b *testing.B, batch, size int) {
	a, c := hostPair(b, []netip.Addr{v4A}, []netip.Addr{v4B}, func(o *netstack.Options) {
		o.BatchSize = batch
	})
	srv, err := c.ListenUDP(netip.AddrPortFrom(v4B, 5002))
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	var got atomic.Int64
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		buf := make([]byte, 2048)
		for {
			if _, _, err := srv.ReadFrom(buf); err != nil {
				return
			}
			got.Add(1)
		}
	}()
	conn, err := a.DialUDP(netip.AddrPort{}, netip.AddrPortFrom(v4B, 5002))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	msg := make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := conn.Write(msg); err != nil {
			b.Fatal(err)
		}
	}
	// Wait for the last datagrams in flight, then count.
	deadline := time.Now().Add(2 * time.Second)
	last := int64(-1)
	for time.Now().Before(deadline) && got.Load() != int64(b.N) && got.Load() != last {
		last = got.Load()
		time.Sleep(20 * time.Millisecond)
	}
	b.StopTimer()
	n := got.Load()
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "delivered-pkts/s")
	b.ReportMetric(100*float64(int64(b.N)-n)/float64(b.N), "loss-%")
	srv.Close()
	<-stopped
}
