package claim_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/claimtest"
	"github.com/vipkit/vipkit/transport/transporttest"
)

func TestControllerClaimRenewRoundTrips(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	a := e.m("a")
	// Steady holder: exactly one KV round trip (the renewal) per 2 s.
	before := a.KV.Counts()
	e.advance(20 * time.Second)
	d := a.KV.Counts().Sub(before)
	if d.KeepAlive != 10 || d.Total() != 10 {
		t.Fatalf("holder over 20 s: %+v, want 10 keep-alives and nothing else", d)
	}
	if st := a.Ctl().Status(); st.Role != claim.RoleHolder || !st.Carried || st.Epoch != 1 || st.RenewalAge >= 2*time.Second {
		t.Fatalf("holder status %+v", st)
	}
	if got := e.m("b").Carrier.RoutedTo(e.f.VIP); got != e.f.A.Addr {
		t.Fatalf("b routes the vip to %v", got)
	}
	if got := e.m("c").Carrier.RoutedTo(e.f.VIP); got != e.f.A.Addr {
		t.Fatalf("observer c routes the vip to %v (announce)", got)
	}
}

func TestFailoverRoundTripsPerClaim(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	b := e.m("b")
	e.isolate("a", true)
	// Count b's calls in the step that claims: the read of the counter and
	// the transaction, with the lease granted ahead.
	var claimed claimtest.Counts
	for i := 0; i < 300 && !b.Carrier.Carried(e.f.VIP); i++ {
		before := b.KV.Counts()
		e.clock.Step()
		claimed = b.KV.Counts().Sub(before)
	}
	if !b.Carrier.Carried(e.f.VIP) {
		t.Fatal("b never claimed")
	}
	if claimed.Txn != 1 || claimed.Get != 1 || claimed.Grant != 0 {
		t.Fatalf("claiming step: %+v, want 1 get + 1 txn (+ the renewal), no grant", claimed)
	}
	if claimed.Get+claimed.Txn > 2 {
		t.Fatalf("claim took %d round trips", claimed.Get+claimed.Txn)
	}
}

func TestPartitionedHolderDropsThenReplicaCarries(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	a := e.m("a")
	// Align: right after a renewal.
	e.advance(2 * time.Second)
	lastRenew := e.clock.Now().Add(-a.Ctl().Status().RenewalAge)
	cut := e.clock.Now()
	e.isolate("a", true)
	var dropAt, carryAt time.Time
	carrying := map[string]bool{"a": true}
	e.hist.OnEvent(func(ev claimtest.Event) {
		switch ev.Kind {
		case claimtest.Carry:
			carrying[ev.Node] = true
		case claimtest.Drop:
			carrying[ev.Node] = false
		}
		switch {
		case ev.Node == "a" && ev.Kind == claimtest.Drop:
			dropAt = ev.At
		case ev.Node == "b" && ev.Kind == claimtest.Carry:
			carryAt = ev.At
		}
		if carrying["a"] && carrying["b"] {
			t.Errorf("two carriers at %v", ev.At)
		}
	})
	e.advance(30 * time.Second)
	if dropAt.IsZero() || dropAt.Sub(lastRenew) != claim.DefaultDropAfter {
		t.Fatalf("a dropped at %v, %v after its last answered renewal; want exactly 10 s", dropAt, dropAt.Sub(lastRenew))
	}
	if dropAt.Sub(cut) > 10*time.Second {
		t.Fatalf("partitioned holder dropped %v after the cut", dropAt.Sub(cut))
	}
	if carryAt.IsZero() || carryAt.Sub(lastRenew) < claim.DefaultLeaseTTL || carryAt.Sub(lastRenew) > claim.DefaultLeaseTTL+claim.DefaultRenewInterval {
		t.Fatalf("b carried %v after a's last renewal; want within [20 s, 22 s]", carryAt.Sub(lastRenew))
	}
	if st := a.Ctl().Status(); !st.Fenced || st.Carried {
		t.Fatalf("a after the partition: %+v", st)
	}
	// Heal: a takes the newer claim, stays fenced, never claims again.
	e.isolate("a", false)
	e.advance(5 * time.Second)
	st := a.Ctl().Status()
	if !st.Fenced || st.Epoch != 2 || st.Holder != e.f.B.Addr || st.RoutedTo != e.f.B.Addr {
		t.Fatalf("healed a: %+v", st)
	}
	// Even when b's lease goes, a does not claim by itself.
	e.stop("b")
	e.advance(60 * time.Second)
	if a.Carrier.Carried(e.f.VIP) {
		t.Fatal("fenced old primary carried the vip by itself")
	}
	// Only a promote on a clears the fence.
	res, err := a.Ctl().Promote(context.Background(), claim.PromoteOptions{OldPrimaryGone: true})
	if err != nil || res.Claim == nil || res.Claim.Epoch != 3 || !a.Carrier.Carried(e.f.VIP) {
		t.Fatalf("promote on a: %+v %v", res, err)
	}
}

