package wg

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/transporttest"
	"github.com/vipkit/vipkit/transport/wg/wgtest"
)

// fakeBind hands the tie-break one received packet at a time and records
// what it sends.
type fakeBind struct {
	conn.Bind // nil: only the methods below are called
	in        chan fakeRecv
	sent      int
}

type fakeRecv struct {
	p  []byte
	ep conn.Endpoint
}

// openTieBreak opens a tie-break bind on clock over inner, whose receive
// function reads in, and returns it with recv, which delivers one packet
// through the tie-break and returns its size there (0: dropped).
func openTieBreak(t *testing.T, inner conn.Bind, in chan<- fakeRecv, clock transport.Clock) (*tieBreakBind, func(fakeRecv) int) {
	t.Helper()
	b := newTieBreakBind(inner, clock)
	fns, _, err := b.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	bufs, sizes, eps := [][]byte{make([]byte, 256)}, []int{0}, []conn.Endpoint{nil}
	return b, func(r fakeRecv) int {
		in <- r
		if n, err := fns[0](bufs, sizes, eps); n != 1 || err != nil {
			t.Fatalf("receive: %d %v", n, err)
		}
		return sizes[0]
	}
}

func (f *fakeBind) Open(uint16) ([]conn.ReceiveFunc, uint16, error) {
	return []conn.ReceiveFunc{func(packets [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		r := <-f.in
		sizes[0] = copy(packets[0], r.p)
		eps[0] = r.ep
		return 1, nil
	}}, 1, nil
}

func (f *fakeBind) Send(bufs [][]byte, _ conn.Endpoint) error { f.sent += len(bufs); return nil }

// message builds a WireGuard message of type typ and size n whose
// ephemeral key (for an initiation) starts with eph.
func message(typ byte, n int, eph byte) []byte {
	p := make([]byte, n)
	p[0] = typ
	if n >= ephemeralOffset+ephemeralKeyBytes {
		for i := range ephemeralKeyBytes {
			p[ephemeralOffset+i] = eph
		}
	}
	return p
}

func TestTieBreakRules(t *testing.T) {
	epA := &wgtest.SimEndpoint{AddrPort: netip.MustParseAddrPort("10.9.0.1:51820")}
	epB := &wgtest.SimEndpoint{AddrPort: netip.MustParseAddrPort("10.9.0.2:51820")}
	data := message(4, initiationSize, 0) // a transport message of the same size
	reserved := message(msgInitiation, initiationSize, 9)
	reserved[2] = 1
	cases := []struct {
		name    string
		sent    []byte        // our initiation to epA, if any (nil: none)
		wait    time.Duration // between ours and theirs
		between []fakeRecv    // received in between
		recv    fakeRecv
		drop    bool
	}{
		{name: "no pending initiation", recv: fakeRecv{message(msgInitiation, initiationSize, 9), epA}},
		{name: "crossing, ours smaller", sent: message(msgInitiation, initiationSize, 5), wait: 200 * time.Millisecond,
			recv: fakeRecv{message(msgInitiation, initiationSize, 9), epA}, drop: true},
		{name: "crossing, ours greater", sent: message(msgInitiation, initiationSize, 9), wait: 200 * time.Millisecond,
			recv: fakeRecv{message(msgInitiation, initiationSize, 5), epA}},
		{name: "ours older than the window", sent: message(msgInitiation, initiationSize, 5), wait: tieBreakWindow,
			recv: fakeRecv{message(msgInitiation, initiationSize, 9), epA}},
		{name: "ours answered", sent: message(msgInitiation, initiationSize, 5), wait: 200 * time.Millisecond,
			between: []fakeRecv{{message(msgResponse, responseSize, 0), epA}},
			recv:    fakeRecv{message(msgInitiation, initiationSize, 9), epA}},
		{name: "a response from another endpoint", sent: message(msgInitiation, initiationSize, 5), wait: 200 * time.Millisecond,
			between: []fakeRecv{{message(msgResponse, responseSize, 0), epB}},
			recv:    fakeRecv{message(msgInitiation, initiationSize, 9), epA}, drop: true},
		{name: "from another endpoint", sent: message(msgInitiation, initiationSize, 5), wait: 200 * time.Millisecond,
			recv: fakeRecv{message(msgInitiation, initiationSize, 9), epB}},
		{name: "transport data of initiation size", sent: message(msgInitiation, initiationSize, 5),
			recv: fakeRecv{data, epA}},
		{name: "reserved bytes set", sent: message(msgInitiation, initiationSize, 5),
			recv: fakeRecv{reserved, epA}},
		{name: "truncated initiation", sent: message(msgInitiation, initiationSize, 5),
			recv: fakeRecv{message(msgInitiation, initiationSize-1, 9), epA}},
		{name: "no endpoint", sent: message(msgInitiation, initiationSize, 5),
			recv: fakeRecv{message(msgInitiation, initiationSize, 9), nil}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := transporttest.NewManualClock()
			f := &fakeBind{in: make(chan fakeRecv, 8)}
			b, recv := openTieBreak(t, f, f.in, clock)
			if c.sent != nil {
				if err := b.Send([][]byte{c.sent}, epA); err != nil || f.sent != 1 {
					t.Fatalf("send: %v, %d sent", err, f.sent)
				}
			}
			clock.Advance(c.wait)
			for _, r := range c.between {
				if got := recv(r); got != len(r.p) {
					t.Fatalf("a %d-byte message in between came out as %d bytes", len(r.p), got)
				}
			}
			got := recv(c.recv)
			if dropped := got == 0; dropped != c.drop || (!dropped && got != len(c.recv.p)) {
				t.Fatalf("size %d after the tie-break (in %d), want dropped=%v", got, len(c.recv.p), c.drop)
			}
			want := uint64(0)
			if c.drop {
				want = 1
			}
			if b.dropped.Load() != want {
				t.Fatalf("dropped counter %d, want %d", b.dropped.Load(), want)
			}
		})
	}
}

