package flow

import (
	"testing"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/packet"
)

// Established flows translate without allocating, in both directions, for
// TCP and UDP, and hairpin.
func TestZeroAllocsEstablished(t *testing.T) {
	testenv.SkipIfLockOrder(t)
	f := newFixture(t)
	setTCP(t, f, be1)
	setUDP(t, f, be2)
	hair := Listener{VIP: vip2Addr, Proto: ProtoUDP, Port: 80}
	if err := f.nat.SetListener(hair, ListenerConfig{Backends: []Backend{beLocal}}); err != nil {
		t.Fatalf("f.nat.SetListener(hair, ListenerConfig{Backends: []Backend{beLocal}}): %v", err)
	}

	out := openTCP(t, f, 40000)
	tcpOut := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40000, Dport: 443, Flags: packet.TCPFlagACK, Payload: make([]byte, 1000)}.Build()
	tcpIn := replyTo(out, packet.TCPFlagACK, "0123456789")
	u := udpTo(5000, "q")
	if got := f.host(u).Verdict; got != Forward {
		t.Fatalf("f.host(u).Verdict = %v, want %v", got, Forward)
	}
	udpIn := replyTo(u, 0, "answer")
	h := P{Src: localAddr, Dst: vip2Addr, Proto: ProtoUDP, Sport: 6000, Dport: 80, Payload: []byte("x")}.Build()
	if got := f.host(h).Verdict; got != Reflect {
		t.Fatalf("f.host(h).Verdict = %v, want %v", got, Reflect)
	}
	hairIn := replyTo(h, 0, "y")

	cases := []struct {
		name string
		pkt  []byte
		peer PeerID // 0: FromHost
		want Verdict
	}{
		{"tcp out", tcpOut, 0, Forward},
		{"tcp in", tcpIn, be1.Peer, Forward},
		{"udp out", udpTo(5000, "q"), 0, Forward},
		{"udp in", udpIn, be2.Peer, Forward},
		{"hairpin in", hairIn, 0, Reflect},
	}
	for _, c := range cases {
		buf := make([]byte, len(c.pkt))
		var r Result
		allocs := testing.AllocsPerRun(1000, func() {
			copy(buf, c.pkt)
			if c.peer == 0 {
				r = f.nat.FromHost(buf, f.clock.Now())
			} else {
				r = f.nat.FromPeer(buf, c.peer, f.clock.Now())
			}
		})
		if r.Verdict != c.want {
			t.Fatalf("%v: r.Verdict = %v, want %v", c.name, r.Verdict, c.want)
		}
		if allocs != 0 {
			t.Fatalf("%v: allocs = %v, want 0", c.name, allocs)
		}
	}
}
