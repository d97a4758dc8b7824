package flow

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/packet"
)

// The fast path (translation from the index entry alone, counters and
// deadlines through the log) is an optimisation only: the same seeded
// traffic through a NAT whose fast path is switched off gives the same
// verdicts, the same bytes, the same bindings (counters and expiry times
// included) and the same listener counters, while time runs across idle
// expiries, RST and FIN retention, quarantine and health changes.
func TestFastPathMatchesFullPath(t *testing.T) {
	seed := testenv.Seed(t, 11)
	rng := rand.New(rand.NewPCG(seed, 11))
	mk := func(fast bool) *fixture {
		f := newFixture(t, func(o *Options) {
			o.Capacity = 64
			o.UDPIdleTimeout = 30 * time.Second
			o.TCPIdleTimeout = 90 * time.Second
			// A coarse sweep leaves expired bindings in the table between
			// sweeps: packets must still see them as expired.
			o.SweepInterval = 7 * time.Second
		})
		if !fast {
			f.nat.mu.Lock()
			f.nat.hotLimit = 0
			f.nat.mu.Unlock()
		}
		setTCP(t, f, be1, be2)
		setUDP(t, f, be1, be2)
		hair := Listener{VIP: vip2Addr, Proto: ProtoUDP, Port: 80}
		if err := f.nat.SetListener(hair, ListenerConfig{Backends: []Backend{beLocal}}); err != nil {
			t.Fatalf("f.nat.SetListener(hair, ListenerConfig{Backends: []Backend{beLocal}}): %v", err)
		}
		return f
	}
	fast, full := mk(true), mk(false)
	fixtures := []*fixture{fast, full}
	last := map[uint16][]byte{} // by client port: the last translated client packet (from full)
	hits := 0
	for step := range 4000 {
		var pkt []byte
		var from PeerID
		host := true
		sport := uint16(1000 + rng.IntN(12))
		switch op := rng.IntN(20); {
		case op < 6:
			pkt = udpTo(sport, "q")
		case op < 7:
			pkt = P{Src: localAddr, Dst: vip2Addr, Proto: ProtoUDP, Sport: sport, Dport: 80, Payload: []byte("h")}.Build()
		case op < 8:
			pkt = syn(sport, uint32(rng.IntN(3)))
		case op < 11:
			flags := []uint8{packet.TCPFlagACK, packet.TCPFlagACK, packet.TCPFlagACK | packet.TCPFlagPSH, packet.TCPFlagFIN | packet.TCPFlagACK, packet.TCPFlagRST}[rng.IntN(5)]
			pkt = P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: sport, Dport: 443, Flags: flags, Payload: []byte("d")}.Build()
		case op < 16:
			out := last[sport]
			if out == nil {
				continue
			}
			flags := []uint8{0, packet.TCPFlagACK, packet.TCPFlagACK, packet.TCPFlagSYN | packet.TCPFlagACK, packet.TCPFlagFIN | packet.TCPFlagACK}[rng.IntN(5)]
			pkt = replyTo(out, flags, "r")
			if packet.IPv4(out).Dst() != localAddr {
				host = false
				from = be1.Peer
				if packet.IPv4(out).Dst() == be2.Addr {
					from = be2.Peer
				}
				if rng.IntN(10) == 0 {
					from = 77 // not the binding's peer
				}
			}
		case op < 18:
			d := time.Duration(rng.IntN(12000)) * time.Millisecond
			if rng.IntN(20) == 0 {
				d = 100 * time.Second
			}
			for _, f := range fixtures {
				f.clock.Advance(d)
			}
			continue
		case op < 19:
			b := []Backend{be1, be2}[rng.IntN(2)]
			down := rng.IntN(2) == 0
			for _, f := range fixtures {
				f.sel.setDown(b, down)
				f.nat.HealthChanged()
			}
			continue
		default:
			requireSameState(t, fast, full, step)
			continue
		}
		var res [2]Result
		var bufs [2][]byte
		for i, f := range fixtures {
			bufs[i] = append([]byte(nil), pkt...)
			if host {
				res[i] = f.host(bufs[i])
			} else {
				res[i] = f.peer(from, bufs[i])
			}
		}
		if res[0] != res[1] {
			t.Fatalf("step %d: res[0] = %v, want %v", step, res[0], res[1])
		}
		if !bytes.Equal(bufs[0], bufs[1]) {
			t.Fatalf("step %d: bufs[0] = %v, want %v", step, bufs[0], bufs[1])
		}
		if host && (res[1].Verdict == Forward || res[1].Verdict == Reflect) && packet.IPv4(pkt).Dst() != localAddr {
			last[sport] = bufs[1]
		}
		fast.nat.mu.Lock()
		if e := fast.nat.idx.find(packetTuple(pkt, pkt[packet.IPv4(pkt).HeaderLen():])); e != nil && e.v1>>48 != classNone {
			hits++
		}
		fast.nat.mu.Unlock()
	}
	requireSameState(t, fast, full, -1)
	if hits <= 500 {
		t.Fatalf("the fast path was hardly used: hits = %v, want > %v", hits, 500)
	}
}

func requireSameState(t *testing.T, a, b *fixture, step int) {
	t.Helper()
	if want, got := b.nat.Bindings(), a.nat.Bindings(); !reflect.DeepEqual(got, want) {
		t.Fatalf("step %d: a.nat.Bindings() = %v, want %v", step, got, want)
	}
	if want, got := b.nat.Stats(), a.nat.Stats(); got != want {
		t.Fatalf("step %d: a.nat.Stats() = %v, want %v", step, got, want)
	}
	for _, l := range []Listener{lTCP, lUDP, {VIP: vip2Addr, Proto: ProtoUDP, Port: 80}} {
		sa, _ := a.nat.ListenerStats(l)
		sb, _ := b.nat.ListenerStats(l)
		if sa != sb {
			t.Fatalf("step %d: %v: sa = %v, want %v", step, l, sa, sb)
		}
	}
}
