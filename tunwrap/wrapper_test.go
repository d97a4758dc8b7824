package tunwrap_test

import (
	"errors"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/packet"
	"github.com/vipkit/vipkit/transport/transporttest"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/tunwrap"
)

// hooks is a Filter from functions; the counters are plain ints on purpose:
// the race detector checks that each side runs one call at a time.
type hooks struct {
	out    func(pkt []byte) tunwrap.Verdict
	in     func(pkt []byte, peer flow.PeerID, ok bool) tunwrap.Verdict
	nOut   int
	nIn    int
	lastIn flow.PeerID
	lastOK bool
}

func (h *hooks) Outbound(pkt []byte) tunwrap.Verdict {
	h.nOut++
	if h.out == nil {
		return tunwrap.Accept
	}
	return h.out(pkt)
}

func (h *hooks) Inbound(pkt []byte, peer flow.PeerID, ok bool) tunwrap.Verdict {
	h.nIn++
	h.lastIn, h.lastOK = peer, ok
	if h.in == nil {
		return tunwrap.Accept
	}
	return h.in(pkt, peer, ok)
}

// udp builds a datagram from src port sp whose payload is tag.
func udp(t testing.TB, src netip.Addr, sp uint16, tag string) []byte {
	t.Helper()
	p, err := packet.AppendUDP(nil, packet.IPv4Fields{Src: src, Dst: vipAddr}, packet.UDPFields{SrcPort: sp, DstPort: 53}, []byte(tag))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func tag(p []byte) string { return string(packet.UDP(packet.IPv4(p).Payload()).Payload()) }

// fixture: host ⇄ ChanIO pair ⇄ (inner tun.Device) ⇄ Wrapper ⇄ the test as wireguard-go.
func newFixture(t *testing.T, f tunwrap.Filter, o tunwrap.Options) (*tunwrap.Wrapper, *transporttest.ChanIO) {
	t.Helper()
	host, dev := transporttest.NewChanPair(transporttest.ChanPairOptions{})
	o.Filter = f
	if o.PeerOf == nil {
		o.PeerOf = func(src netip.Addr) (flow.PeerID, bool) { return 7, src == beAddr }
	}
	w := tunwrap.Wrap(wg.TUNFromPacketIO(dev), o)
	t.Cleanup(func() { w.Close(); host.Close() })
	return w, host
}

func batch(n int) ([][]byte, []int) {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, tunwrap.Offset+2048)
	}
	return bufs, make([]int, n)
}

// readN reads from w, as wireguard-go does, until n packets arrived.
func readN(t *testing.T, w *tunwrap.Wrapper, n int) []string {
	t.Helper()
	var got []string
	bufs, sizes := batch(64)
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < n {
		if time.Now().After(deadline) {
			t.Fatalf("read %v, want %d packets", got, n)
		}
		k, err := w.Read(bufs, sizes, tunwrap.Offset)
		if err != nil {
			t.Fatal(err)
		}
		for i := range k {
			got = append(got, tag(bufs[i][tunwrap.Offset:tunwrap.Offset+sizes[i]]))
		}
	}
	return got
}

