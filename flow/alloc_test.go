package flow

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vipkit/vipkit/packet"
)

// Established flows translate without allocating, in both directions, for
// TCP and UDP, and hairpin.
func TestZeroAllocsEstablished(t *testing.T) {
	f := newFixture(t)
	setTCP(t, f, be1)
	setUDP(t, f, be2)
	hair := Listener{VIP: vip2Addr, Proto: ProtoUDP, Port: 80}
	require.NoError(t, f.nat.SetListener(hair, ListenerConfig{Backends: []Backend{beLocal}}))

	out := openTCP(t, f, 40000)
	tcpOut := P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: 40000, Dport: 443, Flags: packet.TCPFlagACK, Payload: make([]byte, 1000)}.Build()
	tcpIn := replyTo(out, packet.TCPFlagACK, "0123456789")
	u := udpTo(5000, "q")
	require.Equal(t, Forward, f.host(u).Verdict)
	udpIn := replyTo(u, 0, "answer")
	h := P{Src: localAddr, Dst: vip2Addr, Proto: ProtoUDP, Sport: 6000, Dport: 80, Payload: []byte("x")}.Build()
	require.Equal(t, Reflect, f.host(h).Verdict)
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
		require.Equal(t, c.want, r.Verdict, c.name)
		require.Zero(t, allocs, c.name)
	}
}
