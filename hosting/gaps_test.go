package hosting_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vipkit/vipkit/hosting"
)

func TestMaxHostsFromSettings(t *testing.T) {
	get := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	if n, err := hosting.MaxHostsFromSettings(get(nil)); err != nil || n != hosting.DefaultMaxHosts {
		t.Fatalf("absent: %d, %v", n, err)
	}
	if n, err := hosting.MaxHostsFromSettings(get(map[string]string{hosting.SettingMaxHosts: "3"})); err != nil || n != 3 {
		t.Fatalf("3: %d, %v", n, err)
	}
	for _, bad := range []string{"0", "-1", "x", "", "9223372036854775808"} {
		if _, err := hosting.MaxHostsFromSettings(get(map[string]string{hosting.SettingMaxHosts: bad})); !errors.Is(err, hosting.ErrSettings) {
			t.Errorf("%q: err = %v, want ErrSettings", bad, err)
		}
	}
	// The validator uses it: three hosts are over a cap of 2.
	st := hosting.NewMemStore()
	for _, a := range []string{"a", "b", "c"} {
		_ = st.PutAgent(context.Background(), hosting.Agent{ID: a, AccountID: account})
	}
	err := hosting.Validator{MaxHosts: 2}.Validate(context.Background(), hosting.Share{AccountID: account, Name: "n", Kind: hosting.KindTCP, TargetAddress: "h", TargetPort: 1, Hosts: hosting.NewHosts([]string{"a", "b"}, []string{"c"})}, st)
	if got := violations(err); len(got) != 1 || got[0].Message != "a share has at most 2 hosts, got 3" {
		t.Fatalf("cap 2: %v", err)
	}
}

// The audit columns carry the principal of the request that wrote them.
func TestAuditColumnsCarryThePrincipal(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1")
	ctx := hosting.WithPrincipal(e.ctx, "alice")
	s, err := e.svc.Create(ctx, hosting.Share{AccountID: account, Name: "db", Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432}, hosting.Update{Active: hosting.Of("a1")})
	if err != nil {
		t.Fatal(err)
	}
	if s.CreatedBy != "alice" || s.UpdatedBy != "alice" {
		t.Fatalf("create: by %q/%q", s.CreatedBy, s.UpdatedBy)
	}
	if _, err := e.svc.Update(hosting.WithPrincipal(e.ctx, "bob"), s.ID, hosting.Update{Method: hosting.Patch, Passive: hosting.Of("p1")}); err != nil {
		t.Fatal(err)
	}
	got, _ := e.store.Get(e.ctx, s.ID)
	if got.CreatedBy != "alice" || got.UpdatedBy != "bob" {
		t.Fatalf("update: by %q/%q", got.CreatedBy, got.UpdatedBy)
	}
	if err := e.svc.Delete(hosting.WithPrincipal(e.ctx, "carol"), s.ID); err != nil {
		t.Fatal(err)
	}
	got, _ = e.store.Get(e.ctx, s.ID)
	if got.DeletedBy != "carol" || got.UpdatedBy != "carol" {
		t.Fatalf("delete: by %q/%q", got.DeletedBy, got.UpdatedBy)
	}
	if hosting.PrincipalOf(e.ctx) != hosting.SystemPrincipal {
		t.Fatalf("no principal reads %q", hosting.PrincipalOf(e.ctx))
	}
}

type gate struct{ cleanup bool }

func (g gate) ShouldCleanupZiti(ctx context.Context, s hosting.Share) (bool, error) {
	return g.cleanup, nil
}

