package flow

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/vipkit/vipkit/packet"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// benchTable is a NAT filled with established flows. The loop builds each
// packet's header arithmetically from a template (flow j's addresses and
// ports written in, checksums adjusted), like a fresh packet from a NIC,
// without a per-flow header array whose cache misses would not be the NAT's.
type benchTable struct {
	nat          *NAT
	proto        Proto
	flows        int
	hl           int
	tmplOut      []byte   // flow 0's client header
	tmplIn       []byte   // flow 0's reply header (backend 0, shadow 0)
	shadow       []uint16 // per flow: the shadow port (the backend is benchBidx)
	bytesPerFlow float64
	now          time.Time
}

func (bt *benchTable) close() { bt.nat.Close() }

func benchClient(i int) (uint32, uint16) {
	return uint32(100<<24|80<<16) | uint32(i>>16), uint16(i)
}

func benchBackend(i int) uint32 { return uint32(100<<24 | 65<<16 | i<<8 | 1) }

// benchBidx is the backend that flow i is bound to: the benchmark's
// selector takes the 32 backends in turn, one Select per flow.
func benchBidx(i int) int { return (i + 1) % 32 }

// header writes flow j's header into pkt.
func (bt *benchTable) header(pkt []byte, j int, in bool) PeerID {
	csum := 6
	if bt.proto == ProtoTCP {
		csum = 16
	}
	if !in {
		copy(pkt, bt.tmplOut)
		src, sport := benchClient(j)
		src0, sport0 := benchClient(0)
		binary.BigEndian.PutUint32(pkt[12:], src)
		binary.BigEndian.PutUint16(pkt[20:], sport)
		d := packet.Delta32(src0, src)
		packet.Adjust(pkt[10:], d)
		packet.Adjust(pkt[20+csum:], packet.AddDelta(d, packet.Delta16(sport0, sport)))
		return 0
	}
	copy(pkt, bt.tmplIn)
	bidx, shadow := benchBidx(j), bt.shadow[j]
	d := packet.Delta32(benchBackend(benchBidx(0)), benchBackend(bidx))
	binary.BigEndian.PutUint32(pkt[12:], benchBackend(bidx))
	binary.BigEndian.PutUint16(pkt[22:], shadow)
	packet.Adjust(pkt[10:], d)
	packet.Adjust(pkt[20+csum:], packet.AddDelta(d, packet.Delta16(bt.shadow[0], shadow)))
	return PeerID(bidx + 1)
}

