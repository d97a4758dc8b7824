package flow

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/packet"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// P describes a test packet; Build makes it with correct checksums.
type P struct {
	Src, Dst     netip.Addr
	Proto        Proto
	Sport, Dport uint16
	Flags        uint8
	Seq, Ack     uint32
	Payload      []byte
	ID           uint16
	DF           bool
	TTL          uint8
	NoUDPCsum    bool
	Options      []byte // IP options, padded to 4 by Build
	ICMPType     uint8
	ICMPCode     uint8
	ICMPRest     uint32
}

func (p P) Build() []byte {
	opts := append([]byte(nil), p.Options...)
	for len(opts)%4 != 0 {
		opts = append(opts, 0)
	}
	hl := packet.IPv4MinHeaderLen + len(opts)
	var l4 []byte
	switch p.Proto {
	case ProtoTCP:
		l4 = make([]byte, packet.TCPMinHeaderLen+len(p.Payload))
		binary.BigEndian.PutUint16(l4[0:], p.Sport)
		binary.BigEndian.PutUint16(l4[2:], p.Dport)
		binary.BigEndian.PutUint32(l4[4:], p.Seq)
		binary.BigEndian.PutUint32(l4[8:], p.Ack)
		l4[12] = 5 << 4
		l4[13] = p.Flags
		binary.BigEndian.PutUint16(l4[14:], 65535)
		copy(l4[20:], p.Payload)
	case ProtoUDP:
		l4 = make([]byte, packet.UDPHeaderLen+len(p.Payload))
		binary.BigEndian.PutUint16(l4[0:], p.Sport)
		binary.BigEndian.PutUint16(l4[2:], p.Dport)
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
		copy(l4[8:], p.Payload)
	case ProtoICMP:
		l4 = make([]byte, packet.ICMPv4HeaderLen+len(p.Payload))
		l4[0], l4[1] = p.ICMPType, p.ICMPCode
		binary.BigEndian.PutUint32(l4[4:], p.ICMPRest)
		copy(l4[8:], p.Payload)
	default:
		l4 = append([]byte(nil), p.Payload...)
	}
	pkt := make([]byte, hl+len(l4))
	pkt[0] = 0x40 | byte(hl/4)
	binary.BigEndian.PutUint16(pkt[2:], uint16(len(pkt)))
	binary.BigEndian.PutUint16(pkt[4:], p.ID)
	if p.DF {
		binary.BigEndian.PutUint16(pkt[6:], packet.IPv4FlagDF)
	}
	pkt[8] = p.TTL
	if pkt[8] == 0 {
		pkt[8] = 64
	}
	pkt[9] = byte(p.Proto)
	s4, d4 := p.Src.As4(), p.Dst.As4()
	copy(pkt[12:], s4[:])
	copy(pkt[16:], d4[:])
	copy(pkt[20:], opts)
	copy(pkt[hl:], l4)
	packet.IPv4(pkt).UpdateChecksum()
	fixL4(pkt, p.NoUDPCsum)
	return pkt
}

