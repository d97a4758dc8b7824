package hosting_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/zitifake"
	"github.com/vipkit/vipkit/transport/transporttest"
)

const deployment = "dep-1"

// reconEnv is env with a projection that tags the deployment, a
// reconciler on the same store and a manual clock.
type reconEnv struct {
	*env
	clk *transporttest.ManualClock
	rec *hosting.Reconciler
	z   *ziti.Client
}

func newReconEnv(t *testing.T, ro func(*hosting.ReconcilerOptions)) *reconEnv {
	t.Helper()
	f := zitifake.Start(t, zititest.Options{})
	st := hosting.NewMemStore()
	clk := transporttest.NewManualClock()
	p, err := hosting.NewProjection(f.Client(), hosting.ProjectionOptions{FrontdoorID: frontdoo, HealthCheck: testHC, DeploymentID: deployment})
	if err != nil {
		t.Fatal(err)
	}
	pub := &recPub{}
	svc, err := hosting.NewService(hosting.Options{Store: st, Projection: p, Publisher: pub, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	o := hosting.ReconcilerOptions{Store: st, Projection: p, Outbox: st, Clock: clk, Grace: time.Minute}
	if ro != nil {
		ro(&o)
	}
	rec, err := hosting.NewReconciler(o)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, fake: f, proj: p, svc: svc, store: st, pub: pub, ident: map[string]string{}, ctx: context.Background()}
	return &reconEnv{env: e, clk: clk, rec: rec, z: f.Client()}
}

// pass runs one pass and fails the test on an error.
func (e *reconEnv) pass(dry bool) hosting.Report {
	e.t.Helper()
	rep, err := e.rec.Pass(e.ctx, dry)
	if err != nil {
		e.t.Fatalf("pass: %v (report %+v)", err, rep)
	}
	if !rep.Locked {
		e.t.Fatal("pass found the lock held")
	}
	return rep
}

func kinds(ds []hosting.Drift) []string {
	var out []string
	for _, d := range ds {
		out = append(out, string(d.Kind))
	}
	slices.Sort(out)
	return out
}

// The finding: a standby override on an active host (what a crash
// between a Ziti write and the commit leaves) survives later updates of
// the share, and only the reconciler repairs it.
func TestStrayOverrideOnActiveSurvivesUpdates(t *testing.T) {
	e := newReconEnv(t, nil)
	e.agents(account, "a1", "a2", "p1")
	s := e.create("db", []string{"a1"}, []string{"p1"})
	z := e.zitiOf(s.ID)
	if err := e.z.AssignServiceConfigs(e.ctx, e.ident["a1"], []ziti.ServiceConfig{{ServiceID: z.service.ID, ConfigID: z.standby.ID}}); err != nil {
		t.Fatal(err)
	}
	s = e.patch(s.ID, list("a1", "a2"), nil)
	s = e.patch(s.ID, list("a1"), nil)
	if got := e.zitiOf(s.ID).override[e.ident["a1"]]; got == "" {
		t.Fatal("the stray override is gone after two updates; the finding no longer holds")
	}
	rep := e.pass(false)
	if got := kinds(rep.Drifts); !slices.Equal(got, []string{"OVERRIDE_STRAY"}) || rep.Repairs != 1 || !rep.Drifts[0].Repaired || rep.Drifts[0].AgentID != "a1" {
		t.Fatalf("report %+v", rep)
	}
	e.checkModel(s)
	// A second pass finds nothing.
	e.fake.ResetCalls()
	if rep := e.pass(false); len(rep.Drifts) != 0 || len(e.writes()) != 0 {
		t.Fatalf("second pass: %+v, writes %v", rep, e.writes())
	}
}

// Each kind of drift, injected into the model controller, is listed by a
// dry run (which writes nothing) and repaired by a pass.
func TestReconcilerRepairsEachDrift(t *testing.T) {
	cases := []struct {
		name   string
		inject func(e *reconEnv, s hosting.Share, z zitiOf)
		want   []string
	}{
		{"stray override on an active", func(e *reconEnv, s hosting.Share, z zitiOf) {
			must(t, e.z.AssignServiceConfigs(e.ctx, e.ident["a1"], []ziti.ServiceConfig{{ServiceID: z.service.ID, ConfigID: z.standby.ID}}))
		}, []string{"OVERRIDE_STRAY"}},
		{"missing override on a passive", func(e *reconEnv, s hosting.Share, z zitiOf) {
			must(t, e.z.RemoveServiceConfigs(e.ctx, e.ident["p1"], []ziti.ServiceConfig{{ServiceID: z.service.ID, ConfigID: z.standby.ID}}))
		}, []string{"OVERRIDE_MISSING"}},
		{"override on a passive to another config", func(e *reconEnv, s hosting.Share, z zitiOf) {
			must(t, e.z.AssignServiceConfigs(e.ctx, e.ident["p1"], []ziti.ServiceConfig{{ServiceID: z.service.ID, ConfigID: z.host.ID}}))
		}, []string{"OVERRIDE_MISSING"}},
		{"standby config missing", func(e *reconEnv, s hosting.Share, z zitiOf) {
			must(t, e.z.RemoveServiceConfigs(e.ctx, e.ident["p1"], []ziti.ServiceConfig{{ServiceID: z.service.ID, ConfigID: z.standby.ID}}))
			must(t, e.z.DeleteConfig(e.ctx, z.standby.ID))
		}, []string{"OVERRIDE_MISSING", "STANDBY_MISSING"}},
		{"names", func(e *reconEnv, s hosting.Share, z zitiOf) {
			n := "renamed"
			must(t, e.z.PatchService(e.ctx, z.service.ID, ziti.ServicePatch{Name: &n}))
			must(t, e.z.PatchConfig(e.ctx, z.host.ID, ziti.ConfigPatch{Name: &n}))
			must(t, e.z.PatchConfig(e.ctx, z.standby.ID, ziti.ConfigPatch{Name: &n}))
			must(t, e.z.PatchServicePolicy(e.ctx, z.policy.ID, ziti.ServicePolicyPatch{Name: &n}))
		}, []string{"NAME", "NAME", "NAME", "NAME"}},
		{"config bodies", func(e *reconEnv, s hosting.Share, z zitiOf) {
			other := s.Clone()
			other.TargetPort = 1
			must(t, e.z.PatchConfig(e.ctx, z.host.ID, ziti.ConfigPatch{Data: e.proj.HostConfigData(other, ziti.PrecedenceDefault)}))
			must(t, e.z.PatchConfig(e.ctx, z.standby.ID, ziti.ConfigPatch{Data: e.proj.HostConfigData(other, ziti.PrecedenceRequired)}))
		}, []string{"CONFIG", "CONFIG"}},
		{"service configs", func(e *reconEnv, s hosting.Share, z zitiOf) {
			none := []string{}
			must(t, e.z.PatchService(e.ctx, z.service.ID, ziti.ServicePatch{Configs: &none}))
		}, []string{"CONFIG"}},
		{"bind policy identities", func(e *reconEnv, s hosting.Share, z zitiOf) {
			roles := []string{hosting.AgentRole("p1"), hosting.AgentRole("x1"), "#all"}
			must(t, e.z.PatchServicePolicy(e.ctx, z.policy.ID, ziti.ServicePolicyPatch{IdentityRoles: &roles}))
		}, []string{"BIND_POLICY"}},
		{"override on an identity that hosts nothing", func(e *reconEnv, s hosting.Share, z zitiOf) {
			roles := append(slices.Clone(z.policy.IdentityRoles), hosting.AgentRole("x1"))
			must(t, e.z.PatchServicePolicy(e.ctx, z.policy.ID, ziti.ServicePolicyPatch{IdentityRoles: &roles}))
			must(t, e.z.AssignServiceConfigs(e.ctx, e.ident["x1"], []ziti.ServiceConfig{{ServiceID: z.service.ID, ConfigID: z.standby.ID}}))
		}, []string{"BIND_POLICY", "OVERRIDE_STRAY"}},
		{"deployment tag", func(e *reconEnv, s hosting.Share, z zitiOf) {
			tags := ziti.Tags{hosting.TagFrontdoor: frontdoo, hosting.TagShare: s.ID}
			must(t, e.z.PatchService(e.ctx, z.service.ID, ziti.ServicePatch{Tags: tags}))
			must(t, e.z.PatchServicePolicy(e.ctx, z.policy.ID, ziti.ServicePolicyPatch{Tags: tags}))
			must(t, e.z.PatchConfig(e.ctx, z.host.ID, ziti.ConfigPatch{Tags: tags}))
		}, []string{"TAGS", "TAGS", "TAGS"}},
		{"bind policy missing", func(e *reconEnv, s hosting.Share, z zitiOf) {
			must(t, e.z.DeleteServicePolicy(e.ctx, z.policy.ID))
		}, []string{"MISSING"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newReconEnv(t, nil)
			e.agents(account, "a1", "p1", "x1")
			s := e.create("db", []string{"a1"}, []string{"p1"})
			tc.inject(e, s, e.zitiOf(s.ID))
			e.fake.ResetCalls()
			dry := e.pass(true)
			if got := kinds(dry.Drifts); !slices.Equal(got, tc.want) || dry.Repairs != 0 || len(e.writes()) != 0 {
				t.Fatalf("dry run: %v (want %v), repairs %d, writes %v", got, tc.want, dry.Repairs, e.writes())
			}
			for _, d := range dry.Drifts {
				if d.Repaired || d.Held != hosting.HeldDryRun || d.ShareID != s.ID || d.Detail == "" {
					t.Fatalf("dry drift %+v", d)
				}
			}
			rep := e.pass(false)
			if got := kinds(rep.Drifts); !slices.Equal(got, tc.want) || rep.Repairs != len(tc.want) {
				t.Fatalf("pass: %+v, want %v", rep, tc.want)
			}
			e.no500()
			e.checkModel(s)
			z := e.zitiOf(s.ID)
			if z.service.Name != "db | "+frontdoo+" | "+s.ID || z.policy.Name != "db | bind | "+frontdoo+" | "+s.ID ||
				z.host.Name != "db | host | "+frontdoo+" | "+s.ID || !slices.Equal(z.service.Configs, []string{z.host.ID}) {
				t.Fatalf("objects %+v %+v %+v", z.service, z.policy, z.host)
			}
			for _, tags := range []ziti.Tags{z.service.Tags, z.policy.Tags, z.host.Tags, z.standby.Tags} {
				if tags[hosting.TagDeployment] != deployment {
					t.Fatalf("tags %v", tags)
				}
			}
			if rep := e.pass(false); len(rep.Drifts) != 0 {
				t.Fatalf("second pass: %+v", rep)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A standby config left on a share with no passive goes, after the
// overrides that name it.
func TestReconcilerRemovesAStrayStandbyConfig(t *testing.T) {
	e := newReconEnv(t, nil)
	e.agents(account, "a1", "p1")
	s := e.create("db", []string{"a1"}, []string{"p1"})
	z := e.zitiOf(s.ID)
	// The crash of an update that removed the passive after its Ziti
	// writes but before the commit, undone the other way: the store
	// says no passive, Ziti still has p1's side.
	s = e.patch(s.ID, nil, list())
	ct := z.host.ConfigTypeID
	sb, err := e.z.CreateConfig(e.ctx, ziti.ConfigCreate{Name: e.proj.StandbyConfigName(s), ConfigTypeID: ct, Data: e.proj.HostConfigData(s, ziti.PrecedenceDefault),
		Tags: ziti.Tags{hosting.TagFrontdoor: frontdoo, hosting.TagShare: s.ID, hosting.TagDeployment: deployment, hosting.TagObject: hosting.TagStandbyHost}})
	must(t, err)
	must(t, e.z.AssignServiceConfigs(e.ctx, e.ident["p1"], []ziti.ServiceConfig{{ServiceID: z.service.ID, ConfigID: sb}}))
	roles := []string{hosting.AgentRole("a1"), hosting.AgentRole("p1")}
	must(t, e.z.PatchServicePolicy(e.ctx, z.policy.ID, ziti.ServicePolicyPatch{IdentityRoles: &roles}))
	rep := e.pass(false)
	if got := kinds(rep.Drifts); !slices.Equal(got, []string{"BIND_POLICY", "OVERRIDE_STRAY", "STANDBY_STRAY"}) {
		t.Fatalf("report %+v", rep)
	}
	e.no500()
	e.checkModel(s)
}

// A passive whose agent has no identity is reported and kept off the bind
// policy; nothing is written for it. An active with none is reported and
// stays on the policy, as an update leaves it.
func TestReconcilerReportsABrokenHost(t *testing.T) {
	e := newReconEnv(t, nil)
	e.agents(account, "a1", "p1", "p2")
	s := e.create("db", []string{"a1"}, []string{"p1", "p2"})
	e.fake.DeleteIdentity(e.ident["p2"])
	e.fake.DeleteIdentity(e.ident["a1"])
	rep := e.pass(false)
	if got := kinds(rep.Drifts); !slices.Equal(got, []string{"BIND_POLICY", "BROKEN", "BROKEN"}) {
		t.Fatalf("report %+v", rep)
	}
	z := e.zitiOf(s.ID)
	if slices.Contains(z.policy.IdentityRoles, hosting.AgentRole("p2")) || !slices.Contains(z.policy.IdentityRoles, hosting.AgentRole("p1")) ||
		!slices.Contains(z.policy.IdentityRoles, hosting.AgentRole("a1")) {
		t.Fatalf("policy %v", z.policy.IdentityRoles)
	}
	if e.rec.Stats().Broken == 0 {
		t.Fatal("broken host not counted")
	}
}

// Orphans: objects of this deployment whose share is not live go once
// older than the grace period, unless the outbox names their share;
// objects without the deployment tag, or with another's, stay.
func TestReconcilerDeletesOrphansAfterGrace(t *testing.T) {
	e := newReconEnv(t, nil)
	e.agents(account, "a1", "p1")
	ghost := func(p *hosting.Projection, name string) hosting.Share {
		s := hosting.Share{ID: hosting.NewID(), AccountID: account, Name: name, Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432,
			Hosts: hosting.NewHosts([]string{"a1"}, []string{"p1"})}
		must(t, p.Project(e.ctx, s))
		return s
	}
	untagged, err := hosting.NewProjection(e.z, hosting.ProjectionOptions{FrontdoorID: frontdoo, HealthCheck: testHC})
	must(t, err)
	otherDep, err := hosting.NewProjection(e.z, hosting.ProjectionOptions{FrontdoorID: frontdoo, HealthCheck: testHC, DeploymentID: "dep-2"})
	must(t, err)
	orphan := ghost(e.proj, "orphan")
	named := ghost(e.proj, "named")
	keepUntagged := ghost(untagged, "untagged")
	keepOther := ghost(otherDep, "other")
	deleted := e.create("deleted", []string{"a1"}, []string{"p1"})
	live := e.create("live", []string{"a1"}, []string{"p1"})
	must(t, e.store.InTx(e.ctx, func(ctx context.Context, tx hosting.Tx) error {
		if _, err := tx.Lock(ctx, deleted.ID); err != nil {
			return err
		}
		msg, err := hosting.Event{ID: hosting.NewID(), Type: hosting.EventUpdated, Share: named, At: e.clk.Now()}.Message()
		if err != nil {
			return err
		}
		if err := tx.(hosting.OutboxTx).AddEvents(ctx, []hosting.EventMessage{msg}); err != nil {
			return err
		}
		return tx.Delete(ctx, deleted.ID, e.clk.Now(), "test")
	}))
	count := func(id string) int {
		n := 0
		st := e.fake.Snapshot()
		for _, x := range st.Services {
			if x.Tags[hosting.TagShare] == id {
				n++
			}
		}
		for _, x := range st.Configs {
			if x.Tags[hosting.TagShare] == id {
				n++
			}
		}
		for _, x := range st.Policies {
			if x.Tags[hosting.TagShare] == id {
				n++
			}
		}
		return n
	}
	held := func(rep hosting.Report) map[string]string {
		out := map[string]string{}
		for _, d := range rep.Drifts {
			if d.Kind != hosting.DriftOrphan {
				t.Fatalf("drift %+v", d)
			}
			if prev, ok := out[d.ShareID]; ok && prev != d.Held {
				t.Fatalf("share %s held %q and %q", d.ShareID, prev, d.Held)
			}
			out[d.ShareID] = d.Held
		}
		return out
	}
	e.fake.ResetCalls()
	rep := e.pass(false)
	if h := held(rep); len(h) != 3 || h[orphan.ID] != hosting.HeldGrace || h[deleted.ID] != hosting.HeldGrace || h[named.ID] != hosting.HeldOutbox || len(e.writes()) != 0 {
		t.Fatalf("first pass: %v, writes %v", h, e.writes())
	}
	e.clk.Advance(time.Minute - time.Nanosecond)
	if h := held(e.pass(false)); h[orphan.ID] != hosting.HeldGrace || len(e.writes()) != 0 {
		t.Fatalf("grace minus 1ns: %v", h)
	}
	e.clk.Advance(time.Nanosecond)
	if h := held(e.pass(true)); h[orphan.ID] != hosting.HeldDryRun || len(e.writes()) != 0 {
		t.Fatalf("dry run at grace: %v, writes %v", h, e.writes())
	}
	rep = e.pass(false)
	if h := held(rep); h[orphan.ID] != "" || h[deleted.ID] != "" || h[named.ID] != hosting.HeldOutbox || rep.Repairs != 2*4 {
		t.Fatalf("at grace: %+v", rep)
	}
	e.no500()
	for id, want := range map[string]int{orphan.ID: 0, deleted.ID: 0, named.ID: 4, keepUntagged.ID: 4, keepOther.ID: 4, live.ID: 4} {
		if got := count(id); got != want {
			t.Errorf("share %s has %d objects, want %d", id, got, want)
		}
	}
	e.checkModel(live)
	// Only the orphans named in the outbox are left.
	if h := held(e.pass(false)); len(h) != 1 || h[named.ID] != hosting.HeldOutbox {
		t.Fatalf("after: %v", h)
	}
}

// The rate limit: a pass makes at most MaxRepairs repairs, a share whole;
// the shares left are listed as held and repaired by the next pass.
func TestReconcilerRateLimit(t *testing.T) {
	e := newReconEnv(t, func(o *hosting.ReconcilerOptions) { o.MaxRepairs = 1 })
	e.agents(account, "a1", "p1")
	var ss []hosting.Share
	for _, n := range []string{"one", "two", "three"} {
		s := e.create(n, []string{"a1"}, []string{"p1"})
		z := e.zitiOf(s.ID)
		must(t, e.z.RemoveServiceConfigs(e.ctx, e.ident["p1"], []ziti.ServiceConfig{{ServiceID: z.service.ID, ConfigID: z.standby.ID}}))
		ss = append(ss, s)
	}
	for pass := 1; pass <= 3; pass++ {
		rep := e.pass(false)
		if rep.Repairs != 1 || rep.Held != 3-pass {
			t.Fatalf("pass %d: %+v", pass, rep)
		}
		for _, d := range rep.Drifts {
			if !d.Repaired && d.Held != hosting.HeldRateLimit {
				t.Fatalf("pass %d: %+v", pass, d)
			}
		}
	}
	for _, s := range ss {
		e.checkModel(s)
	}
	if st := e.rec.Stats(); st.Repairs != 3 || st.Held != 3 || st.Passes != 3 {
		t.Fatalf("stats %+v", st)
	}
}

type heldLock struct{}

func (heldLock) TryLockReconciler(context.Context) (func(), bool, error) { return nil, false, nil }

// One reconciler at a time: a pass that finds the lock held does nothing.
// A dry run takes no lock.
func TestReconcilerLock(t *testing.T) {
	e := newReconEnv(t, func(o *hosting.ReconcilerOptions) { o.Locker = heldLock{} })
	e.agents(account, "a1", "p1")
	s := e.create("db", []string{"a1"}, []string{"p1"})
	z := e.zitiOf(s.ID)
	must(t, e.z.RemoveServiceConfigs(e.ctx, e.ident["p1"], []ziti.ServiceConfig{{ServiceID: z.service.ID, ConfigID: z.standby.ID}}))
	e.fake.ResetCalls()
	rep, err := e.rec.Pass(e.ctx, false)
	if err != nil || rep.Locked || len(rep.Drifts) != 0 || len(e.fake.Calls()) != 0 || e.rec.Stats().Skipped != 1 {
		t.Fatalf("locked elsewhere: %+v %v, calls %v", rep, err, e.fake.Calls())
	}
	if rep := e.pass(true); len(rep.Drifts) != 1 || e.rec.Stats().Passes != 0 {
		t.Fatalf("dry run: %+v, stats %+v", rep, e.rec.Stats())
	}
}

// A failed compensation kicks the reconciler (Options.OnDrift), and Run
// makes a pass on start, on a kick (no sooner than MinGap after the last
// pass) and every Interval.
func TestFailedCompensationKicksTheReconciler(t *testing.T) {
	e := newReconEnv(t, func(o *hosting.ReconcilerOptions) { o.Interval = time.Hour; o.MinGap = time.Second })
	kicked := 0
	svc, err := hosting.NewService(hosting.Options{Store: e.store, Projection: e.proj, Clock: e.clk, OnDrift: func() { kicked++; e.rec.Kick() }})
	must(t, err)
	e.svc = svc
	e.agents(account, "a1", "p1")
	s := e.create("db", []string{"a1"}, nil)
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- e.rec.Run(ctx) }()
	waitFor(t, func() bool { return e.rec.Stats().Passes == 1 && e.clk.Pending() == 1 })
	// Adding p1 fails at the bind policy, and its compensation fails
	// to delete the standby config: Ziti keeps it and p1's override.
	e.fake.FailNext("patchServicePolicy", 503)
	e.fake.FailNext("deleteConfig", 503)
	if _, err := e.svc.Update(e.ctx, s.ID, hosting.Update{Method: hosting.Patch, Passive: hosting.Of("p1")}); err == nil {
		t.Fatal("update succeeded")
	}
	if kicked != 1 {
		t.Fatalf("OnDrift called %d times", kicked)
	}
	// The kick waits out MinGap on the clock.
	waitFor(t, func() bool { return e.clk.Pending() == 1 && e.rec.Stats().Passes == 1 })
	e.clk.Advance(time.Second)
	waitFor(t, func() bool { return e.rec.Stats().Passes == 2 })
	waitFor(t, func() bool { return e.clk.Pending() == 1 })
	e.checkModel(s)
	if e.rec.Stats().Repairs == 0 {
		t.Fatal("nothing repaired")
	}
	e.clk.Advance(time.Hour)
	waitFor(t, func() bool { return e.rec.Stats().Passes == 3 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
}

// waitFor polls cond until it holds, for up to a minute.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in a minute")
		}
		time.Sleep(time.Millisecond)
	}
}

// With WatchStates, a pass counts the shares per hosting state, and a
// state that changed since the last pass is written into the outbox as a
// HOSTING_STATE_CHANGED event and told to OnStateChange; the first pass
// only learns the states.
func TestReconcilerAnnouncesHostingStateChanges(t *testing.T) {
	var seen []hosting.StateChange
	var reports []hosting.Report
	e := newReconEnv(t, func(o *hosting.ReconcilerOptions) {
		o.WatchStates = true
		o.OnStateChange = func(c hosting.StateChange) { seen = append(seen, c) }
		o.OnPass = func(r hosting.Report) { reports = append(reports, r) }
	})
	e.agents(account, "a1", "p1")
	s := e.create("db", []string{"a1"}, []string{"p1"})
	z := e.zitiOf(s.ID)
	ta := e.fake.AddTerminator(z.service.ID, e.ident["a1"], ziti.PrecedenceRequired)
	e.fake.AddTerminator(z.service.ID, e.ident["p1"], ziti.PrecedenceDefault)
	ob := e.store.(hosting.Outbox)
	pending := func() []hosting.OutboxEntry {
		es, err := ob.Pending(e.ctx, 100)
		must(t, err)
		return es
	}
	rep := e.pass(false)
	if rep.States[hosting.Healthy] != 1 || len(seen) != 0 || len(pending()) != 0 {
		t.Fatalf("first pass: states %v, changes %v, outbox %v", rep.States, seen, pending())
	}
	e.fake.RemoveTerminator(ta)
	rep = e.pass(false)
	if rep.States[hosting.FailedOver] != 1 || len(seen) != 1 || seen[0].From != hosting.Healthy || seen[0].To != hosting.FailedOver || seen[0].Share.ID != s.ID {
		t.Fatalf("failover: states %v, changes %+v", rep.States, seen)
	}
	es := pending()
	if len(es) != 1 || es[0].RoutingKey != "share.HOSTING_STATE_CHANGED" || es[0].ID != seen[0].ID {
		t.Fatalf("outbox %+v", es)
	}
	var body struct {
		Type string `json:"type"`
		Data struct {
			ID    string `json:"id"`
			From  string `json:"from"`
			To    string `json:"to"`
			Hosts []struct {
				AgentID    string `json:"agentId"`
				Precedence string `json:"precedence"`
			} `json:"hosts"`
		} `json:"data"`
	}
	must(t, json.Unmarshal(es[0].Body, &body))
	if body.Type != "HOSTING_STATE_CHANGED" || body.Data.ID != s.ID || body.Data.From != "HEALTHY" || body.Data.To != "FAILED_OVER" ||
		len(body.Data.Hosts) != 2 || body.Data.Hosts[1].AgentID != "p1" || body.Data.Hosts[1].Precedence != "default" {
		t.Fatalf("body %s", es[0].Body)
	}
	// No change, no event.
	if e.pass(false); len(seen) != 1 || len(pending()) != 1 {
		t.Fatalf("unchanged: %v", seen)
	}
	e.fake.AddTerminator(z.service.ID, e.ident["a1"], ziti.PrecedenceRequired)
	if e.pass(false); len(seen) != 2 || seen[1].From != hosting.FailedOver || seen[1].To != hosting.Healthy {
		t.Fatalf("failback: %+v", seen)
	}
	// A dry run neither counts states nor reports to OnPass.
	if rep := e.pass(true); rep.States != nil || len(reports) != 4 {
		t.Fatalf("dry run: %v, %d reports", rep.States, len(reports))
	}
}

// The memory of first sightings is bounded: with MaxTracked 4 and six
// orphaned objects, four are tracked and two held until the first four
// are gone; then those two are tracked and go after their own grace.
// (With MaxTracked at 4 the fourth object is tracked and the fifth is
// held: the bound is reached, not passed.)
func TestReconcilerTracksAtMostMaxTrackedOrphans(t *testing.T) {
	e := newReconEnv(t, func(o *hosting.ReconcilerOptions) { o.MaxTracked = 4 })
	e.agents(account, "a1")
	for _, n := range []string{"g1", "g2"} {
		s := hosting.Share{ID: hosting.NewID(), AccountID: account, Name: n, Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432,
			Hosts: hosting.NewHosts([]string{"a1"}, nil)}
		must(t, e.proj.Project(e.ctx, s)) // host.v1, service, bind policy
	}
	objects := func() int {
		st := e.fake.Snapshot()
		return len(st.Services) + len(st.Configs) + len(st.Policies)
	}
	count := func(rep hosting.Report, held string) int {
		n := 0
		for _, d := range rep.Drifts {
			if d.Held == held {
				n++
			}
		}
		return n
	}
	rep := e.pass(false)
	if count(rep, hosting.HeldGrace) != 4 || count(rep, hosting.HeldTracking) != 2 {
		t.Fatalf("first pass: %+v", rep.Drifts)
	}
	e.clk.Advance(time.Minute)
	// The four go, which frees their places: the last two are tracked
	// in the same pass.
	rep = e.pass(false)
	if rep.Repairs != 4 || count(rep, hosting.HeldGrace) != 2 || count(rep, hosting.HeldTracking) != 0 || objects() != 2 {
		t.Fatalf("at grace: %+v, %d objects", rep, objects())
	}
	e.clk.Advance(time.Minute)
	if rep := e.pass(false); rep.Repairs != 2 || objects() != 0 {
		t.Fatalf("last pass: %+v, %d objects", rep, objects())
	}
	if _, err := hosting.NewReconciler(hosting.ReconcilerOptions{Store: e.store, Projection: e.proj, MaxTracked: -1}); !errors.Is(err, hosting.ErrInvalidOptions) {
		t.Fatalf("negative bound: %v", err)
	}
}

// A create whose projection fails and whose own clean-up fails too
// leaves objects in Ziti: it kicks the reconciler as well.
func TestFailedProjectCleanupKicksTheReconciler(t *testing.T) {
	e := newReconEnv(t, nil)
	kicked := 0
	svc, err := hosting.NewService(hosting.Options{Store: e.store, Projection: e.proj, Clock: e.clk, OnDrift: func() { kicked++ }})
	must(t, err)
	e.svc = svc
	e.agents(account, "a1")
	// The bind policy fails, then the clean-up's service delete.
	e.fake.FailNext("createServicePolicy", 503)
	e.fake.FailNext("deleteService", 503)
	if _, err := e.svc.Create(e.ctx, hosting.Share{AccountID: account, Name: "db", Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432},
		hosting.Update{Active: hosting.Of("a1")}); err == nil {
		t.Fatal("create succeeded")
	}
	if kicked != 1 {
		t.Fatalf("OnDrift called %d times", kicked)
	}
	// A create refused before any write does not kick.
	if _, err := e.svc.Create(e.ctx, hosting.Share{AccountID: account, Name: "db", Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432},
		hosting.Update{Active: hosting.Of("nobody")}); err == nil || kicked != 1 {
		t.Fatalf("refused create: %v, kicked %d", err, kicked)
	}
	// The pass removes what the failed create left, after the grace.
	e.pass(false)
	e.clk.Advance(time.Minute)
	if rep := e.pass(false); rep.Repairs != 2 {
		t.Fatalf("orphans: %+v", rep)
	}
	if st := e.fake.Snapshot(); len(st.Services)+len(st.Configs)+len(st.Policies) != 0 {
		t.Fatalf("left: %+v", st)
	}
}
