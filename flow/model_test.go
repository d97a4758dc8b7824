package flow

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/packet"
)

// modelSel is a deterministic selector shared by the NAT and the model: the
// first (or, with second set, the second) candidate that is not down.
type modelSel struct {
	down   map[Backend]bool
	second bool
}

func (s *modelSel) pick(cands []Backend) int {
	seen := 0
	first := -1
	for i, c := range cands {
		if s.down[c] {
			continue
		}
		if first < 0 {
			first = i
		}
		seen++
		if s.second && seen == 2 {
			return i
		}
	}
	return first
}

func (s *modelSel) Select(req SelectRequest) int { return s.pick(req.Candidates) }
func (s *modelSel) Available(_ Listener, b Backend, _ time.Time) bool {
	return !s.down[b]
}

type mBinding struct {
	proto         Proto
	cport         uint16
	backend       Backend
	shadow        uint16
	quarantined   bool
	deadline      time.Time
	idle          time.Duration
	isn           uint32
	synAck        bool
	synData       bool
	finOut, finIn bool
	gen           int
}

type mListener struct {
	l       Listener
	removed bool
	cands   []Backend
	idle    time.Duration
}

type model struct {
	cap       int
	bs        []*mBinding
	lis       map[Proto]*mListener
	sel       *modelSel
	gen       int
	refused   int
	retargets int
	failovers int
}

const (
	mQuarantine = DefaultQuarantine
	mClosed     = DefaultTCPClosedTimeout
	mFin        = DefaultTCPFinTimeout
)

func (m *model) expire(now time.Time) {
	keep := m.bs[:0]
	for _, b := range m.bs {
		if !b.quarantined && !now.Before(b.deadline) {
			b.quarantined = true
			b.deadline = b.deadline.Add(mQuarantine)
		}
		if b.quarantined && !now.Before(b.deadline) {
			continue
		}
		keep = append(keep, b)
	}
	m.bs = keep
}

func (m *model) active(proto Proto, cport uint16) *mBinding {
	for _, b := range m.bs {
		if !b.quarantined && b.proto == proto && b.cport == cport {
			return b
		}
	}
	return nil
}

func (m *model) retire(b *mBinding, now time.Time) {
	b.quarantined = true
	b.deadline = now.Add(mQuarantine)
}

func (m *model) selectFor(ls *mListener) int {
	if ls.removed || len(ls.cands) == 0 {
		return -1
	}
	return m.sel.pick(ls.cands)
}

// want is the model's prediction for one packet.
type want struct {
	res     Result
	backend Backend // for Forward from the host
	newB    *mBinding
}

func (m *model) hostPacket(proto Proto, cport uint16, flags uint8, seq uint32, data bool, now time.Time) want {
	m.expire(now)
	b := m.active(proto, cport)
	if b != nil && proto == ProtoTCP && flags&(packet.TCPFlagSYN|packet.TCPFlagACK|packet.TCPFlagRST) == packet.TCPFlagSYN {
		if seq != b.isn {
			m.retire(b, now)
			b = nil
		} else if !b.synAck && !b.synData && !data {
			ls := m.lis[proto]
			if i := m.selectFor(ls); i >= 0 && ls.cands[i] != b.backend {
				if len(m.bs) < m.cap {
					m.retire(b, now)
					nb := m.create(ls, ls.cands[i], cport, seq, false, now)
					m.retargets++
					b = nb
				} else {
					m.refused++
				}
			}
		}
	}
	if b != nil && proto == ProtoUDP && b.gen != m.gen {
		b.gen = m.gen
		if m.sel.down[b.backend] {
			ls := m.lis[proto]
			if i := m.selectFor(ls); i >= 0 && ls.cands[i] != b.backend {
				if len(m.bs) < m.cap {
					m.retire(b, now)
					b = m.create(ls, ls.cands[i], cport, 0, false, now)
					m.failovers++
				} else {
					m.refused++
				}
			}
		}
	}
	if b == nil {
		ls := m.lis[proto]
		if ls == nil || ls.removed {
			if m.lis[ProtoTCP].removed && m.lis[ProtoUDP].removed {
				// The VIP only drains, or is gone: new flows pass.
				return want{}
			}
			return want{res: Result{Verdict: Drop, Reason: ReasonNoListener}}
		}
		if proto == ProtoTCP && flags&(packet.TCPFlagSYN|packet.TCPFlagACK|packet.TCPFlagRST) != packet.TCPFlagSYN {
			return want{res: Result{Verdict: Drop, Reason: ReasonNoFlow}}
		}
		i := m.selectFor(ls)
		if i < 0 {
			return want{res: Result{Verdict: Drop, Reason: ReasonNoBackend}}
		}
		if len(m.bs) >= m.cap {
			m.refused++
			return want{res: Result{Verdict: Drop, Reason: ReasonCapacity}}
		}
		b = m.create(ls, ls.cands[i], cport, seq, data, now)
	}
	if proto == ProtoTCP {
		m.flags(b, flags, true)
	}
	b.deadline = now.Add(b.idle)
	return want{res: Result{Verdict: Forward, Peer: b.backend.Peer}, backend: b.backend, newB: b}
}

