package vip

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/internal/testenv"
)

// The engine's defaults tests pin, with literal values and by behaviour,
// the numbers the engine takes from the Registry's default Limits and from
// flow's and probe's defaults.

// hangDialer's connects hang until their context ends.
type hangDialer struct{}

func (hangDialer) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestEngineDefaultFlowTable: the NAT holds 4096 bindings (the 4097th flow
// is refused and counted), a UDP binding lasts 120 s after its last
// datagram, and a retired one stays quarantined 120 s.
func TestEngineDefaultFlowTable(t *testing.T) {
	checkLeaks(t)
	u := newUnitEngine(t, testenv.Seed(t, 31))
	if _, err := u.reg.PortAdd(context.Background(), "api", PortKey{UDP, 53}, []Backend{{u.peer.ID, 5353}}); err != nil {
		t.Fatal(err)
	}
	vip := netip.AddrPortFrom(u.svc.Addr, 53)
	b := newBatch(1, 2048)
	t0 := u.clock.Now()
	for i := range 4096 {
		if u.hostBatch(b, ipv4Packet(17, netip.AddrPortFrom(u.self.Addr, uint16(1000+i)), vip, 0, []byte("q"))) != 1 {
			t.Fatalf("flow %d of 4096 refused: %+v", i+1, u.e.Status().Flow)
		}
	}
	if u.hostBatch(b, ipv4Packet(17, netip.AddrPortFrom(u.self.Addr, 1000+4096), vip, 0, []byte("q"))) != 0 {
		t.Fatal("the 4097th flow was accepted")
	}
	fs := u.e.Status().Flow
	if fs.Capacity != 4096 || fs.Active != 4096 || fs.Refused != 1 || fs.Drops["capacity"] != 1 {
		t.Fatalf("flow status %+v, want capacity 4096, 4096 active, 1 refused", fs)
	}
	var first flow.BindingInfo
	for _, bi := range u.e.NAT().Bindings() {
		if bi.Client.Port() == 1000 {
			first = bi
		}
	}
	if !first.Expires.Equal(t0.Add(120 * time.Second)) {
		t.Fatalf("a UDP binding expires %v after its datagram, want 120s", first.Expires.Sub(t0))
	}
	u.e.NAT().Expire(t0.Add(120 * time.Second))
	for _, bi := range u.e.NAT().Bindings() {
		if bi.Client.Port() == 1000 && (bi.State != flow.Quarantined || !bi.Expires.Equal(t0.Add(240*time.Second))) {
			t.Fatalf("retired at 120 s: %v until %v, want quarantined until 240 s", bi.State, bi.Expires.Sub(t0))
		}
	}
}

// fragment1 is the first fragment (MF set, offset 0) of a UDP datagram.
func fragment1(src, dst netip.AddrPort, id uint16) []byte {
	p := ipv4Packet(17, src, dst, 0, make([]byte, 16))
	binary.BigEndian.PutUint16(p[4:], id)
	binary.BigEndian.PutUint16(p[6:], 0x2000) // MF
	binary.BigEndian.PutUint16(p[10:], 0)
	binary.BigEndian.PutUint16(p[10:], ^fold16(sum16(p[:20], 0)))
	return p
}

// TestEngineDefaultIncompleteDatagrams: the NAT holds 64 incomplete
// datagrams: 32 from the host and 32 from one peer fill it (a sender may
// hold half), and the 65th, from another peer, is refused.
func TestEngineDefaultIncompleteDatagrams(t *testing.T) {
	checkLeaks(t)
	u := newUnitEngine(t, testenv.Seed(t, 32))
	ctx := context.Background()
	third := NodeInfo{ID: NodeID{3}, Name: "third", Addr: netip.AddrFrom4([4]byte{100, 80, 0, 3})}
	u.mu.Lock()
	u.nodes = append(u.nodes, third)
	u.mu.Unlock()
	u.reg.Refresh()
	if _, err := u.reg.PortAdd(ctx, "api", PortKey{UDP, 53}, []Backend{{u.peer.ID, 5353}}); err != nil {
		t.Fatal(err)
	}
	if _, err := u.reg.PortAdd(ctx, "api", PortKey{UDP, 54}, []Backend{{third.ID, 5353}}); err != nil {
		t.Fatal(err)
	}
	// Bindings to both peers: their fragments are NAT traffic.
	b := newBatch(1, 2048)
	client := netip.AddrPortFrom(u.self.Addr, 40000)
	for _, port := range []uint16{53, 54} {
		if u.hostBatch(b, ipv4Packet(17, client, netip.AddrPortFrom(u.svc.Addr, port), 0, []byte("q"))) != 1 {
			t.Fatalf("no binding for udp/%d", port)
		}
	}
	vip := netip.AddrPortFrom(u.svc.Addr, 53)
	for i := range 32 {
		u.hostBatch(b, fragment1(netip.AddrPortFrom(u.self.Addr, 41000), vip, uint16(i+1)))
	}
	for i := range 32 {
		if _, err := u.e.Write([][]byte{fragment1(netip.AddrPortFrom(u.peer.Addr, 5353), netip.AddrPortFrom(u.self.Addr, 42000), uint16(i+1))}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if st := u.e.NAT().Stats(); st.FragPending != 64 || st.Drops[flow.ReasonFragLimit] != 0 {
		t.Fatalf("after 64 first fragments: %d pending, %d refused; want 64 and 0", st.FragPending, st.Drops[flow.ReasonFragLimit])
	}
	if _, err := u.e.Write([][]byte{fragment1(netip.AddrPortFrom(third.Addr, 5353), netip.AddrPortFrom(u.self.Addr, 42001), 1)}, 0); err != nil {
		t.Fatal(err)
	}
	if st := u.e.NAT().Stats(); st.FragPending != 64 || st.Drops[flow.ReasonFragLimit] != 1 {
		t.Fatalf("the 65th incomplete datagram: %d pending, %d refused; want 64 and 1", st.FragPending, st.Drops[flow.ReasonFragLimit])
	}
}

// TestEngineDefaultConnectChecks: the engine's connect checks are served by
// a 250 ms worker tick, and 32 checks (the listener's 32 backends) are all
// in flight at once after one tick.
func TestEngineDefaultConnectChecks(t *testing.T) {
	checkLeaks(t)
	u := newUnitEngineWith(t, testenv.Seed(t, 33), func(o *EngineOptions) { o.Dialer = hangDialer{} })
	t0 := u.clock.Now()
	var bs []Backend
	for i := range 32 {
		bs = append(bs, Backend{u.peer.ID, uint16(9000 + i)})
	}
	if _, err := u.reg.PortAdd(context.Background(), "api", PortKey{TCP, 80}, bs); err != nil {
		t.Fatal(err)
	}
	u.clock.AdvanceTo(t0.Add(250*time.Millisecond - 1))
	if st := u.e.checker.Stats(); st.Checks != 32 || st.Started != 0 {
		t.Fatalf("before the first tick: %+v, want 32 checks and no connect", st)
	}
	u.clock.AdvanceTo(t0.Add(250 * time.Millisecond))
	if st := u.e.checker.Stats(); st.Started != 32 || st.InFlight != 32 {
		t.Fatalf("at the first tick, 250ms: %+v, want 32 connects in flight", st)
	}
}
