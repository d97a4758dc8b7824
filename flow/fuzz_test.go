package flow

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/packet"
)

// seedPackets are the unit tables' packets, used as fuzz corpus seeds.
func seedPackets() [][]byte {
	good := udpTo(5000, "payload")
	s := syn(40000, 1)
	frags := fragment(bigUDP(5000, 3000, 1), 1200)
	icmp := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoICMP, ICMPType: packet.ICMPDestUnreachable, ICMPCode: 3, Payload: s}.Build()
	bad := append([]byte(nil), good...)
	bad[10] ^= 1
	opts := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 1, Dport: 53, Options: []byte{0x94, 4, 0, 0}}.Build()
	return [][]byte{
		good, s, icmp, bad, opts, frags[0], frags[1], frags[2], good[:10], {0x45}, {0x60, 0, 0, 0},
		P{Src: be1.Addr, Dst: localAddr, Proto: ProtoUDP, Sport: be1.Port, Dport: 33000, Payload: []byte("x")}.Build(),
		P{Src: localAddr, Dst: vipAddr, Proto: ProtoICMP, ICMPType: packet.ICMPEchoRequest}.Build(),
	}
}

// fuzzNAT builds a NAT with a TCP, a UDP and a hairpin listener and small
// bounds, so that fuzzing reaches the limits.
func fuzzNAT(t testing.TB) *fixture {
	var f *fixture
	f = newFixture(t, func(o *Options) {
		o.Capacity = 16
		o.MaxFragDatagrams = 4
		o.MaxFragBytes = 8000
		o.MTU = 600
		o.Emit = func(d Direction, p []byte) {
			if len(p) > 65535 {
				panic("emitted packet too big")
			}
			f.out = append(f.out[:0], emitted{d, append([]byte(nil), p...)})
		}
	})
	setTCP(t, f, be1, be2)
	setUDP(t, f, be1)
	if err := f.nat.SetListener(Listener{VIP: vip2Addr, Proto: ProtoUDP, Port: 80}, ListenerConfig{Backends: []Backend{beLocal}}); err != nil {
		t.Fatalf("f.nat.SetListener(Listener{VIP: vip2Addr, Proto: ProtoUDP, Port: 80}, ListenerConfig{Backends: []Backend{beLocal}}): %v", err)
	}
	return f
}

func checkBounds(t testing.TB, f *fixture) {
	st := f.nat.Stats()
	if st.Active+st.Quarantined > st.Capacity {
		t.Fatalf("st.Active+st.Quarantined = %v, want <= %v", st.Active+st.Quarantined, st.Capacity)
	}
	if st.FragPending > 4 {
		t.Fatalf("st.FragPending = %v, want <= %v", st.FragPending, 4)
	}
	if st.FragBytes > 8000 {
		t.Fatalf("st.FragBytes = %v, want <= %v", st.FragBytes, 8000)
	}
	if st.FragBytes < 0 {
		t.Fatalf("st.FragBytes = %v, want >= %v", st.FragBytes, 0)
	}
}

// FuzzFromHost feeds one arbitrary packet to the ingress path, then to the
// egress path as if a peer sent it.
func FuzzFromHost(f *testing.F) {
	for _, p := range seedPackets() {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fx := fuzzNAT(t)
		n := len(b)
		r := fx.host(b)
		if len(b) != n {
			t.Fatalf("len(b) = %d, want %d: %v", len(b), n, b)
		}
		if r.Verdict == Drop {
			if r.Reason == ReasonNone {
				t.Fatalf("r.Reason = %v, want anything else", r.Reason)
			}
		}
		if r.Reason == ReasonRefused || r.Reason == ReasonPortUnreachable {
			// A refusal is one well-formed packet from the VIP to the sender.
			out := fx.takeOut()
			if len(out) != 1 {
				t.Fatalf("len(out) = %d, want %d: %v", len(out), 1, out)
			}
			ip := packet.IPv4(out[0].pkt)
			if out[0].dir != ToHost {
				t.Fatalf("out[0].dir = %v, want %v", out[0].dir, ToHost)
			}
			if err := ip.Validate(); err != nil {
				t.Fatalf("ip.Validate(): %v", err)
			}
			requireSums(t, ip)
			if !fx.nat.IsVIP(ip.Src()) {
				t.Fatal("fx.nat.IsVIP(ip.Src()) is false")
			}
			if want, got := packet.IPv4(b).Src(), ip.Dst(); got != want {
				t.Fatalf("ip.Dst() = %v, want %v", got, want)
			}
		}
		fx.peer(be1.Peer, b)
		checkBounds(t, fx)
	})
}

