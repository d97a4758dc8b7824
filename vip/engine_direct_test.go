package vip

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/packet"
	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// directEngine is a unit engine whose host is one end of a ChanIO pair
// (a transport.ReadInterrupter, so the engine reads it directly); the test
// writes host packets into the other end and plays wireguard-go by calling
// Read.
func directEngine(t *testing.T, readAhead bool) (*unitEngine, *transporttest.ChanIO) {
	t.Helper()
	host, stack := transporttest.NewChanPair(transporttest.ChanPairOptions{})
	u := newUnitEngineWith(t, 7, func(o *EngineOptions) {
		o.Host = host
		o.ReadAhead = readAhead
	})
	if (u.e.direct != nil) == readAhead {
		t.Fatalf("direct = %v with ReadAhead %v", u.e.direct != nil, readAhead)
	}
	return u, stack
}

// hostUDP is a UDP packet from the unit engine's node to its peer, payload
// tagged with i.
func hostUDP(t *testing.T, u *unitEngine, i int) []byte {
	t.Helper()
	return hostUDPTo(t, u, u.peer.Addr, i)
}

// hostUDPTo is hostUDP to dst.
func hostUDPTo(t *testing.T, u *unitEngine, dst netip.Addr, i int) []byte {
	t.Helper()
	p, err := packet.AppendUDP(nil, packet.IPv4Fields{Src: u.self.Addr, Dst: dst},
		packet.UDPFields{SrcPort: 40000, DstPort: 9}, fmt.Appendf(nil, "packet %d", i))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type readResult struct {
	pkts [][]byte
	err  error
}

// readOnce calls u.e.Read once in a goroutine, as wireguard-go does (16
// bytes of headroom), and delivers copies of what it returned.
func readOnce(u *unitEngine) <-chan readResult {
	ch := make(chan readResult, 1)
	go func() {
		bufs, sizes := make([][]byte, 64), make([]int, 64)
		for i := range bufs {
			bufs[i] = make([]byte, 16+1500)
		}
		n, err := u.e.Read(bufs, sizes, 16)
		var r readResult
		for i := range n {
			r.pkts = append(r.pkts, append([]byte(nil), bufs[i][16:16+sizes[i]]...))
		}
		r.err = err
		ch <- r
	}()
	return ch
}

// blockedRead is readOnce, returning once a direct engine's Read waits in
// the host (a read-ahead engine's Read waits on its pump instead).
func blockedRead(t *testing.T, u *unitEngine, readAhead bool) <-chan readResult {
	t.Helper()
	ch := readOnce(u)
	if !readAhead {
		pollUntil(t, 10*time.Second, "Read to block in the host", u.e.reading.Load)
	}
	return ch
}

func waitRead(t *testing.T, ch <-chan readResult, what string) readResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("Read did not return %s within 10 s", what)
		return readResult{}
	}
}

// An engine-made packet queued while the host is idle leaves at once: it
// interrupts the host Read that Read is blocked in.
func TestEngineDirectReadSendsEnginePacketsWhileHostIdle(t *testing.T) {
	readPaths(t, func(t *testing.T, readAhead bool) {
		u, _ := directEngine(t, readAhead)
		ch := blockedRead(t, u, readAhead)
		pkt := hostUDP(t, u, 1)
		if !u.e.injectOverlay(pkt) {
			t.Fatal("inject queue full")
		}
		r := waitRead(t, ch, "the injected packet")
		if r.err != nil || len(r.pkts) != 1 || !bytes.Equal(r.pkts[0], pkt) {
			t.Fatalf("Read = %d packets, %v; want the injected one", len(r.pkts), r.err)
		}
	})
}

// Host packets the NAT drops leave no hole: the kept ones behind them are
// moved forward in wireguard-go's buffers, in order and intact.
func TestEngineDirectReadCompactsDrops(t *testing.T) {
	readPaths(t, func(t *testing.T, readAhead bool) {
		u, stack := directEngine(t, readAhead)
		var want [][]byte
		var batch [][]byte
		for i := range 6 {
			p := hostUDP(t, u, i)
			if i%2 == 1 {
				// To the VIP on a port it does not serve: the NAT drops it.
				p = hostUDPTo(t, u, u.svc.Addr, i)
			} else {
				want = append(want, p)
			}
			batch = append(batch, p)
		}
		before := u.e.nat.Stats()
		if _, err := stack.Write(batch, 0); err != nil {
			t.Fatal(err)
		}
		var got [][]byte
		for len(got) < len(want) {
			r := waitRead(t, readOnce(u), "the kept packets")
			if r.err != nil {
				t.Fatal(r.err)
			}
			got = append(got, r.pkts...)
		}
		if len(got) != len(want) {
			t.Fatalf("got %d packets, want %d", len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Errorf("packet %d = %x, want %x", i, got[i], want[i])
			}
		}
		if d := dropsTotal(u.e.nat.Stats()) - dropsTotal(before); d != 3 {
			t.Errorf("NAT drops grew by %d, want 3", d)
		}
	})
}

