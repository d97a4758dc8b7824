package probe

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
)

// BenchmarkSchedulerTick measures the scheduling cost of the worker tick
// with N shared checks (limit raised), 32 slots and the default 3 s
// interval, in steady state. One op is one 250 ms tick with everything it
// starts and completes:
//
//   - instant: every connect completes at once, so each check runs once
//     every 12 ticks (the scheduler's own cost per start dominates);
//   - timeout: every connect times out after 2 s, so the 32 slots are
//     always busy and the due queue stays long (the 10,000-check test's
//     load).
//
// ns/check-tick is the op's cost divided by N (the goal is ≤ 1 µs);
// ns/start divides it by the connects started. naive-scan is a scheduler
// that scans every check on each tick, for comparison.
func BenchmarkSchedulerTick(b *testing.B) {
	for _, mode := range []string{"instant", "timeout"} {
		for _, n := range []int{32, 1000, 10000} {
			b.Run(fmt.Sprintf("%s/checks=%d", mode, n), func(b *testing.B) {
				benchScheduler(b, n, mode == "timeout")
			})
		}
	}
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("naive-scan/instant/checks=%d", n), func(b *testing.B) {
			benchNaive(b, n)
		})
	}
}

// schedLoad is a Scheduler with n checks under the steady load of
// BenchmarkSchedulerTick; tick runs one worker tick and returns the number
// of connects it started.
func schedLoad(tb testing.TB, n int, timeouts bool) (tick func() int) {
	const slots = 32
	s, err := NewScheduler(SchedulerConfig{MaxChecks: n, MaxConcurrent: slots})
	if err != nil {
		tb.Fatal(err)
	}
	now := t0
	for i := 0; i < n; i++ {
		if _, err := s.Acquire(checkKey(i), CheckConfig{}, now.Add(time.Duration(i)*DefaultCheckInterval/time.Duration(n))); err != nil {
			tb.Fatal(err)
		}
	}
	work := make([]Start, 0, 4*slots)
	next := make([]Start, 0, 4*slots)
	// In flight, for the timeout mode: a ring of the ticks' starts.
	const timeoutTicks = int(DefaultCheckTimeout / DefaultCheckTick)
	var inflight [timeoutTicks][]Start
	for i := range inflight {
		inflight[i] = make([]Start, 0, slots)
	}
	ok := Result{Elapsed: time.Millisecond}
	fail := Result{Err: ErrCheckTimeout, Elapsed: DefaultCheckTimeout}
	k := 0
	tick = func() int {
		k++
		starts := 0
		now = now.Add(DefaultCheckTick)
		work = s.Tick(now, work[:0])
		if timeouts {
			// Complete what started timeoutTicks ago; their freed slots
			// start more, which time out in turn.
			slot := &inflight[k%timeoutTicks]
			done := *slot
			*slot = (*slot)[:0]
			for _, st := range done {
				var err error
				if work, err = s.Complete(st, fail, now, work); err != nil {
					tb.Fatal(err)
				}
			}
			*slot = append(*slot, work...)
			return len(work)
		}
		for len(work) > 0 {
			starts += len(work)
			next = next[:0]
			for _, st := range work {
				var err error
				if next, err = s.Complete(st, ok, now, next); err != nil {
					tb.Fatal(err)
				}
			}
			work, next = next, work
		}
		return starts
	}
	for i := 0; i < 200; i++ { // reach the steady state
		tick()
	}
	return tick
}

func benchScheduler(b *testing.B, n int, timeouts bool) {
	tick := schedLoad(b, n, timeouts)
	var starts uint64
	b.ReportAllocs()
	b.ResetTimer()
	for k := 0; k < b.N; k++ {
		starts += uint64(tick())
	}
	b.StopTimer()
	ns := float64(b.Elapsed().Nanoseconds())
	b.ReportMetric(ns/float64(b.N)/float64(n), "ns/check-tick")
	if starts > 0 {
		b.ReportMetric(ns/float64(starts), "ns/start")
	}
	b.ReportMetric(float64(starts)/float64(b.N), "starts/tick")
}