func TestReplyLostCountsAsNoRenewal(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	a := e.m("a")
	a.KV.SetReplyLost(true) // renewals reach etcd, answers are lost
	e.advance(10*time.Second + 100*time.Millisecond)
	if a.Carrier.Carried(e.f.VIP) {
		t.Fatal("holder kept the vip 10 s without an answered renewal")
	}
	if !a.Ctl().Status().Fenced {
		t.Fatal("holder not fenced after dropping")
	}
}

func TestLeaderChangeDoesNotMoveVIP(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	e.advance(2 * time.Second)
	// etcd re-elects for 5 s: renewals fail, then every lease is refreshed.
	for _, n := range []string{"a", "b"} {
		e.m(n).KV.SetDown(true)
	}
	e.advance(5 * time.Second)
	e.mkv.LeaderChange(claim.DefaultElectionTimeout)
	for _, n := range []string{"a", "b"} {
		e.m(n).KV.SetDown(false)
	}
	e.advance(30 * time.Second)
	if got := fmt.Sprint(e.carriers()); got != "[a]" {
		t.Fatalf("after a 5 s election carriers = %s", got)
	}
}

func TestRestartCarriesOnlyAfterOwnRenewal(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	a := e.m("a")
	e.stop("a")
	if a.Carrier.Carried(e.f.VIP) {
		t.Fatal("stopped controller left the vip carried")
	}
	// Restart while etcd is unreachable: nothing is carried.
	a.KV.SetDown(true)
	e.start("a")
	e.advance(5 * time.Second)
	if a.Carrier.Carried(e.f.VIP) {
		t.Fatal("restarted holder carried before renewing its lease")
	}
	a.KV.SetDown(false)
	e.advance(3 * time.Second)
	if !a.Carrier.Carried(e.f.VIP) {
		t.Fatal("restarted holder did not carry after renewing its live lease")
	}
}

func TestRebootedHolderAfterFailoverStaysOff(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	a, b := e.m("a"), e.m("b")
	e.stop("a")
	e.advance(25 * time.Second)
	if !b.Carrier.Carried(e.f.VIP) {
		t.Fatal("b did not take over from a stopped holder")
	}
	// a's state still names its old lease.
	if st, _ := a.Store.Load(); st.Lease == 0 || st.Held.Holder != e.f.A.Addr {
		t.Fatalf("a's stored state %+v", st)
	}
	e.start("a")
	e.advance(10 * time.Second)
	st := a.Ctl().Status()
	if a.Carrier.Carried(e.f.VIP) || st.Holder != e.f.B.Addr || !st.Fenced {
		t.Fatalf("rebooted old holder: carried=%v %+v", a.Carrier.Carried(e.f.VIP), st)
	}
}

