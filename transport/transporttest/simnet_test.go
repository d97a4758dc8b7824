package transporttest_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// runTrace drives a fixed pattern of sends over a lossy, jittery,
// duplicating, reordering network on the manual clock and returns its trace.
func runTrace(t *testing.T, seed uint64) []transporttest.TraceEvent {
	t.Helper()
	c := transporttest.NewManualClock()
	n := transporttest.NewNetwork(c, seed)
	defer n.Close()
	if err := n.SetDefault(transporttest.LinkConfig{
		Latency: 20 * time.Millisecond, Jitter: 10 * time.Millisecond,
		Loss: 0.1, Duplicate: 0.05, Reorder: 0.1,
	}); err != nil {
		t.Fatal(err)
	}
	var trace []transporttest.TraceEvent
	n.SetTrace(func(e transporttest.TraceEvent) { trace = append(trace, e) })
	var nodes []*transporttest.Node
	for i := range 4 {
		nodes = append(nodes, n.MustAddNode(fmt.Sprint("n", i), transporttest.NodeOptions{Handler: func(transporttest.Packet) {}}))
	}
	for round := range 50 {
		for i, a := range nodes {
			b := nodes[(i+1+round)%len(nodes)]
			if a == b {
				continue
			}
			if err := a.Send(b.Addr(), make([]byte, 10+round+i)); err != nil {
				t.Fatal(err)
			}
		}
		c.Advance(5 * time.Millisecond)
	}
	c.Advance(time.Second)
	return trace
}

func TestSimNetDeterministicPerSeed(t *testing.T) {
	seed := testenv.Seed(t, 42)
	a, b := runTrace(t, seed), runTrace(t, seed)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("same seed and sends gave different traces")
	}
	other := runTrace(t, seed+1)
	if fmt.Sprint(a) == fmt.Sprint(other) {
		t.Fatal("a different seed gave the same trace")
	}
	var delivers, drops int
	for _, e := range a {
		switch e.Kind {
		case transporttest.TraceDeliver:
			delivers++
		case transporttest.TraceDrop:
			drops++
		}
	}
	if delivers == 0 || drops == 0 {
		t.Fatalf("trace has %d deliveries and %d drops; want both", delivers, drops)
	}
}

func TestSimNetLatencyJitterLossStats(t *testing.T) {
	seed := testenv.Seed(t, 7)
	c := transporttest.NewManualClock()
	n := transporttest.NewNetwork(c, seed)
	defer n.Close()
	var delays []time.Duration
	var sentAt = map[byte]time.Time{}
	a := n.MustAddNode("a", transporttest.NodeOptions{})
	b := n.MustAddNode("b", transporttest.NodeOptions{Handler: func(p transporttest.Packet) {
		delays = append(delays, c.Now().Sub(sentAt[p.Data[0]]))
	}})
	cfg := transporttest.LinkConfig{Latency: 50 * time.Millisecond, Jitter: 5 * time.Millisecond, Loss: 0.02}
	if err := n.SetLink(a, b, cfg); err != nil {
		t.Fatal(err)
	}
	const N = 5000
	for i := range N {
		sentAt[byte(i)] = c.Now()
		if err := a.Send(b.Addr(), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		c.Advance(time.Millisecond) // < 256 in flight, so the byte tag is unique
	}
	c.Advance(time.Second)
	for _, d := range delays {
		if d < 45*time.Millisecond || d > 55*time.Millisecond {
			t.Fatalf("delay %v outside 50ms ± 5ms", d)
		}
	}
	st := n.LinkStats(a, b)
	loss := float64(st.Dropped[transporttest.DropLoss]) / N
	if math.Abs(loss-0.02) > 0.01 {
		t.Fatalf("loss %.4f, want about 0.02", loss)
	}
	if st.Sent != N || st.Delivered+st.Dropped[transporttest.DropLoss] != N || int(st.Delivered) != len(delays) {
		t.Fatalf("stats don't add up: %+v, handler saw %d", st, len(delays))
	}
	// The reverse direction is a separate, perfect link.
	if back := n.Link(b, a); back != (transporttest.LinkConfig{}) {
		t.Fatalf("reverse link %+v, want the zero default", back)
	}
}

func TestSimNetPartitionOneWayAndHeal(t *testing.T) {
	c := transporttest.NewManualClock()
	n := transporttest.NewNetwork(c, 1)
	defer n.Close()
	got := map[string]int{}
	h := func(name string) func(transporttest.Packet) {
		return func(transporttest.Packet) { got[name]++ }
	}
	a := n.MustAddNode("a", transporttest.NodeOptions{Handler: h("a")})
	b := n.MustAddNode("b", transporttest.NodeOptions{Handler: h("b")})
	x := n.MustAddNode("x", transporttest.NodeOptions{Handler: h("x")})

	n.Cut(a, b) // one way
	_ = a.Send(b.Addr(), []byte("1"))
	_ = b.Send(a.Addr(), []byte("2"))
	c.Advance(0)
	if got["b"] != 0 || got["a"] != 1 {
		t.Fatalf("one-way cut: got %v", got)
	}
	n.Heal()
	n.Partition([]*transporttest.Node{a}, []*transporttest.Node{b, x})
	_ = a.Send(x.Addr(), []byte("3"))
	_ = x.Send(b.Addr(), []byte("4"))
	c.Advance(0)
	if got["x"] != 0 || got["b"] != 1 {
		t.Fatalf("partition: got %v", got)
	}
	if n.Stats().Dropped[transporttest.DropPartition] != 2 {
		t.Fatalf("partition drops %d, want 2", n.Stats().Dropped[transporttest.DropPartition])
	}
	n.Heal()
	_ = a.Send(x.Addr(), []byte("5"))
	c.Advance(0)
	if got["x"] != 1 {
		t.Fatalf("after heal: got %v", got)
	}
	// An unknown destination is a counted drop, not an error.
	if err := a.Send(netip.MustParseAddrPort("198.18.9.9:1"), []byte("6")); err != nil {
		t.Fatal(err)
	}
	if n.Stats().Dropped[transporttest.DropNoRoute] != 1 {
		t.Fatal("no-route drop not counted")
	}
}

func TestSimNetDuplicateAndReorder(t *testing.T) {
	c := transporttest.NewManualClock()
	n := transporttest.NewNetwork(c, testenv.Seed(t, 3))
	defer n.Close()
	var order []byte
	a := n.MustAddNode("a", transporttest.NodeOptions{})
	b := n.MustAddNode("b", transporttest.NodeOptions{Handler: func(p transporttest.Packet) { order = append(order, p.Data[0]) }})
	if err := n.SetLink(a, b, transporttest.LinkConfig{Latency: 10 * time.Millisecond, Duplicate: 0.2, Reorder: 0.2}); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		_ = a.Send(b.Addr(), []byte{byte(i)})
		c.Advance(time.Millisecond)
	}
	c.Advance(time.Second)
	st := n.LinkStats(a, b)
	if st.Duplicated == 0 || st.Reordered == 0 || st.Delivered != 200+st.Duplicated {
		t.Fatalf("stats %+v", st)
	}
	inversions := 0
	for i := 1; i < len(order); i++ {
		if order[i] < order[i-1] {
			inversions++
		}
	}
	if inversions == 0 {
		t.Fatal("no packet was reordered")
	}
}

