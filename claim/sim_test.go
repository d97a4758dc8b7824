package claim_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/claimtest"
	"github.com/vipkit/vipkit/claim/memkv"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// The simulation: members a and b and observer c, each with a controller,
// etcd as the memory KV, all on one manual clock; the topology is a
// transporttest.Network of a, b, c and etcd whose cuts decide which KV
// calls and channel calls get through. A seeded schedule of partitions,
// heals, crashes, restarts, etcd leader changes and promotes runs, and an
// independent checker (below; it shares no code with the controller)
// watches the carriers' history.

type simEventKind int

const (
	evIsolate     simEventKind = iota // cut a member from everyone (etcd included)
	evReplyLost                       // cut etcd → member only: requests apply, answers are lost
	evEtcdCut                         // cut member ↔ etcd only; the channel still works
	evHeal                            // heal every link
	evCrash                           // stop a member's controller
	evRestart                         // restart it from its state
	evElection                        // etcd loses its leader for a while
	evElectionEnd                     // a new leader: leases refreshed
	evPromote                         // planned promote on a member
)

var simEventNames = [...]string{"isolate", "reply-lost", "etcd-cut", "heal", "crash", "restart", "election", "election-end", "promote"}

type simEvent struct {
	at    time.Duration
	kind  simEventKind
	node  string
	quiet bool // nothing else happens for 25 s after it
}

func (e simEvent) String() string {
	return fmt.Sprintf("%v %s %s", e.at, simEventNames[e.kind], e.node)
}

// genSchedule draws a schedule of about dur.
func genSchedule(rng *rand.Rand, dur time.Duration) []simEvent {
	var evs []simEvent
	t := 5 * time.Second
	crashed := map[string]bool{}
	electing := false
	for t < dur {
		node := []string{"a", "b"}[rng.IntN(2)]
		var e simEvent
		switch r := rng.IntN(100); {
		case r < 22:
			e = simEvent{kind: evIsolate, node: node}
		case r < 30:
			e = simEvent{kind: evReplyLost, node: node}
		case r < 36:
			e = simEvent{kind: evEtcdCut, node: node}
		case r < 56:
			e = simEvent{kind: evHeal}
		case r < 68:
			if crashed[node] {
				e = simEvent{kind: evRestart, node: node}
				crashed[node] = false
			} else {
				e = simEvent{kind: evCrash, node: node}
				crashed[node] = true
			}
		case r < 76:
			if electing {
				continue
			}
			e = simEvent{kind: evElection}
			electing = true
			e.at = t
			evs = append(evs, e)
			t += time.Duration(5+rng.IntN(4)) * time.Second
			evs = append(evs, simEvent{at: t, kind: evElectionEnd})
			electing = false
			t += time.Second
			continue
		default:
			e = simEvent{kind: evPromote, node: node}
		}
		e.at = t
		if e.kind == evIsolate && rng.IntN(2) == 0 {
			e.quiet = true
		}
		evs = append(evs, e)
		if e.quiet {
			t += 30 * time.Second
		} else {
			t += time.Duration(1+rng.IntN(25))*time.Second + time.Duration(rng.IntN(1000))*time.Millisecond
		}
	}
	return evs
}

type sim struct {
	t     testing.TB
	f     *claimtest.Fixture
	clock *transporttest.ManualClock
	net   *transporttest.Network
	kv    *memkv.KV
	hist  *claimtest.History
	rng   *rand.Rand

	netNodes map[string]*transporttest.Node
	addrName map[netip.Addr]string
	members  map[string]*simMember
	electing bool
	lastElec time.Time // when the last election ended
	loss     float64
}

type simMember struct {
	name    string
	cfg     claim.Config
	ctl     *claim.Controller
	carrier *claimtest.FakeCarrier
	store   *claim.MemStore
	// saved is the role of every state saved (the watch's reference);
	// watches holds one Watch per controller started, in order.
	saved   []claim.Role
	watches []<-chan claim.Change
}

// roleStore records the role of every State saved.
type roleStore struct {
	claim.StateStore
	m *simMember
}

func (r *roleStore) Save(st claim.State) error {
	r.m.saved = append(r.m.saved, st.Role(r.m.cfg.Self))
	return r.StateStore.Save(st)
}

// simKV is one node's view of etcd through the simulated network.
type simKV struct {
	claim.KV
	s    *sim
	node string
}