func TestPlannedPromoteWithKV(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	a, b := e.m("a"), e.m("b")
	var order []string
	e.hist.OnEvent(func(ev claimtest.Event) {
		if ev.Kind != claimtest.Route {
			order = append(order, ev.Node+" "+ev.Kind.String())
		}
	})
	before, beforeA := b.KV.Counts(), a.KV.Counts()
	res, err := b.Ctl().Promote(context.Background(), claim.PromoteOptions{})
	if err != nil || res.Claim == nil || res.Claim.Epoch != 2 {
		t.Fatalf("promote b: %+v %v", res, err)
	}
	// The round trips of a planned move: b reads the keys, a drops the
	// address and answers the release with no KV call, b claims at once
	// with the transaction that replaces a's holder key (no second read,
	// no wait for a's revoke).
	if got, want := b.KV.Counts().Sub(before), (claimtest.Counts{Get: 1, Txn: 1}); got != want {
		t.Errorf("b's KV calls in the promote: %+v, want %+v", got, want)
	}
	if got, want := a.KV.Counts().Sub(beforeA), (claimtest.Counts{}); got != want {
		t.Errorf("a's KV calls in the release: %+v, want %+v", got, want)
	}
	if fmt.Sprint(order) != "[a drop b carry]" {
		t.Fatalf("order %v, want the holder to drop before b carries", order)
	}
	st := a.Ctl().Status()
	if !st.Released && st.Epoch != 2 {
		t.Fatalf("a after release: %+v", st)
	}
	e.advance(5 * time.Second)
	st = a.Ctl().Status()
	if st.Fenced || st.Released || st.Holder != e.f.B.Addr {
		t.Fatalf("a after the move: %+v (a node that released is not fenced)", st)
	}
	// a's next steps revoked the lease it released; b's holder key, on b's
	// lease, is untouched.
	if got := a.KV.Counts().Sub(beforeA).Revoke; got != 1 {
		t.Errorf("a revoked %d leases after the release, want 1", got)
	}
	g, err := e.mkv.Get(context.Background(), claim.KeysFor(e.f.Mesh, e.f.VIP).Holder, false)
	if err != nil || len(g.KVs) != 1 {
		t.Fatalf("holder key after a's revoke: %+v %v", g, err)
	}
	if hc, err := claim.ParseClaim(g.KVs[0].Value); err != nil || hc.Holder != e.f.B.Addr || hc.Epoch != 2 {
		t.Fatalf("holder key holds %+v %v, want b's epoch 2", hc, err)
	}
	if !b.Carrier.Carried(e.f.VIP) || a.Carrier.Carried(e.f.VIP) {
		t.Fatalf("carriers after a's revoke: %v", e.carriers())
	}
	if got := e.m("c").Carrier.RoutedTo(e.f.VIP); got != e.f.B.Addr {
		t.Fatalf("observer routes to %v after the move", got)
	}
	// a, a normal replica now, fails over when b goes.
	e.stop("b")
	e.advance(25 * time.Second)
	if !a.Carrier.Carried(e.f.VIP) {
		t.Fatal("a (released, then replica) did not fail over")
	}
}

func TestPromoteHolderUnreachable(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	b := e.m("b")
	e.mu.Lock()
	e.cut[[2]netip.Addr{e.f.B.Addr, e.f.A.Addr}] = true
	e.mu.Unlock()
	_, err := b.Ctl().Promote(context.Background(), claim.PromoteOptions{})
	if !errors.Is(err, claim.ErrHolderUnreachable) {
		t.Fatalf("promote without an answer: %v", err)
	}
	if b.Carrier.Carried(e.f.VIP) {
		t.Fatal("refused promote carried")
	}
}

func TestReleaseOnlyFromOtherMember(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	a := e.m("a")
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		by   claimtest.Node
		from netip.Addr
		next uint64
		want error
	}{
		{"outsider", e.f.D, e.f.D.Addr, 2, claim.ErrNotPairMember},
		{"observer", e.f.C, e.f.C.Addr, 2, claim.ErrNotPairMember},
		{"wrong sender", e.f.B, e.f.C.Addr, 2, claim.ErrWrongSender},
		{"stale", e.f.B, e.f.B.Addr, 1, claim.ErrStale},
		{"jump", e.f.B, e.f.B.Addr, 66, claim.ErrEpochJump},
	} {
		r, err := claim.NewRelease(tc.by.Key, e.f.Mesh, e.f.VIP, tc.by.Addr, tc.next)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Ctl().HandleRelease(ctx, tc.from, r); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if !a.Carrier.Carried(e.f.VIP) {
		t.Fatal("a refused release dropped the vip")
	}
}

func TestPromoteWithoutKV(t *testing.T) {
	e := newEnv(t, false)
	for _, n := range []string{"a", "b", "c"} {
		e.start(n)
	}
	a, b := e.m("a"), e.m("b")
	res, err := a.Ctl().Promote(context.Background(), claim.PromoteOptions{})
	if err != nil || !a.Carrier.Carried(e.f.VIP) || res.Taken != 2 || res.Answered != 2 {
		t.Fatalf("first promote: %+v %v", res, err)
	}
	// Planned move to b: a drops first, b carries epoch 2.
	res, err = b.Ctl().Promote(context.Background(), claim.PromoteOptions{})
	if err != nil || res.Claim.Epoch != 2 || a.Carrier.Carried(e.f.VIP) || !b.Carrier.Carried(e.f.VIP) {
		t.Fatalf("move to b: %+v %v carriers %v", res, err, e.carriers())
	}
	if e.m("c").Carrier.RoutedTo(e.f.VIP) != e.f.B.Addr {
		t.Fatal("observer did not learn the move")
	}
	// b unreachable: a's promote refuses unless the old primary is gone.
	e.isolate("b", true)
	if _, err := a.Ctl().Promote(context.Background(), claim.PromoteOptions{}); !errors.Is(err, claim.ErrHolderUnreachable) {
		t.Fatalf("promote with the holder unreachable: %v", err)
	}
	// With c also unreachable, no peer answers: no majority, nothing carried.
	e.isolate("c", true)
	if _, err := a.Ctl().Promote(context.Background(), claim.PromoteOptions{OldPrimaryGone: true}); !errors.Is(err, claim.ErrNoMajority) {
		t.Fatalf("promote with no peer answering: %v", err)
	}
	if a.Carrier.Carried(e.f.VIP) {
		t.Fatal("promote without a majority carried")
	}
	e.isolate("c", false)
	res, err = a.Ctl().Promote(context.Background(), claim.PromoteOptions{OldPrimaryGone: true})
	if err != nil || !a.Carrier.Carried(e.f.VIP) || res.Claim.Epoch != 3 {
		t.Fatalf("promote with the old primary gone: %+v %v", res, err)
	}
}

