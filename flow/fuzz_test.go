package flow

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vipkit/vipkit/internal/testenv"
)

// seedPackets are the unit tables' packets, used as fuzz corpus seeds.
func seedPackets() [][]byte {
	good := udpTo(5000, "payload")
	s := syn(40000, 1)
	frags := fragment(bigUDP(5000, 3000, 1), 1200)
	icmp := P{Src: be1.Addr, Dst: localAddr, Proto: ProtoICMP, ICMPType: ICMPDestUnreachable, ICMPCode: 3, Payload: s}.Build()
	bad := append([]byte(nil), good...)
	bad[10] ^= 1
	opts := P{Src: localAddr, Dst: vipAddr, Proto: ProtoUDP, Sport: 1, Dport: 53, Options: []byte{0x94, 4, 0, 0}}.Build()
	return [][]byte{
		good, s, icmp, bad, opts, frags[0], frags[1], frags[2], good[:10], {0x45}, {0x60, 0, 0, 0},
		P{Src: be1.Addr, Dst: localAddr, Proto: ProtoUDP, Sport: be1.Port, Dport: 33000, Payload: []byte("x")}.Build(),
		P{Src: localAddr, Dst: vipAddr, Proto: ProtoICMP, ICMPType: ICMPEchoRequest}.Build(),
	}
}

func FuzzIPv4(f *testing.F) {
	for _, p := range seedPackets() {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ip := IPv4(b)
		if ip.Validate() != nil {
			return
		}
		require.LessOrEqual(t, ip.HeaderLen(), len(b))
		require.Equal(t, len(b), ip.TotalLen())
		_ = ip.Payload()
		_, _, _, _, _ = ip.Src(), ip.Dst(), ip.ID(), ip.FragOffset(), ip.Protocol()
		// A valid header's checksum verifies, and recomputing changes nothing.
		cp := append([]byte(nil), b...)
		IPv4(cp).UpdateChecksum()
		require.Equal(t, ip.Checksum(), IPv4(cp).Checksum())
	})
}

func FuzzTCP(f *testing.F) {
	f.Add(syn(1, 2)[20:])
	f.Add([]byte{0, 1, 0, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		h := TCP(b)
		if h.Validate() != nil {
			return
		}
		require.LessOrEqual(t, h.HeaderLen(), len(b))
		_ = h.Payload()
		_, _, _, _, _ = h.SrcPort(), h.DstPort(), h.Seq(), h.Ack(), h.Flags()
	})
}

func FuzzUDP(f *testing.F) {
	f.Add(udpTo(1, "x")[20:])
	f.Add([]byte{0, 1, 0, 2, 0, 200, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h := UDP(b)
		if h.Validate() != nil {
			return
		}
		require.LessOrEqual(t, h.Length(), len(b))
		_ = h.Payload()
	})
}

func FuzzICMPv4(f *testing.F) {
	f.Add(P{Src: be1.Addr, Dst: localAddr, Proto: ProtoICMP, ICMPType: 3, ICMPCode: 4, ICMPRest: 1400, Payload: syn(1, 1)}.Build()[20:])
	f.Fuzz(func(t *testing.T, b []byte) {
		h := ICMPv4(b)
		if h.Validate() != nil {
			return
		}
		_, _, _, _ = h.Type(), h.Code(), h.MTU(), h.IsError()
		_ = h.Quoted()
	})
}

// FuzzChecksumIncremental checks RFC 1624 updates against a full recompute
// for arbitrary data and arbitrary 32-bit and 16-bit rewrites.
func FuzzChecksumIncremental(f *testing.F) {
	f.Add([]byte("0123456789abcdef"), uint32(0xc0a80001), uint16(443), uint8(4))
	f.Add([]byte{0xff, 0xff, 0, 0, 0xff, 0xff}, uint32(0), uint16(0), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, v32 uint32, v16 uint16, at uint8) {
		if len(data) < 8 {
			return
		}
		buf := append([]byte{0, 0}, data...) // checksum field at 0
		binary.BigEndian.PutUint16(buf, Checksum(buf, 0))
		off := 2 + 2*(int(at)%((len(data)-4)/2+1))
		if off+4 > len(buf) {
			return
		}
		old32 := binary.BigEndian.Uint32(buf[off:])
		binary.BigEndian.PutUint32(buf[off:], v32)
		adjust(buf, delta32(old32, v32))
		want := append([]byte(nil), buf...)
		binary.BigEndian.PutUint16(want, 0)
		binary.BigEndian.PutUint16(want, Checksum(want, 0))
		// Equal as one's-complement values (the only ambiguity is ±0, which
		// RFC 1624 eqn. 3 avoids for nonzero data).
		require.Equal(t, binary.BigEndian.Uint16(want), binary.BigEndian.Uint16(buf))
		// A 16-bit rewrite too.
		o := binary.BigEndian.Uint16(buf[off+2:])
		binary.BigEndian.PutUint16(buf[off+2:], v16)
		adjust(buf, delta16(o, v16))
		binary.BigEndian.PutUint16(want[off+2:], v16)
		binary.BigEndian.PutUint16(want, 0)
		binary.BigEndian.PutUint16(want, Checksum(want, 0))
		require.Equal(t, binary.BigEndian.Uint16(want), binary.BigEndian.Uint16(buf))
	})
}

// fuzzNAT builds a NAT with a TCP, a UDP and a hairpin listener and small
// bounds, so that fuzzing reaches the limits.
func fuzzNAT(t testing.TB) *fixture {
	f := newFixture(t, func(o *Options) {
		o.Capacity = 16
		o.MaxFragDatagrams = 4
		o.MaxFragBytes = 8000
		o.MTU = 600
		o.Emit = func(d Direction, p []byte) {
			if len(p) > 65535 {
				panic("emitted packet too big")
			}
		}
	})
	setTCP(t, f, be1, be2)
	setUDP(t, f, be1)
	require.NoError(t, f.nat.SetListener(Listener{VIP: vip2Addr, Proto: ProtoUDP, Port: 80}, ListenerConfig{Backends: []Backend{beLocal}}))
	return f
}

func checkBounds(t testing.TB, f *fixture) {
	st := f.nat.Stats()
	require.LessOrEqual(t, st.Active+st.Quarantined, st.Capacity)
	require.LessOrEqual(t, st.FragPending, 4)
	require.LessOrEqual(t, st.FragBytes, 8000)
	require.GreaterOrEqual(t, st.FragBytes, 0)
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
		require.Len(t, b, n)
		if r.Verdict == Drop {
			require.NotEqual(t, ReasonNone, r.Reason)
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
			require.NotNil(t, e)
			require.Equal(t, id, e.id())
			require.Equal(t, dirRev, e.dir())
			// The values move with their key when deletion shifts entries.
			require.Equal(t, uint64(id)*3, e.v0)
			require.Equal(t, ^uint64(id), e.v1)
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
				require.Equal(t, !exists, x.insert(k, id, dirRev, uint64(id)*3, ^uint64(id)), "run %d step %d", run, step)
				if !exists {
					model[k] = id
				}
			case 1:
				_, exists := model[k]
				require.Equal(t, exists, x.remove(k))
				delete(model, k)
			default:
				want, exists := model[k]
				if exists {
					check(k, want)
				} else {
					require.Nil(t, x.find(k))
				}
			}
			require.Equal(t, len(model), x.n)
		}
		for k, id := range model {
			check(k, id)
		}
	}
}
