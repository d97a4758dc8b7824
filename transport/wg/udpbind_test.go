package wg

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/transporttest"
	"github.com/vipkit/vipkit/transport/wg/wgtest"
)

// recordBind is an inner bind that records what reaches the "socket", with
// the manual clock's time.
type recordBind struct {
	clk *transporttest.ManualClock
	// mu guards sent.
	mu sync.Mutex
	// +checklocks:mu
	sent []sentPkt
}

type sentPkt struct {
	at   time.Time
	dst  netip.AddrPort
	data string
}

func (r *recordBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) { return nil, port, nil }
func (r *recordBind) Close() error                                         { return nil }
func (r *recordBind) SetMark(uint32) error                                 { return nil }
func (r *recordBind) BatchSize() int                                       { return 4 }
func (r *recordBind) ParseEndpoint(s string) (conn.Endpoint, error) {
	a, err := netip.ParseAddrPort(s)
	if err != nil {
		return nil, err
	}
	return &wgtest.SimEndpoint{AddrPort: a}, nil
}
func (r *recordBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	at := r.clk.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range bufs {
		r.sent = append(r.sent, sentPkt{at: at, dst: ep.(*wgtest.SimEndpoint).AddrPort, data: string(b)})
	}
	return nil
}
func (r *recordBind) take() []sentPkt {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sent
	r.sent = nil
	return s
}

var (
	dst1 = netip.MustParseAddrPort("127.0.0.1:1001")
	dst2 = netip.MustParseAddrPort("127.0.0.1:1002")
)

