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
	"github.com/vipkit/vipkit/probe"
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

// A member with a valid key floods probe requests (as wireguard-go hands
// them to Write after decryption) while the host sends traffic of its own.
// Each request is answered with an engine-made packet that goes through the
// inject queue and may interrupt the host's Read. The flood must not starve
// the host: every host packet leaves while it lasts. The engine answers at
// most probeReplyRate requests a second per peer (a burst of as many, here
// on a clock that stands still), refuses and counts the rest, and every
// reply it queued comes out of Read.
// (The peer's batches cross the engine's Write directly; wireguard-go's
// decryption, which bounds a real peer's rate far below this, is left out.)
func TestEngineDirectReadProbeFloodDoesNotStarveHost(t *testing.T) {
	readPaths(t, func(t *testing.T, readAhead bool) {
		u, stack := directEngine(t, readAhead)
		const hostPkts = 500
		port := u.e.probePort
		stop := make(chan struct{})
		floodDone := make(chan uint64)
		// The flood: 64-request batches, as fast as Write takes them, from
		// prebuilt requests (so that building them does not pace it).
		batch := make([][]byte, 64)
		for i := range batch {
			batch[i] = probeRequest(t, u, uint64(i))
		}
		go func() {
			var sent uint64
			for {
				select {
				case <-stop:
					floodDone <- sent
					return
				default:
				}
				for i := range batch { // Write may have used the headroom
					batch[i] = batch[i][:16+probe.PacketLen]
				}
				if _, err := u.e.Write(batch, 16); err != nil {
					floodDone <- sent
					return
				}
				sent += uint64(len(batch))
			}
		}()
		go func() {
			for i := range hostPkts {
				_, _ = stack.Write([][]byte{hostUDP(t, u, i)}, 0)
				if i%16 == 0 {
					time.Sleep(time.Millisecond) // the host's own pace
				}
			}
		}()
		bufs, sizes := make([][]byte, 64), make([]int, 64)
		for i := range bufs {
			bufs[i] = make([]byte, 16+1500)
		}
		var hostGot, replies uint64
		deadline := time.Now().Add(20 * time.Second)
		for hostGot < hostPkts {
			if time.Now().After(deadline) {
				close(stop)
				t.Fatalf("%d of %d host packets left during the flood (%d replies read)", hostGot, hostPkts, replies)
			}
			n, err := u.e.Read(bufs, sizes, 16)
			if err != nil {
				t.Fatal(err)
			}
			for i := range n {
				if probe.IsProbePacket(bufs[i][16:16+sizes[i]], port) {
					replies++
				} else if _, dst, _, err := probe.ParseIPv4UDP(bufs[i][16 : 16+sizes[i]]); err == nil && dst.Port() == 9 {
					hostGot++
				}
			}
		}
		close(stop)
		sent := <-floodDone
		// Drain what is still queued, then account for every answered request.
		for u.e.pending.Load() > 0 {
			n, err := u.e.Read(bufs, sizes, 16)
			if err != nil {
				t.Fatal(err)
			}
			replies += uint64(n)
		}
		// Every probe packet the engine queued (replies and its own probes)
		// came out of Read; beyond the burst, requests were refused.
		st, full := u.e.Status().Probe, u.e.counters.queueFull.Load()
		if replies != st.PacketsOut || full != 0 {
			t.Fatalf("%d probe packets queued, %d read, %d queue-full", st.PacketsOut, replies, full)
		}
		if st.Answered > probeReplyRate || st.Answered+st.Rejected != sent {
			t.Fatalf("%d requests: %d answered, %d rejected; want at most %d answered, the rest rejected", sent, st.Answered, st.Rejected, probeReplyRate)
		}
		t.Logf("flood of %d requests: %d replies read, %d dropped as queue-full, %d host packets", sent, replies, full, hostGot)
	})
}

// probeRequest is a probe request from the unit engine's peer to its node.
func probeRequest(t *testing.T, u *unitEngine, seq uint64) []byte {
	t.Helper()
	m, err := probe.Message{Type: probe.TypeRequest, Session: 1, Sequence: seq, Nonce: seq}.Marshal(make([]byte, probe.MessageLen))
	if err != nil {
		t.Fatal(err)
	}
	port := u.e.probePort
	p, err := probe.AppendIPv4UDP(make([]byte, 16, 16+probe.PacketLen), netip.AddrPortFrom(u.peer.Addr, port), netip.AddrPortFrom(u.self.Addr, port), uint16(seq), m)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A peer's probe replies follow a token bucket: a burst of probeReplyRate,
// then probeReplyRate a second; at the boundary, exactly the tokens earned.
func TestEngineProbeReplyRate(t *testing.T) {
	u := newUnitEngine(t, 7)
	send := func(n int) (answered, rejected uint64) {
		st0 := u.e.Status().Probe
		for i := range n {
			if _, err := u.e.Write([][]byte{probeRequest(t, u, uint64(i))}, 16); err != nil {
				t.Fatal(err)
			}
		}
		st1 := u.e.Status().Probe
		return st1.Answered - st0.Answered, st1.Rejected - st0.Rejected
	}
	if a, r := send(probeReplyRate - 1); a != probeReplyRate-1 || r != 0 {
		t.Fatalf("burst-1: %d answered, %d rejected", a, r)
	}
	if a, r := send(2); a != 1 || r != 1 {
		t.Fatalf("burst and one over: %d answered, %d rejected; want 1 and 1", a, r)
	}
	u.clock.Advance(500 * time.Millisecond) // earns half the rate
	if a, r := send(probeReplyRate); a != probeReplyRate/2 || r != probeReplyRate/2 {
		t.Fatalf("after 500 ms: %d answered, %d rejected; want %d each", a, r, probeReplyRate/2)
	}
	u.clock.Advance(time.Hour) // the bucket holds no more than the burst
	if a, r := send(2 * probeReplyRate); a != probeReplyRate || r != probeReplyRate {
		t.Fatalf("after an hour: %d answered, %d rejected; want %d each", a, r, probeReplyRate)
	}
}
