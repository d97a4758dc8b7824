package vip

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/packet"
	"github.com/vipkit/vipkit/probe"
)

// TestEngineMovedVIPReachesNewOwner: a VIP's address moves because a new
// member's address wins it, while a TCP binding on the old address still
// drains (kept alive by its traffic). The member that now holds the
// address is reachable in both directions at once: the host's SYN to it
// leaves untouched, its SYN reaches the host. The draining flow goes on
// to its backend, and nobody can pose as its VIP side.
func TestEngineMovedVIPReachesNewOwner(t *testing.T) {
	checkLeaks(t)
	u := newUnitEngine(t, testenv.Seed(t, 40))
	client := netip.AddrPortFrom(u.self.Addr, 40000)
	old := u.svc.Addr
	b := newBatch(2, 2048)
	if u.hostBatch(b, ipv4Packet(6, client, netip.AddrPortFrom(old, 443), tcpSYN, nil)) != 1 {
		t.Fatal("SYN to the VIP not forwarded")
	}
	owner := NodeInfo{ID: NodeID{1}, Name: "owner", Addr: old}
	u.mu.Lock()
	u.nodes = append(u.nodes, owner)
	u.mu.Unlock()
	u.reg.Refresh()
	if err := u.e.Apply(); err != nil {
		t.Fatal(err)
	}
	if v, _ := u.reg.Get("api"); !v.AddrMoved || v.Addr == old {
		t.Fatalf("the VIP did not move: %v", v.Addr)
	}
	var toHost [][]byte
	u.host.onWrite = func(p []byte) { toHost = append(toHost, bytes.Clone(p)) }

	// Host → new owner: the SYN leaves for the overlay as it was.
	syn := ipv4Packet(6, netip.AddrPortFrom(u.self.Addr, 40001), netip.AddrPortFrom(old, 443), tcpSYN, nil)
	if n := u.hostBatch(b, syn); n != 1 || !bytes.Equal(b.bufs[0][:b.sizes[0]], syn) {
		t.Errorf("SYN to the new owner: %d packets for the overlay (unchanged %v), want 1 unchanged; drops %v",
			n, n == 1 && bytes.Equal(b.bufs[0][:b.sizes[0]], syn), u.e.Status().Flow.Drops)
	}
	// New owner → host: its SYN reaches the host.
	in := ipv4Packet(6, netip.AddrPortFrom(old, 5555), netip.AddrPortFrom(u.self.Addr, 22), tcpSYN, nil)
	if _, err := u.e.Write([][]byte{bytes.Clone(in)}, 0); err != nil {
		t.Fatal(err)
	}
	if len(toHost) != 1 || !bytes.Equal(toHost[0], in) {
		t.Errorf("SYN from the new owner: %d packets reached the host, want it unchanged; drops %v", len(toHost), u.e.Status().Flow.Drops)
	}
	if d := u.e.Status().Flow.Drops; d["refused"]+d["vip-source"]+d["no-listener"] != 0 {
		t.Errorf("drops %v, want no refused, no-listener or vip-source", d)
	}

	// The draining flow still goes to its backend.
	ack := ipv4Packet(6, client, netip.AddrPortFrom(old, 443), tcpACK, []byte("more"))
	if u.hostBatch(b, ack) != 1 || netip.AddrFrom4([4]byte(b.bufs[0][16:20])) != u.peer.Addr {
		t.Fatal("the draining flow no longer reaches its backend")
	}
	// The new owner cannot speak into it as the VIP.
	toHost = nil
	spoof := ipv4Packet(6, netip.AddrPortFrom(old, 443), client, tcpACK, []byte("spoof"))
	if _, err := u.e.Write([][]byte{spoof}, 0); err != nil {
		t.Fatal(err)
	}
	if len(toHost) != 0 {
		t.Error("a packet posing as the draining flow's VIP side reached the host")
	}
	if got := u.e.Status().Flow.Drops["vip-source"]; got != 1 {
		t.Errorf("vip-source drops %d, want 1", got)
	}

	// A fragmented datagram from the host to the new owner's probe port is
	// reassembled by the NAT (the address still drains) and must not leave
	// as a probe: it is dropped and counted like an unfragmented one.
	before := u.e.Status().Probe.HostDropped
	dg := ipv4Packet(17, netip.AddrPortFrom(u.self.Addr, probe.DefaultPort), netip.AddrPortFrom(old, probe.DefaultPort), 0, make([]byte, 64))
	first, second := splitAt(dg, 32)
	if n := u.hostBatch(b, first, second); n != 0 {
		t.Fatalf("fragments to the probe port: %d packets for the overlay, want 0", n)
	}
	if got := u.e.Status().Probe.HostDropped - before; got != 1 {
		t.Errorf("host probe-port drops rose by %d, want 1", got)
	}
}

// splitAt splits a whole IPv4 datagram into two fragments at payload
// offset off (a multiple of 8).
func splitAt(pkt []byte, off int) (first, second []byte) {
	hl := packet.IPv4(pkt).HeaderLen()
	mk := func(data []byte, fo int, mf bool) []byte {
		f := make([]byte, hl+len(data))
		copy(f, pkt[:hl])
		copy(f[hl:], data)
		fl := uint16(fo / 8)
		if mf {
			fl |= packet.IPv4FlagMF
		}
		f[6], f[7] = byte(fl>>8), byte(fl)
		f[2], f[3] = byte(len(f)>>8), byte(len(f))
		packet.IPv4(f).UpdateChecksum()
		return f
	}
	return mk(pkt[hl:hl+off], 0, true), mk(pkt[hl+off:], off, false)
}
