package tsng

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/vipkit/vipkit/vip"
)

// TestControlStalledConnections: one member opens 1,500 connections to the
// control channel, announces a maximal frame on each and sends nothing
// more. The receiver keeps at most the per-peer limit of them, allocates
// nothing for bytes that never came, counts the refusals, and still takes
// frames from another member.
func TestControlStalledConnections(t *testing.T) {
	const conns = 1500
	const maxFrame = 64 << 10
	self, evil, good := netip.MustParseAddr("127.0.0.31"), netip.MustParseAddr("127.0.0.32"), netip.MustParseAddr("127.0.0.33")
	idEvil, idGood := vip.NodeID{2}, vip.NodeID{3}
	peer := func(a netip.Addr) (vip.NodeID, bool) {
		switch a {
		case evil:
			return idEvil, true
		case good:
			return idGood, true
		}
		return vip.NodeID{}, false
	}
	got := make(chan vip.NodeID, 16)
	key, _ := testKey("self")
	c, err := NewControl(context.Background(), ControlOptions{Net: KernelNet{Self: self}, Self: self, Port: 51932, Key: key, Peer: peer,
		Addr: func(vip.NodeID) (netip.Addr, bool) { return netip.Addr{}, false }, MaxFrame: maxFrame,
		Handle: func(_ context.Context, from vip.NodeID, _ []byte) error { got <- from; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()

	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: evil.AsSlice()}}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], maxFrame)
	open := make([]net.Conn, 0, conns)
	defer func() {
		for _, x := range open {
			x.Close()
		}
	}()
	for i := 0; i < conns; i++ {
		x, err := d.Dial("tcp", "127.0.0.31:51932")
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		open = append(open, x)
		x.Write(hdr[:])
		x.Write([]byte{1, 2, 3}) // a few bytes of the frame, then silence
	}
	// Every connection beyond the limit is refused and counted.
	deadline := time.Now().Add(10 * time.Second)
	for c.Stats().Refused < conns-uint64(DefaultControlConnsPerPeer) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	g1 := runtime.NumGoroutine()
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d stalled connections: %+d goroutines, %+d KiB heap, refused %d", conns, g1-g0, heap>>10, c.Stats().Refused)
	if g1-g0 > 2*DefaultControlConnsPerPeer+8 {
		t.Errorf("goroutines grew by %d for one member's stalled connections", g1-g0)
	}
	if heap > 4<<20 {
		t.Errorf("heap grew by %d KiB for one member's stalled connections", heap>>10)
	}
	if r := c.Stats().Refused; r < conns-uint64(DefaultControlConnsPerPeer) {
		t.Fatalf("refused %d of %d stalled connections, want all beyond the limit of %d", r, conns, DefaultControlConnsPerPeer)
	}
	// Another member still gets through.
	gd := net.Dialer{LocalAddr: &net.TCPAddr{IP: good.AsSlice()}}
	x, err := gd.Dial("tcp", "127.0.0.31:51932")
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	binary.BigEndian.PutUint32(hdr[:], 2)
	x.Write(append(hdr[:], 'o', 'k'))
	select {
	case from := <-got:
		if from != idGood {
			t.Fatalf("frame from %v", from)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the other member's frame did not arrive")
	}
}

// TestControlFrameDeadline: a frame whose bytes stop arriving is given up
// after the frame deadline, and the connection closed.
func TestControlFrameDeadline(t *testing.T) {
	self, p := netip.MustParseAddr("127.0.0.34"), netip.MustParseAddr("127.0.0.35")
	key, _ := testKey("self")
	c, err := NewControl(context.Background(), ControlOptions{Net: KernelNet{Self: self}, Self: self, Port: 51933, Key: key,
		Peer:     func(a netip.Addr) (vip.NodeID, bool) { return vip.NodeID{5}, a == p },
		Addr:     func(vip.NodeID) (netip.Addr, bool) { return netip.Addr{}, false },
		MaxFrame: 1024, FrameTimeout: 200 * time.Millisecond,
		Handle: func(context.Context, vip.NodeID, []byte) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: p.AsSlice()}}
	x, err := d.Dial("tcp", "127.0.0.34:51933")
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	x.Write([]byte{0, 0, 1, 0, 'a'})
	x.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := x.Read(make([]byte, 1)); err == nil {
		t.Fatal("the stalled frame's connection stayed open")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the stalled frame's connection was not closed within 10s")
	}
	if c.Stats().Refused == 0 {
		t.Fatal("the stalled frame was not counted")
	}
}