// TestWithoutKVHolderAnnouncesUntilAnswered: without a KV, a peer that was
// unreachable when the VIP moved learns of the move from the holder's next
// step once it is back, and a peer that answered is not asked again.
func TestWithoutKVHolderAnnouncesUntilAnswered(t *testing.T) {
	e := newEnv(t, false)
	for _, n := range []string{"a", "b", "c"} {
		e.start(n)
	}
	a, c := e.m("a"), e.m("c")
	e.isolate("c", true)
	res, err := a.Ctl().Promote(context.Background(), claim.PromoteOptions{})
	if err != nil || res.Taken != 1 || res.Answered != 1 || !a.Carrier.Carried(e.f.VIP) {
		t.Fatalf("promote with c unreachable: %+v %v", res, err)
	}
	if got := c.Carrier.RoutedTo(e.f.VIP); got.IsValid() {
		t.Fatalf("unreachable c routed the VIP to %v", got)
	}
	// Still unreachable: every step tries again and fails.
	e.advance(3 * claim.DefaultRenewInterval)
	if got := c.Carrier.RoutedTo(e.f.VIP); got.IsValid() {
		t.Fatalf("unreachable c routed the VIP to %v", got)
	}
	failed := a.Ctl().Stats().AnnounceErrs
	if failed < 3 {
		t.Fatalf("%d failed announcements over three steps, want at least 3", failed)
	}
	e.isolate("c", false)
	e.advance(claim.DefaultRenewInterval)
	if got := c.Carrier.RoutedTo(e.f.VIP); got != e.f.A.Addr {
		t.Fatalf("c routes the VIP to %v after it came back, want a", got)
	}
	st := a.Ctl().Stats()
	e.advance(5 * claim.DefaultRenewInterval)
	if st2 := a.Ctl().Stats(); st2.Announced != st.Announced || st2.AnnounceErrs != st.AnnounceErrs {
		t.Fatalf("announced again to peers that had answered: %+v then %+v", st, st2)
	}
}