func dropsTotal(s flow.Stats) uint64 {
	var n uint64
	for _, v := range s.Drops {
		n += v
	}
	return n
}

// Many goroutines injecting while the host carries traffic and then while
// it is idle: every packet arrives; a lost wake-up leaves the reader blocked
// in the idle host until the deadline.
func TestEngineDirectReadNoLostWakeup(t *testing.T) {
	readPaths(t, func(t *testing.T, readAhead bool) {
		u, stack := directEngine(t, readAhead)
		const injectors, each, hostPkts = 4, 200, 300
		hostDone := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(hostDone)
			for i := range hostPkts {
				_, _ = stack.Write([][]byte{hostUDP(t, u, i)}, 0)
				if i%8 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}()
		for g := range injectors {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					if i == each/2 {
						<-hostDone // the second half into an idle host
					}
					p := hostUDP(t, u, 10000*(g+1)+i)
					for !u.e.injectOverlay(p) {
						time.Sleep(time.Millisecond) // queue full: let the reader drain
					}
					if i%16 == 0 {
						time.Sleep(time.Millisecond)
					}
				}
			}()
		}
		bufs, sizes := make([][]byte, 64), make([]int, 64)
		for i := range bufs {
			bufs[i] = make([]byte, 16+1500)
		}
		got := 0
		deadline := time.Now().Add(20 * time.Second)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for got < injectors*each+hostPkts {
				n, err := u.e.Read(bufs, sizes, 16)
				if err != nil {
					return
				}
				got += n
			}
		}()
		select {
		case <-done:
		case <-time.After(time.Until(deadline)):
			u.e.Close()
			<-done
			t.Fatalf("got %d of %d packets by the deadline", got, injectors*each+hostPkts)
		}
		wg.Wait()
		if got != injectors*each+hostPkts {
			t.Fatalf("got %d packets, want %d", got, injectors*each+hostPkts)
		}
		if q := u.e.counters.queueFull.Load(); q != 0 {
			t.Logf("%d injections found the queue full and were retried", q)
		}
	})
}

// Close unblocks a Read waiting in the host, which reports ErrEngineClosed.
func TestEngineDirectReadClose(t *testing.T) {
	readPaths(t, func(t *testing.T, readAhead bool) {
		u, _ := directEngine(t, readAhead)
		ch := blockedRead(t, u, readAhead)
		u.e.Close()
		if r := waitRead(t, ch, "after Close"); !errors.Is(r.err, ErrEngineClosed) {
			t.Fatalf("Read after Close: %v, want ErrEngineClosed", r.err)
		}
	})
}

// failingHost is an interruptible host whose Read returns one packet and
// then an error of its own (as a TUN reports ErrTooManySegments).
type failingHost struct {
	recHost
	pkt []byte
	err error
}

func (h *failingHost) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	sizes[0] = copy(bufs[0][offset:], h.pkt)
	return 1, h.err
}

func (h *failingHost) InterruptRead() {}

var _ transport.ReadInterrupter = (*failingHost)(nil)

// A host error that comes with packets (a TUN's tun.ErrTooManySegments
// comes with the segments that fit) does not end the read-ahead pump: the
// packets keep coming.
func TestEngineReadAheadHostErrorWithPackets(t *testing.T) {
	hostErr := errors.New("too many segments")
	// The unit engine's node and peer are 100.80.0.1 and .2.
	pkt, err := packet.AppendUDP(nil, packet.IPv4Fields{Src: netip.MustParseAddr("100.80.0.1"), Dst: netip.MustParseAddr("100.80.0.2")},
		packet.UDPFields{SrcPort: 40000, DstPort: 9}, []byte("segment"))
	if err != nil {
		t.Fatal(err)
	}
	h := &failingHost{recHost: recHost{done: make(chan struct{})}, pkt: pkt, err: hostErr}
	u := newUnitEngineWith(t, 7, func(o *EngineOptions) { o.Host, o.ReadAhead = h, true })
	for i := range 3 {
		r := waitRead(t, readOnce(u), "packets")
		if r.err != nil || len(r.pkts) == 0 {
			t.Fatalf("Read %d = %d packets, %v; want packets and no error", i, len(r.pkts), r.err)
		}
	}
}

// A direct host's own read error reaches wireguard-go with the packets read
// before it, as from a TUN: wireguard-go tells a transient one
// (tun.ErrTooManySegments) from a fatal one.
func TestEngineDirectReadHostErrorPassesThrough(t *testing.T) {
	hostErr := errors.New("too many segments")
	var u *unitEngine
	h := &failingHost{recHost: recHost{done: make(chan struct{})}, err: hostErr}
	u = newUnitEngineWith(t, 7, func(o *EngineOptions) { o.Host = h })
	h.pkt = hostUDP(t, u, 1)
	r := waitRead(t, readOnce(u), "the host's error")
	if !errors.Is(r.err, hostErr) || len(r.pkts) != 1 || !bytes.Equal(r.pkts[0], h.pkt) {
		t.Fatalf("Read = %d packets, %v; want the packet and the host's error", len(r.pkts), r.err)
	}
}
