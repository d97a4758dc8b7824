package netstack

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// rawIPv4 returns a minimal valid IPv4 packet (UDP, zero checksum) of the
// given total size from src to dst.
func rawIPv4(src, dst netip.Addr, size int) []byte {
	p := make([]byte, size)
	p[0] = 0x45
	p[2], p[3] = byte(size>>8), byte(size)
	p[8] = 64
	p[9] = 17
	copy(p[12:16], src.AsSlice())
	copy(p[16:20], dst.AsSlice())
	ip := header.IPv4(p)
	ip.SetChecksum(^ip.CalculateChecksum())
	u := header.UDP(p[20:])
	u.SetSourcePort(1)
	u.SetDestinationPort(2)
	u.SetLength(uint16(size - 20))
	return p
}

// allocHost is the host of an allocation test, 10.0.0.1, closed at t's
// cleanup. It skips t under the race detector, where allocation counts
// are meaningless.
func allocHost(t *testing.T) *Host {
	t.Helper()
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	h, err := New(Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestReadAllocs asserts that moving packets from the stack's queue to the
// caller's buffers allocates nothing.
func TestReadAllocs(t *testing.T) {
	testenv.SkipIfLockOrder(t)
	h := allocHost(t)
	var list stack.PacketBufferList
	for i := range 8 {
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(rawIPv4(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), 100+i*100))})
		defer pkt.DecRef()
		list.PushBack(pkt)
	}
	bufs := make([][]byte, 8)
	sizes := make([]int, 8)
	for i := range bufs {
		bufs[i] = make([]byte, 16+1500)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if n, err := h.link.WritePackets(list); n != 8 || err != nil {
			t.Fatalf("WritePackets = %d, %v", n, err)
		}
		if n, err := h.Read(bufs, sizes, 16); n != 8 || err != nil {
			t.Fatalf("Read = %d, %v", n, err)
		}
	})
	if allocs != 0 {
		t.Errorf("queue + Read of 8 packets: %.1f allocations, want 0", allocs)
	}
	if sizes[7] != 800 || bufs[7][16] != 0x45 {
		t.Errorf("last packet: size %d, first byte %#x", sizes[7], bufs[7][16])
	}
}

// TestWriteAllocs asserts that injecting a batch into the stack allocates
// nothing in this package: the packets go to an address that is not the
// host's, so the stack drops them right after the IP header checks.
func TestWriteAllocs(t *testing.T) {
	testenv.SkipIfLockOrder(t)
	h := allocHost(t)
	bufs := make([][]byte, 8)
	for i := range bufs {
		bufs[i] = append(make([]byte, 16), rawIPv4(netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"), 1400)...)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if n, err := h.Write(bufs, 16); n != 8 || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	})
	if allocs != 0 {
		t.Errorf("Write of 8 packets: %.1f allocations, want 0", allocs)
	}
	if got := h.Stack().Stats().IP.InvalidDestinationAddressesReceived.Value(); got < 8000 {
		t.Errorf("stack saw %d packets, want ≥ 8000", got)
	}
}

// BenchmarkLink measures the host's own packet path without the stack's
// protocol work: Out is the stack queueing a batch for Read plus the Read
// that copies it out; In is Write injecting a batch that the IP layer drops
// at once (not for this host). Reported per packet.
func BenchmarkLink(b *testing.B) {
	for _, batch := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("Out/batch=%d", batch), func(b *testing.B) {
			h, err := New(Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, BatchSize: batch})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			var list stack.PacketBufferList
			for range batch {
				pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(rawIPv4(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), 1400))})
				defer pkt.DecRef()
				list.PushBack(pkt)
			}
			bufs := make([][]byte, batch)
			sizes := make([]int, batch)
			for i := range bufs {
				bufs[i] = make([]byte, 16+1500)
			}
			b.SetBytes(int64(batch * 1400))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				h.link.WritePackets(list)
				if n, err := h.Read(bufs, sizes, 16); n != batch || err != nil {
					b.Fatalf("Read = %d, %v", n, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/pkt")
		})
		b.Run(fmt.Sprintf("In/batch=%d", batch), func(b *testing.B) {
			h, err := New(Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, BatchSize: batch})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			bufs := make([][]byte, batch)
			for i := range bufs {
				bufs[i] = append(make([]byte, 16), rawIPv4(netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"), 1400)...)
			}
			b.SetBytes(int64(batch * 1400))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				h.Write(bufs, 16)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/pkt")
		})
	}
}

// The host's Read keeps the transport.ReadInterrupter contract; queued
// packets go before a pending interrupt.
func TestHostReadInterrupter(t *testing.T) {
	h := allocHost(t)
	list := func() stack.PacketBufferList {
		var l stack.PacketBufferList
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(rawIPv4(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), 100))})
		t.Cleanup(func() { pkt.DecRef() })
		l.PushBack(pkt)
		return l
	}
	bufs, sizes := [][]byte{make([]byte, 1500)}, []int{0}
	if _, err := h.link.WritePackets(list()); err != nil {
		t.Fatal(err)
	}
	h.InterruptRead()
	if n, err := h.Read(bufs, sizes, 0); n != 1 || err != nil {
		t.Fatalf("Read with a packet queued and an interrupt pending = %d, %v; want the packet", n, err)
	}
	if n, err := h.Read(bufs, sizes, 0); n != 0 || !errors.Is(err, transport.ErrInterrupted) {
		t.Fatalf("the next Read = %d, %v; want the interrupt", n, err)
	}
	transporttest.CheckReadInterrupter(t, h, func(t testing.TB) {
		if _, err := h.link.WritePackets(list()); err != nil {
			t.Fatal(err)
		}
	})
}
