package claim_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/claimtest"
)

// wipe replaces a stopped member's state store with an empty one: a
// reinstalled or replaced disk.
func (e *env) wipe(name string) {
	m := e.m(name)
	m.Store = new(claim.MemStore)
	m.Cfg.Store = m.Store
}

// The fence outlives the state file: a partition fences a and b takes
// over; a's state is erased and a restarts; b stops. a must stay fenced
// (etcd's held key shows that a once held the VIP) until a promote.
func TestWipedFencedHolderStaysFenced(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	a := e.m("a")
	e.isolate("a", true)
	e.advance(25 * time.Second)
	if !e.m("b").Carrier.Carried(e.f.VIP) || !a.Ctl().Status().Fenced {
		t.Fatalf("after the partition: carriers %v, a %+v", e.carriers(), a.Ctl().Status())
	}
	e.stop("a")
	e.wipe("a")
	e.isolate("a", false)
	e.start("a")
	e.advance(5 * time.Second)
	if st := a.Ctl().Status(); !st.Fenced || st.Holder != e.f.B.Addr {
		t.Fatalf("wiped a after restart: %+v, want fenced, following b", st)
	}
	e.stop("b")
	e.advance(60 * time.Second)
	if a.Carrier.Carried(e.f.VIP) {
		t.Fatalf("wiped, fenced a claimed by itself: %+v", a.Ctl().Status())
	}
	if st, _ := a.Store.Load(); !st.Fenced {
		t.Fatalf("a's new state file does not keep the fence: %+v", st)
	}
	res, err := a.Ctl().Promote(context.Background(), claim.PromoteOptions{OldPrimaryGone: true})
	if err != nil || res.Claim == nil || res.Claim.Epoch != 3 || !a.Carrier.Carried(e.f.VIP) {
		t.Fatalf("promote on wiped a: %+v %v", res, err)
	}
}

// A wiped node that takes the other member's announcement before it has
// read etcd is still fenced by its held key: a claim taken from the
// channel does not stand for the state it lost.
func TestWipedHolderTakesAnnouncementFirst(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	a, b := e.m("a"), e.m("b")
	e.isolate("a", true)
	e.advance(25 * time.Second)
	e.stop("a")
	e.wipe("a")
	// a comes back with etcd still unreachable: it is fenced until etcd
	// answers, and claims nothing.
	e.isolate("a", false)
	a.KV.SetDown(true)
	e.start("a")
	held := b.Ctl().State().Held
	if err := a.Ctl().HandleClaim(context.Background(), e.f.B.Addr, held); err != nil {
		t.Fatalf("a takes b's claim: %v", err)
	}
	e.advance(5 * time.Second)
	if st := a.Ctl().Status(); !st.Fenced || !st.Unchecked {
		t.Fatalf("wiped a while etcd is down: %+v, want fenced pending the check", st)
	}
	// A restart in between keeps the check pending: it is in the state.
	e.stop("a")
	e.start("a")
	a.KV.SetDown(false)
	e.stop("b")
	e.advance(60 * time.Second)
	if a.Carrier.Carried(e.f.VIP) {
		t.Fatal("wiped a claimed by itself after taking an announcement")
	}
	if st := a.Ctl().Status(); !st.Fenced || st.Unchecked {
		t.Fatalf("a after etcd answered: %+v, want fenced and checked", st)
	}
}

// A legitimate newcomer has no state either, and finds a holder in etcd;
// it never held the VIP, so it is not fenced and fails over as any
// replica. Here b's disk is replaced (b never held) and a new b starts.
func TestNewcomerWithoutStateFailsOver(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	b := e.m("b")
	e.stop("b")
	e.wipe("b")
	e.start("b")
	e.advance(5 * time.Second)
	if st := b.Ctl().Status(); st.Fenced || st.Unchecked || st.Holder != e.f.A.Addr {
		t.Fatalf("newcomer b: %+v, want a replica following a", st)
	}
	e.stop("a")
	e.advance(25 * time.Second)
	if !b.Carrier.Carried(e.f.VIP) {
		t.Fatalf("newcomer b did not fail over: %+v", b.Ctl().Status())
	}
}