func TestSimNetBadConfig(t *testing.T) {
	n := transporttest.NewNetwork(transporttest.NewManualClock(), 1)
	defer n.Close()
	for _, c := range []transporttest.LinkConfig{{Loss: 1.5}, {Duplicate: -0.1}, {Latency: -1}, {Reorder: math.NaN()}} {
		if err := n.SetDefault(c); err == nil {
			t.Errorf("SetDefault(%+v) accepted", c)
		}
	}
	if _, err := n.AddNode("a", transporttest.NodeOptions{Addr: netip.MustParseAddrPort("198.18.0.1:51820")}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.AddNode("dup", transporttest.NodeOptions{Addr: netip.MustParseAddrPort("198.18.0.1:51820")}); err == nil {
		t.Fatal("duplicate address accepted")
	}
}

// TestSimNetRealClockInboxAndClose runs the network on the real clock, as the
// WireGuard Bind over it does: packets arrive after their latency and Close
// unblocks receivers.
func TestSimNetRealClockInboxAndClose(t *testing.T) {
	n := transporttest.NewNetwork(nil, 9)
	a := n.MustAddNode("a", transporttest.NodeOptions{})
	b := n.MustAddNode("b", transporttest.NodeOptions{})
	if err := n.SetLinkBoth(a, b, transporttest.LinkConfig{Latency: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := a.Send(b.Addr(), []byte("hello")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := b.Recv(ctx)
	if err != nil || string(p.Data) != "hello" || p.From != a.Addr() {
		t.Fatalf("Recv = %+v, %v", p, err)
	}
	if el := time.Since(start); el < 20*time.Millisecond {
		t.Fatalf("delivered after %v, before the link's 20ms latency", el)
	}
	done := make(chan error, 1)
	go func() { _, err := a.Recv(context.Background()); done <- err }()
	_ = b.Send(a.Addr(), []byte("in flight at close"))
	n.Close()
	if err := <-done; !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Recv after Close = %v, want ErrClosed", err)
	}
	if err := a.Send(b.Addr(), nil); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Send after Close = %v", err)
	}
}

func ExampleNetwork() {
	clock := transporttest.NewManualClock()
	net := transporttest.NewNetwork(clock, 1)
	defer net.Close()
	a := net.MustAddNode("a", transporttest.NodeOptions{})
	b := net.MustAddNode("b", transporttest.NodeOptions{Handler: func(p transporttest.Packet) {
		fmt.Printf("%s at +%v\n", p.Data, clock.Now().Sub(transporttest.Epoch))
	}})
	_ = net.SetLink(a, b, transporttest.LinkConfig{Latency: 30 * time.Millisecond})
	_ = a.Send(b.Addr(), []byte("ping"))
	net.Cut(a, b)
	_ = a.Send(b.Addr(), []byte("lost"))
	clock.Advance(time.Second)
	fmt.Println("dropped:", net.Stats().Dropped[transporttest.DropPartition])
	// Output:
	// ping at +30ms
	// dropped: 1
}