// fixL4 recomputes the L4 checksum of a whole packet.
func fixL4(pkt []byte, noUDP bool) {
	hl := packet.IPv4(pkt).HeaderLen()
	l4 := pkt[hl:]
	var s, d [4]byte
	copy(s[:], pkt[12:16])
	copy(d[:], pkt[16:20])
	switch Proto(pkt[9]) {
	case ProtoTCP:
		binary.BigEndian.PutUint16(l4[16:], 0)
		binary.BigEndian.PutUint16(l4[16:], packet.Checksum(l4, packet.PseudoHeaderSum(s, d, ProtoTCP, len(l4))))
	case ProtoUDP:
		binary.BigEndian.PutUint16(l4[6:], 0)
		if noUDP {
			return
		}
		c := packet.Checksum(l4, packet.PseudoHeaderSum(s, d, ProtoUDP, len(l4)))
		if c == 0 {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(l4[6:], c)
	case ProtoICMP:
		binary.BigEndian.PutUint16(l4[2:], 0)
		binary.BigEndian.PutUint16(l4[2:], packet.Checksum(l4, 0))
	}
}

// requireSums checks that the IPv4 header checksum and the L4 checksum of a
// whole packet equal a full recompute.
func requireSums(t testing.TB, pkt []byte) {
	t.Helper()
	cp := append([]byte(nil), pkt...)
	packet.IPv4(cp).UpdateChecksum()
	if want, got := packet.IPv4(cp).Checksum(), packet.IPv4(pkt).Checksum(); got != want {
		t.Fatalf("IPv4 header checksum: packet.IPv4(pkt).Checksum() = %v, want %v", got, want)
	}
	if packet.IPv4(pkt).IsFragment() {
		return
	}
	hl := packet.IPv4(pkt).HeaderLen()
	noUDP := Proto(pkt[9]) == ProtoUDP && binary.BigEndian.Uint16(pkt[hl+6:]) == 0
	fixL4(cp, noUDP)
	if want, got := cp[hl:], pkt[hl:]; !bytes.Equal(got, want) {
		t.Fatalf("L4 header and checksum: pkt[hl:] = %v, want %v", got, want)
	}
}

var (
	localAddr = netip.MustParseAddr("100.64.0.1")
	clientAlt = netip.MustParseAddr("100.64.0.99")
	vipAddr   = netip.MustParseAddr("100.100.0.10")
	vip2Addr  = netip.MustParseAddr("100.100.0.11")
	be1       = Backend{Peer: 2, Addr: netip.MustParseAddr("100.64.0.2"), Port: 6443}
	be2       = Backend{Peer: 3, Addr: netip.MustParseAddr("100.64.0.3"), Port: 7443}
	beLocal   = Backend{Peer: LocalPeer, Addr: localAddr, Port: 8443}
	lTCP      = Listener{VIP: vipAddr, Proto: ProtoTCP, Port: 443}
	lUDP      = Listener{VIP: vipAddr, Proto: ProtoUDP, Port: 53}
)

// testSel picks backends by a function (default: the first candidate) and
// reports availability from a set of down backends.
type testSel struct {
	// pick is set by the test's goroutine, between packets.
	pick func(req SelectRequest) int

	mu sync.Mutex
	// +checklocks:mu
	down map[Backend]bool
	// +checklocks:mu
	calls []SelectRequest
}

func (s *testSel) Select(req SelectRequest) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	req.Candidates = append([]Backend(nil), req.Candidates...)
	s.calls = append(s.calls, req)
	if s.pick != nil {
		return s.pick(req)
	}
	for i, c := range req.Candidates {
		if !s.down[c] {
			return i
		}
	}
	return -1
}

func (s *testSel) Available(_ Listener, b Backend, _ time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.down[b]
}

func (s *testSel) setDown(b Backend, down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down == nil {
		s.down = map[Backend]bool{}
	}
	s.down[b] = down
}

type emitted struct {
	dir Direction
	pkt []byte
}

type report struct {
	l Listener
	b Backend
}

type fixture struct {
	t       testing.TB
	clock   *transporttest.ManualClock
	nat     *NAT
	sel     *testSel
	res     *MemReserver
	out     []emitted
	reports []report
}

func newFixture(t testing.TB, mods ...func(*Options)) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: transporttest.NewManualClock(), sel: &testSel{}}
	f.res = NewMemReserver(MemReserverOptions{Seed: 7})
	o := Options{
		LocalAddr: localAddr,
		Selector:  f.sel,
		Reserver:  f.res,
		Clock:     f.clock,
		Emit: func(d Direction, p []byte) {
			f.out = append(f.out, emitted{d, append([]byte(nil), p...)})
		},
		OnPortUnreachable: func(l Listener, b Backend) { f.reports = append(f.reports, report{l, b}) },
	}
	for _, m := range mods {
		m(&o)
	}
	n, err := New(o)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { n.Close() })
	f.nat = n
	return f
}

func (f *fixture) host(p []byte) Result            { return f.nat.FromHost(p, f.clock.Now()) }
func (f *fixture) peer(id PeerID, p []byte) Result { return f.nat.FromPeer(p, id, f.clock.Now()) }

func (f *fixture) takeOut() []emitted {
	o := f.out
	f.out = nil
	return o
}

// syn builds a client SYN to the VIP.
func syn(sport uint16, seq uint32) []byte {
	return P{Src: localAddr, Dst: vipAddr, Proto: ProtoTCP, Sport: sport, Dport: 443, Flags: packet.TCPFlagSYN, Seq: seq}.Build()
}

func udpTo(sport uint16, payload string) []byte {
	return P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: sport, Dport: 53, Payload: []byte(payload)}.Build()
}

// replyTo builds the backend's reply to a translated client packet.
func replyTo(out []byte, flags uint8, payload string) []byte {
	ip := packet.IPv4(out)
	hl := ip.HeaderLen()
	p := P{Src: ip.Dst(), Dst: ip.Src(), Proto: ip.Protocol(), Payload: []byte(payload), Flags: flags}
	p.Sport = binary.BigEndian.Uint16(out[hl+2:])
	p.Dport = binary.BigEndian.Uint16(out[hl:])
	return p.Build()
}

func ports(pkt []byte) (uint16, uint16) {
	hl := packet.IPv4(pkt).HeaderLen()
	return binary.BigEndian.Uint16(pkt[hl:]), binary.BigEndian.Uint16(pkt[hl+2:])
}

func netipFrom(b [4]byte) netip.Addr { return netip.AddrFrom4(b) }
