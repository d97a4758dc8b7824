package probe

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
)

func be(node byte, port uint16) Backend {
	return Backend{Node: nodeID(node), Proto: ProtoTCP, Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, 64, 0, node}), port)}
}

func local(node byte, port uint16) Backend {
	b := be(node, port)
	b.Local = true
	return b
}

var (
	ok   = func(rtt time.Duration) Status { return Status{Reason: ReasonOK, RTT: rtt, RTTKnown: true} }
	loc  = Status{Reason: ReasonOK, RTTKnown: true}
	unk  = Status{Reason: ReasonRTTUnknown, SampleAge: -1}
	stl  = Status{Reason: ReasonRTTStale, SampleAge: 12 * time.Second}
	excl = func(r Reason, rtt time.Duration) Status { return Status{Reason: r, RTT: rtt, RTTKnown: rtt > 0} }
)

// TestPick covers every ranking rule of the selector, each in both list
// orders where order could matter.
func TestPick(t *testing.T) {
	for _, tc := range []struct {
		name string
		bs   []Backend
		st   []Status
		want int
	}{
		{"no backends", nil, nil, -1},
		{"none eligible", []Backend{be(1, 80), be(2, 80)}, []Status{excl(ReasonNoPath, 0), excl(ReasonDisabled, time.Millisecond)}, -1},
		{"lowest smoothed RTT", []Backend{be(1, 80), be(2, 80), be(3, 80)}, []Status{ok(30 * time.Millisecond), ok(10 * time.Millisecond), ok(20 * time.Millisecond)}, 1},
		{"unknown RTT is not zero", []Backend{be(1, 80), be(2, 80)}, []Status{unk, ok(900 * time.Millisecond)}, 1},
		{"unknown RTT is not zero, reversed", []Backend{be(2, 80), be(1, 80)}, []Status{ok(900 * time.Millisecond), unk}, 0},
		{"stale RTT ranks after known", []Backend{be(1, 80), be(2, 80)}, []Status{stl, ok(2 * time.Second)}, 1},
		{"stale with a leftover low RTT field still ranks after known", []Backend{be(1, 80), be(2, 80)}, []Status{{Reason: ReasonRTTStale, RTT: time.Millisecond}, ok(time.Second)}, 1},
		{"unknown is still eligible when alone", []Backend{be(1, 80), be(2, 80)}, []Status{excl(ReasonProbeTimeout, time.Millisecond), unk}, 1},
		{"local beats the fastest remote", []Backend{be(1, 80), local(9, 80)}, []Status{ok(time.Nanosecond), loc}, 1},
		{"excluded with a low RTT is skipped", []Backend{be(1, 80), be(2, 80)}, []Status{excl(ReasonProbeTimeout, time.Millisecond), ok(50 * time.Millisecond)}, 1},
		{"check-failed is skipped", []Backend{be(1, 80), be(2, 80)}, []Status{{Reason: ReasonCheckFailed, RTT: time.Millisecond, RTTKnown: true}, ok(time.Second)}, 1},
		{"icmp-unreachable is skipped", []Backend{be(1, 80), be(2, 80)}, []Status{{Reason: ReasonICMPUnreachable, RTT: time.Millisecond, RTTKnown: true}, ok(time.Second)}, 1},
		{"disabled is skipped", []Backend{local(1, 80), be(2, 80)}, []Status{{Reason: ReasonDisabled, RTTKnown: true}, ok(time.Second)}, 1},
		{"no-path is skipped", []Backend{be(1, 80), be(2, 80)}, []Status{excl(ReasonNoPath, time.Millisecond), unk}, 1},
		{"RTT tie: lower node id", []Backend{be(2, 80), be(1, 80)}, []Status{ok(time.Second), ok(time.Second)}, 1},
		{"RTT tie: lower node id, reversed", []Backend{be(1, 80), be(2, 80)}, []Status{ok(time.Second), ok(time.Second)}, 0},
		{"unknown tie: lower node id", []Backend{be(3, 80), be(2, 80)}, []Status{unk, stl}, 1},
		{"same node: lower address", []Backend{be(1, 9090), be(1, 8080)}, []Status{ok(time.Second), ok(time.Second)}, 1},
		{"two locals: lower address", []Backend{local(1, 9090), local(1, 8080)}, []Status{loc, loc}, 1},
		{"identical: first position", []Backend{be(1, 80), be(1, 80)}, []Status{ok(time.Second), ok(time.Second)}, 0},
		{"short status slice", []Backend{be(1, 80), be(2, 80)}, []Status{excl(ReasonNoPath, 0)}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Pick(tc.bs, tc.st); got != tc.want {
				t.Fatalf("Pick = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestReasons(t *testing.T) {
	want := map[Reason]struct {
		name     string
		eligible bool
	}{
		ReasonOK: {"ok", true}, ReasonDisabled: {"disabled", false}, ReasonNoPath: {"no-path", false},
		ReasonProbeTimeout: {"probe-timeout", false}, ReasonCheckFailed: {"check-failed", false},
		ReasonICMPUnreachable: {"icmp-unreachable", false}, ReasonRTTStale: {"rtt-stale", true},
		ReasonRTTUnknown: {"rtt-unknown", true}, numReasons: {"reason(8)", false},
	}
	for r, w := range want {
		if r.String() != w.name || r.Eligible() != w.eligible || (Status{Reason: r}).Eligible() != w.eligible {
			t.Errorf("%d: %q eligible=%v, want %q %v", r, r.String(), r.Eligible(), w.name, w.eligible)
		}
	}
}

// selectorFixture builds a prober, a scheduler and an unreachable table
// with one peer in each state, evaluated at now = t0+450ms:
//
//	stale    sampled at t0+10ms (10 ms RTT); StaleAfter 300 ms
//	timeout  probe at t0 unanswered; Timeout 100 ms, MissLimit 1
//	nopath   sampled, then SetPath(false)
//	fast     sampled at t0+405ms (5 ms RTT)
//	slow     sampled at t0+440ms (40 ms RTT)
//	unknown  tracked, not yet probed
type selectorFixture struct {
	sel                                      *Selector
	stale, timeout, nopath, fast, slow, unkn NodeID
	failing, passing                         *Subscription
	checkErr                                 error
	now                                      time.Time
}

func newSelectorFixture(t *testing.T) *selectorFixture {
	f := &selectorFixture{stale: nodeID(1), timeout: nodeID(2), nopath: nodeID(3), fast: nodeID(4), slow: nodeID(5), unkn: nodeID(6), now: at(450 * time.Millisecond)}
	p := newProber(t, ProberConfig{Interval: time.Hour, Timeout: 100 * time.Millisecond, MissLimit: 1, StaleAfter: 300 * time.Millisecond})
	answer := func(pr Probe, d time.Duration) {
		if err := p.HandleReply(pr.Peer, reply(t, pr), at(d)); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []NodeID{f.stale, f.timeout, f.nopath} {
		_ = p.AddPeer(id, t0)
	}
	// Each measured peer's first reply ends its silence and is no sample;
	// the prober probes it again at once, and that reply is the sample.
	first := poll(p, t0)
	answer(first[0], 0)
	answer(first[2], 0)
	again := poll(p, t0)
	if len(again) != 2 || again[0].Peer != f.stale || again[1].Peer != f.nopath {
		t.Fatalf("probes after the first replies: %+v", again)
	}
	answer(again[0], 10*time.Millisecond)
	answer(again[1], 20*time.Millisecond)
	_ = p.SetPath(f.nopath, false)
	_ = p.AddPeer(f.fast, at(400*time.Millisecond))
	_ = p.AddPeer(f.slow, at(400*time.Millisecond))
	second := poll(p, at(400*time.Millisecond))
	answer(second[0], 400*time.Millisecond)
	answer(second[1], 400*time.Millisecond)
	again = poll(p, at(400*time.Millisecond))
	if len(again) != 2 || again[0].Peer != f.fast || again[1].Peer != f.slow {
		t.Fatalf("probes after the first replies at 400ms: %+v", again)
	}
	answer(again[0], 405*time.Millisecond)
	answer(again[1], 440*time.Millisecond)
	_ = p.AddPeer(f.unkn, at(450*time.Millisecond))

	s := newScheduler(t, SchedulerConfig{})
	f.failing = mustAcquire(t, s, checkKey(1), CheckConfig{}, t0)
	f.passing = mustAcquire(t, s, checkKey(2), CheckConfig{}, t0)
	f.checkErr = errors.New("connection refused")
	for i := 0; i < 2; i++ {
		for _, st := range s.Tick(at(time.Duration(i)*3*time.Second), nil) {
			res := Result{Elapsed: time.Millisecond}
			if st.Key == checkKey(1) {
				res.Err = f.checkErr
			}
			if _, err := s.Complete(st, res, at(time.Duration(i)*3*time.Second+time.Millisecond), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	u, _ := NewUnreachable(UnreachableConfig{})
	f.sel = &Selector{Prober: p, Unreachable: u}
	return f
}

// TestEvaluate derives every health reason from the real sources, and the
// precedence between reasons.
func TestEvaluate(t *testing.T) {
	f := newSelectorFixture(t)
	udp := func(b Backend) Backend { b.Proto = ProtoUDP; return b }
	with := func(b Backend, node NodeID, sub *Subscription, disabled bool) Backend {
		b.Node, b.Check, b.Disabled = node, sub, disabled
		return b
	}
	icmpAt := at(445 * time.Millisecond)
	until, err := f.sel.Unreachable.Report(UnreachableKey{Node: f.fast, Proto: ProtoUDP, Addr: be(4, 53).Addr}, icmpAt)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.sel.Unreachable.Report(UnreachableKey{Node: f.fast, Proto: ProtoUDP, Addr: be(4, 54).Addr}, icmpAt)
	_, _ = f.sel.Unreachable.Report(UnreachableKey{Node: f.stale, Proto: ProtoUDP, Addr: be(4, 53).Addr}, icmpAt)

	for _, tc := range []struct {
		name string
		b    Backend
		want Status
	}{
		{"ok", with(be(4, 80), f.fast, f.passing, false), Status{Reason: ReasonOK, RTT: 5 * time.Millisecond, RTTKnown: true, SampleAge: 45 * time.Millisecond}},
		{"ok slower", with(be(5, 80), f.slow, nil, false), Status{Reason: ReasonOK, RTT: 40 * time.Millisecond, RTTKnown: true, SampleAge: 10 * time.Millisecond}},
		{"rtt-stale", with(be(1, 80), f.stale, nil, false), Status{Reason: ReasonRTTStale, SampleAge: 440 * time.Millisecond}},
		{"rtt-unknown", with(be(6, 80), f.unkn, nil, false), Status{Reason: ReasonRTTUnknown, SampleAge: -1}},
		{"probe-timeout", with(be(2, 80), f.timeout, nil, false), Status{Reason: ReasonProbeTimeout, SampleAge: -1}},
		{"no-path keeps the RTT for status", with(be(3, 80), f.nopath, nil, false), Status{Reason: ReasonNoPath, SampleAge: 430 * time.Millisecond}},
		{"untracked peer: no-path", with(be(7, 80), nodeID(7), nil, false), Status{Reason: ReasonNoPath, SampleAge: -1}},
		{"check-failed with the last error", with(be(4, 80), f.fast, f.failing, false), Status{Reason: ReasonCheckFailed, Err: f.checkErr, RTT: 5 * time.Millisecond, RTTKnown: true, SampleAge: 45 * time.Millisecond}},
		{"icmp-unreachable until", udp(with(be(4, 53), f.fast, nil, false)), Status{Reason: ReasonICMPUnreachable, Until: until, RTT: 5 * time.Millisecond, RTTKnown: true, SampleAge: 45 * time.Millisecond}},
		{"icmp report is per protocol", with(be(4, 53), f.fast, nil, false), Status{Reason: ReasonOK, RTT: 5 * time.Millisecond, RTTKnown: true, SampleAge: 45 * time.Millisecond}},
		{"disabled", with(be(4, 80), f.fast, f.passing, true), Status{Reason: ReasonDisabled, RTT: 5 * time.Millisecond, RTTKnown: true, SampleAge: 45 * time.Millisecond}},
		{"local: RTT 0, no probe needed", with(local(8, 80), nodeID(8), f.passing, false), Status{Reason: ReasonOK, RTTKnown: true}},
		{"local with a failing check", with(local(8, 80), nodeID(8), f.failing, false), Status{Reason: ReasonCheckFailed, Err: f.checkErr, RTTKnown: true}},
		{"local disabled", with(local(8, 80), nodeID(8), nil, true), Status{Reason: ReasonDisabled, RTTKnown: true}},
		// Precedence.
		{"disabled before no-path", with(be(3, 80), f.nopath, f.failing, true), Status{Reason: ReasonDisabled, SampleAge: 430 * time.Millisecond}},
		{"no-path before check-failed", with(be(3, 80), f.nopath, f.failing, false), Status{Reason: ReasonNoPath, SampleAge: 430 * time.Millisecond}},
		{"probe-timeout before check-failed", with(be(2, 80), f.timeout, f.failing, false), Status{Reason: ReasonProbeTimeout, SampleAge: -1}},
		{"check-failed before icmp-unreachable", udp(with(be(4, 54), f.fast, f.failing, false)), Status{Reason: ReasonCheckFailed, Err: f.checkErr, RTT: 5 * time.Millisecond, RTTKnown: true, SampleAge: 45 * time.Millisecond}},
		{"icmp-unreachable before rtt-stale", udp(with(be(4, 53), f.stale, nil, false)), Status{Reason: ReasonICMPUnreachable, Until: until, SampleAge: 440 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := f.sel.Evaluate(&tc.b, f.now)
			if got.Reason != tc.want.Reason || !errors.Is(got.Err, tc.want.Err) || (tc.want.Err == nil) != (got.Err == nil) ||
				!got.Until.Equal(tc.want.Until) || got.RTT != tc.want.RTT || got.RTTKnown != tc.want.RTTKnown || got.SampleAge != tc.want.SampleAge {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
	// The ICMP exclusion ends after 10 s.
	b := udp(with(be(4, 53), f.fast, nil, false))
	if st := f.sel.Evaluate(&b, until); st.Reason == ReasonICMPUnreachable {
		t.Fatalf("at the end of the hold: %+v", st)
	}
}

// TestSelectEndToEnd picks among real sources: the fastest eligible
// backend, moving on as backends fail.
func TestSelectEndToEnd(t *testing.T) {
	f := newSelectorFixture(t)
	bs := []Backend{be(5, 80), be(1, 80), be(6, 80), be(4, 80), be(2, 80), be(3, 80)}
	bs[0].Node, bs[1].Node, bs[2].Node, bs[3].Node, bs[4].Node, bs[5].Node = f.slow, f.stale, f.unkn, f.fast, f.timeout, f.nopath
	var st []Status
	var i int
	st, i = f.sel.Select(bs, f.now, st)
	if i != 3 || len(st) != len(bs) {
		t.Fatalf("picked %d, want the 5 ms backend (3): %+v", i, st)
	}
	bs[3].Check = f.failing
	if st, i = f.sel.Select(bs, f.now, st); i != 0 {
		t.Fatalf("picked %d, want the 40 ms backend", i)
	}
	bs[0].Disabled = true
	// Stale (node 1) and unknown (node 6) remain: node id order.
	if st, i = f.sel.Select(bs, f.now, st); i != 1 {
		t.Fatalf("picked %d, want the stale backend of the lower node id", i)
	}
	bs[1].Disabled, bs[2].Disabled = true, true
	if _, i = f.sel.Select(bs, f.now, st); i != -1 {
		t.Fatalf("picked %d with nothing eligible", i)
	}
	var nilSel Selector
	if st := nilSel.Evaluate(&bs[3], f.now); st.Reason != ReasonNoPath {
		t.Fatalf("no prober: %+v", st)
	}
}

func TestSelectZeroAlloc(t *testing.T) {
	testenv.SkipIfLockOrder(t)
	f := newSelectorFixture(t)
	bs := []Backend{be(5, 80), be(1, 80), be(4, 80)}
	bs[0].Node, bs[1].Node, bs[2].Node = f.slow, f.stale, f.fast
	bs[2].Check = f.passing
	st := make([]Status, 0, len(bs))
	if n := testing.AllocsPerRun(100, func() {
		var i int
		st, i = f.sel.Select(bs, f.now, st)
		if i != 2 {
			t.Fatal(i)
		}
	}); n != 0 {
		t.Fatalf("Select allocates %v times", n)
	}
}

func ExamplePick() {
	bs := []Backend{
		{Node: NodeID{1}, Addr: netip.MustParseAddrPort("100.64.0.1:6443")},
		{Node: NodeID{2}, Addr: netip.MustParseAddrPort("100.64.0.2:7443")},
		{Node: NodeID{3}, Addr: netip.MustParseAddrPort("100.64.0.3:8443")},
	}
	st := []Status{
		{Reason: ReasonRTTUnknown, SampleAge: -1},                                             // no sample yet: after every known RTT
		{Reason: ReasonOK, RTT: 42 * time.Millisecond, RTTKnown: true},                        // eligible, known
		{Reason: ReasonProbeTimeout, RTT: 3 * time.Millisecond, RTTKnown: true, SampleAge: 4}, // excluded
	}
	i := Pick(bs, st)
	fmt.Println(bs[i].Addr, st[i].Reason)
	// Output: 100.64.0.2:7443 ok
}
