package claim_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/claimtest"
	"github.com/vipkit/vipkit/claim/memkv"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// env is a pair (a, b) and an observer (c) on a memory KV and a manual
// clock, with an in-process members' channel that can be cut.
type env struct {
	t     testing.TB
	f     *claimtest.Fixture
	clock *transporttest.ManualClock
	mkv   *memkv.KV
	hist  *claimtest.History
	ms    *claimtest.Members

	mu sync.Mutex
	// +checklocks:mu
	cut map[[2]netip.Addr]bool
	// noEpoch drops the epoch queries a node sends (their answers lost).
	// +checklocks:mu
	noEpoch map[netip.Addr]bool
	// afterRelease runs after a release was answered, before the
	// requester goes on.
	afterRelease func()
}

func newEnv(t testing.TB, withKV bool) *env {
	e := &env{t: t, f: claimtest.NewFixture(), clock: transporttest.NewManualClock(), hist: new(claimtest.History),
		ms: claimtest.NewMembers(t), cut: map[[2]netip.Addr]bool{}, noEpoch: map[netip.Addr]bool{}}
	if withKV {
		e.mkv = memkv.New(memkv.Options{Clock: e.clock})
		t.Cleanup(func() { e.mkv.Close() })
	}
	for _, n := range []claimtest.Node{e.f.A, e.f.B, e.f.C} {
		m := &claimtest.Member{Name: n.Name, Node: n, Store: new(claim.MemStore),
			Carrier: claimtest.NewFakeCarrier(n.Name, e.clock, e.hist)}
		m.Cfg = claim.Config{
			Policy: e.f.Policy(), Self: n.Addr, VIP: e.f.VIP,
			Carrier: m.Carrier, Store: m.Store, Clock: e.clock,
			Channel: e.directChannel(n.Addr), NoWatch: true,
			Peers: []netip.Addr{e.f.A.Addr, e.f.B.Addr, e.f.C.Addr},
		}
		if n.Name != "c" {
			m.Cfg.Key, m.Cfg.Pair = n.Key, e.f.Pair
			if withKV {
				m.KV = claimtest.NewCountingKV(e.mkv)
				m.Cfg.KV = m.KV
			}
		}
		e.ms.Add(m)
	}
	return e
}

func (e *env) m(name string) *claimtest.Member { return e.ms.M(name) }

// start (re)starts a node's controller from its stored state.
func (e *env) start(name string) *claim.Controller {
	e.t.Helper()
	return e.ms.Start(name)
}

func (e *env) stop(name string) { e.ms.Stop(name) }

// isolate cuts a node from the KV and from the channel, both ways.
func (e *env) isolate(name string, v bool) {
	m := e.m(name)
	if m.KV != nil {
		m.KV.SetDown(v)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, o := range e.ms.All() {
		if a := o.Node.Addr; a != m.Node.Addr {
			e.cut[[2]netip.Addr{a, m.Node.Addr}] = v
			e.cut[[2]netip.Addr{m.Node.Addr, a}] = v
		}
	}
}

func (e *env) carriers() []string {
	var out []string
	for _, n := range []string{"a", "b", "c"} {
		if e.m(n).Carrier.Carried(e.f.VIP) {
			out = append(out, n)
		}
	}
	return out
}

var errUnreachable = errors.New("test: peer unreachable")

// directTarget is the in-process channel's view of the environment: cut
// links and stopped controllers are unreachable.
func (e *env) directTarget(from netip.Addr) func(netip.Addr) (*claim.Controller, error) {
	return func(peer netip.Addr) (*claim.Controller, error) {
		e.mu.Lock()
		cut := e.cut[[2]netip.Addr{from, peer}] || e.cut[[2]netip.Addr{peer, from}]
		e.mu.Unlock()
		if cut {
			return nil, fmt.Errorf("%w: %v", errUnreachable, peer)
		}
		ctl := e.ms.Running(peer)
		if ctl == nil {
			return nil, fmt.Errorf("%w: %v down", errUnreachable, peer)
		}
		return ctl, nil
	}
}

// directChannel is the members' channel in process for node from.
func (e *env) directChannel(from netip.Addr) *claimtest.DirectChannel {
	return &claimtest.DirectChannel{From: from, Target: e.directTarget(from),
		BeforeEpoch: func() error {
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.noEpoch[from] {
				return errUnreachable
			}
			return nil
		},
		AfterRelease: func() {
			if e.afterRelease != nil {
				e.afterRelease()
			}
		}}
}

// advance moves the clock in steps of 100 ms, so that each due timer runs.
func (e *env) advance(d time.Duration) {
	end := e.clock.Now().Add(d)
	for e.clock.Now().Before(end) {
		e.clock.Advance(min(100*time.Millisecond, end.Sub(e.clock.Now())))
	}
}

// bootstrap makes a the holder with a promote and lets b and c follow.
func (e *env) bootstrap() {
	e.t.Helper()
	e.start("a")
	e.start("b")
	e.start("c")
	e.advance(100 * time.Millisecond)
	res, err := e.m("a").Ctl().Promote(context.Background(), claim.PromoteOptions{})
	if err != nil {
		e.t.Fatalf("bootstrap promote: %v", err)
	}
	if res.Claim == nil || res.Claim.Epoch != 1 {
		e.t.Fatalf("bootstrap claim %v", res.Claim)
	}
	e.advance(3 * time.Second)
	if got := fmt.Sprint(e.carriers()); got != "[a]" {
		e.t.Fatalf("after bootstrap carriers = %s", got)
	}
}
