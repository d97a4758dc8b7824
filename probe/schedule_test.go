package probe

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
)

func checkKey(i int) CheckKey {
	return CheckKey{Network: "home", Node: nodeID(byte(i % 200)), Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, 64, byte(i >> 8), byte(i)}), 443)}
}

func newScheduler(t testing.TB, cfg SchedulerConfig) *Scheduler {
	t.Helper()
	s, err := NewScheduler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustAcquire(t testing.TB, s *Scheduler, k CheckKey, cfg CheckConfig, now time.Time) *Subscription {
	t.Helper()
	sub, err := s.Acquire(k, cfg, now)
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

func TestSchedulerConfig(t *testing.T) {
	if _, err := NewScheduler(SchedulerConfig{MaxChecks: -1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("negative limit: %v", err)
	}
	s := newScheduler(t, SchedulerConfig{})
	sub := mustAcquire(t, s, checkKey(1), CheckConfig{}, t0)
	if c := sub.Config(); c.Interval != 3*time.Second || c.Timeout != 2*time.Second || c.Failures != 2 || c.Successes != 1 {
		t.Fatalf("defaults %+v", c)
	}
	if sub.Key() != checkKey(1) {
		t.Fatal("key")
	}
	for _, bad := range []CheckConfig{{Interval: -1}, {Timeout: -1}, {Failures: -1}, {Successes: -1}} {
		if _, err := s.Acquire(checkKey(2), bad, t0); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	if _, err := s.Acquire(CheckKey{Addr: netip.MustParseAddrPort("100.64.0.1:0")}, CheckConfig{}, t0); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("port 0: %v", err)
	}
}

func TestSchedulerLimitAndSharing(t *testing.T) {
	s := newScheduler(t, SchedulerConfig{}) // the default 32
	var subs []*Subscription
	for i := 0; i < DefaultMaxChecks; i++ {
		subs = append(subs, mustAcquire(t, s, checkKey(i), CheckConfig{}, t0))
	}
	_, err := s.Acquire(checkKey(99), CheckConfig{}, t0)
	if !errors.Is(err, ErrCheckLimit) || !strings.Contains(err.Error(), "limit 32") {
		t.Fatalf("33rd check: %v, want ErrCheckLimit naming the limit", err)
	}
	// The same target from another listener shares the check: no limit.
	shared := mustAcquire(t, s, checkKey(0), CheckConfig{Timeout: time.Second}, t0)
	if st := s.Stats(); st.Checks != 32 || st.Subscriptions != 33 || st.Refused != 1 {
		t.Fatalf("stats %+v", st)
	}
	shared.Release()
	shared.Release() // idempotent
	subs[0].Release()
	if st := s.Stats(); st.Checks != 31 || st.Subscriptions != 31 {
		t.Fatalf("after release: %+v", st)
	}
	mustAcquire(t, s, checkKey(99), CheckConfig{}, t0)
}

// TestSchedulerThresholds: per subscription, 2 consecutive failures exclude
// and 1 success recovers (defaults), other settings per listener; shared
// connects are judged against each subscription's own timeout.
func TestSchedulerThresholds(t *testing.T) {
	s := newScheduler(t, SchedulerConfig{})
	k := checkKey(1)
	def := mustAcquire(t, s, k, CheckConfig{}, t0)
	strict := mustAcquire(t, s, k, CheckConfig{Interval: time.Second, Timeout: 500 * time.Millisecond, Failures: 1, Successes: 3}, t0)
	refused := errors.New("connection refused")
	now := t0
	var pending []Start
	run := func(res Result) {
		t.Helper()
		starts := append(pending, s.Tick(now, nil)...)
		if len(starts) != 1 {
			t.Fatalf("at %v: %d starts", now.Sub(t0), len(starts))
		}
		if starts[0].Timeout != 2*time.Second {
			t.Fatalf("a shared check waits for the longest timeout: %v", starts[0].Timeout)
		}
		started := now
		now = now.Add(res.Elapsed)
		var err error
		if pending, err = s.Complete(starts[0], res, now, nil); err != nil {
			t.Fatal(err)
		}
		// Next due: the shortest interval after the start, or at once
		// (restarted by Complete) when the connect took that long.
		want := started.Add(time.Second)
		if len(pending) == 0 {
			if n, _ := s.Next(); !n.Equal(want) {
				t.Fatalf("next due %v, want %v", n.Sub(t0), want.Sub(t0))
			}
		} else if !want.Equal(now) {
			t.Fatalf("restarted at once at %v, due %v", now.Sub(t0), want.Sub(t0))
		}
		if now.Before(want) {
			now = want
		}
	}
	for i, step := range []struct {
		res                   Result
		defPass, strictPass   bool
		defFails, strictFails int
	}{
		{Result{Elapsed: time.Millisecond}, true, true, 0, 0},
		{Result{Err: refused, Elapsed: time.Millisecond}, true, false, 1, 1},
		{Result{Err: refused, Elapsed: time.Millisecond}, false, false, 2, 2},
		{Result{Elapsed: time.Millisecond}, true, false, 0, 0}, // 1 success recovers def; strict needs 3
		{Result{Elapsed: time.Second}, true, false, 0, 1},      // slow accept: fails strict's 500 ms only
		{Result{Elapsed: time.Millisecond}, true, false, 0, 0},
		{Result{Elapsed: time.Millisecond}, true, false, 0, 0},
		{Result{Elapsed: time.Millisecond}, true, true, 0, 0},
	} {
		run(step.res)
		d, st := def.Status(), strict.Status()
		if d.Passing != step.defPass || st.Passing != step.strictPass || d.Failures != step.defFails || st.Failures != step.strictFails {
			t.Fatalf("step %d: default %+v, strict %+v", i, d, st)
		}
	}
	if st := def.Status(); !errors.Is(st.LastErr, refused) || !st.Checked {
		t.Fatalf("last error kept: %+v", st)
	}
	if st := strict.Status(); !errors.Is(st.LastErr, ErrCheckTimeout) {
		t.Fatalf("slow accept error %v", st.LastErr)
	}
}

func TestSchedulerReleaseInFlight(t *testing.T) {
	s := newScheduler(t, SchedulerConfig{MaxConcurrent: 1})
	a := mustAcquire(t, s, checkKey(1), CheckConfig{}, t0)
	mustAcquire(t, s, checkKey(2), CheckConfig{}, t0)
	starts := s.Tick(t0, nil)
	if len(starts) != 1 || starts[0].Key != checkKey(1) {
		t.Fatalf("starts %+v", starts)
	}
	a.Release()
	// The released check keeps its slot until its connect completes.
	if got := s.Tick(t0.Add(time.Second), nil); len(got) != 0 {
		t.Fatalf("slot reused while a connect is in flight: %+v", got)
	}
	next, err := s.Complete(starts[0], Result{}, t0.Add(time.Second), nil)
	if err != nil || len(next) != 1 || next[0].Key != checkKey(2) {
		t.Fatalf("complete: %+v %v", next, err)
	}
	if _, err := s.Complete(starts[0], Result{}, t0.Add(time.Second), nil); !errors.Is(err, ErrStaleStart) {
		t.Fatalf("double complete: %v", err)
	}
	if st := s.Stats(); st.Checks != 1 || st.InFlight != 1 || st.MaxInFlight != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// schedSim drives a Scheduler the way Checker does, without goroutines: a
// tick every tick, completions when the model says so, and records each
// start's wait behind its due time.
type schedSim struct {
	s        *Scheduler
	slots    int
	tick     time.Duration
	done     []pendingDone // in flight, by completion time
	maxWait  time.Duration
	starts   int
	inflight int
	maxIn    int
	dur      func(Start) (Result, time.Duration)
}

type pendingDone struct {
	st  Start
	res Result
	at  time.Time
}

func (m *schedSim) begin(now time.Time, starts []Start) {
	for _, st := range starts {
		m.starts++
		m.inflight++
		m.maxIn = max(m.maxIn, m.inflight)
		m.maxWait = max(m.maxWait, now.Sub(st.Due))
		res, d := m.dur(st)
		m.done = append(m.done, pendingDone{st, res, now.Add(d)})
	}
}

// run advances from now to end; it returns the time reached.
func (m *schedSim) run(t testing.TB, now, end time.Time) {
	nextTick := now.Add(m.tick)
	for now.Before(end) {
		// The next event: a tick or the earliest completion.
		j := -1
		for i, d := range m.done {
			if j < 0 || d.at.Before(m.done[j].at) {
				j = i
			}
		}
		if j >= 0 && m.done[j].at.Before(nextTick) {
			d := m.done[j]
			m.done = append(m.done[:j], m.done[j+1:]...)
			now = d.at
			m.inflight--
			next, err := m.s.Complete(d.st, d.res, now, nil)
			if err != nil {
				t.Fatal(err)
			}
			m.begin(now, next)
			continue
		}
		now = nextTick
		nextTick = nextTick.Add(m.tick)
		m.begin(now, m.s.Tick(now, nil))
		// Work-conserving: after a tick, a free slot means nothing is due.
		if n, ok := m.s.Next(); ok && !n.After(now) && m.inflight < m.slots {
			t.Fatalf("at %v: %d of %d slots busy while a check due at %v waits", now.Sub(t0), m.inflight, m.slots, n.Sub(t0))
		}
	}
}

// TestSchedulerFairness10000 runs 10,000 shared checks against targets that
// all time out, with 32 slots, on simulated time: never more than 32 in
// flight, and every start within ceil(N/32) × timeout + one tick of its due
// time (N = 10,000 checks all due).
func TestSchedulerFairness10000(t *testing.T) {
	const n, slots = 10000, 32
	s := newScheduler(t, SchedulerConfig{MaxChecks: n, MaxConcurrent: slots})
	for i := 0; i < n; i++ {
		mustAcquire(t, s, checkKey(i), CheckConfig{}, t0)
	}
	m := &schedSim{s: s, slots: slots, tick: DefaultCheckTick, dur: func(st Start) (Result, time.Duration) {
		return Result{Err: ErrCheckTimeout, Elapsed: st.Timeout}, st.Timeout
	}}
	m.run(t, t0, t0.Add(1300*time.Second)) // two full rounds
	bound := time.Duration((n+slots-1)/slots)*DefaultCheckTimeout + DefaultCheckTick
	if m.maxIn > slots || s.Stats().MaxInFlight > slots {
		t.Fatalf("%d in flight, limit %d", m.maxIn, slots)
	}
	if m.maxWait > bound {
		t.Fatalf("a check waited %v, bound %v", m.maxWait, bound)
	}
	if m.starts < 2*n-slots {
		t.Fatalf("only %d starts in two rounds", m.starts)
	}
	t.Logf("%d starts, longest wait %v (bound %v)", m.starts, m.maxWait, bound)
}

// TestSchedulerFairnessRandom: random check counts, slots, timeouts,
// intervals and outcomes; the scheduler never exceeds its slots, never
// leaves a slot idle while a check is due at a tick, and no check waits
// longer than the bound.
func TestSchedulerFairnessRandom(t *testing.T) {
	seed := testenv.Seed(t, 11)
	rng := rand.New(rand.NewPCG(seed, 2))
	for round := 0; round < 20; round++ {
		n, slots := 1+rng.IntN(300), 1+rng.IntN(40)
		s := newScheduler(t, SchedulerConfig{MaxChecks: n, MaxConcurrent: slots})
		var maxTimeout time.Duration
		for i := 0; i < n; i++ {
			cfg := CheckConfig{
				Interval: time.Duration(1+rng.IntN(40)) * 250 * time.Millisecond,
				Timeout:  time.Duration(1+rng.IntN(20)) * 100 * time.Millisecond,
			}
			maxTimeout = max(maxTimeout, cfg.Timeout)
			mustAcquire(t, s, checkKey(i), cfg, t0.Add(time.Duration(rng.IntN(5000))*time.Millisecond))
		}
		m := &schedSim{s: s, slots: slots, tick: DefaultCheckTick, dur: func(st Start) (Result, time.Duration) {
			d := time.Duration(rng.Int64N(int64(st.Timeout) + 1))
			if rng.IntN(3) == 0 {
				return Result{Err: ErrCheckTimeout, Elapsed: st.Timeout}, st.Timeout
			}
			return Result{Elapsed: d}, d
		}}
		m.run(t, t0, t0.Add(120*time.Second))
		bound := time.Duration((n+slots-1)/slots)*maxTimeout + DefaultCheckTick
		if m.maxIn > slots {
			t.Fatalf("round %d: %d in flight with %d slots", round, m.maxIn, slots)
		}
		if m.maxWait > bound {
			t.Fatalf("round %d (n=%d slots=%d): waited %v, bound %v", round, n, slots, m.maxWait, bound)
		}
	}
}

func ExampleScheduler() {
	s, _ := NewScheduler(SchedulerConfig{MaxConcurrent: 1})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, _ := s.Acquire(CheckKey{Network: "home", Addr: netip.MustParseAddrPort("100.64.0.2:443")}, CheckConfig{}, now)
	_, _ = s.Acquire(CheckKey{Network: "home", Addr: netip.MustParseAddrPort("100.64.0.3:443")}, CheckConfig{}, now)

	starts := s.Tick(now, nil) // one slot: the first due check starts
	fmt.Println("start", starts[0].Key.Addr, "timeout", starts[0].Timeout)
	// The dial was refused after 1 ms; the freed slot starts the next check.
	next, _ := s.Complete(starts[0], Result{Err: errors.New("refused"), Elapsed: time.Millisecond}, now.Add(time.Millisecond), nil)
	fmt.Println("start", next[0].Key.Addr)
	fmt.Println("passing after 1 failure:", a.Status().Passing)
	// Output:
	// start 100.64.0.2:443 timeout 2s
	// start 100.64.0.3:443
	// passing after 1 failure: true
}
