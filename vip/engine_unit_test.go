package vip

import (
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/probe"
	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// unitEngine is one engine on a recording host and the manual clock: the
// test plays both the host and wireguard-go (calling Read and Write).
type unitEngine struct {
	e     *Engine
	reg   *Registry
	clock *transporttest.ManualClock
	host  *recHost
	self  NodeInfo
	peer  NodeInfo
	svc   ServiceView

	mu sync.Mutex
	// +checklocks:mu
	nodes []NodeInfo // the membership Registry.Nodes reports
}

func (u *unitEngine) nodeList() []NodeInfo {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]NodeInfo(nil), u.nodes...)
}

// recHost is a host PacketIO whose Read waits for Close (the test drives
// the host path through fromHost) and whose Write hands every packet to
// onWrite synchronously, without copying.
type recHost struct {
	onWrite func(pkt []byte)
	done    chan struct{}
	once    sync.Once
}

func (h *recHost) Read([][]byte, []int, int) (int, error) {
	<-h.done
	return 0, transport.ErrClosed
}

func (h *recHost) Write(bufs [][]byte, offset int) (int, error) {
	for _, b := range bufs {
		if h.onWrite != nil {
			h.onWrite(b[offset:])
		}
	}
	return len(bufs), nil
}

func (h *recHost) BatchSize() int { return 64 }
func (h *recHost) MTU() int       { return 1420 }
func (h *recHost) Close() error {
	h.once.Do(func() { close(h.done) })
	return nil
}

func newUnitEngine(t testing.TB, seed uint64) *unitEngine {
	t.Helper()
	return newUnitEngineWith(t, seed, nil)
}

