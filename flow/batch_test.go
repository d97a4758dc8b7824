package flow

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/packet"
)

// The batch calls give exactly the results, rewrites, emitted packets and
// reports of calling FromHost / FromPeer on each packet in order.
func TestBatchEqualsSingle(t *testing.T) {
	seed := testenv.Seed(t, 6)
	rng := rand.New(rand.NewPCG(seed, 6))
	a := newFixture(t, func(o *Options) { o.Capacity = 64; o.MTU = 800 })
	b := newFixture(t, func(o *Options) { o.Capacity = 64; o.MTU = 800 })
	for _, f := range []*fixture{a, b} {
		setTCP(t, f, be1)
		setUDP(t, f, be1, be2)
	}
	var replies [][]byte
	for round := range 40 {
		n := 1 + rng.IntN(100) // crosses the 64-packet chunk
		hostSide := round%2 == 0 || len(replies) == 0
		var pkts [][]byte
		for range n {
			var p []byte
			switch k := rng.IntN(10); {
			case !hostSide && k < 6 && len(replies) > 0:
				p = replyTo(replies[rng.IntN(len(replies))], packet.TCPFlagACK, "r")
			case !hostSide && k < 8 && len(replies) > 0:
				q := replies[rng.IntN(len(replies))]
				p = P{Src: packet.IPv4(q).Dst(), Dst: localAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: 3, Payload: q}.Build()
			case k < 3:
				p = udpTo(uint16(1000+rng.IntN(80)), "x")
			case k < 5:
				p = syn(uint16(2000+rng.IntN(40)), 1)
			case k < 6:
				p = bigUDP(uint16(3000+rng.IntN(5)), 1500, uint16(rng.IntN(3)))
				p = fragment(p, 1000)[rng.IntN(2)]
			case k < 7:
				p = udpTo(1, "garbage")[:10+rng.IntN(20)]
			default:
				p = P{Src: localAddr, Dst: be2.Addr, Proto: ProtoUDP, Sport: 1, Dport: 2}.Build()
			}
			pkts = append(pkts, p)
		}
		single := make([][]byte, n)
		batch := make([][]byte, n)
		want := make([]Result, n)
		got := make([]Result, n)
		for i, p := range pkts {
			single[i] = append([]byte(nil), p...)
			batch[i] = append([]byte(nil), p...)
		}
		if hostSide {
			for i := range single {
				want[i] = a.host(single[i])
			}
			b.nat.FromHostBatch(batch, b.clock.Now(), got)
		} else {
			for i := range single {
				want[i] = a.peer(be1.Peer, single[i])
			}
			b.nat.FromPeerBatch(batch, be1.Peer, b.clock.Now(), got)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: got = %v, want %v", round, got, want)
		}
		if !reflect.DeepEqual(batch, single) {
			t.Fatalf("round %d: batch = %v, want %v", round, batch, single)
		}
		if want, got := len(a.takeOut()), len(b.takeOut()); got != want {
			t.Fatalf("len(b.takeOut()) = %v, want %v", got, want)
		}
		if !reflect.DeepEqual(b.reports, a.reports) {
			t.Fatalf("b.reports = %v, want %v", b.reports, a.reports)
		}
		for i, r := range want {
			if r.Verdict == Forward && hostSide {
				replies = append(replies, single[i])
			}
		}
	}
	if len(a.reports) == 0 {
		t.Fatal("a.reports is empty")
	}
}
