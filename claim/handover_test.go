package claim_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/claimtest"
)

var errCheck = errors.New("test: check failing")

// watchCarriers fails the test if two nodes ever carry the VIP at once.
func watchCarriers(t *testing.T, e *env) {
	carrying := map[string]bool{"a": true}
	e.hist.OnEvent(func(ev claimtest.Event) {
		switch ev.Kind {
		case claimtest.Carry:
			carrying[ev.Node] = true
		case claimtest.Drop:
			carrying[ev.Node] = false
		}
		if carrying["a"] && carrying["b"] {
			t.Errorf("two carriers at %v", ev.At)
		}
	})
}

// waitCarrier polls (the hand-over's promote runs on its own goroutine)
// until name carries the VIP alone.
func waitCarrier(t *testing.T, e *env, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c := e.carriers(); len(c) == 1 && c[0] == name {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("carriers %v, want [%s]", e.carriers(), name)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestHandOverMovesToPassingReplica: a holder's hand-over moves the VIP as
// a planned promote of the replica whose check passes (the holder drops
// first, never two carriers), neither node is fenced, and the VIP can be
// handed back.
func TestHandOverMovesToPassingReplica(t *testing.T) {
	e := newEnv(t, true)
	pass := func() error { return nil }
	e.m("a").Cfg.Healthy, e.m("b").Cfg.Healthy = pass, pass
	e.bootstrap()
	watchCarriers(t, e)
	if err := e.m("a").Ctl().HandOver(context.Background()); err != nil {
		t.Fatalf("hand-over: %v", err)
	}
	waitCarrier(t, e, "b")
	e.advance(3 * time.Second)
	a, b := e.m("a").Ctl().Status(), e.m("b").Ctl().Status()
	if a.Fenced || a.Role != claim.RoleReplica || b.Role != claim.RoleHolder || b.Epoch != 2 || a.Holder != e.f.B.Addr {
		t.Fatalf("after the hand-over: a %+v, b %+v", a, b)
	}
	if got := e.m("c").Carrier.RoutedTo(e.f.VIP); got != e.f.B.Addr {
		t.Fatalf("c routes to %v", got)
	}
	// A fresh replica can take it back the same way.
	if err := e.m("b").Ctl().HandOver(context.Background()); err != nil {
		t.Fatalf("hand-over back: %v", err)
	}
	waitCarrier(t, e, "a")
	if st := e.m("a").Ctl().Status(); st.Epoch != 3 || st.Fenced {
		t.Fatalf("a after the hand-over back: %+v", st)
	}
}

// TestHandOverBothFailKeeps: a replica whose check fails, or that has no
// check, refuses with ErrCheckFailing, and the holder keeps the VIP.
func TestHandOverBothFailKeeps(t *testing.T) {
	e := newEnv(t, true)
	e.m("b").Cfg.Healthy = func() error { return errCheck }
	e.bootstrap()
	err := e.m("a").Ctl().HandOver(context.Background())
	if !errors.Is(err, claim.ErrCheckFailing) {
		t.Fatalf("hand-over to a failing replica: %v, want ErrCheckFailing", err)
	}
	e.advance(30 * time.Second)
	if got := e.carriers(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("carriers %v, want a kept it", got)
	}
	if st := e.m("a").Ctl().Status(); st.Role != claim.RoleHolder || st.Epoch != 1 {
		t.Fatalf("a %+v", st)
	}
	e.stop("b")
	e.m("b").Cfg.Healthy = nil
	e.start("b")
	e.advance(3 * time.Second)
	if err := e.m("a").Ctl().HandOver(context.Background()); !errors.Is(err, claim.ErrCheckFailing) {
		t.Fatalf("hand-over to a replica without a check: %v, want ErrCheckFailing", err)
	}
	if got := e.carriers(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("carriers %v", got)
	}
}

// TestHandOverRefusals: only the holder of the pair may ask, only a
// carrying holder asks, and a fenced replica takes nothing over.
func TestHandOverRefusals(t *testing.T) {
	e := newEnv(t, true)
	e.m("b").Cfg.Healthy = func() error { return nil }
	e.bootstrap()
	ctx := context.Background()
	if err := e.m("b").Ctl().HandleHandOver(ctx, e.f.C.Addr); !errors.Is(err, claim.ErrNotPairMember) {
		t.Fatalf("from the observer: %v", err)
	}
	if err := e.m("b").Ctl().HandOver(ctx); !errors.Is(err, claim.ErrNoHandOver) {
		t.Fatalf("a replica asking: %v", err)
	}
	if err := e.m("c").Ctl().HandOver(ctx); !errors.Is(err, claim.ErrNoHandOver) {
		t.Fatalf("an observer asking: %v", err)
	}
	if err := e.m("a").Ctl().HandleHandOver(ctx, e.f.B.Addr); !errors.Is(err, claim.ErrNotHolder) {
		t.Fatalf("the holder asked by its replica: %v", err)
	}
	// Fence b: cut it off until its lease is gone, then heal.
	e.isolate("b", true)
	e.advance(25 * time.Second)
	e.isolate("b", false)
	e.stop("b")
	st := e.m("b").Store
	s, _ := st.Load()
	s.Fenced = true
	if err := st.Save(s); err != nil {
		t.Fatal(err)
	}
	e.start("b")
	e.advance(3 * time.Second)
	if err := e.m("a").Ctl().HandOver(ctx); !errors.Is(err, claim.ErrFenced) {
		t.Fatalf("hand-over to a fenced replica: %v, want ErrFenced", err)
	}
	if got := e.carriers(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("carriers %v", got)
	}
}

// TestHandOverNeverDelaysFence: a holder whose hand-over hangs (the
// replica's check does not answer) still drops the VIP exactly DropAfter
// after its last answered renewal when its renewals stop.
func TestHandOverNeverDelaysFence(t *testing.T) {
	e := newEnv(t, true)
	hang, asked := make(chan struct{}), make(chan struct{})
	e.m("b").Cfg.Healthy = func() error {
		close(asked)
		<-hang
		return nil
	}
	e.bootstrap()
	a := e.m("a")
	e.advance(2 * time.Second) // right after a renewal
	lastRenew := e.clock.Now().Add(-a.Ctl().Status().RenewalAge)
	var dropAt time.Time
	e.hist.OnEvent(func(ev claimtest.Event) {
		if ev.Node == "a" && ev.Kind == claimtest.Drop && dropAt.IsZero() {
			dropAt = ev.At
		}
	})
	done := make(chan error, 1)
	go func() { done <- a.Ctl().HandOver(context.Background()) }()
	<-asked
	a.KV.SetDown(true)
	e.advance(15 * time.Second)
	if dropAt.IsZero() || dropAt.Sub(lastRenew) != claim.DefaultDropAfter {
		t.Fatalf("a dropped at %v, %v after its last answered renewal; want exactly %v", dropAt, dropAt.Sub(lastRenew), claim.DefaultDropAfter)
	}
	if st := a.Ctl().Status(); st.Carried || !st.Fenced {
		t.Fatalf("a %+v", st)
	}
	close(hang)
	<-done
}

// TestHandOverOverHTTP: the hand-over op on the members' channel, without
// etcd: a refusal is a 409 "check-failing"; an accepted one moves the VIP
// by the replica's promote.
func TestHandOverOverHTTP(t *testing.T) {
	e := newEnv(t, false)
	mesh := &httpMesh{servers: map[netip.Addr]*httptest.Server{}}
	var healthy atomic.Bool
	e.m("b").Cfg.Healthy = func() error {
		if !healthy.Load() {
			return errCheck
		}
		return nil
	}
	for _, n := range []string{"a", "b", "c"} {
		m := e.m(n)
		m.Cfg.Channel = mesh.client(m.Node.Addr)
		mesh.serve(t, m.Node.Addr, e.start(n))
	}
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	ctx := context.Background()
	if _, err := e.m("a").Ctl().Promote(ctx, claim.PromoteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.advance(3 * time.Second) // b checks its state with a
	err := e.m("a").Ctl().HandOver(ctx)
	var ref *claim.RefusalError
	if !errors.As(err, &ref) || ref.Code != "check-failing" || !strings.Contains(ref.Reason, errCheck.Error()) {
		t.Fatalf("hand-over to a failing replica over http: %v", err)
	}
	if err := mesh.client(e.f.C.Addr).HandOver(ctx, e.f.B.Addr, e.f.VIP); !errors.Is(err, claim.ErrNotPairMember) {
		t.Fatalf("hand-over asked by the observer: %v", err)
	}
	healthy.Store(true)
	if err := e.m("a").Ctl().HandOver(ctx); err != nil {
		t.Fatal(err)
	}
	waitCarrier(t, e, "b")
	if got := e.m("c").Carrier.RoutedTo(e.f.VIP); got != e.f.B.Addr {
		t.Fatalf("c routes to %v", got)
	}
}

// TestHandOverLateRequestStartsNothing: a request whose asker has given
// up (its call's context ended, so the holder counts it unanswered and
// keeps the VIP) is refused, and no move follows.
func TestHandOverLateRequestStartsNothing(t *testing.T) {
	e := newEnv(t, true)
	pass := func() error { return nil }
	e.m("a").Cfg.Healthy, e.m("b").Cfg.Healthy = pass, pass
	e.bootstrap()
	watchCarriers(t, e)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.m("b").Ctl().HandleHandOver(ctx, e.f.A.Addr); !errors.Is(err, context.Canceled) {
		t.Fatalf("a hand-over its asker gave up on: %v, want context.Canceled", err)
	}
	e.advance(30 * time.Second)
	if got := e.carriers(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("carriers %v, want a kept it", got)
	}
	if st := e.m("a").Ctl().Status(); st.Role != claim.RoleHolder || st.Epoch != 1 {
		t.Fatalf("a %+v", st)
	}
}