// newUnitEngineWith is newUnitEngine with a change to the engine options.
func newUnitEngineWith(t testing.TB, seed uint64, opt func(*EngineOptions)) *unitEngine {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 3))
	var keys []ed25519.PrivateKey
	var nodes []NodeInfo
	var members []crdt.AuthorID
	for i := range 2 {
		var s [32]byte
		for j := range s {
			s[j] = byte(rng.Uint32())
		}
		k := ed25519.NewKeyFromSeed(s[:])
		var id NodeID
		copy(id[:], k.Public().(ed25519.PublicKey))
		keys = append(keys, k)
		nodes = append(nodes, NodeInfo{ID: id, Name: []string{"self", "peer"}[i], Addr: netip.AddrFrom4([4]byte{100, 80, 0, byte(i + 1)})})
		members = append(members, crdt.AuthorID(id))
	}
	var netID crdt.NetworkID
	copy(netID[:], "engine-unit-net!")
	rep, err := crdt.Open(context.Background(), crdt.Config{Network: netID, Signer: keys[0], Members: members, Store: crdt.NewMemStore(), Obsolete: Obsolete, Check: CheckField, Rank: Rank})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rep.Close() })
	u := &unitEngine{clock: transporttest.NewManualClock(), self: nodes[0], peer: nodes[1], nodes: nodes}
	u.reg, err = NewRegistry(RegistryOptions{Network: "home", Prefix: netip.MustParsePrefix("100.80.0.0/16"), Replica: rep,
		Nodes: u.nodeList, Rand: rand.NewChaCha8([32]byte{byte(seed)}),
		OnChange: func([]ServiceID, bool) {
			if u.e != nil {
				_ = u.e.Apply()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	u.host = &recHost{done: make(chan struct{})}
	off := false
	eo := EngineOptions{Registry: u.reg, Self: u.self.ID, Host: u.host, Clock: u.clock, Prober: probe.ProberConfig{Seed: probe.SeedFrom(seed)}}
	if opt != nil {
		opt(&eo)
	}
	u.e, err = NewEngine(eo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.e.Close() })
	ctx := context.Background()
	if _, err := u.reg.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	if _, err := u.reg.PortAdd(ctx, "api", PortKey{TCP, 443}, []Backend{{u.peer.ID, 8443}}); err != nil {
		t.Fatal(err)
	}
	if u.svc, err = u.reg.PortSet(ctx, "api", PortKey{TCP, 443}, PortSettings{PortCheck: &off}); err != nil {
		t.Fatal(err)
	}
	return u
}

// ipv4Packet builds an IPv4 packet with a TCP or UDP header and valid
// checksums.
func ipv4Packet(proto uint8, src, dst netip.AddrPort, flags uint8, payload []byte) []byte {
	hl := 8
	if proto == 6 {
		hl = 20
	}
	p := make([]byte, 20+hl+len(payload))
	p[0], p[8], p[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	binary.BigEndian.PutUint16(p[10:], ^fold16(sum16(p[:20], 0)))
	l4 := p[20:]
	binary.BigEndian.PutUint16(l4[0:], src.Port())
	binary.BigEndian.PutUint16(l4[2:], dst.Port())
	if proto == 6 {
		binary.BigEndian.PutUint32(l4[4:], 1000)
		l4[12], l4[13] = 5<<4, flags
		binary.BigEndian.PutUint16(l4[14:], 65535)
	} else {
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	}
	copy(l4[hl:], payload)
	pseudo := sum16(p[12:20], uint32(proto)+uint32(len(l4)))
	ck := ^fold16(sum16(l4, pseudo))
	if proto == 6 {
		binary.BigEndian.PutUint16(l4[16:], ck)
	} else {
		binary.BigEndian.PutUint16(l4[6:], ck)
	}
	return p
}

func sum16(b []byte, acc uint32) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		acc += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		acc += uint32(b[len(b)-1]) << 8
	}
	return acc
}

func fold16(acc uint32) uint16 {
	for acc > 0xffff {
		acc = acc>>16 + acc&0xffff
	}
	return uint16(acc)
}

const (
	tcpSYN = 0x02
	tcpACK = 0x10
)

// hostBatch runs pkts through the engine's host path as one batch and
// returns how many stayed for the overlay.
func (u *unitEngine) hostBatch(b *batch, pkts ...[]byte) int {
	for i, p := range pkts {
		b.sizes[i] = copy(b.bufs[i], p)
	}
	u.e.fromHost(b, len(pkts))
	return b.n
}

func newBatch(n, size int) *batch {
	b := &batch{bufs: make([][]byte, n), sizes: make([]int, n)}
	for i := range b.bufs {
		b.bufs[i] = make([]byte, size)
	}
	return b
}

// The pass-through and established-flow paths allocate nothing, in both
// directions.
func TestEnginePacketPathZeroAlloc(t *testing.T) {
	testenv.SkipIfLockOrder(t)
	checkLeaks(t)
	u := newUnitEngine(t, testenv.Seed(t, 1))
	client := netip.AddrPortFrom(u.self.Addr, 40000)
	vip := netip.AddrPortFrom(u.svc.Addr, 443)
	b := newBatch(4, 2048)
	if n := u.hostBatch(b, ipv4Packet(6, client, vip, tcpSYN, nil)); n != 1 {
		t.Fatalf("SYN to the VIP: %d packets for the overlay, want 1", n)
	}
	binds := u.e.NAT().Bindings()
	if len(binds) != 1 {
		t.Fatalf("%d bindings after the SYN", len(binds))
	}
	shadow := binds[0].Shadow
	backend := netip.AddrPortFrom(u.peer.Addr, 8443)
	synack := ipv4Packet(6, backend, shadow, tcpSYN|tcpACK, nil)
	ack := ipv4Packet(6, client, vip, tcpACK, make([]byte, 1000))
	reply := ipv4Packet(6, backend, shadow, tcpACK, make([]byte, 1000))
	passOut := ipv4Packet(17, client, netip.AddrPortFrom(u.peer.Addr, 53), 0, make([]byte, 100))
	passIn := ipv4Packet(17, netip.AddrPortFrom(u.peer.Addr, 53), client, 0, make([]byte, 100))

	var delivered [][]byte
	u.host.onWrite = func(pkt []byte) { delivered = append(delivered, pkt) }
	if _, err := u.e.Write([][]byte{synack}, 0); err != nil {
		t.Fatal(err)
	}
	if len(delivered) != 1 {
		t.Fatalf("SYN-ACK did not reach the host: %d packets", len(delivered))
	}
	if got := netip.AddrFrom4([4]byte(delivered[0][12:16])); got != u.svc.Addr {
		t.Fatalf("SYN-ACK source %v, want the VIP %v", got, u.svc.Addr)
	}
	got := 0
	u.host.onWrite = func([]byte) { got++ }

	wbufs := [][]byte{make([]byte, 2048), make([]byte, 2048)}
	w := make([][]byte, 2)
	allocs := testing.AllocsPerRun(200, func() {
		if u.hostBatch(b, ack, passOut) != 2 {
			t.Fatal("host batch lost a packet")
		}
		copy(wbufs[0][16:], reply)
		copy(wbufs[1][16:], passIn)
		w[0], w[1] = wbufs[0][:16+len(reply)], wbufs[1][:16+len(passIn)]
		if _, err := u.e.Write(w, 16); err != nil {
			t.Fatal(err)
		}
	})
	if got < 400 {
		t.Errorf("%d packets reached the host, want 2 per round", got)
	}
	if allocs != 0 {
		t.Errorf("packet path: %v allocations per round, want 0", allocs)
	}
	st := u.e.Status()
	if st.PassThrough.PacketsOut < 200 || st.PassThrough.PacketsIn < 200 {
		t.Errorf("pass-through counters %+v", st.PassThrough)
	}
	if l := st.Services[0].Listeners[0]; l.PacketsOut < 200 || l.PacketsIn < 200 || l.Active != 1 {
		t.Errorf("listener counters %+v", l.Traffic)
	}
}

// Probes from a peer are answered inside the engine (toward the overlay,
// never the host) and counted apart; a peer cannot send from a VIP.
func TestEngineAnswersProbesAndRefusesVIPSource(t *testing.T) {
	checkLeaks(t)
	u := newUnitEngine(t, testenv.Seed(t, 2))
	var toHost [][]byte
	u.host.onWrite = func(p []byte) { toHost = append(toHost, append([]byte(nil), p...)) }
	var m probe.Message
	m.Type = probe.TypeRequest
	m.Session, m.Sequence, m.Nonce = 7, 1, 99
	payload := m.Bytes()
	req, err := probe.AppendIPv4UDP(nil, netip.AddrPortFrom(u.peer.Addr, probe.DefaultPort), netip.AddrPortFrom(u.self.Addr, probe.DefaultPort), 1, payload[:])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.e.Write([][]byte{req}, 0); err != nil {
		t.Fatal(err)
	}
	// The reply comes out of Read (toward wireguard-go), among the
	// engine's own probes to the peer.
	bufs, sizes := [][]byte{make([]byte, 2048), make([]byte, 2048)}, []int{0, 0}
	var reply []byte
	for reply == nil {
		n, err := u.e.Read(bufs, sizes, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			_, dst, pl, err := probe.ParseIPv4UDP(bufs[i][:sizes[i]])
			if err == nil && dst.Addr() == u.peer.Addr {
				if got, err := probe.ParseMessage(pl); err == nil && got.Type == probe.TypeReply && got.Nonce == 99 {
					reply = pl
				}
			}
		}
	}
	spoof := ipv4Packet(17, netip.AddrPortFrom(u.svc.Addr, 443), netip.AddrPortFrom(u.self.Addr, 5000), 0, []byte("x"))
	if _, err := u.e.Write([][]byte{spoof}, 0); err != nil {
		t.Fatal(err)
	}
	outside := ipv4Packet(17, netip.MustParseAddrPort("192.0.2.1:53"), netip.AddrPortFrom(u.self.Addr, 5000), 0, []byte("x"))
	if _, err := u.e.Write([][]byte{outside}, 0); err != nil {
		t.Fatal(err)
	}
	st := u.e.Status()
	if st.Flow.Drops["admission"] != 1 {
		t.Errorf("drops %v, want one admission drop for a source outside the overlay", st.Flow.Drops)
	}
	if st.Probe.Answered != 1 || st.Probe.PacketsIn != 1 || st.PassThrough.PacketsIn != 0 {
		t.Errorf("probe %+v, pass-through %+v", st.Probe, st.PassThrough)
	}
	if st.Flow.Drops["vip-source"] != 1 {
		t.Errorf("drops %v, want one vip-source", st.Flow.Drops)
	}
	if len(toHost) != 0 {
		t.Errorf("%d packets reached the host, want none", len(toHost))
	}
}

// FuzzEngineWrite feeds arbitrary packets from a peer (what wireguard-go
// decrypted) and from the host through the engine: it never panics and
// never delivers a packet with a VIP source from a peer to the host.
func FuzzEngineWrite(f *testing.F) {
	u := newUnitEngine(f, 3)
	client := netip.AddrPortFrom(u.self.Addr, 40000)
	vip := netip.AddrPortFrom(u.svc.Addr, 443)
	peer := netip.AddrPortFrom(u.peer.Addr, 8443)
	f.Add(ipv4Packet(6, peer, client, tcpSYN|tcpACK, nil), false)
	f.Add(ipv4Packet(6, client, vip, tcpSYN, nil), true)
	f.Add(ipv4Packet(17, netip.AddrPortFrom(u.peer.Addr, probe.DefaultPort), netip.AddrPortFrom(u.self.Addr, probe.DefaultPort), 0, make([]byte, probe.MessageLen)), false)
	f.Add(ipv4Packet(17, vip, client, 0, []byte("spoof")), false)
	f.Add([]byte{0x45}, false)
	f.Add([]byte("000000000000dP\x0f\x1f0000"), false) // version 3 with a VIP "source": found by the fuzzer
	f.Add([]byte{}, true)
	b := newBatch(1, 65536)
	vip4 := u.svc.Addr.As4()
	leaked := false
	u.host.onWrite = func(p []byte) {
		if len(p) >= 20 && [4]byte(p[12:16]) == vip4 {
			leaked = true
		}
	}
	f.Fuzz(func(t *testing.T, pkt []byte, fromHost bool) {
		if fromHost {
			if len(pkt) <= len(b.bufs[0]) {
				u.hostBatch(b, pkt)
			}
			return
		}
		leaked = false
		if _, err := u.e.Write([][]byte{append([]byte(nil), pkt...)}, 0); err != nil {
			t.Fatal(err)
		}
		// Replies of bindings legitimately come out with the VIP as source;
		// a packet that claimed the VIP itself must never get through.
		if leaked && len(pkt) >= 20 && [4]byte(pkt[12:16]) == vip4 && pkt[0]>>4 != 6 {
			t.Fatalf("a packet with a VIP source reached the host from a peer: % x", pkt)
		}
	})
}

// Removing a backend stops new bindings to it while the existing binding
// keeps forwarding; when the VIP's effective address moves (a node took
// it), the old listener drains with the original VIP address and the new
// address takes new flows.
func TestEngineRemovedBackendAndMovedVIPDrain(t *testing.T) {
	checkLeaks(t)
	u := newUnitEngine(t, testenv.Seed(t, 4))
	ctx := context.Background()
	client := netip.AddrPortFrom(u.self.Addr, 40000)
	oldVIP := netip.AddrPortFrom(u.svc.Addr, 443)
	b := newBatch(2, 2048)
	if u.hostBatch(b, ipv4Packet(6, client, oldVIP, tcpSYN, nil)) != 1 {
		t.Fatal("SYN not forwarded")
	}
	k := PortKey{TCP, 443}
	if _, err := u.reg.BackendAdd(ctx, "api", k, Backend{u.peer.ID, 9443}); err != nil {
		t.Fatal(err)
	}
	if _, err := u.reg.BackendRemove(ctx, "api", k, Backend{u.peer.ID, 8443}); err != nil {
		t.Fatal(err)
	}
	// The old flow keeps its backend; a new one gets the remaining backend.
	if u.hostBatch(b, ipv4Packet(6, client, oldVIP, tcpACK, []byte("more"))) != 1 {
		t.Fatal("established flow stopped after its backend was removed")
	}
	if got := binary.BigEndian.Uint16(b.bufs[0][22:]); got != 8443 {
		t.Errorf("established flow now goes to port %d, want 8443", got)
	}
	client2 := netip.AddrPortFrom(u.self.Addr, 40001)
	if u.hostBatch(b, ipv4Packet(6, client2, oldVIP, tcpSYN, nil)) != 1 {
		t.Fatal("new SYN not forwarded")
	}
	if got := binary.BigEndian.Uint16(b.bufs[0][22:]); got != 9443 {
		t.Errorf("new flow goes to port %d, want 9443", got)
	}

	// A new member takes the VIP's address: node addresses win, so the
	// service moves; the engine drains the old listener.
	u.mu.Lock()
	u.nodes = append(u.nodes, NodeInfo{ID: NodeID{1}, Name: "squatter", Addr: u.svc.Addr})
	u.mu.Unlock()
	u.reg.Refresh()
	if err := u.e.Apply(); err != nil {
		t.Fatal(err)
	}
	v, _ := u.reg.Get("api")
	if !v.AddrMoved || v.Addr == u.svc.Addr {
		t.Fatalf("VIP did not move: %v (moved %v)", v.Addr, v.AddrMoved)
	}
	st := u.e.Status()
	if len(st.Draining) != 1 || st.Draining[0].VIP != u.svc.Addr || st.Draining[0].Active != 2 || st.Draining[0].Next != nil {
		t.Fatalf("draining %+v, want the old VIP with its 2 bindings", st.Draining)
	}
	if l := st.Services[0].Listeners[0]; l.VIP != v.Addr || !l.Routed || l.Next == nil {
		t.Fatalf("listener at the new address: %+v", l)
	}
	if u.hostBatch(b, ipv4Packet(6, client, oldVIP, tcpACK, []byte("still"))) != 1 {
		t.Error("existing binding stopped when the VIP moved")
	}
	// A new flow to the old address is the squatter's: it passes
	// untouched (TestEngineMovedVIPReachesNewOwner).
	if u.hostBatch(b, ipv4Packet(6, netip.AddrPortFrom(u.self.Addr, 40002), oldVIP, tcpSYN, nil)) != 1 || netip.AddrFrom4([4]byte(b.bufs[0][16:20])) != u.svc.Addr {
		t.Error("a new flow to the old VIP address did not pass to its new owner")
	}
	if u.hostBatch(b, ipv4Packet(6, netip.AddrPortFrom(u.self.Addr, 40002), netip.AddrPortFrom(v.Addr, 443), tcpSYN, nil)) != 1 {
		t.Error("a new flow to the new VIP address was refused")
	}
	// A backend whose node has no overlay address is reported, not routed.
	u.mu.Lock()
	u.nodes = append(u.nodes, NodeInfo{ID: NodeID{2}, Name: "noaddr"})
	u.mu.Unlock()
	if _, err := u.reg.BackendAdd(ctx, "api", k, Backend{NodeID{2}, 7000}); err != nil {
		t.Fatal(err)
	}
	l := u.e.Status().Services[0].Listeners[0]
	var reasons []string
	for _, b := range l.Backends {
		reasons = append(reasons, b.Reason)
	}
	if len(l.Backends) != 2 || reasons[1] != "unknown-node" {
		t.Errorf("backend reasons %v, want the address-less node reported as unknown-node", reasons)
	}
}

// Property: after any sequence of configuration changes, the NAT's
// listeners are exactly the listeners of the routable services (with their
// effective VIP addresses and the backends whose nodes have an address),
// and every listener that went away is removed (draining) or gone.
func TestEngineApplyMatchesModel(t *testing.T) {
	checkLeaks(t)
	seed := testenv.Seed(t, 5)
	u := newUnitEngine(t, seed)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 77))
	members := []NodeID{u.self.ID, u.peer.ID}
	names := []string{"api", "web", "db"}
	seen := map[flow.Listener]bool{}
	for step := range 150 {
		name := names[rng.IntN(len(names))]
		k := PortKey{[]Proto{TCP, UDP}[rng.IntN(2)], uint16(1 + rng.IntN(4))}
		be := Backend{members[rng.IntN(2)], uint16(8000 + rng.IntN(3))}
		var err error
		switch op := rng.IntN(6); op {
		case 0:
			_, err = u.reg.Create(ctx, name)
		case 1:
			_, err = u.reg.PortAdd(ctx, name, k, []Backend{be})
		case 2:
			_, err = u.reg.BackendAdd(ctx, name, k, be)
		case 3:
			_, err = u.reg.BackendRemove(ctx, name, k, be)
		case 4:
			_, err = u.reg.PortRemove(ctx, name, k)
		case 5:
			if rng.IntN(4) == 0 {
				err = u.reg.Remove(ctx, name, "")
			}
		}
		if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrExists) {
			t.Fatalf("step %d: %v", step, err)
		}
		// The model: routable services' listeners.
		want := map[flow.Listener]int{}
		for _, v := range u.reg.List() {
			if !v.Routable {
				continue
			}
			for _, l := range v.Listeners {
				want[flow.Listener{VIP: v.Addr, Proto: flow.Proto(l.Proto), Port: l.Port}] = len(l.Backends)
			}
		}
		for fl, n := range want {
			seen[fl] = true
			ls, ok := u.e.NAT().ListenerStats(fl)
			if !ok || ls.Removed || ls.Backends != n {
				t.Fatalf("step %d (seed %d): listener %v: NAT has %+v (present %v), model %d backends", step, seed, fl, ls, ok, n)
			}
		}
		for fl := range seen {
			if _, ok := want[fl]; ok {
				continue
			}
			if ls, ok := u.e.NAT().ListenerStats(fl); ok && !ls.Removed {
				t.Fatalf("step %d (seed %d): listener %v is still routed after it went away", step, seed, fl)
			}
		}
	}
	if len(seen) == 0 {
		t.Fatal("the walk never routed a listener")
	}
}