// TestTieBreakExactlyOneSurvives: for random pairs of crossing
// initiations, the two sides' rules keep exactly one.
func TestTieBreakExactlyOneSurvives(t *testing.T) {
	seed := testenv.Seed(t, 31)
	r := rand.New(rand.NewPCG(seed, 0))
	epA := &wgtest.SimEndpoint{AddrPort: netip.MustParseAddrPort("10.9.0.1:51820")}
	epB := &wgtest.SimEndpoint{AddrPort: netip.MustParseAddrPort("10.9.0.2:51820")}
	for i := range 1000 {
		clock := transporttest.NewManualClock()
		a := newTieBreakBind(&fakeBind{}, clock)
		b := newTieBreakBind(&fakeBind{}, clock)
		ia, ib := make([]byte, initiationSize), make([]byte, initiationSize)
		ia[0], ib[0] = msgInitiation, msgInitiation
		for k := ephemeralOffset; k < ephemeralOffset+ephemeralKeyBytes; k++ {
			ia[k], ib[k] = byte(r.Uint32()), byte(r.Uint32())
		}
		if i%7 == 0 { // keys sharing a long prefix
			copy(ib[ephemeralOffset:ephemeralOffset+31], ia[ephemeralOffset:])
		}
		_ = a.Send([][]byte{ia}, epB)
		_ = b.Send([][]byte{ib}, epA)
		clock.Advance(time.Duration(r.Int64N(int64(tieBreakWindow))))
		dropA, _ := a.losesCrossing(ib, epB)
		dropB, _ := b.losesCrossing(ia, epA)
		if dropA == dropB && string(ia) != string(ib) {
			t.Fatalf("case %d: a drops b's: %v, b drops a's: %v (seed %d)", i, dropA, dropB, seed)
		}
	}
}

// TestCrossingHandshakesComplete: two peers 400 ms apart that both
// initiate at once (persistent keepalive) get a session in about one round
// trip. Without the tie-break both initiations cross, both responses are
// refused, and the first retry comes 5 s later.
func TestCrossingHandshakesComplete(t *testing.T) {
	seed := testenv.Seed(t, 32)
	n := transporttest.NewNetwork(nil, seed)
	defer n.Close()
	if err := n.SetDefault(transporttest.LinkConfig{Latency: 400 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	a := newRawNode(t, n, "a", "10.0.0.1")
	b := newRawNode(t, n, "b", "10.0.0.2")
	pa, pb := a.peer("10.0.0.1/32"), b.peer("10.0.0.2/32")
	pa.PersistentKeepalive, pb.PersistentKeepalive = time.Second, time.Second
	a.start(t, pb)
	b.start(t, pa)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	if err := a.dev.WaitHandshake(ctx, b.key.PublicKey()); err != nil {
		t.Fatal(err)
	}
	if err := b.dev.WaitHandshake(ctx, a.key.PublicKey()); err != nil {
		t.Fatal(err)
	}
	if got := a.dev.CrossedInitiations() + b.dev.CrossedInitiations(); got == 0 {
		t.Fatal("no initiation crossed: the test did not exercise the tie-break")
	}
}
