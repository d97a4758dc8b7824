//go:build linux

package flow

import (
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/vipkit/vipkit/packet"
)

// The OS reserver really binds: no local socket can take a reserved port,
// and it is free again after Release.
func TestOSReserverBindsOnLoopback(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	r, err := NewOSReserver(lo)
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer r.Close()
	for _, proto := range []Proto{ProtoTCP, ProtoUDP} {
		p, err := r.Reserve(proto, netip.AddrPort{})
		if err != nil {
			t.Fatalf("%v", err)
		}
		ap := netip.AddrPortFrom(lo, p)
		if proto == ProtoTCP {
			_, err = net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(ap))
		} else {
			_, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(ap))
		}
		if err == nil {
			t.Fatalf("%v port %d must be taken: err is nil, want an error", proto, p)
		}
		r.Release(proto, netip.AddrPort{}, p)
		if proto == ProtoTCP {
			l, err := net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(ap))
			if err != nil {
				t.Fatalf("%v", err)
			}
			l.Close()
		} else {
			l, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(ap))
			if err != nil {
				t.Fatalf("%v", err)
			}
			l.Close()
		}
	}
	_, err = r.Reserve(ProtoICMP, netip.AddrPort{})
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("error %v, want ErrUnsupported", err)
	}
	_, err = NewOSReserver(netip.MustParseAddr("::1"))
	if !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("error %v, want ErrInvalidOptions", err)
	}
}

// A NAT on the OS reserver holds one socket per binding (active or
// quarantined) and closes them all on Close.
func TestNATWithOSReserver(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	r, err := NewOSReserver(lo)
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer r.Close()
	f := newFixture(t, func(o *Options) { o.LocalAddr = lo; o.Reserver = r })
	if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1}}): %v", err)
	}
	for i := range 5 {
		p := P{Src: lo, Dst: vipAddr, Proto: ProtoUDP, Sport: uint16(100 + i), Dport: 53}.Build()
		if got := f.host(p).Verdict; got != Forward {
			t.Fatalf("f.host(p).Verdict = %v, want %v", got, Forward)
		}
		if got := packet.IPv4(p).Src(); got != lo {
			t.Fatalf("packet.IPv4(p).Src() = %v, want %v", got, lo)
		}
	}
	if got := r.InUse(); got != 5 {
		t.Fatalf("r.InUse() = %v, want %v", got, 5)
	}
	f.clock.Advance(DefaultUDPIdleTimeout)
	if got := r.InUse(); got != 5 {
		t.Fatalf("quarantined ports stay bound: r.InUse() = %v, want %v", got, 5)
	}
	f.clock.Advance(DefaultQuarantine)
	if got := r.InUse(); got != 0 {
		t.Fatalf("r.InUse() = %v, want %v", got, 0)
	}
	if got := f.host(P{Src: lo, Dst: vipAddr, Proto: ProtoUDP, Sport: 1, Dport: 53}.Build()).Verdict; got != Forward {
		t.Fatalf("f.host(P{Src: lo, Dst: vipAddr, Proto: ProtoUDP, Sport: 1, Dport: 53}.Build()).Verdict = %v, want %v", got, Forward)
	}
	if err := f.nat.Close(); err != nil {
		t.Fatalf("f.nat.Close(): %v", err)
	}
	if got := r.InUse(); got != 0 {
		t.Fatalf("r.InUse() = %v, want %v", got, 0)
	}
}