// On the manual clock: a UDP binding stays with its backend while that is
// eligible, even when a better one appears; when the backend's probes
// expire (two missing), the engine's path tick tells the NAT, and the next
// datagram fails over (here to the local backend, by hairpin).
func TestEngineUDPFailoverOnProbeTimeout(t *testing.T) {
	checkLeaks(t)
	u := newUnitEngine(t, testenv.Seed(t, 6))
	ctx := context.Background()
	k := PortKey{UDP, 53}
	if _, err := u.reg.PortAdd(ctx, "api", k, []Backend{{u.peer.ID, 5353}}); err != nil {
		t.Fatal(err)
	}
	var toHost [][]byte
	u.host.onWrite = func(p []byte) { toHost = append(toHost, append([]byte(nil), p...)) }
	client := netip.AddrPortFrom(u.self.Addr, 40000)
	vip := netip.AddrPortFrom(u.svc.Addr, 53)
	dgram := ipv4Packet(17, client, vip, 0, []byte("q"))
	b := newBatch(1, 2048)
	if u.hostBatch(b, dgram) != 1 || netip.AddrFrom4([4]byte(b.bufs[0][16:20])) != u.peer.Addr {
		t.Fatal("first datagram not sent to the peer")
	}
	if _, err := u.reg.BackendAdd(ctx, "api", k, Backend{u.self.ID, 5353}); err != nil {
		t.Fatal(err)
	}
	if u.hostBatch(b, dgram) != 1 {
		t.Fatal("the binding moved while its backend is eligible")
	}
	// No probe is ever answered: after two expire the peer is excluded.
	u.clock.Advance(5 * time.Second)
	l, _ := listenerOf1(u.e, "api", "udp/53")
	if r := backendOf1(l, u.peer.ID).Reason; r != "probe-timeout" {
		t.Fatalf("peer reason %q, want probe-timeout", r)
	}
	toHost = nil
	if n := u.hostBatch(b, dgram); n != 0 || len(toHost) != 1 {
		t.Fatalf("after the peer died: %d packets to the overlay, %d to the host; want the hairpin", n, len(toHost))
	}
	if src := netip.AddrFrom4([4]byte(toHost[0][12:16])); src != u.svc.Addr {
		t.Errorf("the local backend sees source %v, want the VIP", src)
	}
	l, _ = listenerOf1(u.e, "api", "udp/53")
	if l.Failovers != 1 || l.Active != 1 {
		t.Errorf("failovers %d, active %d; want 1 and 1", l.Failovers, l.Active)
	}
}