// A network that is gone is not cleaned up: the share delete soft-deletes
// and asks nothing of Ziti.
func TestNetworkAvailabilityGatesTheZitiCleanup(t *testing.T) {
	for _, cleanup := range []bool{true, false} {
		t.Run(fmt.Sprint("cleanup=", cleanup), func(t *testing.T) {
			e := newEnvWith(t, nil, func(o *hosting.Options) { o.Network = gate{cleanup} })
			e.agents(account, "a1")
			s := e.create("db", []string{"a1"}, nil)
			e.fake.ResetCalls()
			if err := e.svc.Delete(e.ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			got, _ := e.store.Get(e.ctx, s.ID)
			if got.Live() {
				t.Fatal("share still live")
			}
			left := len(e.fake.Snapshot().Services)
			if cleanup && (left != 0 || len(e.writes()) == 0) {
				t.Fatalf("cleanup: %d services left, writes %v", left, e.writes())
			}
			if !cleanup && (left != 1 || len(e.fake.Calls()) != 0) {
				t.Fatalf("no cleanup: %d services left, calls %v", left, e.fake.Calls())
			}
		})
	}
}

// fakeIngress records teardowns; a share's ingress is up until torn down.
type fakeIngress struct {
	down map[string]bool
	torn []string
}

func (f *fakeIngress) TearDown(ctx context.Context, s hosting.Share) error {
	f.down[s.ID] = true
	f.torn = append(f.torn, s.ID)
	return nil
}

func (f *fakeIngress) Up(ctx context.Context, s hosting.Share) (bool, error) {
	return !f.down[s.ID], nil
}

// staleOnly answers FindLiveHostedOnlyBy from before a concurrent cascade
// made the agent the last host, once.
type staleOnly struct {
	hosting.Store
	stale bool
}

func (s *staleOnly) FindLiveHostedOnlyBy(ctx context.Context, agent string) ([]hosting.Share, error) {
	if s.stale {
		s.stale = false
		return nil, nil
	}
	return s.Store.FindLiveHostedOnlyBy(ctx, agent)
}

// The cascade tears the ingress of the shares the agent alone hosts down
// before its transaction, refuses to delete a share whose ingress is still
// up (the unlocked read missed it), and the retry of the whole handler then
// tears it down and deletes.
func TestIngressTornDownBeforeTheCascade(t *testing.T) {
	ing := &fakeIngress{down: map[string]bool{}}
	st := &staleOnly{Store: hosting.NewMemStore()}
	e := newEnvWith(t, st, func(o *hosting.Options) { o.Ingress = ing })
	e.agents(account, "a1", "a2")
	only := e.create("only", []string{"a1"}, nil)
	shared := e.create("shared", []string{"a1", "a2"}, nil)
	e.deleteAgent("a1")
	if _, err := e.svc.RemoveDeletedAgent(e.ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ing.torn) != fmt.Sprint([]string{only.ID}) {
		t.Fatalf("torn down %v, want only %s", ing.torn, only.ID)
	}
	// a2 goes too, but the unlocked read is stale: the share is a2's alone
	// by now, its ingress is still up, and the delete is refused.
	e.deleteAgent("a2")
	st.stale = true
	_, err := e.svc.RemoveDeletedAgent(e.ctx, "a2")
	if !errors.Is(err, hosting.ErrIngressUp) {
		t.Fatalf("err = %v, want ErrIngressUp", err)
	}
	cur, _ := e.store.Get(e.ctx, shared.ID)
	if !cur.Live() || !cur.Hosts.Equal(hosting.NewHosts([]string{"a2"}, nil)) {
		t.Fatalf("share changed with its ingress up: %+v", cur)
	}
	e.checkModel(cur)
	// The retry runs the whole handler: teardown, then the delete.
	if _, err := e.svc.RemoveDeletedAgent(e.ctx, "a2"); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.store.Get(e.ctx, shared.ID); got.Live() {
		t.Fatal("share still live after the retry")
	}
}

// With Outbox, a change's events go into the store's outbox in its
// transaction, the Publisher is not called, and OnOutbox is told after the
// commit; a change that writes nothing tells nobody.
func TestOutboxEventsAndTheKick(t *testing.T) {
	st := hosting.NewMemStore()
	kicks := 0
	e := newEnvWith(t, st, func(o *hosting.Options) { o.Outbox, o.OnOutbox = true, func() { kicks++ } })
	e.agents(account, "a1", "p1")
	s := e.create("db", []string{"a1"}, nil)
	e.patch(s.ID, nil, list("p1"))
	e.patch(s.ID, nil, list("p1")) // no change
	if err := e.svc.Delete(e.ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	p, err := st.Pending(e.ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, m := range p {
		keys = append(keys, m.RoutingKey)
	}
	if fmt.Sprint(keys) != "[share.UPDATED share.DELETED]" || kicks != 2 || len(e.pub.evs) != 0 {
		t.Fatalf("outbox %v, kicks %d, published %d", keys, kicks, len(e.pub.evs))
	}
}

// A redelivered frontdoor DELETED changes nothing: not in the store (the
// inbox), and not at the ingress either. The shares created after the
// first delivery keep their ingress up.
func TestRedeliveredFrontdoorDeletedKeepsIngress(t *testing.T) {
	ing := &fakeIngress{down: map[string]bool{}}
	e := newEnvWith(t, hosting.NewMemStore(), func(o *hosting.Options) { o.Ingress = ing })
	e.agents(account, "a1")
	old := e.create("old", []string{"a1"}, nil)
	del := hosting.Intake{ID: "fd-del-1", Entity: hosting.EntityFrontdoor, Type: hosting.EventDeleted, FrontdoorID: frontdoo, At: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	if _, err := e.svc.HandleIntake(e.ctx, del); err != nil {
		t.Fatal(err)
	}
	if !ing.down[old.ID] {
		t.Fatalf("the first delivery left %s's ingress up", old.ID)
	}
	s := e.create("new", []string{"a1"}, nil)
	evs, err := e.svc.HandleIntake(e.ctx, del)
	if err != nil || len(evs) != 0 {
		t.Fatalf("redelivery: %+v, %v", evs, err)
	}
	if ing.down[s.ID] {
		t.Fatalf("the redelivery tore down the ingress of %s, created after the first delivery (torn %v)", s.ID, ing.torn)
	}
	if cur, _ := e.store.Get(e.ctx, s.ID); !cur.Live() {
		t.Fatal("the redelivery deleted a share")
	}
}