func (m *model) flags(b *mBinding, fl uint8, out bool) {
	if fl&packet.TCPFlagRST != 0 {
		b.idle = min(b.idle, mClosed)
		return
	}
	if fl&packet.TCPFlagFIN != 0 {
		if out {
			b.finOut = true
		} else {
			b.finIn = true
		}
		if b.finOut && b.finIn {
			b.idle = min(b.idle, mFin)
		}
	}
	if !out && fl&(packet.TCPFlagSYN|packet.TCPFlagACK) == packet.TCPFlagSYN|packet.TCPFlagACK {
		b.synAck = true
	}
}

func (m *model) create(ls *mListener, be Backend, cport uint16, isn uint32, data bool, now time.Time) *mBinding {
	b := &mBinding{proto: ls.l.Proto, cport: cport, backend: be, idle: ls.idle, isn: isn, synData: data, gen: m.gen, shadow: 0}
	m.bs = append(m.bs, b)
	return b
}

func (m *model) peerPacket(b *mBinding, peer PeerID, flags uint8, now time.Time) Result {
	m.expire(now)
	if !slices.Contains(m.bs, b) {
		return Result{}
	}
	if b.quarantined {
		return Result{Verdict: Drop, Reason: ReasonQuarantined}
	}
	if peer != b.backend.Peer {
		return Result{Verdict: Drop, Reason: ReasonPeerMismatch}
	}
	if b.proto == ProtoTCP {
		m.flags(b, flags, false)
	}
	b.deadline = now.Add(b.idle)
	return Result{Verdict: Forward}
}

func TestModel(t *testing.T) {
	seed := testenv.Seed(t, 1)
	runs, steps := 40, 400
	if testenv.Long() {
		runs, steps = 400, 2000
	}
	seen := map[string]int{}
	for run := range runs {
		t.Run(fmt.Sprint(run), func(t *testing.T) { modelRun(t, seed+uint64(run), steps, seen) })
	}
	// The random walk must reach every interesting outcome, or it proves little.
	for _, k := range []string{"forward", "peer/forward", "drop/capacity", "drop/no-flow", "drop/no-listener",
		"drop/no-backend", "peer/drop/quarantined", "peer/drop/peer-mismatch", "retarget", "failover", "peer/pass"} {
		if seen[k] <= 0 {
			t.Fatalf("outcome %q never happened: %v: seen[k] = %v, want > 0", k, seen, seen[k])
		}
	}
}