func TestPromoteWithoutKVMajorityRefuses(t *testing.T) {
	e := newEnv(t, false)
	for _, n := range []string{"a", "b", "c"} {
		e.start(n)
	}
	a, b := e.m("a"), e.m("b")
	if _, err := a.Ctl().Promote(context.Background(), claim.PromoteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Ctl().Promote(context.Background(), claim.PromoteOptions{}); err != nil {
		t.Fatal(err)
	}
	// a loses its state and its epoch queries go unanswered: it proposes
	// epoch 1, which b and c (holding 2) refuse as stale.
	e.stop("a")
	a.Store.Save(claim.State{})
	e.start("a")
	e.mu.Lock()
	e.noEpoch[e.f.A.Addr] = true
	e.mu.Unlock()
	res, err := a.Ctl().Promote(context.Background(), claim.PromoteOptions{})
	if !errors.Is(err, claim.ErrNoMajority) || res.Taken != 0 || res.Answered != 2 {
		t.Fatalf("promote refused by every peer: %+v %v", res, err)
	}
	if a.Carrier.Carried(e.f.VIP) || !b.Carrier.Carried(e.f.VIP) {
		t.Fatalf("carriers after a refused promote: %v", e.carriers())
	}
}

func TestPromoteReportsOwnControllerClaim(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	b := e.m("b")
	// Between the release and the promote's transaction, b's own controller
	// steps: it sees the holder key gone and claims first.
	e.afterRelease = func() {
		e.afterRelease = nil
		e.clock.Advance(claim.DefaultRenewInterval)
	}
	res, err := b.Ctl().Promote(context.Background(), claim.PromoteOptions{})
	if err != nil || !res.ByController || res.Claim == nil || res.Claim.Holder != e.f.B.Addr {
		t.Fatalf("promote raced by its own controller: %+v %v", res, err)
	}
	if !b.Carrier.Carried(e.f.VIP) || e.m("a").Carrier.Carried(e.f.VIP) {
		t.Fatalf("carriers %v", e.carriers())
	}
}

func TestFencedHolderRefusesRelease(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	a := e.m("a")
	a.KV.SetDown(true)
	e.advance(11 * time.Second)
	r, _ := claim.NewRelease(e.f.B.Key, e.f.Mesh, e.f.VIP, e.f.B.Addr, 2)
	if _, err := a.Ctl().HandleRelease(context.Background(), e.f.B.Addr, r); !errors.Is(err, claim.ErrFenced) {
		t.Fatalf("release asked of a fenced holder: %v", err)
	}
}

func TestInvalidHolderValueDoesNotBlockFailover(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	b := e.m("b")
	e.stop("a")
	// Someone with etcd access overwrites the holder key with a value that
	// is not a valid claim, on no lease: it would never expire.
	keys := claim.KeysFor(e.f.Mesh, e.f.VIP)
	tampered := bytes.Clone(e.f.Claim(e.f.A, 1).Encode())
	tampered[len(tampered)-1] ^= 1
	if _, err := e.mkv.Txn(context.Background(), claim.Txn{Then: []claim.Op{claim.Put(keys.Holder, tampered, 0)}}); err != nil {
		t.Fatal(err)
	}
	e.advance(3 * time.Second)
	if !b.Carrier.Carried(e.f.VIP) {
		t.Fatal("an invalid holder value blocked the failover")
	}
	if b.Ctl().Stats().BadValues == 0 {
		t.Fatal("the invalid value was not counted")
	}
	if st := b.Ctl().Status(); st.Epoch != 2 {
		t.Fatalf("b after failover: %+v", st)
	}
}

func TestObserverFollowsKeysWithoutLease(t *testing.T) {
	e := newEnv(t, true)
	c := e.m("c")
	kv := claimtest.NewCountingKV(e.mkv)
	c.Cfg.KV = kv
	e.bootstrap()
	e.advance(3 * time.Second)
	if got := c.Carrier.RoutedTo(e.f.VIP); got != e.f.A.Addr {
		t.Fatalf("observer routes to %v", got)
	}
	e.stop("a")
	e.advance(25 * time.Second)
	if got := c.Carrier.RoutedTo(e.f.VIP); got != e.f.B.Addr {
		t.Fatalf("observer routes to %v after the failover", got)
	}
	if n := kv.Counts(); n.Grant != 0 || n.KeepAlive != 0 || n.Txn != 0 {
		t.Fatalf("observer wrote to the kv: %+v", n)
	}
	if e.mkv.Leases() != 1 {
		t.Fatalf("%d leases, want b's only", e.mkv.Leases())
	}
}

// suspendClock is CLOCK_BOOTTIME over a manual clock: Suspend moves Now
// forward without running timers, as a suspended machine's Go timers
// (CLOCK_MONOTONIC) stand still while CLOCK_BOOTTIME counts on.
type suspendClock struct {
	*transporttest.ManualClock // +checklocksignore: set at construction, read-only after

	// mu guards slept.
	mu sync.Mutex
	// +checklocks:mu
	slept time.Duration
}

func (s *suspendClock) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ManualClock.Now().Add(s.slept)
}

func (s *suspendClock) Suspend(d time.Duration) {
	s.mu.Lock()
	s.slept += d
	s.mu.Unlock()
}

func TestHolderWakingFromSuspendDrops(t *testing.T) {
	e := newEnv(t, true)
	sc := &suspendClock{ManualClock: e.clock}
	a := e.m("a")
	a.Cfg.Clock = sc
	e.bootstrap()
	e.advance(2 * time.Second)
	if !a.Carrier.Carried(e.f.VIP) {
		t.Fatal("a does not carry")
	}
	sc.Suspend(time.Minute)
	// The first timer after the wake-up: the renewal is a minute old on
	// CLOCK_BOOTTIME, so the VIP goes before anything else happens.
	e.clock.Step()
	if a.Carrier.Carried(e.f.VIP) {
		t.Fatal("holder woken from a one-minute suspend still carries")
	}
	if st := a.Ctl().Status(); !st.Fenced {
		t.Fatalf("woken holder not fenced: %+v", st)
	}
	// a's fence abandons its lease (revoked at once), so b may take over
	// right away, but only after a dropped.
	dropped := false
	for _, ev := range e.hist.Events() {
		switch {
		case ev.Node == "a" && ev.Kind == claimtest.Drop:
			dropped = true
		case ev.Node == "b" && ev.Kind == claimtest.Carry && !dropped:
			t.Fatal("b carried before the woken holder dropped")
		}
	}
	if !dropped {
		t.Fatal("no drop recorded")
	}
}

