package wgtest

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/transporttest"
)

func openSim(t *testing.T, b *SimBind, port uint16) (conn.ReceiveFunc, uint16) {
	t.Helper()
	fns, p, err := b.Open(port)
	if err != nil {
		t.Fatalf("Open(%d): %v", port, err)
	}
	if len(fns) != 1 {
		t.Fatalf("%d receive funcs", len(fns))
	}
	return fns[0], p
}

func TestSimBindBatchAndEndpoints(t *testing.T) {
	clk := transporttest.NewManualClock()
	n := transporttest.NewNetwork(clk, 1)
	defer n.Close()
	a, b := NewSimBind(n, "a"), NewSimBind(n, "b")
	if a.BatchSize() != conn.IdealBatchSize {
		t.Fatalf("batch %d", a.BatchSize())
	}
	_, pa := openSim(t, a, 0)
	recvB, pb := openSim(t, b, 0)
	defer a.Close()
	defer b.Close()
	if pa != a.Addr().Port() || pb != b.Addr().Port() {
		t.Fatalf("ports %d %d, want the nodes' %v %v", pa, pb, a.Addr(), b.Addr())
	}
	ep, err := a.ParseEndpoint(b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	pkts := [][]byte{[]byte("one"), []byte("two"), []byte("three"), make([]byte, 1400), []byte("five")}
	if err := a.Send(pkts, ep); err != nil {
		t.Fatal(err)
	}
	clk.Advance(0)
	rx := NewBatch(8, 2048)
	k, err := recvB(rx.Bufs, rx.Sizes, rx.Eps)
	if err != nil || k != len(pkts) {
		t.Fatalf("receive = %d, %v; want all %d in one batch", k, err, len(pkts))
	}
	fromA, _ := b.ParseEndpoint(a.Addr().String())
	for i := range k {
		if !bytes.Equal(rx.Bufs[i][:rx.Sizes[i]], pkts[i]) {
			t.Fatalf("packet %d: %q", i, rx.Bufs[i][:rx.Sizes[i]])
		}
		if rx.Eps[i] != fromA { // one endpoint per address: no allocation per packet
			t.Fatalf("endpoint %v is not the cached %v", rx.Eps[i], fromA)
		}
	}
	if e := rx.Eps[0]; e.DstToString() != a.Addr().String() || e.DstIP() != a.Addr().Addr() || e.SrcToString() != "" || e.SrcIP().IsValid() || len(e.DstToBytes()) == 0 {
		t.Fatalf("endpoint methods: %v", e)
	}
	if s := a.Stats(); s.Sent != uint64(len(pkts)) {
		t.Fatalf("a stats %+v", s)
	}
	if s := b.Stats(); s.Received != uint64(len(pkts)) {
		t.Fatalf("b stats %+v", s)
	}
}

func TestSimBindCloseReopen(t *testing.T) {
	clk := transporttest.NewManualClock()
	n := transporttest.NewNetwork(clk, 1)
	defer n.Close()
	a, b := NewSimBind(n, "a"), NewSimBind(n, "b")
	openSim(t, a, 0)
	defer a.Close()
	recvB, _ := openSim(t, b, 0)
	if _, _, err := b.Open(0); !errors.Is(err, conn.ErrBindAlreadyOpen) {
		t.Fatalf("second Open = %v", err)
	}

	// Close unblocks a receiver.
	rx := NewBatch(4, 2048)
	errc := make(chan error, 1)
	go func() {
		_, err := recvB(rx.Bufs, rx.Sizes, rx.Eps)
		errc <- err
	}()
	b.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("receive after Close = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock the receive function")
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	ep, _ := a.ParseEndpoint(b.Addr().String())
	if err := b.Send([][]byte{{1}}, ep); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Send on a closed bind = %v", err)
	}

	// While closed, arrivals are dropped like at a closed socket.
	a.Send([][]byte{[]byte("lost")}, ep)
	clk.Advance(0)
	if s := b.Stats(); s.DroppedClosed != 1 {
		t.Fatalf("stats while closed %+v", s)
	}

	// Reopened, it receives again (and not the packet sent while closed).
	recvB, _ = openSim(t, b, 0)
	defer b.Close()
	a.Send([][]byte{[]byte("again")}, ep)
	clk.Advance(0)
	k, err := recvB(rx.Bufs, rx.Sizes, rx.Eps)
	if err != nil || k != 1 || string(rx.Bufs[0][:rx.Sizes[0]]) != "again" {
		t.Fatalf("after reopen: %d %v %q", k, err, rx.Bufs[0][:rx.Sizes[0]])
	}
}