func (k *simKV) gate(f func() error) error {
	s := k.s
	n, e := s.netNodes[k.node], s.netNodes["etcd"]
	if s.electing || s.net.IsCut(n, e) || s.rng.Float64() < s.loss {
		return claimtest.ErrUnavailable
	}
	if err := f(); err != nil {
		return err
	}
	if s.net.IsCut(e, n) || s.rng.Float64() < s.loss {
		return claimtest.ErrUnavailable
	}
	return nil
}

func (k *simKV) Get(ctx context.Context, key string, prefix bool) (r claim.GetResponse, err error) {
	err = k.gate(func() error { r, err = k.KV.Get(ctx, key, prefix); return err })
	return
}
func (k *simKV) Txn(ctx context.Context, t claim.Txn) (r claim.TxnResponse, err error) {
	err = k.gate(func() error { r, err = k.KV.Txn(ctx, t); return err })
	return
}
func (k *simKV) Grant(ctx context.Context, ttl time.Duration) (id claim.LeaseID, got time.Duration, err error) {
	err = k.gate(func() error { id, got, err = k.KV.Grant(ctx, ttl); return err })
	return
}
func (k *simKV) KeepAliveOnce(ctx context.Context, id claim.LeaseID) (ttl time.Duration, err error) {
	err = k.gate(func() error { ttl, err = k.KV.KeepAliveOnce(ctx, id); return err })
	return
}
func (k *simKV) Revoke(ctx context.Context, id claim.LeaseID) error {
	return k.gate(func() error { return k.KV.Revoke(ctx, id) })
}
func (k *simKV) TimeToLive(ctx context.Context, id claim.LeaseID) (ttl time.Duration, err error) {
	err = k.gate(func() error { ttl, err = k.KV.TimeToLive(ctx, id); return err })
	return
}

// simChannel is the members' channel through the simulated network.
type simChannel struct {
	s    *sim
	from string
}

func (c *simChannel) target(peer netip.Addr) (*claim.Controller, error) {
	s := c.s
	name := s.addrName[peer]
	if name == "" || s.net.IsCut(s.netNodes[c.from], s.netNodes[name]) || s.net.IsCut(s.netNodes[name], s.netNodes[c.from]) {
		return nil, errUnreachable
	}
	m := s.members[name]
	if m.ctl == nil {
		return nil, errUnreachable
	}
	return m.ctl, nil
}

func (c *simChannel) Announce(ctx context.Context, peer netip.Addr, cl *claim.Claim) error {
	t, err := c.target(peer)
	if err != nil {
		return err
	}
	return claim.Refusal(t.HandleClaim(ctx, c.s.members[c.from].cfg.Self, cl))
}

func (c *simChannel) Release(ctx context.Context, peer netip.Addr, r *claim.Release) (*claim.Claim, error) {
	t, err := c.target(peer)
	if err != nil {
		return nil, err
	}
	cl, err := t.HandleRelease(ctx, c.s.members[c.from].cfg.Self, r)
	return cl, claim.Refusal(err)
}

func (c *simChannel) Epoch(ctx context.Context, peer netip.Addr, vip netip.Addr) (*claim.Claim, error) {
	t, err := c.target(peer)
	if err != nil {
		return nil, err
	}
	return t.HandleEpoch(ctx)
}

func newSim(t testing.TB, seed uint64) *sim {
	s := &sim{t: t, f: claimtest.NewFixture(), clock: transporttest.NewManualClock(), hist: new(claimtest.History),
		rng: rand.New(rand.NewPCG(seed, seed^0xc1a1)), netNodes: map[string]*transporttest.Node{},
		addrName: map[netip.Addr]string{}, members: map[string]*simMember{}}
	s.net = transporttest.NewNetwork(s.clock, seed)
	s.kv = memkv.New(memkv.Options{Clock: s.clock})
	for _, n := range []string{"a", "b", "c", "etcd"} {
		s.netNodes[n] = s.net.MustAddNode(n, transporttest.NodeOptions{})
	}
	for _, n := range []claimtest.Node{s.f.A, s.f.B, s.f.C} {
		m := &simMember{name: n.Name, store: new(claim.MemStore), carrier: claimtest.NewFakeCarrier(n.Name, s.clock, s.hist)}
		m.cfg = claim.Config{
			Policy: s.f.Policy(), Self: n.Addr, VIP: s.f.VIP, Carrier: m.carrier, Store: &roleStore{StateStore: m.store, m: m},
			Clock: s.clock, Channel: &simChannel{s: s, from: n.Name}, NoWatch: true,
			Peers: []netip.Addr{s.f.A.Addr, s.f.B.Addr, s.f.C.Addr},
		}
		if n.Name != "c" {
			m.cfg.Key, m.cfg.Pair = n.Key, s.f.Pair
			m.cfg.KV = &simKV{KV: s.kv, s: s, node: n.Name}
		}
		s.members[n.Name] = m
		s.addrName[n.Addr] = n.Name
	}
	return s
}