func listenerOf1(e *Engine, name, key string) (ListenerStatus, bool) {
	for _, s := range e.Status().Services {
		if s.Name != name {
			continue
		}
		for _, l := range s.Listeners {
			if l.Listener == key {
				return l, true
			}
		}
	}
	return ListenerStatus{}, false
}

func backendOf1(l ListenerStatus, id NodeID) BackendStatus {
	for _, b := range l.Backends {
		if b.Node == id {
			return b
		}
	}
	return BackendStatus{}
}

// The caller's data-path input excludes a peer at the next path tick
// (no-path), and the peer returns when the path does; probes go out through
// Read, and a packet larger than wireguard-go's buffer is dropped and
// counted, never truncated.
func TestEnginePathInputAndReadLimits(t *testing.T) {
	checkLeaks(t)
	var up atomic.Bool
	up.Store(true)
	u := newUnitEngineWith(t, testenv.Seed(t, 7), func(o *EngineOptions) {
		o.PathUp = func(NodeID) bool { return up.Load() }
	})
	reason := func() string {
		l, _ := listenerOf1(u.e, "api", "tcp/443")
		return backendOf1(l, u.peer.ID).Reason
	}
	if r := reason(); r != "rtt-unknown" {
		t.Fatalf("peer reason %q before any probe, want rtt-unknown", r)
	}
	up.Store(false)
	u.clock.Advance(time.Second)
	if r := reason(); r != "no-path" {
		t.Fatalf("peer reason %q with the path down, want no-path", r)
	}
	if n := u.e.Status().Services[0].Listeners[0].Next; n != nil {
		t.Errorf("next = %+v with the only backend's path down", n)
	}
	up.Store(true)
	u.clock.Advance(time.Second)
	if r := reason(); r == "no-path" {
		t.Fatal("peer still no-path after the path returned")
	}
	// The prober's requests wait in Read; a buffer too small drops them.
	small := [][]byte{make([]byte, probe.PacketLen-1)}
	big := [][]byte{make([]byte, 2048)}
	sizes := []int{0}
	done := make(chan int, 1)
	go func() {
		n, _ := u.e.Read(big, sizes, 0)
		done <- n
	}()
	if n := <-done; n != 1 || !probe.IsProbePacket(big[0][:sizes[0]], probe.DefaultPort) {
		t.Fatalf("Read gave %d packets, want a probe", n)
	}
	u.clock.Advance(time.Second) // the next probe
	go func() {
		_, _ = u.e.Read(small, sizes, 0) // drops the probe, then waits
		done <- 0
	}()
	deadline := time.Now().Add(10 * time.Second)
	for u.e.Status().Drops["too-big"] == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a packet too big for the buffer was not counted")
		}
		time.Sleep(time.Millisecond) // polling interval
	}
	u.e.Close()
	<-done
}