func TestSimBindOtherPortAndLimits(t *testing.T) {
	clk := transporttest.NewManualClock()
	n := transporttest.NewNetwork(clk, 1)
	defer n.Close()
	a := NewSimBind(n, "a")
	b := NewSimBindWithOptions(n, "b", SimBindOptions{Queue: 2, BatchSize: 4})
	openSim(t, a, 0)
	defer a.Close()
	recvB, port := openSim(t, b, 4000)
	defer b.Close()
	if port != 4000 {
		t.Fatalf("port %d", port)
	}
	at := netip.AddrPortFrom(b.Addr().Addr(), 4000)
	ep, _ := a.ParseEndpoint(at.String())
	a.Send([][]byte{[]byte("x"), []byte("y"), []byte("z")}, ep) // queue holds 2
	clk.Advance(0)
	if s := b.Stats(); s.DroppedQueueFull != 1 {
		t.Fatalf("stats %+v", s)
	}
	rx := NewBatch(4, 2048)
	if k, _ := recvB(rx.Bufs, rx.Sizes, rx.Eps); k != 2 {
		t.Fatalf("received %d", k)
	}
	// A packet bigger than the receive buffer is dropped and counted.
	a.Send([][]byte{make([]byte, 100), []byte("ok")}, ep)
	clk.Advance(0)
	small := NewBatch(4, 50)
	if k, err := recvB(small.Bufs, small.Sizes, small.Eps); k != 1 || err != nil || string(small.Bufs[0][:small.Sizes[0]]) != "ok" {
		t.Fatalf("receive = %d %v", k, err)
	}
	if s := b.Stats(); s.DroppedTooBig != 1 {
		t.Fatalf("stats %+v", s)
	}
	// Bad input.
	if _, err := a.ParseEndpoint("nonsense"); !errors.Is(err, ErrBadEndpoint) {
		t.Fatalf("ParseEndpoint(nonsense) = %v", err)
	}
	if err := a.Send([][]byte{{1}}, &conn.StdNetEndpoint{}); !errors.Is(err, conn.ErrWrongEndpointType) {
		t.Fatalf("Send(foreign endpoint) = %v", err)
	}
	if err := a.SetMark(7); err != nil {
		t.Fatal(err)
	}
}

func TestSimBindOnNode(t *testing.T) {
	clk := transporttest.NewManualClock()
	n := transporttest.NewNetwork(clk, 1)
	defer n.Close()
	nd := n.MustAddNode("given", transporttest.NodeOptions{})
	a := NewSimBind(n, "a")
	b := NewSimBindOnNode(nd, SimBindOptions{})
	if b.Node() != nd || b.Addr() != nd.Addr() {
		t.Fatal("NewSimBindOnNode does not use the node")
	}
	openSim(t, a, 0)
	defer a.Close()
	ep, _ := a.ParseEndpoint(nd.Addr().String())
	a.Send([][]byte{[]byte("early")}, ep) // queued in the inbox while b is closed
	clk.Advance(0)
	recvB, _ := openSim(t, b, 0)
	defer b.Close()
	a.Send([][]byte{[]byte("late")}, ep)
	clk.Advance(0)
	rx := NewBatch(4, 100)
	k, err := recvB(rx.Bufs, rx.Sizes, rx.Eps)
	if err != nil || k != 1 || string(rx.Bufs[0][:rx.Sizes[0]]) != "late" {
		t.Fatalf("receive = %d %v %q", k, err, rx.Bufs[0][:rx.Sizes[0]])
	}
	if b.Stats().DroppedClosed != 1 {
		t.Fatalf("stats %+v", b.Stats())
	}

	h := n.MustAddNode("handler", transporttest.NodeOptions{Handler: func(transporttest.Packet) {}})
	if _, _, err := NewSimBindOnNode(h, SimBindOptions{}).Open(0); err == nil {
		t.Fatal("a bind on a node with a Handler opened")
	}
	n.Close()
	if _, _, err := NewSimBind(n, "late").Open(0); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Open on a closed network = %v", err)
	}
}

func TestSimBindReceiveAllocs(t *testing.T) {
	testenv.SkipIfLockOrder(t)
	n := transporttest.NewNetwork(nil, 1)
	defer n.Close()
	a, b := NewSimBind(n, "a"), NewSimBind(n, "b")
	openSim(t, a, 0)
	defer a.Close()
	recvB, _ := openSim(t, b, 0)
	defer b.Close()
	ep, _ := a.ParseEndpoint(b.Addr().String())
	const runs = 200
	pkt := [][]byte{make([]byte, 1200)}
	for range runs + 1 {
		a.Send(pkt, ep) // perfect link on the real clock: delivered at once
	}
	rx := NewBatch(1, 2048)
	if allocs := testing.AllocsPerRun(runs, func() {
		if k, err := recvB(rx.Bufs, rx.Sizes, rx.Eps); k != 1 || err != nil {
			t.Fatalf("receive %d %v", k, err)
		}
	}); allocs != 0 {
		t.Fatalf("SimBind receive allocates %v per packet", allocs)
	}
}
