//go:build linux

package keelvip

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// TestCheckGateMinMove: a failing holder hands over only once it has held
// the VIP for MinMoveInterval: deferred at min_move-1ns, handed over at min_move; a
// passing, unknown or stale result, or a replica, never hands over.
func TestCheckGateMinMove(t *testing.T) {
	const minMove = 60 * time.Second
	g := checkGate{minMove: minMove}
	t0 := transporttest.Epoch
	failing := CheckResult{Status: CheckFailing, Fresh: true}
	if d := g.decide(t0, failing); d != gateNone {
		t.Fatalf("a replica: %v", d)
	}
	g.role(t0, true)
	g.role(t0.Add(time.Second), true) // still the holder: the start stays t0
	if d := g.decide(t0.Add(minMove-time.Nanosecond), failing); d != gateDeferred {
		t.Fatalf("at min_move-1ns: %v, want deferred", d)
	}
	if d := g.decide(t0.Add(minMove), failing); d != gateHandOver {
		t.Fatalf("at min_move: %v, want a hand-over", d)
	}
	for _, r := range []CheckResult{{Status: CheckPassing, Fresh: true}, {Status: CheckUnknown, Fresh: true}, {Status: CheckFailing, Fresh: false}} {
		if d := g.decide(t0.Add(2*minMove), r); d != gateNone {
			t.Fatalf("%+v: %v, want none", r, d)
		}
	}
	// The VIP moved away and back: the count starts again.
	g.role(t0.Add(70*time.Second), false)
	g.role(t0.Add(80*time.Second), true)
	if d := g.decide(t0.Add(80*time.Second+minMove-time.Nanosecond), failing); d != gateDeferred {
		t.Fatalf("held again for min_move-1ns: %v", d)
	}
}

type fakeHandOver struct {
	calls atomic.Int64
	err   error
}

func (f *fakeHandOver) HandOver(context.Context) error {
	f.calls.Add(1)
	return f.err
}

// agentOnClock is a check agent whose probe fails when fail is set, on a
// manual clock, driven synchronously (once, then step).
func agentOnClock(t *testing.T, ctl checkCtl, fail *atomic.Bool) (*checkAgent, *transporttest.ManualClock) {
	clk := transporttest.NewManualClock()
	r := newCheckRunner(Checks{TCP: "[::1]:1", Rise: 2, Fall: 3, MinMoveInterval: 60 * time.Second}, clk, nil)
	r.probe = func(context.Context) error {
		if fail.Load() {
			return errProbe
		}
		return nil
	}
	return newCheckAgent(r, ctl, clk, slog.New(slog.NewTextHandler(tWriter{t}, nil))), clk
}

func (a *checkAgent) tick(clk *transporttest.ManualClock, d time.Duration) {
	clk.Advance(d)
	a.runner.once(context.Background())
	a.step(context.Background())
}

// TestCheckAgentHandsOver: the holder's check fails fall times (interval
// × fall); once the VIP has been held for MinMoveInterval the agent asks
// for the hand-over; a passing check asks nothing.
func TestCheckAgentHandsOver(t *testing.T) {
	ctl := &fakeHandOver{}
	var fail atomic.Bool
	a, clk := agentOnClock(t, ctl, &fail)
	a.becomeHolder(clk.Now())
	for range 40 { // 80 s passing
		a.tick(clk, 2*time.Second)
	}
	if ctl.calls.Load() != 0 || a.Healthy() != nil {
		t.Fatalf("a passing check: %d hand-overs, healthy %v", ctl.calls.Load(), a.Healthy())
	}
	fail.Store(true)
	a.tick(clk, 2*time.Second)
	a.tick(clk, 2*time.Second)
	if ctl.calls.Load() != 0 {
		t.Fatal("handed over before fall failures")
	}
	a.tick(clk, 2*time.Second) // the third failure: failing
	if ctl.calls.Load() != 1 || a.Stats().Accepted != 1 {
		t.Fatalf("after fall failures: %d hand-overs, %+v", ctl.calls.Load(), a.Stats())
	}
	if err := a.Healthy(); err == nil {
		t.Fatal("a failing check reports healthy")
	}
}