// FuzzPath runs a sequence of packets through both paths with time passing:
// the input is split into length-prefixed packets; the first byte of each
// says who sends it and how long to wait first.
func FuzzPath(f *testing.F) {
	var seed []byte
	for _, p := range seedPackets() {
		seed = append(seed, byte(len(p)>>8), byte(len(p)), 0x00)
		seed = append(seed, p...)
	}
	f.Add(seed)
	f.Fuzz(func(t *testing.T, in []byte) {
		fx := fuzzNAT(t)
		var replies [][]byte
		for len(in) >= 3 {
			l := int(in[0])<<8 | int(in[1])
			ctl := in[2]
			in = in[3:]
			if l > len(in) {
				l = len(in)
			}
			pkt := append([]byte(nil), in[:l]...)
			in = in[l:]
			fx.clock.Advance(time.Duration(ctl>>4) * 10 * time.Second)
			switch ctl & 3 {
			case 0:
				if r := fx.host(pkt); r.Verdict == Forward {
					replies = append(replies, pkt)
				}
			case 1:
				fx.peer(PeerID(ctl>>2&3), pkt)
			case 2:
				// Answer a translated packet (exercises the reverse path with
				// arbitrary payload bytes).
				if len(replies) > 0 {
					rp := replies[len(replies)-1]
					if r := replyTo(rp, 0, string(pkt)); len(r) <= 65535 {
						fx.peer(be1.Peer, r)
					}
				}
			case 3:
				fx.nat.HealthChanged()
				fx.nat.RemoveBackend(lTCP, be1)
			}
			checkBounds(t, fx)
		}
	})
}

func TestIndexAgainstMap(t *testing.T) {
	seed := testenv.Seed(t, 5)
	rng := rand.New(rand.NewPCG(seed, 5))
	for run := range 20 {
		x := newIndex(8, rng.Uint64(), rng.Uint64()) // 16 entries: lots of collisions and wraparound
		model := map[tuple]uint32{}
		check := func(k tuple, id uint32) {
			e := x.find(k)
			if e == nil {
				t.Fatal("e is nil")
			}
			if got := e.id(); got != id {
				t.Fatalf("e.id() = %v, want %v", got, id)
			}
			if got := e.dir(); got != dirRev {
				t.Fatalf("e.dir() = %v, want %v", got, dirRev)
			}
			// The values move with their key when deletion shifts entries.
			if e.v0 != uint64(id)*3 {
				t.Fatalf("e.v0 = %v, want %v", e.v0, uint64(id)*3)
			}
			if e.v1 != ^uint64(id) {
				t.Fatalf("e.v1 = %v, want %v", e.v1, ^uint64(id))
			}
		}
		for step := range 2000 {
			k := mkTuple(uint32(rng.IntN(4)), uint32(rng.IntN(2)), uint16(rng.IntN(3)), 1, ProtoUDP)
			switch rng.IntN(3) {
			case 0:
				if len(model) >= 12 {
					continue
				}
				id := uint32(rng.IntN(idMask))
				_, exists := model[k]
				if got := x.insert(k, id, dirRev, uint64(id)*3, ^uint64(id)); got != !exists {
					t.Fatalf("run %d step %d: x.insert(k, id, dirRev, uint64(id)*3, ^uint64(id)) = %v, want %v", run, step, got, !exists)
				}
				if !exists {
					model[k] = id
				}
			case 1:
				_, exists := model[k]
				if got := x.remove(k); got != exists {
					t.Fatalf("x.remove(k) = %v, want %v", got, exists)
				}
				delete(model, k)
			default:
				want, exists := model[k]
				if exists {
					check(k, want)
				} else {
					if got := x.find(k); got != nil {
						t.Fatalf("x.find(k) = %v, want nil", got)
					}
				}
			}
			if x.n != len(model) {
				t.Fatalf("x.n = %v, want %v", x.n, len(model))
			}
		}
		for k, id := range model {
			check(k, id)
		}
	}
}
