package netstack_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/netstack"
)

// sendDatagrams makes h emit n UDP datagrams to dst, datagram i carrying
// payload(i), and waits until they are queued for Read.
func sendDatagrams(t *testing.T, h *netstack.Host, dst netip.AddrPort, n int, payload func(int) []byte) {
	t.Helper()
	c, err := h.DialUDP(netip.AddrPort{}, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := h.Stats().OutQueued
	for i := range n {
		if _, err := c.Write(payload(i)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, testTimeout, "datagrams queued", func() bool { return h.Stats().OutQueued >= before+n })
}

// TestReadBatchAndOffset checks that Read fills up to len(bufs) packets at
// the offset, leaves the headroom alone, and returns the rest later.
func TestReadBatchAndOffset(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			h := newHost(t, netstack.Options{Addrs: []netip.Addr{f.a}, BatchSize: 8})
			dst := netip.AddrPortFrom(f.b, 9)
			payload := func(i int) []byte { return []byte(fmt.Sprintf("datagram %02d", i)) }
			const total = 11
			sendDatagrams(t, h, dst, total, payload)

			const offset = 13
			bufs := make([][]byte, 4)
			sizes := make([]int, 4)
			for i := range bufs {
				bufs[i] = bytes.Repeat([]byte{0xAA}, offset+200)
			}
			got := 0
			for _, want := range []int{4, 4, 3} {
				n, err := h.Read(bufs, sizes, offset)
				if err != nil {
					t.Fatal(err)
				}
				if n != want {
					t.Fatalf("Read returned %d packets, want %d", n, want)
				}
				for i := range n {
					if !bytes.Equal(bufs[i][:offset], bytes.Repeat([]byte{0xAA}, offset)) {
						t.Errorf("Read wrote into the headroom of buffer %d", i)
					}
					pkt := bufs[i][offset : offset+sizes[i]]
					src, gotDst, data := parseUDP(t, pkt)
					if src.Addr() != f.a || gotDst != dst {
						t.Errorf("packet %d: %v → %v, want %v → %v", got, src, gotDst, f.a, dst)
					}
					if want := payload(got); !bytes.Equal(data, want) {
						t.Errorf("packet %d carries %q, want %q", got, data, want)
					}
					got++
				}
			}
			if s := h.Stats(); s.OutPackets != total || s.OutQueued != 0 {
				t.Errorf("stats after reading everything: %+v", s)
			}

			// A batch larger than BatchSize is capped at BatchSize.
			sendDatagrams(t, h, dst, 10, payload)
			big := make([][]byte, 16)
			bigSizes := make([]int, 16)
			for i := range big {
				big[i] = make([]byte, 1500)
			}
			n, err := h.Read(big, bigSizes, 0)
			if err != nil || n != 8 {
				t.Fatalf("Read with 16 buffers = %d, %v; want BatchSize 8", n, err)
			}
			if n, err := h.Read(big, bigSizes, 0); err != nil || n != 2 {
				t.Fatalf("second Read = %d, %v; want 2", n, err)
			}
			if n, err := h.Read(nil, nil, 0); n != 0 || err != nil {
				t.Errorf("Read with no buffers = %d, %v", n, err)
			}
			if _, err := h.Read(big, bigSizes, -1); !errors.Is(err, netstack.ErrBadOffset) {
				t.Errorf("Read with offset -1: %v", err)
			}
		})
	}
}

func parseUDP(t *testing.T, pkt []byte) (src, dst netip.AddrPort, payload []byte) {
	t.Helper()
	var s, d []byte
	var u header.UDP
	switch header.IPVersion(pkt) {
	case 4:
		ip := header.IPv4(pkt)
		if !ip.IsValid(len(pkt)) || !ip.IsChecksumValid() {
			t.Fatalf("bad IPv4 packet %x", pkt)
		}
		s, d = ip.SourceAddressSlice(), ip.DestinationAddressSlice()
		u = header.UDP(ip.Payload())
	case 6:
		ip := header.IPv6(pkt)
		if !ip.IsValid(len(pkt)) {
			t.Fatalf("bad IPv6 packet %x", pkt)
		}
		s, d = ip.SourceAddressSlice(), ip.DestinationAddressSlice()
		u = header.UDP(ip.Payload())
	default:
		t.Fatalf("not an IP packet: %x", pkt)
	}
	sa, _ := netip.AddrFromSlice(s)
	da, _ := netip.AddrFromSlice(d)
	return netip.AddrPortFrom(sa, u.SourcePort()), netip.AddrPortFrom(da, u.DestinationPort()), u.Payload()
}

