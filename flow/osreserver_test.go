//go:build linux

package flow

import (
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vipkit/vipkit/packet"
)

// The OS reserver really binds: no local socket can take a reserved port,
// and it is free again after Release.
func TestOSReserverBindsOnLoopback(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	r, err := NewOSReserver(lo)
	require.NoError(t, err)
	defer r.Close()
	for _, proto := range []Proto{ProtoTCP, ProtoUDP} {
		p, err := r.Reserve(proto, netip.AddrPort{})
		require.NoError(t, err)
		ap := netip.AddrPortFrom(lo, p)
		if proto == ProtoTCP {
			_, err = net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(ap))
		} else {
			_, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(ap))
		}
		require.Error(t, err, "%v port %d must be taken", proto, p)
		r.Release(proto, netip.AddrPort{}, p)
		if proto == ProtoTCP {
			l, err := net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(ap))
			require.NoError(t, err)
			l.Close()
		} else {
			l, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(ap))
			require.NoError(t, err)
			l.Close()
		}
	}
	_, err = r.Reserve(ProtoICMP, netip.AddrPort{})
	require.ErrorIs(t, err, ErrUnsupported)
	_, err = NewOSReserver(netip.MustParseAddr("::1"))
	require.ErrorIs(t, err, ErrInvalidOptions)
}

// A NAT on the OS reserver holds one socket per binding (active or
// quarantined) and closes them all on Close.
func TestNATWithOSReserver(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	r, err := NewOSReserver(lo)
	require.NoError(t, err)
	defer r.Close()
	f := newFixture(t, func(o *Options) { o.LocalAddr = lo; o.Reserver = r })
	require.NoError(t, f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}))
	for i := range 5 {
		p := P{Src: lo, Dst: vipAddr, Proto: ProtoUDP, Sport: uint16(100 + i), Dport: 53}.Build()
		require.Equal(t, Forward, f.host(p).Verdict)
		require.Equal(t, lo, packet.IPv4(p).Src())
	}
	require.Equal(t, 5, r.InUse())
	f.clock.Advance(DefaultUDPIdleTimeout)
	require.Equal(t, 5, r.InUse(), "quarantined ports stay bound")
	f.clock.Advance(DefaultQuarantine)
	require.Equal(t, 0, r.InUse())
	require.Equal(t, Forward, f.host(P{Src: lo, Dst: vipAddr, Proto: ProtoUDP, Sport: 1, Dport: 53}.Build()).Verdict)
	require.NoError(t, f.nat.Close())
	require.Equal(t, 0, r.InUse())
}