func (s *sim) start(name string) {
	m := s.members[name]
	ctl, err := claim.NewController(m.cfg)
	if err != nil {
		s.t.Fatalf("start %s: %v", name, err)
	}
	m.ctl = ctl
	// A queue longer than any schedule's changes: the check below reads
	// the changes only at the end and must see every one.
	m.watches = append(m.watches, ctl.Watch(context.Background(), 1<<16))
	if err := ctl.Start(); err != nil {
		s.t.Fatalf("start %s: %v", name, err)
	}
}

func (s *sim) close() {
	for _, m := range s.members {
		if m.ctl != nil {
			m.ctl.Close()
		}
	}
	s.net.Close()
	s.kv.Close()
}

// checker is the independent history checker. It knows only the carriers'
// events, the schedule it is told about, and its own record of cuts.
type checker struct {
	clock     *transporttest.ManualClock
	carrying  map[string]bool
	cutFrom   map[string]time.Time // member → when it lost etcd (zero: connected)
	fencedCut map[string]bool      // dropped while cut from etcd, outside a crash or a release
	busy      map[string]string    // member → "crash" or "promote" while one runs
	failures  []string
}

func newChecker(clock *transporttest.ManualClock) *checker {
	return &checker{clock: clock, carrying: map[string]bool{}, cutFrom: map[string]time.Time{},
		fencedCut: map[string]bool{}, busy: map[string]string{}}
}

func (c *checker) fail(format string, args ...any) {
	c.failures = append(c.failures, fmt.Sprintf("%v: ", c.clock.Now().Sub(transporttest.Epoch))+fmt.Sprintf(format, args...))
}

func (c *checker) event(ev claimtest.Event) {
	switch ev.Kind {
	case claimtest.Carry:
		for n, on := range c.carrying {
			if on && n != ev.Node {
				c.fail("%s carries while %s carries", ev.Node, n)
			}
		}
		if c.fencedCut[ev.Node] {
			c.fail("%s carries again by itself after it was cut off and dropped", ev.Node)
		}
		c.carrying[ev.Node] = true
	case claimtest.Drop:
		c.carrying[ev.Node] = false
		if !c.cutFrom[ev.Node].IsZero() && c.busy[ev.Node] == "" && !c.anyPromote() {
			c.fencedCut[ev.Node] = true
		}
	}
}

func (c *checker) anyPromote() bool {
	for _, v := range c.busy {
		if v == "promote" {
			return true
		}
	}
	return false
}