func TestReleaseRefusedWhenDropFails(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	a, b := e.m("a"), e.m("b")
	a.Carrier.SetFail(errors.New("netlink: busy"))
	_, err := b.Ctl().Promote(context.Background(), claim.PromoteOptions{})
	if err == nil || !errors.Is(err, claim.ErrHolderUnreachable) {
		t.Fatalf("promote whose holder could not drop: %v", err)
	}
	if b.Carrier.Carried(e.f.VIP) {
		t.Fatal("b carries while a could not drop")
	}
	a.Carrier.SetFail(nil)
	if _, err := b.Ctl().Promote(context.Background(), claim.PromoteOptions{}); err != nil || !b.Carrier.Carried(e.f.VIP) || a.Carrier.Carried(e.f.VIP) {
		t.Fatalf("retried promote: %v, carriers %v", err, e.carriers())
	}
}

// TestEveryRenewalExtendsTheCarryDeadline: with a KV, the holder hands the
// carrier the absolute drop deadline (DropAfter after the send of the last
// answered renewal), and every answered renewal moves it on; a renewal
// that goes unanswered does not.
func TestEveryRenewalExtendsTheCarryDeadline(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	a := e.m("a")
	for i := 0; i < 5; i++ {
		e.advance(2 * time.Second)
		st := a.Ctl().Status()
		lastRenew := e.clock.Now().Add(-st.RenewalAge)
		if got, want := a.Carrier.Deadline(e.f.VIP), lastRenew.Add(claim.DefaultDropAfter); !got.Equal(want) {
			t.Fatalf("round %d: deadline %v, want %v (10 s after the last answered renewal)", i, got, want)
		}
	}
	before := a.Carrier.Deadline(e.f.VIP)
	a.KV.SetReplyLost(true)
	e.advance(4 * time.Second)
	if got := a.Carrier.Deadline(e.f.VIP); !got.Equal(before) {
		t.Fatalf("unanswered renewals moved the deadline from %v to %v", before, got)
	}
}

// TestWithoutKVCarriesWithoutDeadline: without etcd there is no lease, and
// the address is carried with no deadline (forever).
func TestWithoutKVCarriesWithoutDeadline(t *testing.T) {
	e := newEnv(t, false)
	e.start("a")
	e.start("b")
	e.start("c")
	a := e.m("a")
	if _, err := a.Ctl().Promote(context.Background(), claim.PromoteOptions{}); err != nil {
		t.Fatal(err)
	}
	if !a.Carrier.Carried(e.f.VIP) || !a.Carrier.Deadline(e.f.VIP).IsZero() {
		t.Fatalf("carried %v deadline %v, want carried with none", a.Carrier.Carried(e.f.VIP), a.Carrier.Deadline(e.f.VIP))
	}
}

// TestPromoteGoneReportsOwnControllerClaim: after the holder died, a
// promote --old-primary-gone waits for its lease; when this node's own
// controller claims first once the lease is gone, the promote reports
// that this node holds the VIP instead of failing the wait.
func TestPromoteGoneReportsOwnControllerClaim(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	e.stop("a")
	b := e.m("b")
	type result struct {
		res claim.PromoteResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := b.Ctl().Promote(context.Background(), claim.PromoteOptions{OldPrimaryGone: true})
		done <- result{res, err}
	}()
	for i := 0; ; i++ {
		select {
		case r := <-done:
			if r.err != nil || r.res.Claim == nil || r.res.Claim.Holder != e.f.B.Addr || !b.Carrier.Carried(e.f.VIP) {
				t.Fatalf("promote after the holder died: %+v %v (b carries: %v)", r.res, r.err, b.Carrier.Carried(e.f.VIP))
			}
			return
		default:
		}
		if i > 2000 {
			t.Fatal("promote never returned")
		}
		e.clock.Advance(100 * time.Millisecond)
		time.Sleep(2 * time.Millisecond) // the promote's goroutine runs between steps
	}
}