// TestReadDropsTooBig checks that a packet larger than the caller's buffer is
// dropped and counted, and that Read goes on to the next one.
func TestReadDropsTooBig(t *testing.T) {
	h := newHost(t, netstack.Options{Addrs: []netip.Addr{v4A}})
	sizes := []int{600, 10, 700, 20}
	sendDatagrams(t, h, netip.AddrPortFrom(v4B, 9), len(sizes), func(i int) []byte { return make([]byte, sizes[i]) })
	bufs := [][]byte{make([]byte, 8+200), make([]byte, 8+200), make([]byte, 8+200)}
	got := make([]int, 3)
	n, err := h.Read(bufs, got, 8)
	if err != nil || n != 2 {
		t.Fatalf("Read = %d, %v; want the 2 small packets", n, err)
	}
	if got[0] != 20+8+10 || got[1] != 20+8+20 {
		t.Errorf("sizes %v, want [38 48]", got[:2])
	}
	if s := h.Stats(); s.OutTooBig != 2 || s.OutPackets != 2 {
		t.Errorf("stats %+v, want OutTooBig 2, OutPackets 2", s)
	}
	// When everything read was too big, Read keeps waiting.
	sendDatagrams(t, h, netip.AddrPortFrom(v4B, 9), 1, func(int) []byte { return make([]byte, 900) })
	done := make(chan error, 1)
	go func() {
		_, err := h.Read(bufs, got, 8)
		done <- err
	}()
	eventually(t, testTimeout, "the big packet to be dropped", func() bool { return h.Stats().OutTooBig == 3 })
	select {
	case err := <-done:
		t.Fatalf("Read returned (%v) with nothing that fits", err)
	default:
	}
	h.Close()
	select {
	case err := <-done:
		if !errors.Is(err, transport.ErrClosed) {
			t.Errorf("Read after Close: %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Close did not unblock Read")
	}
}

// TestCloseUnblocksRead checks that Close wakes a Read blocked on an empty
// queue, and that Read, Write and Close behave after it.
func TestCloseUnblocksRead(t *testing.T) {
	h, err := netstack.New(netstack.Options{Addrs: []netip.Addr{v4A, v6A}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		bufs := [][]byte{make([]byte, 2000)}
		_, err := h.Read(bufs, []int{0}, 0)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("Read returned before Close: %v", err)
	case <-time.After(20 * time.Millisecond): // give Read the chance to block
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, transport.ErrClosed) {
			t.Fatalf("blocked Read returned %v, want ErrClosed", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Close did not unblock Read")
	}
	if _, err := h.Read([][]byte{make([]byte, 10)}, []int{0}, 0); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Read after Close: %v", err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// goleak (TestMain) checks that no goroutine of the host is left.
}

// TestCloseWithTraffic closes hosts while TCP is in full flight, from both
// ends, and checks that nothing hangs or leaks.
func TestCloseWithTraffic(t *testing.T) {
	a, b := hostPair(t, []netip.Addr{v4A}, []netip.Addr{v4B}, nil)
	ln, err := b.ListenTCP(netip.AddrPortFrom(v4B, 1))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	}()
	c, err := a.DialTCP(ctxT(t), netip.AddrPortFrom(v4B, 1))
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				wrote <- err
				return
			}
		}
	}()
	eventually(t, testTimeout, "traffic", func() bool { return b.Stats().InBytes > 1<<20 })
	a.Close()
	select {
	case err := <-wrote:
		if err == nil {
			t.Error("Write on a closed host succeeded")
		}
	case <-time.After(testTimeout):
		t.Fatal("Close did not unblock a TCP Write")
	}
	b.Close()
}