// hdrSum returns the header bytes of a packet with a payload of length plen
// whose one's-complement sum is psum, checksums filled in.
func hdrInto(dst []byte, src, dstA uint32, sport, dport uint16, proto Proto, flags uint8, plen int, psum uint64) {
	clear(dst)
	dst[0] = 0x45
	l4 := dst[20:]
	total := len(dst) + plen
	binary.BigEndian.PutUint16(dst[2:], uint16(total))
	dst[8] = 64
	dst[9] = byte(proto)
	binary.BigEndian.PutUint32(dst[12:], src)
	binary.BigEndian.PutUint32(dst[16:], dstA)
	packet.IPv4(dst).UpdateChecksum()
	binary.BigEndian.PutUint16(l4[0:], sport)
	binary.BigEndian.PutUint16(l4[2:], dport)
	var s, d [4]byte
	binary.BigEndian.PutUint32(s[:], src)
	binary.BigEndian.PutUint32(d[:], dstA)
	l4len := len(l4) + plen
	csumOff := 6
	if proto == ProtoTCP {
		l4[12] = 5 << 4
		l4[13] = flags
		binary.BigEndian.PutUint16(l4[14:], 65535)
		csumOff = 16
	} else {
		binary.BigEndian.PutUint16(l4[4:], uint16(l4len))
	}
	sum := packet.Sum(l4) + psum + uint64(packet.PseudoHeaderSum(s, d, proto, l4len))
	c := ^packet.Fold(sum)
	if c == 0 && proto == ProtoUDP {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(l4[csumOff:], c)
}

func newBenchTable(tb testing.TB, proto Proto, flows, size int) *benchTable {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	capacity := max(flows, DefaultCapacity)
	backends := make([]Backend, 32)
	for i := range backends {
		backends[i] = Backend{Peer: PeerID(i + 1), Addr: addrFrom(benchBackend(i)), Port: 8000}
	}
	var res PortReserver = NewMemReserver(MemReserverOptions{Seed: 1})
	if flows > 16384 {
		res = NewMemReserver(MemReserverOptions{Min: 1024, Max: 65535, PerBackend: true, Seed: 1})
	}
	next := 0
	sel := SelectorFunc(func(req SelectRequest) int { next++; return next % len(req.Candidates) })
	// The real clock, as in production: now carries a monotonic reading.
	n, err := New(Options{LocalAddr: localAddr, Selector: sel, Reserver: res, Capacity: capacity, MTU: 1500})
	if err != nil {
		tb.Fatal(err)
	}
	l := Listener{VIP: vipAddr, Proto: proto, Port: 443}
	if err := n.SetListener(l, ListenerConfig{Backends: backends}); err != nil {
		tb.Fatal(err)
	}
	hl := 20 + packet.UDPHeaderLen
	if proto == ProtoTCP {
		hl = 20 + packet.TCPMinHeaderLen
	}
	plen := size - hl
	payload := make([]byte, plen)
	for i := range payload {
		payload[i] = byte(i)
	}
	psum := packet.Sum(payload)
	bt := &benchTable{nat: n, proto: proto, flows: flows, hl: hl, shadow: make([]uint16, flows), now: time.Now()}
	pkt := make([]byte, size)
	copy(pkt[hl:], payload)
	vip := addr4(vipAddr)
	for i := range flows {
		src, sport := benchClient(i)
		if proto == ProtoTCP {
			hdrInto(pkt[:hl], src, vip, sport, 443, proto, packet.TCPFlagSYN, 0, 0)
			r := n.FromHost(pkt[:hl], bt.now)
			if r.Verdict != Forward {
				tb.Fatalf("flow %d: SYN: %v %v", i, r.Verdict, r.Reason)
			}
			b := pkt[:hl]
			hdrInto(b, binary.BigEndian.Uint32(b[16:]), binary.BigEndian.Uint32(b[12:]), binary.BigEndian.Uint16(b[22:]), binary.BigEndian.Uint16(b[20:]), proto, packet.TCPFlagSYN|packet.TCPFlagACK, 0, 0)
			if r2 := n.FromPeer(b, r.Peer, bt.now); r2.Verdict != Forward {
				tb.Fatalf("flow %d: SYN-ACK: %v %v", i, r2.Verdict, r2.Reason)
			}
		}
		hdrInto(pkt[:hl], src, vip, sport, 443, proto, packet.TCPFlagACK, plen, psum)
		if i == 0 {
			bt.tmplOut = append([]byte(nil), pkt[:hl]...)
		}
		r := n.FromHost(pkt, bt.now)
		if r.Verdict != Forward {
			tb.Fatalf("flow %d: %v %v", i, r.Verdict, r.Reason)
		}
		bidx := int(pkt[18])
		shadow := binary.BigEndian.Uint16(pkt[20:])
		if bidx != benchBidx(i) {
			tb.Fatalf("flow %d went to backend %d, not %d", i, bidx, benchBidx(i))
		}
		bt.shadow[i] = shadow
		if i == 0 {
			bt.tmplIn = make([]byte, hl)
			hdrInto(bt.tmplIn, benchBackend(bidx), addr4(localAddr), 8000, shadow, proto, packet.TCPFlagACK, plen, psum)
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	// Table memory only: the benchmark's own per-flow array is excluded.
	bt.bytesPerFlow = (float64(after.HeapAlloc) - float64(before.HeapAlloc) - float64(2*len(bt.shadow))) / float64(flows)
	return bt
}

// BenchmarkTranslate measures the per-packet path of established flows:
// FromHost (dir=out) or FromPeer (dir=in) on one packet at a time, flows
// visited in a scattered order, or FromHostBatch and FromPeerBatch on
// batches of 64 (dir=*-batch64).
func BenchmarkTranslate(b *testing.B) {
	for _, flows := range []int{1, 4096, 1 << 20} {
		for _, proto := range []Proto{ProtoTCP, ProtoUDP} {
			for _, size := range []int{64, 1400} {
				name := fmt.Sprintf("flows=%d/%v/%dB", flows, proto, size)
				if flows == 1<<20 {
					name = fmt.Sprintf("flows=1M/%v/%dB", proto, size)
				}
				var bt *benchTable
				for _, dir := range []string{"out", "in", "out-batch64", "in-batch64"} {
					b.Run(name+"/"+dir, func(b *testing.B) {
						if bt == nil {
							bt = newBenchTable(b, proto, flows, size)
						}
						in := dir == "in" || dir == "in-batch64"
						if len(dir) > 4 {
							benchTranslateBatch(b, bt, size, in)
						} else {
							benchTranslate(b, bt, size, in)
						}
					})
				}
				if bt != nil {
					bt.close()
					bt = nil
				}
			}
		}
	}
}

// benchTranslate calls FromHost or FromPeer once per packet. The harness
// writes each packet's header (flow j's addresses and ports, checksums
// adjusted) into a ring of buffers a few packets ahead of the NAT, as a NIC
// fills its receive ring: a packet is not read back right after the
// harness's narrow stores into it (a load spanning several in-flight
// stores cannot be forwarded and would wait for the previous packet's work
// to retire, serialising the loop on the harness rather than the NAT).
func benchTranslate(b *testing.B, bt *benchTable, size int, in bool) {
	const ring, ahead = 16, 8
	var bufs [ring][]byte
	var peers [ring]PeerID
	for i := range bufs {
		bufs[i] = make([]byte, size)
		for k := bt.hl; k < size; k++ {
			bufs[i][k] = byte(k - bt.hl)
		}
	}
	mask := bt.flows - 1
	const stride uint64 = 0x9e3779b1 // odd: visits every flow, scattered (uint64: fits on 32-bit too)
	j := 0                           // the flow of the next header to write
	for i := range ahead {
		peers[i] = bt.header(bufs[i], j, in)
		j = int((uint64(j) + stride) & uint64(mask))
	}
	now := bt.now
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	cpu := startCPU()
	if in {
		for i := range b.N {
			w := (i + ahead) % ring
			peers[w] = bt.header(bufs[w], j, true)
			j = int((uint64(j) + stride) & uint64(mask))
			if r := bt.nat.FromPeer(bufs[i%ring], peers[i%ring], now); r.Verdict != Forward {
				b.Fatalf("%v %v", r.Verdict, r.Reason)
			}
		}
	} else {
		for i := range b.N {
			w := (i + ahead) % ring
			bt.header(bufs[w], j, false)
			j = int((uint64(j) + stride) & uint64(mask))
			if r := bt.nat.FromHost(bufs[i%ring], now); r.Verdict != Forward {
				b.Fatalf("%v %v", r.Verdict, r.Reason)
			}
		}
	}
	b.StopTimer()
	cpu.report(b, b.N, "cpu-ns/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mpps")
	if bt.flows >= DefaultCapacity { // with one flow, fixed overhead dominates
		b.ReportMetric(bt.bytesPerFlow, "B/flow")
	}
	if bt.flows > prefetchMinCapacity {
		bt.nat.mu.Lock()
		ents := bt.nat.idx.entries
		bt.nat.mu.Unlock()
		b.ReportMetric(100*hugeShare(unsafe.Pointer(unsafe.SliceData(ents)), uintptr(len(ents))*unsafe.Sizeof(indexEntry{})), "idx-huge-%")
	}
}

// benchTranslateBatch is benchTranslate through FromHostBatch and
// FromPeerBatch, 64 packets per call (the PacketIO batch size). Each
// batch's packets belong to one peer for FromPeerBatch, as wireguard-go
// delivers them.
func benchTranslateBatch(b *testing.B, bt *benchTable, size int, in bool) {
	const batch = 64
	pkts := make([][]byte, batch)
	for i := range pkts {
		pkts[i] = make([]byte, size)
		for k := bt.hl; k < size; k++ {
			pkts[i][k] = byte(k - bt.hl)
		}
	}
	res := make([]Result, batch)
	mask := bt.flows - 1
	const stride uint64 = 0x9e3779b1
	// For FromPeerBatch: per peer, the flows bound to it, so that a batch
	// holds one peer's packets in scattered order.
	var byPeer [][]int
	if in {
		byPeer = make([][]int, 33)
		for j := range bt.flows {
			p := benchBidx(j) + 1
			byPeer[p] = append(byPeer[p], j)
		}
	}
	j := 0
	now := bt.now
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	cpu := startCPU()
	for done := 0; done < b.N; done += batch {
		if in {
			peer := PeerID(1 + (j & 31))
			list := byPeer[peer]
			if len(list) == 0 {
				peer = bt.header(pkts[0], 0, true)
				list = byPeer[peer]
			}
			for i := range pkts {
				bt.header(pkts[i], list[(uint64(j)+uint64(i)*stride)%uint64(len(list))], true)
			}
			j = int((uint64(j) + stride) & uint64(mask))
			bt.nat.FromPeerBatch(pkts, peer, now, res)
		} else {
			for i := range pkts {
				bt.header(pkts[i], j, false)
				j = int((uint64(j) + stride) & uint64(mask))
			}
			bt.nat.FromHostBatch(pkts, now, res)
		}
		for i := range res {
			if res[i].Verdict != Forward {
				b.Fatalf("%v %v", res[i].Verdict, res[i].Reason)
			}
		}
	}
	b.StopTimer()
	cpu.report(b, b.N, "cpu-ns/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mpps")
	if bt.flows >= DefaultCapacity { // with one flow, fixed overhead dominates
		b.ReportMetric(bt.bytesPerFlow, "B/flow")
	}
}

// BenchmarkReassemble measures a 4 KiB UDP datagram arriving in three
// fragments: reassembly, NAT and emission of the (refragmented) result.
func BenchmarkReassemble(b *testing.B) {
	clock := transporttest.NewManualClock()
	var emitted int
	n, err := New(Options{LocalAddr: localAddr, Selector: SelectorFunc(func(SelectRequest) int { return 0 }),
		Clock: clock, MTU: 1500, Emit: func(Direction, []byte) { emitted++ }})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	if err := n.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}); err != nil {
		b.Fatal(err)
	}
	dg := bigUDP(5000, 4096-28, 0)
	frags := fragment(dg, 1480)
	if len(frags) != 3 {
		b.Fatalf("%d fragments", len(frags))
	}
	buf := make([]byte, 1500)
	now := clock.Now()
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU()
	for i := range b.N {
		for _, f := range frags {
			p := buf[:len(f)]
			copy(p, f)
			binary.BigEndian.PutUint16(p[4:], uint16(i)) // a new datagram id each time
			packet.IPv4(p).UpdateChecksum()
			if r := n.FromHost(p, now); r.Verdict == Drop {
				b.Fatalf("%v", r.Reason)
			}
			_ = p
		}
	}
	b.StopTimer()
	cpu.report(b, b.N, "cpu-ns/op")
	if emitted < b.N {
		b.Fatalf("emitted %d for %d datagrams", emitted, b.N)
	}
}
