package tunwrap_test

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/transport/transporttest"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/tunwrap"
)

// countingTUN counts the inner Reads that returned, so a test can tell
// how far the Wrapper's reader has run ahead.
type countingTUN struct {
	tun.Device
	reads atomic.Int64
}

func (c *countingTUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n, err := c.Device.Read(bufs, sizes, offset)
	c.reads.Add(1)
	return n, err
}

// newRingFixture is newFixture over a counted inner TUN of batch size bs.
func newRingFixture(t *testing.T, bs int, o tunwrap.Options) (*tunwrap.Wrapper, *transporttest.ChanIO, *countingTUN) {
	t.Helper()
	host, dev := transporttest.NewChanPair(transporttest.ChanPairOptions{BatchSize: bs})
	inner := &countingTUN{Device: wg.TUNFromPacketIO(dev)}
	if o.PeerOf == nil {
		o.PeerOf = func(src netip.Addr) (flow.PeerID, bool) { return 7, src == beAddr }
	}
	w := tunwrap.Wrap(inner, o)
	t.Cleanup(func() { w.Close(); host.Close() })
	return w, host, inner
}

// waitReads polls until the reader has returned from n inner Reads.
func waitReads(t *testing.T, c *countingTUN, n int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); c.reads.Load() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("the reader returned from %d inner Reads, want %d", c.reads.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func hostSend(t *testing.T, host *transporttest.ChanIO, tags ...string) {
	t.Helper()
	for i, s := range tags {
		if _, err := host.Write([][]byte{udp(t, cliAddr, uint16(100+i), s)}, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// With the ring full (the reader has read ReadAhead batches nobody took),
// injections both ways still go through at once: the outbound ones come
// before the batches already read, the inbound one reaches the host, and
// the host's packets then follow in order.
func TestInjectWithFullRing(t *testing.T) {
	w, host, inner := newRingFixture(t, 1, tunwrap.Options{ReadAhead: 2})
	hostSend(t, host, "h1", "h2", "h3", "h4")
	waitReads(t, inner, 2) // the ring holds h1 and h2; the reader waits for room

	for _, s := range []string{"i1", "i2"} {
		if err := w.InjectOutbound(udp(t, cliAddr, 9, s)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.InjectInbound(udp(t, vipAddr, 9, "to-host")); err != nil {
		t.Fatal(err)
	}
	if g := hostReadN(t, host, 1); g[0] != "to-host" {
		t.Fatalf("host read %v", g)
	}
	got := fmt.Sprint(readN(t, w, 6))
	if want := "[i1 i2 h1 h2 h3 h4]"; got != want {
		t.Fatalf("wireguard-go read %s, want %s", got, want)
	}
}

// Close while the reader has run ahead (a full ring nobody takes, the
// reader waiting for room) returns at once, stops the reader (goleak
// checks) and fails the Read that comes after.
func TestCloseWithFullRing(t *testing.T) {
	w, host, inner := newRingFixture(t, 1, tunwrap.Options{ReadAhead: 3})
	hostSend(t, host, "a", "b", "c", "d", "e")
	waitReads(t, inner, 3)
	closed := make(chan error, 1)
	go func() { closed <- w.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung with a full ring")
	}
	bufs, sizes := batch(4)
	if _, err := w.Read(bufs, sizes, tunwrap.Offset); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Read after Close: %v, want os.ErrClosed", err)
	}
}

// Close while the reader is in the inner Read and a Read waits on the
// empty ring, repeated to catch the interleavings.
func TestCloseWhileReaderAhead(t *testing.T) {
	for i := range 50 {
		w, host, _ := newRingFixture(t, 1, tunwrap.Options{ReadAhead: 2})
		hostSend(t, host, "a")
		done := make(chan error, 1)
		go func() {
			bufs, sizes := batch(1)
			for {
				if _, err := w.Read(bufs, sizes, tunwrap.Offset); err != nil {
					done <- err
					return
				}
			}
		}()
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, os.ErrClosed) {
				t.Fatalf("round %d: Read ended with %v, want os.ErrClosed", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Read hung after Close", i)
		}
	}
}

// A batch larger than the buffers wireguard-go offers is handed on over
// several Reads, in order; batches the reader read ahead are joined into
// one Read while its buffers have room.
func TestPartialAndJoinedBatches(t *testing.T) {
	w, host, inner := newRingFixture(t, 8, tunwrap.Options{})
	var pkts [][]byte
	for _, s := range []string{"a", "b", "c", "d", "e"} {
		pkts = append(pkts, udp(t, cliAddr, 1, s))
	}
	if _, err := host.Write(pkts, 0); err != nil {
		t.Fatal(err)
	}
	waitReads(t, inner, 1)
	bufs, sizes := batch(2)
	var got []string
	for deadline := time.Now().Add(5 * time.Second); len(got) < 5; {
		if time.Now().After(deadline) {
			t.Fatalf("read %v, want [a b c d e]", got)
		}
		n, err := w.Read(bufs, sizes, tunwrap.Offset)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 || n > 2 {
			t.Fatalf("Read gave %d packets into 2 buffers", n)
		}
		for i := range n {
			got = append(got, tag(bufs[i][tunwrap.Offset:tunwrap.Offset+sizes[i]]))
		}
	}
	if fmt.Sprint(got) != "[a b c d e]" {
		t.Fatalf("read %v over several Reads, want [a b c d e]", got)
	}

	w2, host2, inner2 := newRingFixture(t, 1, tunwrap.Options{ReadAhead: 4})
	hostSend(t, host2, "x", "y", "z")
	waitReads(t, inner2, 3)
	bufs, sizes = batch(8)
	n, err := w2.Read(bufs, sizes, tunwrap.Offset)
	if err != nil || n != 3 {
		t.Fatalf("Read = %d, %v; want the 3 batches read ahead in one call", n, err)
	}
}

// When the inner TUN closes on its own (the device went away), Read
// reports ErrClosed, and so does every Read after it, instead of waiting
// for a reader that has stopped.
func TestInnerCloseFailsEveryRead(t *testing.T) {
	w, _, inner := newRingFixture(t, 1, tunwrap.Options{})
	if err := inner.Device.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		done := make(chan error, 1)
		go func() {
			bufs, sizes := batch(1)
			_, err := w.Read(bufs, sizes, tunwrap.Offset)
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, os.ErrClosed) {
				t.Fatalf("Read %d: %v, want os.ErrClosed", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Read %d hung after the inner TUN closed", i)
		}
	}
}

// A packet longer than the buffer wireguard-go offers is dropped and
// counted, never cut short: host traffic and outbound injections alike.
func TestOversizedPacketDroppedNotTruncated(t *testing.T) {
	host, dev := transporttest.NewChanPair(transporttest.ChanPairOptions{MTU: 4000})
	w := tunwrap.Wrap(wg.TUNFromPacketIO(dev), tunwrap.Options{})
	t.Cleanup(func() { w.Close(); host.Close() })
	big := udp(t, cliAddr, 1, string(make([]byte, 3000)))
	if _, err := host.Write([][]byte{big, udp(t, cliAddr, 2, "small")}, 0); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(readN(t, w, 1)); got != "[small]" { // readN offers 2048-byte buffers
		t.Fatalf("wireguard-go read %s, want [small]", got)
	}
	if err := w.InjectOutbound(big); err != nil {
		t.Fatal(err)
	}
	if err := w.InjectOutbound(udp(t, cliAddr, 3, "injected")); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(readN(t, w, 1)); got != "[injected]" {
		t.Fatalf("wireguard-go read %s, want [injected]", got)
	}
	if st := w.Stats(); st.Oversized != 2 || st.InjectedOutbound != 1 {
		t.Fatalf("stats %+v, want 2 oversized and 1 injection delivered", st)
	}
}

// Inbound injections racing with Writes are never stranded in the queue:
// whichever of the injector and the writer comes last writes them, so the
// host gets every packet with no later traffic to push them.
func TestInjectInboundRacingWrites(t *testing.T) {
	// Queues large enough for every packet: nothing may be dropped.
	host, dev := transporttest.NewChanPair(transporttest.ChanPairOptions{Queue: 4096})
	w := tunwrap.Wrap(wg.TUNFromPacketIO(dev), tunwrap.Options{QueueLen: 4096})
	t.Cleanup(func() { w.Close(); host.Close() })
	const injectors, writers, each = 4, 2, 200
	want := (injectors + writers) * each
	got := make(chan int, 1)
	go func() {
		n := 0
		bufs, sizes := batch(64)
		for n < want {
			k, err := host.Read(bufs, sizes, 0)
			if err != nil {
				break
			}
			n += k
		}
		got <- n
	}()
	errs := make(chan error, injectors+writers)
	for g := range injectors {
		go func() {
			p := udp(t, vipAddr, uint16(g), "inj")
			for range each {
				if err := w.InjectInbound(p); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for g := range writers {
		go func() {
			b := append(make([]byte, tunwrap.Offset), udp(t, beAddr, uint16(g), "w")...)
			for range each {
				if _, err := w.Write([][]byte{b}, tunwrap.Offset); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range injectors + writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	select {
	case n := <-got:
		if n != want {
			t.Fatalf("the host got %d packets, want %d (channel drops %d)", n, want, dev.Drops())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the host got fewer than %d packets: an injection was stranded (stats %+v, channel drops %d)", want, w.Stats(), dev.Drops())
	}
}

// gatedTUN blocks the inner Write of a packet tagged "slow" until release
// is closed, so a test can hold the Wrapper's write lock in the middle of
// a write.
type gatedTUN struct {
	tun.Device
	entered, release chan struct{}
}

func (g *gatedTUN) Write(bufs [][]byte, offset int) (int, error) {
	for _, b := range bufs {
		if tag(b[offset:]) == "slow" {
			close(g.entered)
			<-g.release
		}
	}
	return g.Device.Write(bufs, offset)
}

// An inbound injection made while another goroutine holds the write lock
// (here: writing an earlier injection) is written by that goroutine once
// it lets go, not left for later traffic.
func TestInjectInboundWhileLockHeld(t *testing.T) {
	for _, holder := range []string{"injection", "write"} {
		t.Run(holder, func(t *testing.T) {
			host, dev := transporttest.NewChanPair(transporttest.ChanPairOptions{})
			g := &gatedTUN{Device: wg.TUNFromPacketIO(dev), entered: make(chan struct{}), release: make(chan struct{})}
			w := tunwrap.Wrap(g, tunwrap.Options{})
			t.Cleanup(func() { w.Close(); host.Close() })
			held := make(chan error, 1)
			go func() {
				if holder == "write" {
					_, err := w.Write([][]byte{append(make([]byte, tunwrap.Offset), udp(t, beAddr, 1, "slow")...)}, tunwrap.Offset)
					held <- err
					return
				}
				held <- w.InjectInbound(udp(t, vipAddr, 1, "slow"))
			}()
			<-g.entered
			if err := w.InjectInbound(udp(t, vipAddr, 2, "late")); err != nil {
				t.Fatal(err)
			}
			close(g.release)
			if err := <-held; err != nil {
				t.Fatal(err)
			}
			got := make(chan []string, 1)
			go func() {
				var tags []string
				bufs, sizes := batch(64)
				for len(tags) < 2 {
					k, err := host.Read(bufs, sizes, 0)
					if err != nil {
						break
					}
					for i := range k {
						tags = append(tags, tag(bufs[i][:sizes[i]]))
					}
				}
				got <- tags
			}()
			select {
			case tags := <-got:
				if fmt.Sprint(tags) != "[slow late]" {
					t.Fatalf("the host got %v, want [slow late]", tags)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the injection made while the lock was held never reached the host")
			}
		})
	}
}
