package flow

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vipkit/vipkit/packet"
)

// The defaults tests pin each of the spec's numbers by behaviour, with
// literal values: a test that used the Default constants would pass with
// any value of them.

// TestDefaultCapacity4096: with Options.Capacity zero the table holds 4096
// bindings; the 4097th flow is refused and counted, and nothing is evicted.
func TestDefaultCapacity4096(t *testing.T) {
	f := newFixture(t)
	require.NoError(t, f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}))
	for i := range 4096 {
		r := f.host(udpTo(uint16(1000+i), "q"))
		require.Equal(t, Forward, r.Verdict, "flow %d of 4096", i+1)
	}
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonCapacity}, f.host(udpTo(1000+4096, "q")), "the 4097th flow")
	st := f.nat.Stats()
	require.Equal(t, 4096, st.Capacity)
	require.Equal(t, 4096, st.Active)
	require.Equal(t, uint64(1), st.Refused)
	require.Equal(t, Forward, f.host(udpTo(1000, "again")).Verdict, "an existing flow still passes")
}

// TestDefaultUDPIdle120s: a UDP binding lasts exactly 120 s after its last
// datagram.
func TestDefaultUDPIdle120s(t *testing.T) {
	f := newFixture(t)
	require.NoError(t, f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}))
	require.Equal(t, Forward, f.host(udpTo(5000, "q")).Verdict)
	t0 := f.clock.Now()
	require.Equal(t, t0.Add(120*time.Second), f.nat.Bindings()[0].Expires)
	f.nat.Expire(t0.Add(120*time.Second - 1))
	require.Equal(t, Active, f.nat.Bindings()[0].State, "1 ns before 120 s")
	f.nat.Expire(t0.Add(120 * time.Second))
	require.Equal(t, Quarantined, f.nat.Bindings()[0].State, "at 120 s")
}

// TestDefaultQuarantine120s: a retired shadow port stays quarantined for
// exactly 120 s: late replies are dropped until then, and the port is
// released at 120 s.
func TestDefaultQuarantine120s(t *testing.T) {
	f := newFixture(t)
	require.NoError(t, f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}, IdleTimeout: 10 * time.Second}))
	p := udpTo(5000, "q")
	require.Equal(t, Forward, f.host(p).Verdict)
	retired := f.clock.Now().Add(10 * time.Second)
	f.nat.Expire(retired)
	require.Equal(t, Quarantined, f.nat.Bindings()[0].State)
	require.Equal(t, retired.Add(120*time.Second), f.nat.Bindings()[0].Expires)

	late := replyTo(p, 0, "late")
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonQuarantined}, f.nat.FromPeer(late, be1.Peer, retired.Add(120*time.Second-1)))
	require.Equal(t, 1, f.res.InUse(), "1 ns before the end of the quarantine")
	f.nat.Expire(retired.Add(120 * time.Second))
	require.Empty(t, f.nat.Bindings(), "at 120 s")
	require.Equal(t, 0, f.res.InUse())
	late = replyTo(p, 0, "later")
	require.Equal(t, Pass, f.nat.FromPeer(late, be1.Peer, retired.Add(120*time.Second)).Verdict)
}

// firstFragment is the first fragment (MF set, offset 0) of a UDP datagram
// from src to dst with IPv4 id.
func firstFragment(src, dst netip.AddrPort, id uint16) []byte {
	p := P{Src: src.Addr(), Dst: dst.Addr(), Proto: ProtoUDP, Sport: src.Port(), Dport: dst.Port(), Payload: make([]byte, 16), ID: id}.Build()
	binary.BigEndian.PutUint16(p[6:], packet.IPv4FlagMF)
	packet.IPv4(p).UpdateChecksum()
	return p
}

// TestDefaultMaxFragDatagrams64: with the defaults the fragment cache holds
// 64 incomplete datagrams in all (at most half of them per sender): 32 from
// the host and 32 from a peer fill it, and the 65th, from a third sender
// with none held, is refused.
func TestDefaultMaxFragDatagrams64(t *testing.T) {
	f := newFixture(t)
	require.NoError(t, f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}))
	require.NoError(t, f.nat.SetListener(Listener{VIP: vip2Addr, Proto: ProtoUDP, Port: 53}, ListenerConfig{Backends: []Backend{be2}}))
	// Bindings to be1 and be2: their fragments are NAT traffic.
	require.Equal(t, Forward, f.host(udpTo(5000, "q")).Verdict)
	require.Equal(t, Forward, f.host(P{Src: localAddr, Dst: vip2Addr, Proto: ProtoUDP, Sport: 5001, Dport: 53}.Build()).Verdict)

	client := netip.AddrPortFrom(localAddr, 6000)
	vip := netip.AddrPortFrom(vipAddr, 53)
	for i := range 32 {
		require.Equal(t, Consumed, f.host(firstFragment(client, vip, uint16(i+1))).Verdict, "host datagram %d", i+1)
	}
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonFragLimit}, f.host(firstFragment(client, vip, 100)), "the host's 33rd")
	from1 := netip.AddrPortFrom(be1.Addr, be1.Port)
	for i := range 32 {
		require.Equal(t, Consumed, f.peer(be1.Peer, firstFragment(from1, netip.AddrPortFrom(localAddr, 40000), uint16(i+1))).Verdict, "peer datagram %d", i+1)
	}
	require.Equal(t, 64, f.nat.Stats().FragPending)
	from2 := netip.AddrPortFrom(be2.Addr, be2.Port)
	require.Equal(t, Result{Verdict: Drop, Reason: ReasonFragLimit}, f.peer(be2.Peer, firstFragment(from2, netip.AddrPortFrom(localAddr, 40001), 1)), "the 65th")
	require.Equal(t, 64, f.nat.Stats().FragPending)
}