// TestWriteGarbage writes malformed, truncated and oversized packets and
// checks that each is dropped and counted where it should be.
func TestWriteGarbage(t *testing.T) {
	h := newHost(t, netstack.Options{Addrs: []netip.Addr{v4A, v6A}, MTU: 1400})
	good4 := udpPacket(netip.AddrPortFrom(v4B, 1), netip.AddrPortFrom(v4A, 9), 64, []byte("hello"))
	good6 := udpPacket(netip.AddrPortFrom(v6B, 1), netip.AddrPortFrom(v6A, 9), 64, []byte("hello"))
	mod := func(p []byte, f func([]byte)) []byte {
		p = bytes.Clone(p)
		f(p)
		return p
	}
	cases := []struct {
		name                        string
		pkt                         []byte
		malformed, tooBig, accepted uint64
	}{
		{"empty", []byte{}, 1, 0, 0},
		{"version 0", make([]byte, 40), 1, 0, 0},
		{"version 5", mod(good4, func(p []byte) { p[0] = 0x55 }), 1, 0, 0},
		{"version 15", bytes.Repeat([]byte{0xff}, 60), 1, 0, 0},
		{"IPv4 truncated to 10 bytes", good4[:10], 1, 0, 0},
		{"IPv4 truncated inside the payload", good4[:25], 1, 0, 0},
		{"IPv4 IHL 4", mod(good4, func(p []byte) { p[0] = 0x44 }), 1, 0, 0},
		{"IPv4 IHL beyond total length", mod(good4, func(p []byte) { p[0] = 0x4f }), 1, 0, 0},
		{"IPv4 total length 0", mod(good4, func(p []byte) { p[2], p[3] = 0, 0 }), 1, 0, 0},
		{"IPv6 truncated to 30 bytes", good6[:30], 1, 0, 0},
		{"IPv6 payload length too big", mod(good6, func(p []byte) { p[4], p[5] = 0xff, 0xff }), 1, 0, 0},
		{"over the MTU", append(bytes.Clone(good4), make([]byte, 1400)...), 0, 1, 0},
		{"IPv4 bad header checksum", mod(good4, func(p []byte) { p[10] ^= 0xff }), 0, 0, 1},
		{"IPv4 bad UDP checksum", mod(good4, func(p []byte) { p[len(p)-1] ^= 0xff }), 0, 0, 1},
		{"IPv6 bad UDP checksum", mod(good6, func(p []byte) { p[len(p)-1] ^= 0xff }), 0, 0, 1},
		{"IPv4 good", good4, 0, 0, 1},
		{"IPv6 good", good6, 0, 0, 1},
	}
	for _, c := range cases {
		before := h.Stats()
		n, err := h.Write([][]byte{append(make([]byte, 4), c.pkt...)}, 4)
		if n != 1 || err != nil {
			t.Errorf("%s: Write = %d, %v; want 1, nil", c.name, n, err)
		}
		after := h.Stats()
		if got := after.InMalformed - before.InMalformed; got != c.malformed {
			t.Errorf("%s: InMalformed +%d, want +%d", c.name, got, c.malformed)
		}
		if got := after.InTooBig - before.InTooBig; got != c.tooBig {
			t.Errorf("%s: InTooBig +%d, want +%d", c.name, got, c.tooBig)
		}
		if got := after.InPackets - before.InPackets; got != c.accepted {
			t.Errorf("%s: InPackets +%d, want +%d", c.name, got, c.accepted)
		}
	}
	s := h.Stats()
	if s.StackMalformed != 1 {
		t.Errorf("StackMalformed = %d, want 1 (the bad header checksum)", s.StackMalformed)
	}
	if s.StackChecksumErrors != 2 {
		t.Errorf("StackChecksumErrors = %d, want 2 (the bad UDP checksums)", s.StackChecksumErrors)
	}
	// An offset past the end of a buffer is a malformed packet, not a panic.
	before := h.Stats().InMalformed
	if _, err := h.Write([][]byte{make([]byte, 3)}, 8); err != nil {
		t.Error(err)
	}
	if got := h.Stats().InMalformed - before; got != 1 {
		t.Errorf("offset past the end: InMalformed +%d, want +1", got)
	}
	if _, err := h.Write([][]byte{good4}, -1); !errors.Is(err, netstack.ErrBadOffset) {
		t.Errorf("Write with offset -1: %v", err)
	}
}

// TestWriteDelivers checks that an injected datagram reaches a socket.
func TestWriteDelivers(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			h := newHost(t, netstack.Options{Addrs: []netip.Addr{f.a}})
			pc, err := h.ListenUDP(netip.AddrPortFrom(f.a, 9))
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close()
			from := netip.AddrPortFrom(f.b, 1234)
			batch := [][]byte{
				udpPacket(from, netip.AddrPortFrom(f.a, 9), 64, []byte("one")),
				udpPacket(from, netip.AddrPortFrom(f.a, 9), 64, []byte("two")),
			}
			if n, err := h.Write(batch, 0); n != 2 || err != nil {
				t.Fatalf("Write = %d, %v", n, err)
			}
			pc.SetReadDeadline(time.Now().Add(testTimeout))
			buf := make([]byte, 100)
			for _, want := range []string{"one", "two"} {
				n, addr, err := pc.ReadFrom(buf)
				if err != nil {
					t.Fatal(err)
				}
				if string(buf[:n]) != want || addr.String() != from.String() {
					t.Errorf("got %q from %v, want %q from %v", buf[:n], addr, want, from)
				}
			}
		})
	}
}