// TestCheckAgentBothFailKeeps: a replica that refuses (its check fails
// too) leaves the VIP with the holder, which asks again at each result
// and logs once.
func TestCheckAgentBothFailKeeps(t *testing.T) {
	ctl := &fakeHandOver{err: &claim.RefusalError{Code: "check-failing", Reason: "check failing", Err: claim.ErrCheckFailing}}
	var fail atomic.Bool
	fail.Store(true)
	a, clk := agentOnClock(t, ctl, &fail)
	a.becomeHolder(clk.Now())
	for range 3 {
		a.tick(clk, 2*time.Second)
	}
	if s := a.Stats(); s.Deferred != 1 || s.Refused != 0 {
		t.Fatalf("failing at 6 s of holding: %+v, want deferred", s)
	}
	clk.Advance(60 * time.Second)
	a.tick(clk, 2*time.Second)
	a.tick(clk, 2*time.Second)
	if s := a.Stats(); s.Refused != 2 || s.Accepted != 0 {
		t.Fatalf("both failing: %+v", s)
	}
	ctl.err = fmt.Errorf("peer down")
	a.tick(clk, 2*time.Second)
	if s := a.Stats(); s.Unanswered != 1 {
		t.Fatalf("unanswered: %+v", s)
	}
	// A stale result (the check stopped) is not failing: nothing is asked.
	n := ctl.calls.Load()
	clk.Advance(a.runner.cfg.MaxResultAge() + time.Second)
	a.step(context.Background())
	if ctl.calls.Load() != n || a.Healthy() == nil {
		t.Fatal("a stale result moved the VIP or counts as healthy")
	}
}

// TestCheckMetricsAndStatus: the collector exports the check's status,
// runs and hand-overs when a check is configured (and no series without
// one); status shows them.
func TestCheckMetricsAndStatus(t *testing.T) {
	ctl := &fakeHandOver{}
	var fail atomic.Bool
	a, clk := agentOnClock(t, ctl, &fail)
	a.becomeHolder(clk.Now())
	a.tick(clk, time.Second)
	a.tick(clk, time.Second)
	c := controllerCollector{vip: "fd00::1:100", node: "a", ttl: 20 * time.Second,
		status: func() claim.Status { return claim.Status{} }, stats: func() claim.Stats { return claim.Stats{} },
		promotes: new(promoteCounts), checks: a}
	if probs, err := testutil.CollectAndLint(c); err != nil || len(probs) != 0 {
		t.Fatalf("lint: %v %v", probs, err)
	}
	want := `
# HELP keel_vip_check_passing 1 while the service check passes on a fresh result, 0 while it fails, is unknown or stale. Absent without a check.
# TYPE keel_vip_check_passing gauge
keel_vip_check_passing{node="a",vip="fd00::1:100"} 1
# HELP keel_vip_check_runs_total Service check runs, by result: pass, fail. Absent without a check.
# TYPE keel_vip_check_runs_total counter
keel_vip_check_runs_total{node="a",result="fail",vip="fd00::1:100"} 0
keel_vip_check_runs_total{node="a",result="pass",vip="fd00::1:100"} 2
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "keel_vip_check_passing", "keel_vip_check_runs_total"); err != nil {
		t.Fatal(err)
	}
	fail.Store(true)
	for range 3 {
		a.tick(clk, 30*time.Second)
	}
	if a.runner.Result().Passing() {
		t.Fatal("passing after three failures")
	}
	if n, err := testutil.GatherAndCount(registryOf(t, c), "keel_vip_check_handovers_total"); err != nil || n != 4 {
		t.Fatalf("hand-over series: %d %v", n, err)
	}
	c.checks = nil
	if n, err := testutil.GatherAndCount(registryOf(t, c), "keel_vip_check_passing", "keel_vip_check_runs_total", "keel_vip_check_handovers_total"); err != nil || n != 0 {
		t.Fatalf("series without a check: %d %v", n, err)
	}
	s := Status{VIP: "fd00::1:100", Role: "primary", RenewalAgeMs: -1, Check: a.report()}
	var b strings.Builder
	if err := s.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "check:     tcp failing (0.0 s ago): probe failed") || !strings.Contains(b.String(), "handovers: 1 accepted, 0 refused, 0 unanswered, 0 deferred") {
		t.Fatalf("status:\n%s", b.String())
	}
}

func registryOf(t *testing.T, c prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	return reg
}

// becomeHolder tells the agent's gate that this node became the holder at
// now, as a change from the controller's watch does.
func (a *checkAgent) becomeHolder(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gate.role(now, true)
}
