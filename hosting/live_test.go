package hosting_test

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// target is a loopback TCP listener standing for the share's target on one
// agent's host.
type target struct {
	t    *testing.T
	addr string
	// mu guards l.
	mu sync.Mutex
	// +checklocks:mu
	l        net.Listener
	accepted atomic.Int64
	wg       sync.WaitGroup
}

func newTarget(t *testing.T) *target {
	tg := &target{t: t, addr: "127.0.0.1:0"}
	tg.start()
	t.Cleanup(tg.stop)
	return tg
}

func (tg *target) start() {
	tg.t.Helper()
	l, err := net.Listen("tcp", tg.addr)
	if err != nil {
		tg.t.Fatal(err)
	}
	tg.mu.Lock()
	tg.l, tg.addr = l, l.Addr().String()
	tg.mu.Unlock()
	tg.wg.Add(1)
	go func() {
		defer tg.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			tg.accepted.Add(1)
			c.Close()
		}
	}()
}

func (tg *target) stop() {
	tg.mu.Lock()
	l := tg.l
	tg.l = nil
	tg.mu.Unlock()
	if l != nil {
		l.Close()
		tg.wg.Wait()
	}
}

// waitAccepted polls until the target accepted at least n connections.
func (tg *target) waitAccepted(n int64) {
	tg.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for tg.accepted.Load() < n {
		if time.Now().After(deadline) {
			tg.t.Fatalf("target accepted %d connections, want %d", tg.accepted.Load(), n)
		}
		<-time.After(time.Millisecond)
	}
}

func (tg *target) address() string {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return tg.addr
}

// startAgent runs agent's simulated tunneler; every share target resolves
// to tg on its host.
func (e *env) startAgent(agent string, clk *transporttest.ManualClock, tg *target) *zititest.HostAgent {
	e.t.Helper()
	a, err := e.fake.StartAgent(zititest.AgentOptions{Identity: e.ident[agent], Clock: clk, Resolve: func(string) string { return tg.address() }})
	if err != nil {
		e.t.Fatal(err)
	}
	return a
}

// waitTerminators polls the controller until the service's terminators are
// exactly want (identity → precedence).
func (e *env) waitTerminators(service string, want map[string]string) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var got map[string]string
	for time.Now().Before(deadline) {
		ts, err := e.fake.Client().ListTerminators(e.ctx, ziti.Eq("service", service))
		if err != nil {
			e.t.Fatal(err)
		}
		got = map[string]string{}
		for _, tm := range ts {
			got[tm.HostID] = tm.Precedence
		}
		if equalMaps(got, want) {
			return
		}
		<-time.After(2 * time.Millisecond) // poll interval
	}
	e.t.Fatalf("terminators %v, want %v", got, want)
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func waitChecks(t *testing.T, a *zititest.HostAgent, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for a.Checks() < n {
		if time.Now().After(deadline) {
			t.Fatalf("agent %s ran %d checks, want %d", a.Identity(), a.Checks(), n)
		}
		<-time.After(time.Millisecond)
	}
}

// dialOnce opens one circuit and returns the identity that served it.
func (e *env) dialOnce(service string) string {
	e.t.Helper()
	c, host, err := e.fake.Dial(e.ctx, service)
	if err != nil {
		e.t.Fatalf("dial: %v", err)
	}
	c.Close()
	return host
}

func (e *env) state(id string) hosting.State {
	e.t.Helper()
	v, err := e.svc.Get(e.ctx, id)
	if err != nil || v.Hosting == nil {
		e.t.Fatalf("get: %+v %v", v, err)
	}
	return v.Hosting.State
}

// The failover a live deployment shows, on the model controller: two
// agents on one share, real port checks against loopback targets.
func TestLiveCheckOnTheModelController(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1")
	clk := transporttest.NewManualClock()
	ta, tp := newTarget(t), newTarget(t)
	active := e.startAgent("a1", clk, ta)
	passive := e.startAgent("p1", clk, tp)
	s, err := e.svc.Create(e.ctx, hosting.Share{AccountID: account, Name: "db", Kind: hosting.KindTCP, TargetAddress: "db.internal", TargetPort: 5432},
		hosting.Update{Active: hosting.Of("a1"), Passive: hosting.Of("p1")})
	if err != nil {
		t.Fatal(err)
	}
	svc := e.zitiOf(s.ID).service.ID
	ia, ip := e.ident["a1"], e.ident["p1"]

	// The passive's terminator is at default, the active's at required.
	e.waitTerminators(svc, map[string]string{ia: "required", ip: "default"})
	if st := e.state(s.ID); st != hosting.Healthy {
		t.Fatalf("state %s, want HEALTHY", st)
	}
	for i := 0; i < 4; i++ {
		if h := e.dialOnce(svc); h != ia {
			t.Fatalf("circuit %d went to %s, want the active %s", i, h, ia)
		}
	}
	// The circuits reached the target on the active's host only (the
	// passive's port checks reach its own; its circuits would add to them).
	ta.waitAccepted(4)
	if n := tp.accepted.Load(); n != 0 {
		t.Fatalf("the passive's target accepted %d connections", n)
	}

	// A role change moves both.
	e.patch(s.ID, list("p1"), list("a1"))
	e.waitTerminators(svc, map[string]string{ia: "default", ip: "required"})
	e.patch(s.ID, list("a1"), list("p1"))
	e.waitTerminators(svc, map[string]string{ia: "required", ip: "default"})

	// Stopping the active agent sends new circuits to the passive.
	active.Stop()
	e.waitTerminators(svc, map[string]string{ip: "default"})
	if h := e.dialOnce(svc); h != ip {
		t.Fatalf("with the active stopped the circuit went to %s", h)
	}
	if st := e.state(s.ID); st != hosting.FailedOver {
		t.Fatalf("state %s, want FAILED_OVER", st)
	}
	active = e.startAgent("a1", clk, ta)
	e.waitTerminators(svc, map[string]string{ia: "required", ip: "default"})
	if h := e.dialOnce(svc); h != ia {
		t.Fatalf("with the active back the circuit went to %s", h)
	}

	// Stopping the target on the active's host only: its terminator goes
	// to failed on the failures-th check (interval × failures), not before.
	ta.stop()
	base := active.Checks()
	for i := 1; i <= testHC.Failures; i++ {
		clk.Advance(testHC.Interval)
		waitChecks(t, active, base+uint64(i))
		want := "required"
		if i == testHC.Failures {
			want = "failed"
		}
		e.waitTerminators(svc, map[string]string{ia: want, ip: "default"})
	}
	if h := e.dialOnce(svc); h != ip {
		t.Fatalf("with the active failing the circuit went to %s", h)
	}
	if st := e.state(s.ID); st != hosting.FailedOver {
		t.Fatalf("state %s, want FAILED_OVER", st)
	}
	// ... and back to required on the first check after the target returns.
	ta.start()
	clk.Advance(testHC.Interval)
	waitChecks(t, active, base+uint64(testHC.Failures)+1)
	e.waitTerminators(svc, map[string]string{ia: "required", ip: "default"})
	if h := e.dialOnce(svc); h != ia {
		t.Fatalf("with the target back the circuit went to %s", h)
	}
	if passive.Checks() == 0 {
		t.Fatal("the passive ran no port check")
	}
	// Deleting the share unbinds both.
	if err := e.svc.Delete(e.ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.fake.Dial(e.ctx, svc); !errors.Is(err, zititest.ErrNoTerminator) {
		t.Fatalf("dial after delete: %v", err)
	}
}
