package vip

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport"
)

// ackSink accepts connections on nd's port; for every chunk bytes it reads
// it writes one byte back, so the sender can time whole chunks.
func ackSink(t testing.TB, nd *cnode, port uint16, chunk int) {
	t.Helper()
	serveTCP(t, nd, port, func(c net.Conn) {
		buf := make([]byte, 64<<10)
		got := 0
		for {
			n, err := c.Read(buf)
			got += n
			for got >= chunk {
				got -= chunk
				if _, err := c.Write([]byte{1}); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
}

// BenchmarkVIPThroughput compares, in one run and over the same
// wireguard-go/netstack pair, TCP through a VIP (the engine's NAT path)
// with TCP straight to the backend's overlay address (the engine's
// pass-through). Each iteration sends one chunk on each connection,
// alternating which goes first, and waits for the receiver's
// acknowledgement of the whole chunk.
func BenchmarkVIPThroughput(b *testing.B) {
	for _, chunk := range []int{256 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("chunk=%dKiB", chunk>>10), func(b *testing.B) {
			c := newCluster(b, clusterOptions{n: 2, prober: fastProber})
			srv, cli := c.nodes[0], c.nodes[1]
			ackSink(b, srv, 8443, chunk)
			ctx := context.Background()
			if _, err := cli.reg.Create(ctx, "api"); err != nil {
				b.Fatal(err)
			}
			v, err := cli.reg.PortAdd(ctx, "api", PortKey{TCP, 443}, []Backend{{srv.info.ID, 8443}})
			if err != nil {
				b.Fatal(err)
			}
			dial := func(addr netip.AddrPort) net.Conn {
				var conn net.Conn
				pollUntil(b, 20*time.Second, "a connection to "+addr.String(), func() bool {
					dctx, cancel := context.WithTimeout(ctx, time.Second)
					defer cancel()
					conn, err = cli.host.DialContext(dctx, "tcp", addr.String())
					return err == nil
				})
				b.Cleanup(func() { conn.Close() })
				return conn
			}
			viaVIP := dial(netip.AddrPortFrom(v.Addr, 443))
			direct := dial(netip.AddrPortFrom(srv.info.Addr, 8443))
			data := make([]byte, chunk)
			ack := make([]byte, 1)
			send := func(conn net.Conn) time.Duration {
				start := time.Now()
				if _, err := conn.Write(data); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(conn, ack); err != nil {
					b.Fatal(err)
				}
				return time.Since(start)
			}
			send(viaVIP) // warm up both paths (windows, buffers)
			send(direct)
			var tVIP, tDirect time.Duration
			b.ReportAllocs()
			b.SetBytes(int64(2 * chunk))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if i%2 == 0 {
					tVIP += send(viaVIP)
					tDirect += send(direct)
				} else {
					tDirect += send(direct)
					tVIP += send(viaVIP)
				}
			}
			b.StopTimer()
			mb := float64(b.N) * float64(chunk) / 1e6
			vipRate, directRate := mb/tVIP.Seconds(), mb/tDirect.Seconds()
			b.ReportMetric(vipRate, "vip-MB/s")
			b.ReportMetric(directRate, "direct-MB/s")
			b.ReportMetric(vipRate/directRate, "ratio")
			if l, ok := listenerOf(cli, "api", "tcp/443"); !ok || l.BytesOut < uint64(b.N*chunk) {
				b.Fatalf("the VIP listener did not carry the traffic: %+v", l.Traffic)
			}
		})
	}
}

// BenchmarkEnginePacketPath measures the engine's own per-packet cost
// (flow's FromHost/FromPeer, peer lookup, probe diversion, batching) on
// the manual clock, without wireguard-go or a stack: host → overlay
// (the pump's translation of a batch) and overlay → host (Write), for
// pass-through packets and packets of an established VIP flow.
func BenchmarkEnginePacketPath(b *testing.B) {
	u := newUnitEngine(b, 1)
	client := netip.AddrPortFrom(u.self.Addr, 40000)
	vip := netip.AddrPortFrom(u.svc.Addr, 443)
	bt := newBatch(64, 2048)
	u.hostBatch(bt, ipv4Packet(6, client, vip, tcpSYN, nil))
	shadow := u.e.NAT().Bindings()[0].Shadow
	backend := netip.AddrPortFrom(u.peer.Addr, 8443)
	if _, err := u.e.Write([][]byte{ipv4Packet(6, backend, shadow, tcpSYN|tcpACK, nil)}, 0); err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 1340)
	pkts := map[string][2][]byte{ // name → {host→overlay, overlay→host}
		"pass-through": {
			ipv4Packet(6, client, netip.AddrPortFrom(u.peer.Addr, 8443), tcpACK, payload),
			ipv4Packet(6, netip.AddrPortFrom(u.peer.Addr, 8443), client, tcpACK, payload),
		},
		"vip-flow": {
			ipv4Packet(6, client, vip, tcpACK, payload),
			ipv4Packet(6, backend, shadow, tcpACK, payload),
		},
	}
	for _, name := range []string{"pass-through", "vip-flow"} {
		for _, batchSize := range []int{1, 64} {
			p := pkts[name]
			b.Run(fmt.Sprintf("%s/out/batch=%d", name, batchSize), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(p[0]) * batchSize))
				for i := 0; i < b.N; i++ {
					for j := range batchSize {
						bt.sizes[j] = copy(bt.bufs[j], p[0])
					}
					u.e.fromHost(bt, batchSize)
					if bt.n != batchSize {
						b.Fatalf("%d of %d packets forwarded", bt.n, batchSize)
					}
				}
				b.ReportMetric(float64(b.N*batchSize)/b.Elapsed().Seconds(), "pkts/s")
			})
			b.Run(fmt.Sprintf("%s/in/batch=%d", name, batchSize), func(b *testing.B) {
				bufs := make([][]byte, batchSize)
				for j := range bufs {
					bufs[j] = make([]byte, 2048)
				}
				w := make([][]byte, batchSize)
				delivered := 0
				u.host.onWrite = func([]byte) { delivered++ }
				b.ReportAllocs()
				b.SetBytes(int64(len(p[1]) * batchSize))
				for i := 0; i < b.N; i++ {
					for j := range batchSize {
						w[j] = bufs[j][:16+copy(bufs[j][16:], p[1])]
					}
					if _, err := u.e.Write(w, 16); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if delivered != b.N*batchSize {
					b.Fatalf("%d of %d packets delivered", delivered, b.N*batchSize)
				}
				b.ReportMetric(float64(b.N*batchSize)/b.Elapsed().Seconds(), "pkts/s")
			})
		}
	}
}

