package claim_test

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/claimtest"
	"github.com/vipkit/vipkit/internal/testenv"
)

// OnError may call the Controller: errors reported under the controller's
// lock (here a failed grant and failed renewals) reach it after the lock
// is released.
func TestOnErrorMayCallController(t *testing.T) {
	e := newEnv(t, true)
	a := e.m("a")
	var ctl atomic.Pointer[claim.Controller]
	var calls atomic.Int64
	a.Cfg.OnError = func(error) {
		if c := ctl.Load(); c != nil {
			c.Status() // re-enters the controller
			calls.Add(1)
		}
	}
	a.KV.SetDown(true)
	c, err := claim.NewController(a.Cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctl.Store(c)
	e.ms.Put("a", c)
	testenv.Within(t, "start and steps with etcd down", func() {
		if err := c.Start(); err != nil {
			t.Error(err)
		}
		e.advance(5 * time.Second)
	})
	if calls.Load() == 0 {
		t.Fatal("OnError never called")
	}
}

// reentrantTrust is a TrustStore that calls the controller from each
// lookup once armed.
type reentrantTrust struct {
	claim.TrustStore
	ctl   atomic.Pointer[claim.Controller]
	calls atomic.Int64
}

func (r *reentrantTrust) KeyByAddr(a netip.Addr) (claim.PublicKey, bool) {
	if c := r.ctl.Load(); c != nil {
		c.Status()
		r.calls.Add(1)
	}
	return r.TrustStore.KeyByAddr(a)
}

// The trust store is asked without the controller's lock: HandleClaim
// with a store that calls the controller returns.
func TestHandleClaimTrustUnlocked(t *testing.T) {
	e := newEnv(t, false)
	b := e.m("b")
	p := e.f.Policy()
	rt := &reentrantTrust{TrustStore: p.Trust}
	b.Cfg.Policy = &claim.Policy{Mesh: p.Mesh, Trust: rt, Overlay: p.Overlay}
	ctl := e.start("b")
	rt.ctl.Store(ctl)
	cl := e.f.Claim(e.f.A, 1)
	testenv.Within(t, "HandleClaim", func() {
		if err := ctl.HandleClaim(context.Background(), e.f.A.Addr, cl); err != nil {
			t.Error(err)
		}
	})
	if rt.calls.Load() == 0 {
		t.Fatal("trust store never asked")
	}
	if st := ctl.Status(); st.Epoch != 1 || st.Holder != e.f.A.Addr {
		t.Fatalf("status %+v: want a's claim 1 taken", st)
	}
}

// HandleRelease, too, asks the trust store without the controller's lock.
func TestHandleReleaseTrustUnlocked(t *testing.T) {
	e := newEnv(t, true)
	a := e.m("a")
	p := e.f.Policy()
	rt := &reentrantTrust{TrustStore: p.Trust}
	a.Cfg.Policy = &claim.Policy{Mesh: p.Mesh, Trust: rt, Overlay: p.Overlay}
	e.bootstrap()
	ctl := a.Ctl()
	rt.ctl.Store(ctl)
	r, err := claim.NewRelease(e.f.B.Key, p.Mesh, e.f.VIP, e.f.B.Addr, 2)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Within(t, "HandleRelease", func() {
		if _, err := ctl.HandleRelease(context.Background(), e.f.B.Addr, r); err != nil {
			t.Error(err)
		}
	})
	if rt.calls.Load() == 0 {
		t.Fatal("trust store never asked")
	}
	if st := ctl.Status(); !st.Released || st.Carried {
		t.Fatalf("status %+v: want released, not carried", st)
	}
}

// History's OnEvent callback runs unlocked, in order: it may read the
// History and the carrier that recorded the event.
func TestHistoryOnEventUnlocked(t *testing.T) {
	h := new(claimtest.History)
	f := claimtest.NewFakeCarrier("x", nil, h)
	vip := netip.MustParseAddr("fd7a::1:2")
	var kinds []claimtest.EventKind
	h.OnEvent(func(ev claimtest.Event) {
		if n := len(h.Events()); n != len(kinds)+1 {
			t.Errorf("event %d delivered with %d recorded", len(kinds)+1, n)
		}
		f.Carried(vip)
		kinds = append(kinds, ev.Kind)
	})
	testenv.Within(t, "carrier calls", func() {
		ctx := context.Background()
		_ = f.Carry(ctx, vip)
		_ = f.Route(ctx, vip, netip.MustParseAddr("fd7a::2"))
		_ = f.Drop(ctx, vip)
	})
	if len(kinds) != 3 || kinds[0] != claimtest.Carry || kinds[1] != claimtest.Route || kinds[2] != claimtest.Drop {
		t.Fatalf("events %v: want carry, route, drop", kinds)
	}
}
