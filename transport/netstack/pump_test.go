package netstack_test

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/netstack"
)

// pumpOffset is the headroom the test pump asks for, as wireguard-go would.
const pumpOffset = 16

// pump copies packets between two PacketIOs in batches, in both directions,
// until either side is closed. Wait returns when both directions stopped.
type pump struct {
	// loss is the probability that the pump drops a packet, and seed seeds
	// the drop decisions (one RNG per direction).
	loss    float64
	seed    uint64
	dropped atomic.Uint64

	wg sync.WaitGroup
	// mu guards errs.
	mu sync.Mutex
	// errs records any error other than ErrClosed.
	// +checklocks:mu
	errs []error
}

// startLossyPump starts a pump that drops each packet with probability loss
// (0 for none), with drop decisions seeded by seed.
func startLossyPump(a, b transport.PacketIO, loss float64, seed uint64) *pump {
	p := &pump{loss: loss, seed: seed}
	p.wg.Add(2)
	go p.run(a, b, 1)
	go p.run(b, a, 2)
	return p
}

func (p *pump) run(from, to transport.PacketIO, dir uint64) {
	defer p.wg.Done()
	rng := rand.New(rand.NewPCG(p.seed, dir))
	batch := from.BatchSize()
	bufs := make([][]byte, batch)
	out := make([][]byte, batch)
	sizes := make([]int, batch)
	for i := range bufs {
		bufs[i] = make([]byte, pumpOffset+from.MTU())
	}
	for {
		n, err := from.Read(bufs, sizes, pumpOffset)
		if err != nil {
			p.fail(err)
			return
		}
		k := 0
		for i := range n {
			if p.loss > 0 && rng.Float64() < p.loss {
				p.dropped.Add(1)
				continue
			}
			out[k] = bufs[i][:pumpOffset+sizes[i]]
			k++
		}
		if _, err := to.Write(out[:k], pumpOffset); err != nil {
			p.fail(err)
			return
		}
	}
}

func (p *pump) fail(err error) {
	if errors.Is(err, transport.ErrClosed) {
		return
	}
	p.mu.Lock()
	p.errs = append(p.errs, err)
	p.mu.Unlock()
}

// Wait waits for both directions to stop and reports unexpected errors.
func (p *pump) Wait(t testing.TB) {
	t.Helper()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, err := range p.errs {
		t.Errorf("pump: %v", err)
	}
}

// newHost creates a host and closes it when the test ends.
func newHost(t testing.TB, o netstack.Options) *netstack.Host {
	t.Helper()
	h, err := netstack.New(o)
	if err != nil {
		t.Fatalf("New(%+v): %v", o, err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// hostPair returns two hosts joined back to back by a pump, with the given
// addresses; everything is torn down when the test ends.
func hostPair(t testing.TB, addrA, addrB []netip.Addr, tweak func(*netstack.Options)) (a, b *netstack.Host) {
	t.Helper()
	a, b, _ = lossyHostPair(t, addrA, addrB, tweak, 0, 0)
	return a, b
}

// lossyHostPair is hostPair over a pump that drops packets with probability
// loss in each direction.
func lossyHostPair(t testing.TB, addrA, addrB []netip.Addr, tweak func(*netstack.Options), loss float64, seed uint64) (a, b *netstack.Host, p *pump) {
	t.Helper()
	oa := netstack.Options{Addrs: addrA}
	ob := netstack.Options{Addrs: addrB}
	if tweak != nil {
		tweak(&oa)
		tweak(&ob)
	}
	a = newHost(t, oa)
	b = newHost(t, ob)
	p = startLossyPump(a, b, loss, seed)
	t.Cleanup(func() {
		a.Close()
		b.Close()
		p.Wait(t)
	})
	return a, b, p
}

var (
	v4A = netip.MustParseAddr("10.0.0.1")
	v4B = netip.MustParseAddr("10.0.0.2")
	v6A = netip.MustParseAddr("fd00::1")
	v6B = netip.MustParseAddr("fd00::2")
)