// benchNaive is the obvious scheduler: on each tick, scan every check and
// start those due while slots last.
func benchNaive(b *testing.B, n int) {
	type chk struct {
		key       CheckKey
		due, last time.Time
	}
	checks := make([]chk, n)
	now := t0
	for i := range checks {
		checks[i] = chk{key: checkKey(i), due: now.Add(time.Duration(i) * DefaultCheckInterval / time.Duration(n))}
	}
	var starts uint64
	tick := func() {
		now = now.Add(DefaultCheckTick)
		for i := range checks {
			c := &checks[i]
			if !c.due.After(now) { // start and complete at once
				c.last = now
				c.due = now.Add(DefaultCheckInterval)
				starts++
			}
		}
	}
	for k := 0; k < 200; k++ {
		tick()
	}
	starts = 0
	b.ReportAllocs()
	b.ResetTimer()
	for k := 0; k < b.N; k++ {
		tick()
	}
	b.StopTimer()
	ns := float64(b.Elapsed().Nanoseconds())
	b.ReportMetric(ns/float64(b.N)/float64(n), "ns/check-tick")
	b.ReportMetric(ns/float64(starts), "ns/start")
}

// TestSchedulerTickZeroAlloc: the worker tick's scheduling, with 10,000
// checks in steady state, does not allocate.
func TestSchedulerTickZeroAlloc(t *testing.T) {
	testenv.SkipIfLockOrder(t)
	for _, timeouts := range []bool{false, true} {
		tick := schedLoad(t, 10000, timeouts)
		started := 0
		if a := testing.AllocsPerRun(50, func() { started += tick() }); a != 0 || started == 0 {
			t.Fatalf("timeouts=%v: a tick allocates %v times (%d started)", timeouts, a, started)
		}
	}
}

// BenchmarkProberPoll: one Poll over P peers, each due.
func BenchmarkProberPoll(b *testing.B) {
	for _, peers := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("peers=%d", peers), func(b *testing.B) {
			p := newProber(b, ProberConfig{})
			for i := 0; i < peers; i++ {
				var id NodeID
				id[0], id[1] = byte(i), byte(i>>8)
				if err := p.AddPeer(id, t0); err != nil {
					b.Fatal(err)
				}
			}
			out := make([]Probe, 0, peers)
			now := t0
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				out, _ = p.Poll(now, out[:0])
				now = now.Add(time.Second)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(peers), "ns/peer")
		})
	}
}

// BenchmarkProbeExchange: the per-probe packet path: build the probe
// packet, answer it as the peer, parse the reply, take the sample.
func BenchmarkProbeExchange(b *testing.B) {
	p := newProber(b, ProberConfig{})
	id := nodeID(1)
	_ = p.AddPeer(id, t0)
	var r Responder
	out := make([]Probe, 0, 1)
	pkt := make([]byte, 0, PacketLen)
	rep := make([]byte, 0, PacketLen)
	now := t0
	b.ReportAllocs()
	b.SetBytes(2 * PacketLen)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out, _ = p.Poll(now, out[:0])
		var err error
		if pkt, err = out[0].AppendIPv4(pkt[:0], addrA, addrB, DefaultPort); err != nil {
			b.Fatal(err)
		}
		if rep, err = r.RespondIPv4(pkt, rep); err != nil {
			b.Fatal(err)
		}
		_, _, payload, err := ParseIPv4UDP(rep)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.HandleReply(id, payload, now.Add(time.Millisecond)); err != nil {
			b.Fatal(err)
		}
		now = now.Add(time.Second)
	}
}

// BenchmarkSelect: evaluate and pick among B backends on distinct peers,
// each with a connect check and the unreachable table consulted.
func BenchmarkSelect(b *testing.B) {
	for _, n := range []int{2, 8, 32} {
		b.Run(fmt.Sprintf("backends=%d", n), func(b *testing.B) {
			p := newProber(b, ProberConfig{MaxPeers: n})
			s := newScheduler(b, SchedulerConfig{})
			u, _ := NewUnreachable(UnreachableConfig{})
			bs := make([]Backend, n)
			for i := range bs {
				bs[i] = be(byte(i+1), 443)
				_ = p.AddPeer(bs[i].Node, t0)
				bs[i].Check = mustAcquire(b, s, CheckKey{Node: bs[i].Node, Addr: bs[i].Addr}, CheckConfig{}, t0)
			}
			for j, pr := range poll(p, t0) {
				_ = p.HandleReply(pr.Peer, reply(b, pr), t0.Add(time.Duration(j+1)*time.Millisecond))
			}
			sel := &Selector{Prober: p, Unreachable: u}
			st := make([]Status, 0, n)
			now := t0.Add(500 * time.Millisecond)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var k int
				st, k = sel.Select(bs, now, st)
				if k != 0 {
					b.Fatal(k)
				}
			}
		})
	}
}

var sinkOK bool

func BenchmarkIsProbePacket(b *testing.B) {
	pkt, _ := AppendIPv4UDP(nil, netip.AddrPortFrom(addrA, DefaultPort), netip.AddrPortFrom(addrB, DefaultPort), 1, make([]byte, MessageLen))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		sinkOK = IsProbePacket(pkt, DefaultPort)
	}
}
