package netstack_test

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/netstack"
)

// FuzzWrite feeds arbitrary bytes to Write, as one packet and as a batch of
// its two halves, into a host with TCP and UDP sockets open and forwarding
// on. It must never panic, and every packet must be accounted for: handed
// to the stack, or dropped as malformed or too big.
func FuzzWrite(f *testing.F) {
	good4 := udpPacket(netip.AddrPortFrom(v4B, 1), netip.AddrPortFrom(v4A, 9), 64, []byte("hello"))
	good6 := udpPacket(netip.AddrPortFrom(v6B, 1), netip.AddrPortFrom(v6A, 9), 64, []byte("hello"))
	fwd := udpPacket(netip.AddrPortFrom(v4B, 1), netip.MustParseAddrPort("10.9.9.9:9"), 2, []byte("forward"))
	for _, seed := range [][]byte{
		{}, {0x45}, {0x60}, make([]byte, 40), bytes.Repeat([]byte{0xff}, 60),
		good4, good6, fwd, good4[:10], good4[:25], good6[:30],
		append(bytes.Clone(good4), make([]byte, 1500)...),
		tcpSYN(v4B, v4A, 1234, 80), tcpSYN(v6B, v6A, 1234, 80),
	} {
		f.Add(seed, uint8(0))
		f.Add(seed, uint8(3))
	}

	h, err := netstack.New(netstack.Options{Addrs: []netip.Addr{v4A, v6A}, MTU: 1500})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { h.Close() })
	if err := h.SetForwarding(true); err != nil {
		f.Fatal(err)
	}
	ln, err := h.ListenTCP(netip.AddrPortFrom(netip.Addr{}, 80))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { ln.Close() })
	pc, err := h.ListenUDP(netip.AddrPortFrom(netip.Addr{}, 9))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { pc.Close() })
	// Drain what the stack sends (SYN-ACKs, ICMP errors, forwarded
	// packets) so that the queue never fills.
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		bufs := [][]byte{make([]byte, 2000), make([]byte, 2000)}
		sizes := make([]int, 2)
		for {
			if _, err := h.Read(bufs, sizes, 0); err != nil {
				return
			}
		}
	}()
	f.Cleanup(func() {
		h.Close()
		<-drained
	})
	go func() {
		buf := make([]byte, 2000)
		for {
			pc.SetReadDeadline(time.Now().Add(time.Hour))
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()

	f.Fuzz(func(t *testing.T, data []byte, offset uint8) {
		off := int(offset % 8)
		pkt := append(make([]byte, off), data...)
		half := len(data) / 2
		batch := [][]byte{pkt, append(make([]byte, off), data[:half]...), append(make([]byte, off), data[half:]...)}
		before := h.Stats()
		n, err := h.Write(batch, off)
		if n != len(batch) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		after := h.Stats()
		counted := (after.InPackets - before.InPackets) + (after.InMalformed - before.InMalformed) + (after.InTooBig - before.InTooBig)
		if counted != uint64(len(batch)) {
			t.Fatalf("%d packets written, %d accounted for: before %+v, after %+v", len(batch), counted, before, after)
		}
	})
}