// TestForwarding checks that with forwarding on, a packet for another
// address is routed back out with its TTL decremented, and dropped without.
func TestForwarding(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			h := newHost(t, netstack.Options{Addrs: []netip.Addr{f.b}})
			other := netip.MustParseAddr("10.200.0.9")
			if f.a.Is6() {
				other = netip.MustParseAddr("fd00:200::9")
			}
			pkt := udpPacket(netip.AddrPortFrom(f.a, 1000), netip.AddrPortFrom(other, 2000), 64, []byte("through"))
			if _, err := h.Write([][]byte{pkt}, 0); err != nil {
				t.Fatal(err)
			}
			if q := h.Stats().OutQueued; q != 0 {
				t.Fatalf("forwarded %d packets with forwarding off", q)
			}
			if err := h.SetForwarding(true); err != nil {
				t.Fatal(err)
			}
			if _, err := h.Write([][]byte{pkt}, 0); err != nil {
				t.Fatal(err)
			}
			eventually(t, testTimeout, "the forwarded packet", func() bool { return h.Stats().OutQueued == 1 })
			buf := make([]byte, 1500)
			sizes := []int{0}
			if n, err := h.Read([][]byte{buf}, sizes, 0); n != 1 || err != nil {
				t.Fatalf("Read = %d, %v", n, err)
			}
			out := buf[:sizes[0]]
			src, dst, data := parseUDP(t, out)
			if src.Addr() != f.a || dst.Addr() != other || string(data) != "through" {
				t.Errorf("forwarded %v → %v %q", src, dst, data)
			}
			ttl := out[8] // IPv4 TTL
			if f.a.Is6() {
				ttl = out[7] // IPv6 hop limit
			}
			if ttl != 63 {
				t.Errorf("TTL after forwarding = %d, want 63", ttl)
			}
			if err := h.SetForwarding(false); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestConcurrentWriteRead has several goroutines Write into a host at once
// while several goroutines Read from it, under the race detector: every
// datagram injected reaches the socket, and every echo comes out exactly once.
func TestConcurrentWriteRead(t *testing.T) {
	h := newHost(t, netstack.Options{Addrs: []netip.Addr{v4A}, Queue: 4096})
	pc, err := h.ListenUDP(netip.AddrPortFrom(v4A, 7))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	const writers, perWriter = 4, 200
	// Echo every datagram back to its sender: the echoes leave via Read.
	go func() {
		buf := make([]byte, 100)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	seen := make(chan uint32, writers*perWriter)
	readers := make(chan error, 2)
	for range 2 {
		go func() {
			bufs := [][]byte{make([]byte, 200), make([]byte, 200), make([]byte, 200)}
			sizes := make([]int, 3)
			for {
				n, err := h.Read(bufs, sizes, 0)
				if err != nil {
					readers <- err
					return
				}
				for i := range n {
					data := bufs[i][20+8 : sizes[i]] // IPv4 and UDP headers
					seen <- uint32(data[0])<<8 | uint32(data[1])
				}
			}
		}()
	}
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			for i := range perWriter {
				id := w*perWriter + i
				p := udpPacket(netip.AddrPortFrom(v4B, uint16(1000+w)), netip.AddrPortFrom(v4A, 7), 64, []byte{byte(id >> 8), byte(id)})
				if _, err := h.Write([][]byte{p}, 0); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	got := make(map[uint32]bool)
	deadline := time.After(testTimeout)
	for len(got) < writers*perWriter {
		select {
		case id := <-seen:
			if got[id] {
				t.Fatalf("echo %d came out twice", id)
			}
			got[id] = true
		case <-deadline:
			t.Fatalf("%d of %d echoes came out; stats %+v", len(got), writers*perWriter, h.Stats())
		}
	}
	if s := h.Stats(); s.InPackets != writers*perWriter || s.OutPackets != writers*perWriter {
		t.Errorf("stats %+v", s)
	}
	h.Close()
	for range 2 {
		if err := <-readers; !errors.Is(err, transport.ErrClosed) {
			t.Errorf("reader ended with %v", err)
		}
	}
}