func modelRun(t *testing.T, seed uint64, steps int, seen map[string]int) {
	rng := rand.New(rand.NewPCG(seed, 99))
	clock := newFixture(t).clock // a fresh manual clock (the fixture's NAT is unused)
	sel := &modelSel{down: map[Backend]bool{}}
	capacity := 3 + rng.IntN(8)
	n, err := New(Options{
		LocalAddr: localAddr, Selector: sel, Clock: clock, Capacity: capacity,
		Reserver: NewMemReserver(MemReserverOptions{Seed: seed}),
	})
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer n.Close()
	m := &model{cap: capacity, lis: map[Proto]*mListener{}, sel: sel}
	cands := []Backend{be1, be2}
	idles := map[Proto]time.Duration{ProtoTCP: 100 * time.Second, ProtoUDP: 30 * time.Second}
	setL := func(p Proto) {
		l := lTCP
		if p == ProtoUDP {
			l = lUDP
		}
		if err := n.SetListener(l, ListenerConfig{Backends: cands, IdleTimeout: idles[p]}); err != nil {
			t.Fatalf("n.SetListener(l, ListenerConfig{Backends: cands, IdleTimeout: idles[p]}): %v", err)
		}
		if ml := m.lis[p]; ml != nil {
			ml.removed, ml.cands, ml.idle = false, slices.Clone(cands), idles[p]
		} else {
			m.lis[p] = &mListener{l: l, cands: slices.Clone(cands), idle: idles[p]}
		}
	}
	setL(ProtoTCP)
	setL(ProtoUDP)
	shadows := map[*mBinding]uint16{}

	for step := range steps {
		now := clock.Now()
		ctx := fmt.Sprintf("seed %d step %d", seed, step)
		switch op := rng.IntN(100); {
		case op < 40: // host packet
			proto := ProtoUDP
			if rng.IntN(2) == 0 {
				proto = ProtoTCP
			}
			cport := uint16(1000 + rng.IntN(6))
			var flags uint8
			var seq uint32
			var payload []byte
			if proto == ProtoTCP {
				flags = []uint8{packet.TCPFlagSYN, packet.TCPFlagSYN, packet.TCPFlagACK, packet.TCPFlagACK | packet.TCPFlagFIN, packet.TCPFlagRST}[rng.IntN(5)]
				seq = uint32(100 * (1 + rng.IntN(2)))
				if rng.IntN(4) == 0 {
					payload = []byte("data")
				}
			}
			pkt := P{Src: localAddr, Dst: vipAddr, Proto: proto, Sport: cport, Dport: map[Proto]uint16{ProtoTCP: 443, ProtoUDP: 53}[proto],
				Flags: flags, Seq: seq, Payload: payload}.Build()
			w := m.hostPacket(proto, cport, flags, seq, len(payload) > 0, now)
			got := n.FromHost(pkt, now)
			if got != w.res {
				t.Fatalf("%v: got = %v, want %v", ctx, got, w.res)
			}
			seen[outcome("", got)]++
			if got.Verdict == Forward {
				if got := packet.IPv4(pkt).Dst(); got != w.backend.Addr {
					t.Fatalf("%v: packet.IPv4(pkt).Dst() = %v, want %v", ctx, got, w.backend.Addr)
				}
				sp, dp := ports(pkt)
				if dp != w.backend.Port {
					t.Fatalf("%v: dp = %v, want %v", ctx, dp, w.backend.Port)
				}
				if s, ok := shadows[w.newB]; ok {
					if sp != s {
						t.Fatalf("%v: sp = %v, want %v", ctx, sp, s)
					}
				} else {
					shadows[w.newB] = sp
					w.newB.shadow = sp
				}
				requireSums(t, pkt)
			}
		case op < 65: // a backend's reply
			if len(m.bs) == 0 {
				continue
			}
			b := m.bs[rng.IntN(len(m.bs))]
			peer := b.backend.Peer
			if rng.IntN(6) == 0 {
				peer = 9
			}
			var flags uint8
			if b.proto == ProtoTCP {
				flags = []uint8{packet.TCPFlagSYN | packet.TCPFlagACK, packet.TCPFlagACK, packet.TCPFlagACK | packet.TCPFlagFIN, packet.TCPFlagRST}[rng.IntN(4)]
			}
			lport := map[Proto]uint16{ProtoTCP: 443, ProtoUDP: 53}[b.proto]
			pkt := P{Src: b.backend.Addr, Dst: localAddr, Proto: b.proto, Sport: b.backend.Port, Dport: b.shadow, Flags: flags}.Build()
			want := m.peerPacket(b, peer, flags, now)
			got := n.FromPeer(pkt, peer, now)
			if got != want {
				t.Fatalf("%v: got = %v, want %v", ctx, got, want)
			}
			seen[outcome("peer/", got)]++
			if got.Verdict == Forward {
				sp, dp := ports(pkt)
				if got := packet.IPv4(pkt).Src(); got != vipAddr {
					t.Fatalf("%v: packet.IPv4(pkt).Src() = %v, want %v", ctx, got, vipAddr)
				}
				if sp != lport {
					t.Fatalf("%v: sp = %v, want %v", ctx, sp, lport)
				}
				if dp != b.cport {
					t.Fatalf("%v: dp = %v, want %v", ctx, dp, b.cport)
				}
				requireSums(t, pkt)
			}
		case op < 80: // time passes
			d := []time.Duration{500 * time.Millisecond, time.Second, 5 * time.Second, 29 * time.Second, 31 * time.Second, 100 * time.Second, 130 * time.Second}[rng.IntN(7)]
			clock.Advance(d)
		case op < 85: // health changes
			be := cands[rng.IntN(2)]
			sel.down[be] = !sel.down[be]
			m.gen++
			n.HealthChanged()
		case op < 88:
			sel.second = !sel.second
		case op < 92: // removals
			p := []Proto{ProtoTCP, ProtoUDP}[rng.IntN(2)]
			ml := m.lis[p]
			if rng.IntN(2) == 0 {
				be := cands[rng.IntN(2)]
				had := !ml.removed && slices.Contains(ml.cands, be)
				if got := n.RemoveBackend(ml.l, be); got != had {
					t.Fatalf("%v: n.RemoveBackend(ml.l, be) = %v, want %v", ctx, got, had)
				}
				if had {
					ml.cands = slices.DeleteFunc(ml.cands, func(c Backend) bool { return c == be })
				}
			} else {
				if got := n.RemoveListener(ml.l); got != !ml.removed {
					t.Fatalf("%v: n.RemoveListener(ml.l) = %v, want %v", ctx, got, !ml.removed)
				}
				ml.removed, ml.cands = true, nil
			}
		case op < 95:
			setL([]Proto{ProtoTCP, ProtoUDP}[rng.IntN(2)])
		default: // compare the whole table
			n.Expire(now)
			m.expire(now)
			compareModel(t, ctx, n, m)
		}
	}
	n.Expire(clock.Now())
	m.expire(clock.Now())
	compareModel(t, "end", n, m)
	st := n.Stats()
	seen["retarget"] += m.retargets
	seen["failover"] += m.failovers
	if st.Refused != uint64(m.refused) {
		t.Fatalf("st.Refused = %v, want %v", st.Refused, uint64(m.refused))
	}
	if st.Retargets != uint64(m.retargets) {
		t.Fatalf("st.Retargets = %v, want %v", st.Retargets, uint64(m.retargets))
	}
	if st.Failovers != uint64(m.failovers) {
		t.Fatalf("st.Failovers = %v, want %v", st.Failovers, uint64(m.failovers))
	}
}

func compareModel(t *testing.T, ctx string, n *NAT, m *model) {
	t.Helper()
	type row struct {
		proto   Proto
		cport   uint16
		backend Backend
		shadow  uint16
		state   BindingState
		expires time.Time
	}
	var want, got []row
	for _, b := range m.bs {
		st := Active
		if b.quarantined {
			st = Quarantined
		}
		want = append(want, row{b.proto, b.cport, b.backend, b.shadow, st, b.deadline})
	}
	for _, b := range n.Bindings() {
		got = append(got, row{b.Listener.Proto, b.Client.Port(), b.Backend, b.Shadow.Port(), b.State, b.Expires})
	}
	cmp := func(a, b row) int {
		if a.proto != b.proto {
			return int(a.proto) - int(b.proto)
		}
		if a.shadow != b.shadow {
			return int(a.shadow) - int(b.shadow)
		}
		return int(a.cport) - int(b.cport)
	}
	slices.SortFunc(want, cmp)
	slices.SortFunc(got, cmp)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%v: got = %v, want %v", ctx, got, want)
	}
}

func outcome(prefix string, r Result) string {
	if r.Verdict == Drop {
		return prefix + "drop/" + r.Reason.String()
	}
	return prefix + r.Verdict.String()
}