// sourceHost is a host whose Read returns a full batch at once, each packet
// copied from tmpl into the caller's buffers, as a busy TUN's does. It can
// interrupt its Read (which never blocks), so that an engine on it reads it
// directly unless told to read ahead.
type sourceHost struct {
	recHost
	tmpl []byte
}

func (h *sourceHost) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	select {
	case <-h.done:
		return 0, transport.ErrClosed
	default:
	}
	for i := range bufs {
		sizes[i] = copy(bufs[i][offset:], h.tmpl)
	}
	return len(bufs), nil
}

func (h *sourceHost) InterruptRead() {}

// BenchmarkEngineRead measures what wireguard-go's TUN reader gets from
// Engine.Read on a host that always has a full batch of 1,380-byte
// pass-through packets: direct (the host reads into wireguard-go's buffers)
// against read-ahead (the pump reads into the engine's, Read copies them
// out), in the same run. Run it with -cpu 1 as well: with a spare core the
// pump's read overlaps Read's copy, which a loaded data plane does not
// have.
func BenchmarkEngineRead(b *testing.B) {
	for _, readAhead := range []bool{false, true} {
		name := "direct"
		if readAhead {
			name = "read-ahead"
		}
		b.Run(name, func(b *testing.B) {
			client := netip.MustParseAddrPort("100.80.0.1:40000")
			var h *sourceHost
			u := newUnitEngineWith(b, 1, func(o *EngineOptions) {
				h = &sourceHost{recHost: recHost{done: make(chan struct{})}}
				o.Host = h
				o.ReadAhead = readAhead
			})
			h.tmpl = ipv4Packet(6, client, netip.AddrPortFrom(u.peer.Addr, 8443), tcpACK, make([]byte, 1340))
			const batch = 64
			bufs, sizes := make([][]byte, batch), make([]int, batch)
			for i := range bufs {
				bufs[i] = make([]byte, 16+65535) // wireguard-go's MaxMessageSize buffers
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(h.tmpl) * batch))
			b.ResetTimer()
			pkts := 0
			for pkts < b.N*batch {
				n, err := u.e.Read(bufs, sizes, 16)
				if err != nil {
					b.Fatal(err)
				}
				pkts += n
			}
			b.StopTimer()
			b.ReportMetric(float64(pkts)/b.Elapsed().Seconds(), "pkts/s")
		})
	}
}
