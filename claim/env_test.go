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
	kv    *memkv.KV
	hist  *claimtest.History

	mu    sync.Mutex
	nodes map[netip.Addr]*member
	cut   map[[2]netip.Addr]bool
	// noEpoch drops the epoch queries a node sends (their answers lost).
	noEpoch map[netip.Addr]bool
	// afterRelease runs after a release was answered, before the
	// requester goes on.
	afterRelease func()
}

type member struct {
	name    string
	node    claimtest.Node
	kv      *claimtest.CountingKV
	carrier *claimtest.FakeCarrier
	store   *claim.MemStore
	ctl     *claim.Controller
	cfg     claim.Config
}

func newEnv(t testing.TB, withKV bool) *env {
	e := &env{t: t, f: claimtest.NewFixture(), clock: transporttest.NewManualClock(), hist: new(claimtest.History),
		nodes: map[netip.Addr]*member{}, cut: map[[2]netip.Addr]bool{}, noEpoch: map[netip.Addr]bool{}}
	if withKV {
		e.kv = memkv.New(memkv.Options{Clock: e.clock})
		t.Cleanup(func() { e.kv.Close() })
	}
	for _, n := range []claimtest.Node{e.f.A, e.f.B, e.f.C} {
		m := &member{name: n.Name, node: n, store: new(claim.MemStore),
			carrier: claimtest.NewFakeCarrier(n.Name, e.clock, e.hist)}
		m.cfg = claim.Config{
			Policy: e.f.Policy(), Self: n.Addr, VIP: e.f.VIP,
			Carrier: m.carrier, Store: m.store, Clock: e.clock,
			Channel: e.directChannel(n.Addr), NoWatch: true,
			Peers: []netip.Addr{e.f.A.Addr, e.f.B.Addr, e.f.C.Addr},
		}
		if n.Name != "c" {
			m.cfg.Key, m.cfg.Pair = n.Key, e.f.Pair
			if withKV {
				m.kv = claimtest.NewCountingKV(e.kv)
				m.cfg.KV = m.kv
			}
		}
		e.nodes[n.Addr] = m
	}
	t.Cleanup(func() {
		for _, m := range e.nodes {
			if m.ctl != nil {
				m.ctl.Close()
			}
		}
	})
	return e
}

func (e *env) m(name string) *member {
	for _, m := range e.nodes {
		if m.name == name {
			return m
		}
	}
	e.t.Fatalf("no node %s", name)
	return nil
}

// start (re)starts a node's controller from its stored state.
func (e *env) start(name string) *claim.Controller {
	e.t.Helper()
	m := e.m(name)
	if m.ctl != nil {
		m.ctl.Close()
	}
	ctl, err := claim.NewController(m.cfg)
	if err != nil {
		e.t.Fatalf("start %s: %v", name, err)
	}
	e.mu.Lock()
	m.ctl = ctl
	e.mu.Unlock()
	if err := ctl.Start(); err != nil {
		e.t.Fatalf("start %s: %v", name, err)
	}
	return ctl
}

func (e *env) stop(name string) {
	m := e.m(name)
	if m.ctl != nil {
		m.ctl.Close()
		e.mu.Lock()
		m.ctl = nil
		e.mu.Unlock()
	}
}

// isolate cuts a node from the KV and from the channel, both ways.
func (e *env) isolate(name string, v bool) {
	m := e.m(name)
	if m.kv != nil {
		m.kv.SetDown(v)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for a := range e.nodes {
		if a != m.node.Addr {
			e.cut[[2]netip.Addr{a, m.node.Addr}] = v
			e.cut[[2]netip.Addr{m.node.Addr, a}] = v
		}
	}
}

func (e *env) carriers() []string {
	var out []string
	for _, n := range []string{"a", "b", "c"} {
		if e.m(n).carrier.Carried(e.f.VIP) {
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
		defer e.mu.Unlock()
		if e.cut[[2]netip.Addr{from, peer}] || e.cut[[2]netip.Addr{peer, from}] {
			return nil, fmt.Errorf("%w: %v", errUnreachable, peer)
		}
		m := e.nodes[peer]
		if m == nil || m.ctl == nil {
			return nil, fmt.Errorf("%w: %v down", errUnreachable, peer)
		}
		return m.ctl, nil
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
	res, err := e.m("a").ctl.Promote(context.Background(), claim.PromoteOptions{})
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