func newTestUDPBind(t *testing.T, seed uint64) (*UDPBind, *recordBind, *transporttest.ManualClock) {
	t.Helper()
	clk := transporttest.NewManualClock()
	rec := &recordBind{clk: clk}
	b := NewUDPBind(UDPBindOptions{Clock: clk, Seed: seed, Inner: rec})
	if _, _, err := b.Open(0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, rec, clk
}

func ep(t *testing.T, b conn.Bind, a netip.AddrPort) conn.Endpoint {
	t.Helper()
	e, err := b.ParseEndpoint(a.String())
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestImpairmentValidate(t *testing.T) {
	for _, i := range []Impairment{{Loss: -0.1}, {Loss: 1.5}, {Loss: math.NaN()}, {Latency: -1}, {Jitter: -1}} {
		if err := i.Validate(); !errors.Is(err, ErrBadImpairment) {
			t.Errorf("%+v: Validate = %v", i, err)
		}
	}
	b := NewUDPBind(UDPBindOptions{Inner: &recordBind{}})
	if err := b.SetDefault(Impairment{Loss: 2}); !errors.Is(err, ErrBadImpairment) {
		t.Fatalf("SetDefault(loss 2) = %v", err)
	}
	if err := b.SetPeer(dst1, Impairment{Latency: -time.Second}); !errors.Is(err, ErrBadImpairment) {
		t.Fatalf("SetPeer(negative latency) = %v", err)
	}
}

func TestUDPBindLatencyKeepsOrder(t *testing.T) {
	b, rec, clk := newTestUDPBind(t, 1)
	start := clk.Now()
	if err := b.SetDefault(Impairment{Latency: 30 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	e := ep(t, b, dst1)
	for i := range 10 {
		if err := b.Send([][]byte{fmt.Appendf(nil, "p%d", i), fmt.Appendf(nil, "q%d", i)}, e); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(29 * time.Millisecond)
	if s := rec.take(); len(s) != 0 {
		t.Fatalf("%d packets sent before their delay", len(s))
	}
	if b.Delayed() != 20 {
		t.Fatalf("Delayed() = %d", b.Delayed())
	}
	clk.Advance(time.Millisecond)
	s := rec.take()
	if len(s) != 20 {
		t.Fatalf("%d packets after the delay, want 20", len(s))
	}
	for i, p := range s {
		want := fmt.Sprintf("%c%d", "pq"[i%2], i/2)
		if p.data != want || p.at.Sub(start) != 30*time.Millisecond || p.dst != dst1 {
			t.Fatalf("packet %d: %+v, want %s at 30ms", i, p, want)
		}
	}
	st := b.Stats()
	if st.Sent != 20 || st.Delayed != 20 || st.Passed != 20 || st.TotalDropped() != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestUDPBindJitterBounds(t *testing.T) {
	b, rec, clk := newTestUDPBind(t, testenv.Seed(t, 5))
	b.SetDefault(Impairment{Latency: 50 * time.Millisecond, Jitter: 10 * time.Millisecond})
	e := ep(t, b, dst1)
	sentAt := map[string]time.Time{}
	for i := range 500 {
		d := fmt.Sprint(i)
		sentAt[d] = clk.Now()
		b.Send([][]byte{[]byte(d)}, e)
		clk.Advance(time.Millisecond)
	}
	clk.Advance(time.Second)
	var delays []time.Duration
	for _, p := range rec.take() {
		d := p.at.Sub(sentAt[p.data])
		if d < 40*time.Millisecond || d > 60*time.Millisecond {
			t.Fatalf("delay %v outside 50ms ± 10ms", d)
		}
		delays = append(delays, d)
	}
	if len(delays) != 500 {
		t.Fatalf("%d of 500 delivered", len(delays))
	}
	slices.Sort(delays)
	if delays[len(delays)/10] > 45*time.Millisecond || delays[len(delays)*9/10] < 55*time.Millisecond {
		t.Fatalf("delays not spread over the jitter: p10 %v p90 %v", delays[len(delays)/10], delays[len(delays)*9/10])
	}
}

// lossPattern sends n packets one by one with the given loss and returns
// which ones went through.
func lossPattern(t *testing.T, seed uint64, loss float64, n int) []bool {
	b, rec, _ := newTestUDPBind(t, seed)
	b.SetDefault(Impairment{Loss: loss})
	e := ep(t, b, dst1)
	for i := range n {
		b.Send([][]byte{fmt.Appendf(nil, "%d", i)}, e)
	}
	got := make([]bool, n)
	for _, p := range rec.take() {
		var i int
		fmt.Sscan(p.data, &i)
		got[i] = true
	}
	return got
}

func TestUDPBindLossSeeded(t *testing.T) {
	seed := testenv.Seed(t, 9)
	const n, loss = 4000, 0.25
	a := lossPattern(t, seed, loss, n)
	lost := 0
	for _, ok := range a {
		if !ok {
			lost++
		}
	}
	// Binomial: mean 1000, σ ≈ 27; allow 5σ.
	if lost < 860 || lost > 1140 {
		t.Fatalf("lost %d of %d at loss %v", lost, n, loss)
	}
	if !slices.Equal(a, lossPattern(t, seed, loss, n)) {
		t.Fatal("same seed, different losses")
	}
	if slices.Equal(a, lossPattern(t, seed+1, loss, n)) {
		t.Fatal("different seeds, same losses")
	}
}

func TestUDPBindPerPeerCutHeal(t *testing.T) {
	b, rec, clk := newTestUDPBind(t, 1)
	e1, e2 := ep(t, b, dst1), ep(t, b, dst2)
	send := func() (to1, to2 int) {
		b.Send([][]byte{[]byte("1")}, e1)
		b.Send([][]byte{[]byte("2")}, e2)
		clk.Advance(time.Second)
		for _, p := range rec.take() {
			if p.dst == dst1 {
				to1++
			} else {
				to2++
			}
		}
		return
	}
	if a, c := send(); a != 1 || c != 1 {
		t.Fatalf("unimpaired: %d %d", a, c)
	}
	b.SetPeer(dst1, Impairment{Loss: 1})
	if a, c := send(); a != 0 || c != 1 {
		t.Fatalf("loss 1 on dst1: %d %d", a, c)
	}
	b.ClearPeer(dst1)
	b.Cut(dst2)
	if !b.IsCut(dst2) || b.IsCut(dst1) {
		t.Fatal("IsCut wrong")
	}
	if a, c := send(); a != 1 || c != 0 {
		t.Fatalf("dst2 cut: %d %d", a, c)
	}
	b.Cut()
	if a, c := send(); a != 0 || c != 0 {
		t.Fatalf("all cut: %d %d", a, c)
	}
	b.Heal(dst2) // the cut of everything is still in force
	if a, c := send(); a != 0 || c != 0 {
		t.Fatalf("after healing dst2 only: %d %d", a, c)
	}
	b.Heal()
	if a, c := send(); a != 1 || c != 1 {
		t.Fatalf("healed: %d %d", a, c)
	}
	if s := b.PeerStats(dst2); s.Dropped[UDPDropPartition] != 3 {
		t.Fatalf("dst2 stats %+v", s)
	}
	if s := b.PeerStats(dst1); s.Dropped[UDPDropLoss] != 1 || s.Dropped[UDPDropPartition] != 2 {
		t.Fatalf("dst1 stats %+v", s)
	}

	// A packet delayed before a cut still goes, as on a real wire.
	b.SetDefault(Impairment{Latency: 10 * time.Millisecond})
	b.Send([][]byte{[]byte("in flight")}, e1)
	b.Cut()
	clk.Advance(10 * time.Millisecond)
	if s := rec.take(); len(s) != 1 {
		t.Fatalf("in-flight packet dropped by a later cut: %v", s)
	}
}

func TestUDPBindQueueAndClose(t *testing.T) {
	clk := transporttest.NewManualClock()
	rec := &recordBind{clk: clk}
	b := NewUDPBind(UDPBindOptions{Clock: clk, Inner: rec, MaxDelayed: 3})
	if err := b.Send([][]byte{{1}}, &wgtest.SimEndpoint{}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Send before Open = %v", err)
	}
	b.Open(0)
	b.SetDefault(Impairment{Latency: time.Second})
	e := ep(t, b, dst1)
	b.Send([][]byte{{1}, {2}, {3}, {4}, {5}}, e)
	if s := b.Stats(); s.Dropped[UDPDropQueueFull] != 2 || s.Delayed != 3 {
		t.Fatalf("stats %+v", s)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if s := b.Stats(); s.Dropped[UDPDropClosed] != 3 || b.Delayed() != 0 {
		t.Fatalf("after Close: %+v", s)
	}
	if clk.Pending() != 0 {
		t.Fatalf("%d timers left after Close", clk.Pending())
	}
	clk.Advance(2 * time.Second)
	if s := rec.take(); len(s) != 0 {
		t.Fatalf("packets sent after Close: %v", s)
	}
	if err := b.Send([][]byte{{1}}, e); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Send after Close = %v", err)
	}
	// Reopened (as wireguard-go does on a port change), it sends again.
	b.Open(0)
	defer b.Close()
	b.Send([][]byte{{9}}, e)
	clk.Advance(time.Second)
	if s := rec.take(); len(s) != 1 {
		t.Fatalf("after reopen: %v", s)
	}
}

func TestUDPBindFastPathAllocs(t *testing.T) {
	testenv.SkipIfLockOrder(t)
	b, rec, _ := newTestUDPBind(t, 1)
	_ = rec
	nop := &nopBind{}
	b.inner = nop
	e := ep(t, b, dst1)
	bufs := [][]byte{make([]byte, 100), make([]byte, 100)}
	if a := testing.AllocsPerRun(1000, func() { b.Send(bufs, e) }); a != 0 {
		t.Fatalf("unimpaired Send allocates %v", a)
	}
	// Loss only (no delay) takes the impaired path without copying.
	b.SetDefault(Impairment{Loss: 0.5})
	b.Send(bufs, e) // creates the destination's counters
	if a := testing.AllocsPerRun(1000, func() { b.Send(bufs, e) }); a != 0 {
		t.Fatalf("lossy Send allocates %v", a)
	}
}

type nopBind struct{ recordBind }

func (*nopBind) Send([][]byte, conn.Endpoint) error { return nil }

// TestUDPBindLoopback sends through two UDPBinds on real loopback sockets,
// with latency on the real clock.
func TestUDPBindLoopback(t *testing.T) {
	a := NewUDPBind(UDPBindOptions{Seed: 1})
	b := NewUDPBind(UDPBindOptions{Seed: 2})
	_, pa, err := a.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	fns, pb, err := b.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	if a.BatchSize() < 1 || a.SetMark(0) != nil {
		t.Fatal("BatchSize/SetMark")
	}
	to := ep(t, a, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), pb))
	const lat = 50 * time.Millisecond
	a.SetPeer(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), pb), Impairment{Latency: lat})

	got := make(chan time.Time, 1)
	var wg sync.WaitGroup
	for _, fn := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rx := wgtest.NewBatch(b.BatchSize(), 2048)
			for {
				k, err := fn(rx.Bufs, rx.Sizes, rx.Eps)
				if err != nil {
					return
				}
				for i := range k {
					if string(rx.Bufs[i][:rx.Sizes[i]]) == "hello" && rx.Eps[i].DstToString() == fmt.Sprintf("127.0.0.1:%d", pa) {
						got <- time.Now()
					}
				}
			}
		}()
	}
	start := time.Now()
	if err := a.Send([][]byte{[]byte("hello")}, to); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		if d := at.Sub(start); d < lat {
			t.Fatalf("arrived after %v, latency is %v", d, lat)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nothing arrived over loopback")
	}
	b.Close()
	wg.Wait()
}