// The held key: written by every claim's transaction, one per node key,
// without a lease, holding the claim's epoch.
func TestClaimWritesHeldKey(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	keys := claim.KeysFor(e.f.Mesh, e.f.VIP)
	read := func(n claimtest.Node) (uint64, bool) {
		t.Helper()
		g, err := e.mkv.Get(context.Background(), keys.HeldKey(claim.KeyOf(n.Key)), false)
		if err != nil {
			t.Fatal(err)
		}
		if len(g.KVs) == 0 {
			return 0, false
		}
		if g.KVs[0].Lease != 0 {
			t.Fatalf("held key on lease %v", g.KVs[0].Lease)
		}
		v, err := strconv.ParseUint(string(g.KVs[0].Value), 10, 64)
		if err != nil {
			t.Fatalf("held key value %q: %v", g.KVs[0].Value, err)
		}
		return v, true
	}
	if ep, ok := read(e.f.A); !ok || ep != 1 {
		t.Fatalf("a's held key after the first claim: %d %v", ep, ok)
	}
	if _, ok := read(e.f.B); ok {
		t.Fatal("b has a held key without ever claiming")
	}
	if _, err := e.m("b").Ctl().Promote(context.Background(), claim.PromoteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.advance(5 * time.Second)
	if ep, ok := read(e.f.B); !ok || ep != 2 {
		t.Fatalf("b's held key after promote: %d %v", ep, ok)
	}
	// Kept for good: a's stays after its lease was revoked.
	if ep, ok := read(e.f.A); !ok || ep != 1 {
		t.Fatalf("a's held key after the move: %d %v", ep, ok)
	}
}

// Any held key shows that the node held the VIP, whatever its value: a
// wiped node is fenced, says why (ErrStateLost), and a value that is not
// an epoch is counted as bad.
func TestHeldKeyValues(t *testing.T) {
	for _, tc := range []struct {
		val string
		bad bool
	}{
		{"1", false},
		{strconv.FormatUint(claim.MaxEpoch-1, 10), false},
		{strconv.FormatUint(claim.MaxEpoch, 10), false},
		{"18446744073709551615", false},
		{"18446744073709551616", true}, // overflows uint64
		{"0", true},
		{"", true},
		{"+1", true},
	} {
		t.Run(fmt.Sprintf("%q", tc.val), func(t *testing.T) {
			e := newEnv(t, true)
			e.bootstrap()
			e.stop("b")
			e.wipe("b")
			keys := claim.KeysFor(e.f.Mesh, e.f.VIP)
			if _, err := e.mkv.Txn(context.Background(), claim.Txn{Then: []claim.Op{
				claim.Put(keys.HeldKey(claim.KeyOf(e.f.B.Key)), []byte(tc.val), 0)}}); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var lost bool
			e.m("b").Cfg.OnError = func(err error) {
				mu.Lock()
				defer mu.Unlock()
				lost = lost || errors.Is(err, claim.ErrStateLost)
			}
			e.start("b")
			e.advance(3 * time.Second)
			b := e.m("b").Ctl()
			if st := b.Status(); !st.Fenced || st.Unchecked {
				t.Fatalf("wiped b with held %q: %+v, want fenced", tc.val, st)
			}
			if got := b.Stats().BadValues > 0; got != tc.bad {
				t.Errorf("held %q counted bad: %v, want %v", tc.val, got, tc.bad)
			}
			mu.Lock()
			defer mu.Unlock()
			if !lost {
				t.Error("no ErrStateLost reported")
			}
		})
	}
}

// Without etcd, a wiped node asks its peer for the epoch: when the
// newest claim the peer knows is its own, it is fenced; until the peer
// answers it stays unchecked; a peer's claim is taken and routed to.
func TestWipedWithoutKVAsksPeer(t *testing.T) {
	e := newEnv(t, false)
	for _, n := range []string{"a", "b", "c"} {
		e.start(n)
	}
	a, b := e.m("a"), e.m("b")
	if _, err := a.Ctl().Promote(context.Background(), claim.PromoteOptions{}); err != nil {
		t.Fatal(err)
	}
	// a's disk is replaced while b still follows a's epoch 1.
	e.stop("a")
	e.wipe("a")
	e.isolate("a", true)
	e.start("a")
	e.advance(5 * time.Second)
	if st := a.Ctl().Status(); !st.Unchecked || !st.Fenced || a.Carrier.Carried(e.f.VIP) {
		t.Fatalf("wiped a, peer unreachable: %+v", st)
	}
	e.isolate("a", false)
	e.advance(3 * time.Second)
	st := a.Ctl().Status()
	if st.Unchecked || !st.Fenced || st.Epoch != 1 || a.Carrier.Carried(e.f.VIP) {
		t.Fatalf("wiped a after b answered: %+v", st)
	}
	// A restart does not carry: the fence is in the new state file.
	e.start("a")
	if a.Carrier.Carried(e.f.VIP) || !a.Ctl().Status().Fenced {
		t.Fatal("wiped, fenced a carried on restart")
	}
	// Only a promote on a clears the fence.
	res, err := a.Ctl().Promote(context.Background(), claim.PromoteOptions{})
	if err != nil || res.Claim.Epoch != 2 || !a.Carrier.Carried(e.f.VIP) {
		t.Fatalf("promote a: %+v %v", res, err)
	}
	// A newcomer without etcd: b's disk is replaced (b never held); a
	// answers with its own claim, b takes it, is not fenced and routes
	// the vip to a.
	e.stop("b")
	e.wipe("b")
	e.start("b")
	e.advance(3 * time.Second)
	if st := b.Ctl().Status(); st.Fenced || st.Unchecked || st.Holder != e.f.A.Addr || b.Carrier.RoutedTo(e.f.VIP) != e.f.A.Addr {
		t.Fatalf("wiped b (a holds): %+v routed %v", st, b.Carrier.RoutedTo(e.f.VIP))
	}
}