func (c *checker) carriers() []string {
	var out []string
	for n, on := range c.carrying {
		if on {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// runSchedule runs one seeded schedule and returns the checker's failures.
func runSchedule(t testing.TB, seed uint64, dur time.Duration) (fails []string, sched []simEvent) {
	s := newSim(t, seed)
	defer s.close()
	ck := newChecker(s.clock)
	s.hist.OnEvent(ck.event)
	sched = genSchedule(s.rng, dur)
	ctx := context.Background()
	for _, n := range []string{"a", "b", "c"} {
		s.start(n)
	}
	s.clock.Advance(time.Second)
	if _, err := s.members["a"].ctl.Promote(ctx, claim.PromoteOptions{}); err != nil {
		return []string{"bootstrap promote: " + err.Error()}, sched
	}
	s.clock.Advance(3 * time.Second)
	s.loss = float64(s.rng.IntN(3)) / 100 // 0 to 2 % of calls lost from now on
	etcd := s.netNodes["etcd"]
	other := map[string]string{"a": "b", "b": "a"}

	for _, ev := range sched {
		s.clock.AdvanceTo(transporttest.Epoch.Add(ev.at))
		n := s.netNodes[ev.node]
		switch ev.kind {
		case evIsolate, evReplyLost, evEtcdCut:
			switch ev.kind {
			case evIsolate:
				s.net.Isolate(n)
			case evReplyLost:
				s.net.Cut(etcd, n)
			case evEtcdCut:
				s.net.CutBoth(n, etcd)
			}
			if ck.cutFrom[ev.node].IsZero() {
				ck.cutFrom[ev.node] = s.clock.Now()
			}
			// A cut-off holder drops within 10 s of the cut.
			name, cutAt, wasCarrying := ev.node, ck.cutFrom[ev.node], ck.carrying[ev.node]
			s.clock.AfterFunc(claim.DefaultDropAfter+time.Millisecond, func() {
				if wasCarrying && ck.cutFrom[name] == cutAt && ck.carrying[name] {
					ck.fail("%s still carries 10 s after it was cut from etcd", name)
				}
			})
			// The replica carries once the lease expired, when nothing
			// else happens and it is able to claim.
			if ev.kind == evIsolate && ev.quiet && wasCarrying {
				o := s.members[other[ev.node]]
				// An election refreshes leases to TTL + election timeout.
				recentElection := !s.lastElec.IsZero() && s.clock.Now().Sub(s.lastElec) < claim.DefaultLeaseTTL+claim.DefaultElectionTimeout
				if o.ctl != nil && ck.cutFrom[o.name].IsZero() && !s.electing && !recentElection {
					st := o.ctl.Status()
					held := s.members[name].ctl.Status()
					if !st.Fenced && !st.Released && st.Epoch == held.Epoch && st.Holder == held.Holder {
						on := o.name
						// One renewal step after the lease's TTL; with calls
						// lost at random, a few more steps of retries.
						within := claim.DefaultLeaseTTL + claim.DefaultRenewInterval + 100*time.Millisecond
						if s.loss > 0 {
							within += 3 * claim.DefaultRenewInterval
						}
						s.clock.AfterFunc(within, func() {
							if ck.cutFrom[name] == cutAt && !ck.carrying[on] {
								ck.fail("replica %s does not carry %v after the holder %s was cut off", on, within, name)
							}
						})
					}
				}
			}
		case evHeal:
			s.net.Heal()
			clear(ck.cutFrom)
		case evCrash:
			if m := s.members[ev.node]; m.ctl != nil {
				ck.busy[ev.node] = "crash"
				m.ctl.Close()
				m.ctl = nil
				delete(ck.busy, ev.node)
			}
		case evRestart:
			if s.members[ev.node].ctl == nil {
				s.start(ev.node)
			}
		case evElection:
			s.electing = true
			// No leader, no expiry: leases outlive the election.
			s.kv.LeaderChange(10 * time.Second)
		case evElectionEnd:
			s.electing = false
			s.lastElec = s.clock.Now()
			s.kv.LeaderChange(claim.DefaultElectionTimeout)
		case evPromote:
			if m := s.members[ev.node]; m.ctl != nil {
				ck.busy[ev.node] = "promote"
				ck.fencedCut[ev.node] = false
				_, _ = m.ctl.Promote(ctx, claim.PromoteOptions{})
				delete(ck.busy, ev.node)
			}
		}
	}
	// The end: heal everything, restart, settle; promote if nobody holds.
	s.clock.AdvanceTo(transporttest.Epoch.Add(dur))
	s.net.Heal()
	s.loss = 0
	clear(ck.cutFrom)
	if s.electing {
		s.electing = false
		s.kv.LeaderChange(claim.DefaultElectionTimeout)
	}
	for _, n := range []string{"a", "b"} {
		if s.members[n].ctl == nil {
			s.start(n)
		}
	}
	s.clock.Advance(30 * time.Second)
	if len(ck.carriers()) == 0 {
		who := []string{"a", "b"}[s.rng.IntN(2)]
		ck.busy[who] = "promote"
		ck.fencedCut[who] = false
		if _, err := s.members[who].ctl.Promote(ctx, claim.PromoteOptions{}); err != nil {
			g, _ := s.kv.Get(ctx, "/", true)
			var keys []string
			for _, kv := range g.KVs {
				c, _ := claim.ParseClaim(kv.Value)
				keys = append(keys, fmt.Sprintf("%s=%v lease %d", kv.Key, c, kv.Lease))
			}
			ck.fail("final promote on %s: %v\n a: %+v %+v\n b: %+v %+v\n keys: %v", who, err,
				s.members["a"].ctl.Status(), s.members["a"].ctl.State(), s.members["b"].ctl.Status(), s.members["b"].ctl.State(), keys)
		}
		delete(ck.busy, who)
		s.clock.Advance(30 * time.Second)
	}
	cs := ck.carriers()
	if len(cs) != 1 {
		ck.fail("after healing, carriers = %v", cs)
	} else {
		holder := s.members[cs[0]].cfg.Self
		for _, n := range []string{"a", "b", "c"} {
			if n == cs[0] {
				continue
			}
			if got := s.members[n].carrier.RoutedTo(s.f.VIP); got != holder {
				ck.fail("%s routes the vip to %v, holder is %s (%+v)", n, got, cs[0], s.members[n].ctl.Status())
			}
		}
		if st := s.members[cs[0]].ctl.Status(); st.Role != claim.RoleHolder || !st.Carried {
			ck.fail("carrier %s has status %+v", cs[0], st)
		}
	}
	for _, n := range []string{"a", "b", "c"} {
		if m := s.members[n]; m.ctl != nil {
			m.ctl.Close()
			m.ctl = nil
		}
		ck.failures = append(ck.failures, checkWatch(s.members[n])...)
	}
	return ck.failures, sched
}

// checkWatch compares the roles m's watches reported, read after every
// controller of m closed, with the roles of the states m saved: the same
// role changes in the same order, numbered without a gap.
func checkWatch(m *simMember) []string {
	var fails []string
	var got []claim.Role
	for i, ch := range m.watches {
		var last uint64
		first := true
		for {
			var c claim.Change
			var ok bool
			select {
			case c, ok = <-ch:
			case <-time.After(10 * time.Second):
				return append(fails, fmt.Sprintf("%s: watch %d not closed after Close", m.name, i))
			}
			if !ok {
				break
			}
			if c.Missed != 0 || (!first && c.Seq != last+1) {
				fails = append(fails, fmt.Sprintf("%s: watch %d: seq %d after %d, missed %d", m.name, i, c.Seq, last, c.Missed))
			}
			first, last = false, c.Seq
			got = append(got, c.Role)
		}
	}
	want := append([]claim.Role{claim.RoleReplica}, m.saved...)
	if g, w := slices.Compact(got), slices.Compact(want); !slices.Equal(g, w) {
		fails = append(fails, fmt.Sprintf("%s: watched roles %v, saved roles %v", m.name, g, w))
	}
	return fails
}

func TestSimulatedSchedules(t *testing.T) {
	base := testenv.Seed(t, 0x6b65656c)
	n := 300
	if testing.Short() {
		n = 50
	}
	if testenv.Long() {
		n = 10_000
	}
	for i := 0; i < n; i++ {
		seed := base + uint64(i)
		fails, sched := runSchedule(t, seed, 5*time.Minute)
		if len(fails) > 0 {
			var sb strings.Builder
			for _, e := range sched {
				sb.WriteString("\n  " + e.String())
			}
			t.Fatalf("schedule seed %d (repeat with VIPKIT_SEED=%d, schedule %d of this run):\n%s\nschedule:%s",
				seed, seed, i, strings.Join(fails, "\n"), sb.String())
		}
	}
}

// TestCheckerCatchesTwoCarriers makes sure the checker is not vacuous: a
// carrier that ignores the fence is caught.
func TestCheckerCatchesTwoCarriers(t *testing.T) {
	clock := transporttest.NewManualClock()
	ck := newChecker(clock)
	ck.event(claimtest.Event{Node: "a", Kind: claimtest.Carry})
	ck.event(claimtest.Event{Node: "b", Kind: claimtest.Carry})
	if len(ck.failures) != 1 {
		t.Fatalf("two carriers not caught: %v", ck.failures)
	}
	ck = newChecker(clock)
	ck.cutFrom["a"] = clock.Now().Add(time.Nanosecond)
	ck.event(claimtest.Event{Node: "a", Kind: claimtest.Carry})
	ck.event(claimtest.Event{Node: "a", Kind: claimtest.Drop})
	ck.event(claimtest.Event{Node: "a", Kind: claimtest.Carry})
	if len(ck.failures) != 1 || !errors.Is(nil, nil) {
		t.Fatalf("re-carry after a cut-off drop not caught: %v", ck.failures)
	}
}
