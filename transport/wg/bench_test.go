package wg

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/netstack"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// BenchmarkWireGuardNetstack measures TCP between two in-process netstack
// hosts:
//
//   - raw: the hosts joined by a plain transporttest.NewChanPair (no
//     WireGuard), the baseline that later issues compare the VIP path with;
//   - wg-simbind: wireguard-go on each host, over SimBind on a perfect
//     simulated link (real clock);
//   - wg-udpbind: wireguard-go on each host, over UDPBind on loopback.
//
// Each op writes one buffer of the sub-benchmark's size on a long-lived
// connection; the timer stops when the receiver has read everything. It
// reports MB/s and pkts/s, the IP packets that crossed the link (both
// directions, ACKs included).
func BenchmarkWireGuardNetstack(b *testing.B) {
	for _, path := range []string{"raw", "wg-simbind", "wg-udpbind"} {
		for _, size := range []int{1 << 10, 64 << 10} {
			b.Run(fmt.Sprintf("%s/write=%dKiB", path, size>>10), func(b *testing.B) {
				benchTCP(b, path, size)
			})
		}
	}
}

func benchTCP(b *testing.B, path string, size int) {
	var a, c *netstack.Host
	var packets func() uint64
	switch path {
	case "raw":
		a, c = newHost(b, netip.MustParseAddr("10.0.0.1")), newHost(b, netip.MustParseAddr("10.0.0.2"))
		pa, pc := transporttest.NewChanPair(transporttest.ChanPairOptions{})
		var n atomic.Uint64
		stop := pumpAll(&n, [][2]transport.PacketIO{{a, pa}, {pc, c}, {c, pc}, {pa, a}})
		b.Cleanup(func() { a.Close(); c.Close(); pa.Close(); pc.Close(); stop() })
		packets = func() uint64 { return n.Load() / 2 } // each packet is pumped twice
	case "wg-simbind":
		n := transporttest.NewNetwork(nil, 1)
		b.Cleanup(func() { n.Close() })
		na, _ := newSimNode(b, n, "a", "10.0.0.1")
		nc, _ := newSimNode(b, n, "c", "10.0.0.2")
		pair(b, na, nc)
		a, c = na.host, nc.host
		packets = func() uint64 { return n.Stats().Delivered }
	case "wg-udpbind":
		ba, bc := NewUDPBind(UDPBindOptions{}), NewUDPBind(UDPBindOptions{})
		na := newUDPNode(b, "a", "10.0.0.1", ba)
		nc := newUDPNode(b, "c", "10.0.0.2", bc)
		pair(b, na, nc)
		a, c = na.host, nc.host
		packets = func() uint64 { return ba.Stats().Passed + bc.Stats().Passed }
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dst := netip.MustParseAddrPort("10.0.0.2:5001")
	l, err := c.ListenTCP(dst)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	var got atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		buf := make([]byte, 256<<10)
		for {
			n, err := conn.Read(buf)
			got.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	conn, err := a.DialContext(ctx, "tcp", dst.String())
	if err != nil {
		b.Fatal(err)
	}
	defer func() { conn.Close(); wg.Wait() }()
	conn.SetDeadline(time.Now().Add(2 * time.Minute)) // a stalled stack fails the run instead of hanging
	buf := make([]byte, size)
	write := func(n int) {
		for range n {
			if _, err := conn.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
	}
	write(64) // warm up: handshake, slow start
	waitBytes(b, &got, int64(64*size))

	b.SetBytes(int64(size))
	b.ReportAllocs()
	p0 := packets()
	start := time.Now()
	b.ResetTimer()
	write(b.N)
	waitBytes(b, &got, int64((64+b.N)*size))
	b.StopTimer()
	el := time.Since(start).Seconds()
	b.ReportMetric(float64(packets()-p0)/el, "pkts/s")
	// Packets the stacks sent that never reached the other stack: lost in
	// queues on the way (netstack's, wireguard-go's, the bind's).
	sa, sc := a.Stats(), c.Stats()
	lost := float64(sa.OutPackets+sc.OutPackets) - float64(sa.InPackets+sc.InPackets)
	b.ReportMetric(100*lost/float64(sa.OutPackets+sc.OutPackets), "lost%")
	if testing.Verbose() {
		b.Logf("a %+v\nc %+v", sa, sc)
	}
	b.ReportMetric(float64(b.N*size)/el/1e6, "MB/s")
}

// waitBytes polls until the receiver has read n bytes.
func waitBytes(b *testing.B, got *atomic.Int64, n int64) {
	deadline := time.Now().Add(2 * time.Minute)
	for got.Load() < n {
		if time.Now().After(deadline) {
			b.Fatalf("receiver stuck at %d of %d bytes", got.Load(), n)
		}
		time.Sleep(100 * time.Microsecond) // polling interval
	}
}

// pumpAll copies packets from each pair's first PacketIO to its second
// until they close, counting them; stop waits for the pumps to end (close
// the PacketIOs first).
func pumpAll(n *atomic.Uint64, pairs [][2]transport.PacketIO) (stop func()) {
	var wg sync.WaitGroup
	for _, p := range pairs {
		wg.Add(1)
		go func(src, dst transport.PacketIO) {
			defer wg.Done()
			bs := src.BatchSize()
			bufs := make([][]byte, bs)
			for i := range bufs {
				bufs[i] = make([]byte, 65535)
			}
			sizes := make([]int, bs)
			out := make([][]byte, bs)
			for {
				k, err := src.Read(bufs, sizes, 0)
				for i := range k {
					out[i] = bufs[i][:sizes[i]]
				}
				if k > 0 {
					if _, werr := dst.Write(out[:k], 0); werr != nil {
						return
					}
					n.Add(uint64(k))
				}
				if err != nil {
					return
				}
			}
		}(p[0], p[1])
	}
	return wg.Wait
}