// hostReadN reads n packets the host received.
func hostReadN(t *testing.T, host *transporttest.ChanIO, n int) []string {
	t.Helper()
	var got []string
	bufs, sizes := batch(64)
	for len(got) < n {
		k, err := host.Read(bufs, sizes, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := range k {
			got = append(got, tag(bufs[i][:sizes[i]]))
		}
	}
	return got
}

func TestOutboundDropsInBatch(t *testing.T) {
	h := &hooks{out: func(p []byte) tunwrap.Verdict {
		if tag(p) == "b" {
			return tunwrap.Drop
		}
		return tunwrap.Accept
	}}
	w, host := newFixture(t, h, tunwrap.Options{})
	if _, err := host.Write([][]byte{udp(t, cliAddr, 1, "a"), udp(t, cliAddr, 2, "b"), udp(t, cliAddr, 3, "c")}, 0); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, w, 2); got[0] != "a" || got[1] != "c" {
		t.Fatalf("wireguard-go read %v, want [a c]", got)
	}
	if st := w.Stats(); st.OutboundDropped != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestInboundDropsInBatchAndPeerOf(t *testing.T) {
	h := &hooks{in: func(p []byte, _ flow.PeerID, _ bool) tunwrap.Verdict {
		if tag(p) == "b" {
			return tunwrap.Drop
		}
		return tunwrap.Accept
	}}
	w, host := newFixture(t, h, tunwrap.Options{})
	bufs := make([][]byte, 3)
	for i, s := range []string{"a", "b", "c"} {
		bufs[i] = append(make([]byte, tunwrap.Offset), udp(t, beAddr, 1, s)...)
	}
	keep := append([]byte(nil), bufs[1]...)
	n, err := w.Write(bufs, tunwrap.Offset)
	if err != nil || n != 3 {
		t.Fatalf("Write = %d, %v; want 3 (drops are not errors)", n, err)
	}
	if got := hostReadN(t, host, 2); got[0] != "a" || got[1] != "c" {
		t.Fatalf("host read %v, want [a c]", got)
	}
	if string(bufs[1]) != string(keep) {
		t.Fatal("the dropped packet's buffer (wireguard-go's) was modified")
	}
	if h.lastIn != 7 || !h.lastOK {
		t.Fatalf("PeerOf gave %d %v, want peer 7", h.lastIn, h.lastOK)
	}
	if _, err := w.Write([][]byte{append(make([]byte, tunwrap.Offset), udp(t, cliAddr, 1, "x")...)}, tunwrap.Offset); err != nil {
		t.Fatal(err)
	}
	if h.lastOK {
		t.Fatal("PeerOf named a peer for an unknown source")
	}
	hostReadN(t, host, 1)
}

// Injection both ways, including from inside the Filter (flow's Emit does
// that) and to a Read that is already waiting with no host traffic.
func TestInjectBothWays(t *testing.T) {
	var w *tunwrap.Wrapper
	h := &hooks{in: func(p []byte, _ flow.PeerID, _ bool) tunwrap.Verdict {
		if tag(p) == "emit" {
			if err := w.InjectInbound(udp(t, vipAddr, 9, "from-filter")); err != nil {
				t.Error(err)
			}
			return tunwrap.Drop
		}
		return tunwrap.Accept
	}}
	w, host := newFixture(t, h, tunwrap.Options{})

	got := make(chan []string, 1)
	go func() { got <- readN(t, w, 1) }()
	if err := w.InjectOutbound(udp(t, cliAddr, 5, "injected-out")); err != nil {
		t.Fatal(err)
	}
	if g := <-got; g[0] != "injected-out" {
		t.Fatalf("wireguard-go read %v", g)
	}

	if err := w.InjectInbound(udp(t, vipAddr, 5, "injected-in")); err != nil {
		t.Fatal(err)
	}
	if g := hostReadN(t, host, 1); g[0] != "injected-in" {
		t.Fatalf("host read %v", g)
	}
	if _, err := w.Write([][]byte{append(make([]byte, tunwrap.Offset), udp(t, beAddr, 1, "emit")...)}, tunwrap.Offset); err != nil {
		t.Fatal(err)
	}
	if g := hostReadN(t, host, 1); g[0] != "from-filter" {
		t.Fatalf("host read %v", g)
	}
	if st := w.Stats(); st.InjectedOutbound != 1 || st.InjectedInbound != 2 {
		t.Fatalf("stats %+v", st)
	}
	if err := w.InjectOutbound(nil); !errors.Is(err, tunwrap.ErrPacketSize) {
		t.Fatalf("empty injection: %v", err)
	}
}

func TestInjectQueueFullIsCounted(t *testing.T) {
	w, _ := newFixture(t, nil, tunwrap.Options{QueueLen: 2})
	p := udp(t, cliAddr, 1, "x")
	for i := range 2 {
		if err := w.InjectOutbound(p); err != nil {
			t.Fatalf("injection %d: %v", i, err)
		}
	}
	if err := w.InjectOutbound(p); !errors.Is(err, tunwrap.ErrQueueFull) {
		t.Fatalf("third injection: %v, want ErrQueueFull", err)
	}
	if st := w.Stats(); st.InjectDropped != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// wireguard-go writes from one goroutine per peer; the Filter's inbound
// side must see one call at a time (the race detector checks hooks' plain
// counters).
func TestConcurrentWritesSerialized(t *testing.T) {
	h := &hooks{}
	w, host := newFixture(t, h, tunwrap.Options{})
	const writers, each = 4, 50
	hostGot := make(chan int, 1)
	go func() {
		n := 0
		bufs, sizes := batch(64)
		for n < writers*each {
			k, err := host.Read(bufs, sizes, 0)
			if err != nil {
				break
			}
			n += k
		}
		hostGot <- n
	}()
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if _, err := w.Write([][]byte{append(make([]byte, tunwrap.Offset), udp(t, beAddr, uint16(g), "p")...)}, tunwrap.Offset); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if h.nIn != writers*each {
		t.Fatalf("Inbound saw %d packets, want %d", h.nIn, writers*each)
	}
	select {
	case n := <-hostGot:
		if n != writers*each {
			t.Fatalf("the host read %d packets, want %d", n, writers*each)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the host did not get every packet")
	}
}

func TestCloseUnblocksAndFails(t *testing.T) {
	w, _ := newFixture(t, nil, tunwrap.Options{})
	done := make(chan error, 1)
	go func() {
		bufs, sizes := batch(1)
		_, err := w.Read(bufs, sizes, tunwrap.Offset)
		done <- err
	}()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Read after Close: %v, want os.ErrClosed", err)
	}
	if _, err := w.Write([][]byte{make([]byte, 40)}, 16); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Write after Close: %v", err)
	}
	if err := w.InjectInbound([]byte{0x45}); !errors.Is(err, tunwrap.ErrClosed) {
		t.Fatalf("InjectInbound after Close: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// A hairpin the Filter reflects on the way out reaches the host at once,
// with no later traffic to push it.
func TestOutboundReflectReachesHost(t *testing.T) {
	h := &hooks{out: func(p []byte) tunwrap.Verdict {
		if tag(p) == "hairpin" {
			return tunwrap.Reflect
		}
		return tunwrap.Accept
	}}
	w, host := newFixture(t, h, tunwrap.Options{})
	if _, err := host.Write([][]byte{udp(t, cliAddr, 1, "hairpin")}, 0); err != nil {
		t.Fatal(err)
	}
	go func() {
		bufs, sizes := batch(64)
		for {
			if _, err := w.Read(bufs, sizes, tunwrap.Offset); err != nil {
				return
			}
		}
	}()
	got := make(chan []string, 1)
	go func() { got <- hostReadN(t, host, 1) }()
	select {
	case g := <-got:
		if g[0] != "hairpin" {
			t.Fatalf("host read %v", g)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the reflected packet never reached the host")
	}
	// The host may read the packet before the Wrapper counts it delivered.
	for deadline := time.Now().Add(5 * time.Second); ; runtime.Gosched() {
		st := w.Stats()
		if st.OutboundReflected == 1 && st.InjectedInbound == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", st)
		}
	}
}

// Close while a Read holds a batch must not hang it.
func TestCloseDuringBatch(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	h := &hooks{out: func([]byte) tunwrap.Verdict {
		close(entered)
		<-release
		return tunwrap.Drop
	}}
	w, host := newFixture(t, h, tunwrap.Options{})
	if _, err := host.Write([][]byte{udp(t, cliAddr, 1, "x")}, 0); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		bufs, sizes := batch(64)
		w.Read(bufs, sizes, tunwrap.Offset)
		close(done)
	}()
	<-entered
	closed := make(chan struct{})
	go func() { w.Close(); close(closed) }()
	// Close waits for the reader goroutine, which is waiting for this
	// batch's buffers; let the Filter return only once Close has begun
	// (injections fail from then on).
	p := udp(t, cliAddr, 2, "y")
	for deadline := time.Now().Add(5 * time.Second); !errors.Is(w.InjectOutbound(p), tunwrap.ErrClosed); {
		if time.Now().After(deadline) {
			t.Fatal("Close did not begin")
		}
		runtime.Gosched()
	}
	close(release)
	for _, c := range []chan struct{}{done, closed} {
		select {
		case <-c:
		case <-time.After(5 * time.Second):
			t.Fatal("Read or Close hung")
		}
	}
}
