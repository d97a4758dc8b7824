package hosting_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/ziti"
)

func TestCascade(t *testing.T) {
	cases := []struct {
		name            string
		active, passive []string
		gone            string
		want            *hosting.Hosts // nil: share deleted
	}{
		{"a passive deleted", []string{"a1"}, []string{"p1", "p2"}, "p1", &hosting.Hosts{Active: []string{"a1"}, Passive: []string{"p2"}}},
		{"the last passive deleted", []string{"a1"}, []string{"p1"}, "p1", &hosting.Hosts{Active: []string{"a1"}, Passive: []string{}}},
		{"an active deleted, actives left", []string{"a1", "a2"}, []string{"p1"}, "a1", &hosting.Hosts{Active: []string{"a2"}, Passive: []string{"p1"}}},
		{"the last active deleted, passives promoted", []string{"a1"}, []string{"p1", "p2"}, "a1", &hosting.Hosts{Active: []string{"p1", "p2"}, Passive: []string{}}},
		{"the last host deleted", []string{"a1"}, nil, "a1", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.agents(account, "a1", "a2", "p1", "p2")
			s := e.create("db", tc.active, tc.passive)
			e.deleteAgent(tc.gone)
			e.fake.ResetCalls()
			evs, err := e.svc.RemoveDeletedAgent(e.ctx, tc.gone)
			if err != nil {
				t.Fatal(err)
			}
			e.no500()
			got, err := e.store.Get(e.ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != 1 || len(e.pub.evs) != 1 {
				t.Fatalf("events %+v (published %+v)", evs, e.pub.evs)
			}
			if tc.want == nil {
				if got.Live() || evs[0].Type != hosting.EventDeleted {
					t.Fatalf("share %+v, event %s", got, evs[0].Type)
				}
				if st := e.fake.Snapshot(); len(st.Services)+len(st.Configs)+len(st.Policies)+len(st.Overrides) != 0 {
					t.Fatalf("left in Ziti: %+v", st)
				}
				if !got.Hosts.Equal(s.Hosts) {
					t.Fatalf("deleted share reads back with %+v", got.Hosts)
				}
			} else {
				if !got.Live() || !got.Hosts.Equal(*tc.want) || evs[0].Type != hosting.EventUpdated {
					t.Fatalf("share %+v, event %s", got.Hosts, evs[0].Type)
				}
				e.checkModel(got)
			}
			// A redelivery does nothing.
			e.fake.ResetCalls()
			evs, err = e.svc.RemoveDeletedAgent(e.ctx, tc.gone)
			if err != nil || len(evs) != 0 || len(e.writes()) != 0 || len(e.pub.evs) != 1 {
				t.Fatalf("redelivery: %v %v writes %v", evs, err, e.writes())
			}
		})
	}
}

func TestCascadeOverManyShares(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "a2", "p1")
	s1 := e.create("one", []string{"a1"}, nil)
	s2 := e.create("two", []string{"a2"}, []string{"a1"})
	s3 := e.create("three", []string{"a2"}, nil)
	only, err := e.store.FindLiveHostedOnlyBy(e.ctx, "a1")
	if err != nil || len(only) != 1 || only[0].ID != s1.ID {
		t.Fatalf("FindLiveHostedOnlyBy = %v, %v", only, err)
	}
	e.deleteAgent("a1")
	evs, err := e.svc.RemoveDeletedAgent(e.ctx, "a1")
	if err != nil || len(evs) != 2 {
		t.Fatalf("%v %v", evs, err)
	}
	types := map[string]hosting.EventType{}
	for _, ev := range evs {
		types[ev.Share.ID] = ev.Type
	}
	if types[s1.ID] != hosting.EventDeleted || types[s2.ID] != hosting.EventUpdated {
		t.Fatalf("events %v", types)
	}
	got, _ := e.store.Get(e.ctx, s2.ID)
	e.checkModel(got)
	got3, _ := e.store.Get(e.ctx, s3.ID)
	e.checkModel(got3)
}

func TestTwoHostsDeletedCloseTogether(t *testing.T) {
	// p1 and p2 are both deleted before either cascade runs: neither
	// cascade fails on the other's identity, which is already gone.
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1", "p2")
	s := e.create("db", []string{"a1"}, []string{"p1", "p2"})
	e.deleteAgent("p1")
	e.deleteAgent("p2")
	for _, a := range []string{"p1", "p2"} {
		if _, err := e.svc.RemoveDeletedAgent(e.ctx, a); err != nil {
			t.Fatalf("cascade %s: %v", a, err)
		}
	}
	got, _ := e.store.Get(e.ctx, s.ID)
	if !got.Hosts.Equal(hosting.NewHosts([]string{"a1"}, nil)) {
		t.Fatalf("hosts %+v", got.Hosts)
	}
	e.checkModel(got)
	e.no500()
}

func TestAccountCascade(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1")
	e.agents(other, "b1")
	s1 := e.create("one", []string{"a1"}, []string{"p1"})
	s2 := e.create("two", []string{"a1"}, nil)
	s3, err := e.svc.Create(e.ctx, hosting.Share{AccountID: other, Name: "x", Kind: hosting.KindHTTP, TargetAddress: "web", TargetPort: 80}, hosting.Update{Active: hosting.Of("b1")})
	if err != nil {
		t.Fatal(err)
	}
	evs, err := e.svc.RemoveAccount(e.ctx, account)
	if err != nil || len(evs) != 2 {
		t.Fatalf("%v %v", evs, err)
	}
	for _, id := range []string{s1.ID, s2.ID} {
		if got, _ := e.store.Get(e.ctx, id); got.Live() {
			t.Fatalf("share %s still live", id)
		}
	}
	if got, _ := e.store.Get(e.ctx, s3.ID); !got.Live() {
		t.Fatal("other account's share deleted")
	}
	e.no500()
	e.checkModel(s3)
}

func TestCascadeFailureRollsBackAndCompensates(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "a2", "p1")
	s1 := e.create("one", []string{"a1", "a2"}, []string{"p1"})
	s2 := e.create("two", []string{"a1", "a2"}, nil)
	e.deleteAgent("a1")
	// The second share's policy patch fails: the first share's Ziti change
	// is compensated and nothing is stored.
	e.fake.FailNext("patchServicePolicy", 0, 503)
	e.fake.ResetCalls()
	_, err := e.svc.RemoveDeletedAgent(e.ctx, "a1")
	if !errors.Is(err, ziti.ErrServer) {
		t.Fatalf("err = %v", err)
	}
	for _, s := range []hosting.Share{s1, s2} {
		got, _ := e.store.Get(e.ctx, s.ID)
		if !got.Hosts.Equal(s.Hosts) {
			t.Fatalf("store changed: %+v", got.Hosts)
		}
		z := e.zitiOf(s.ID)
		roles := slices.Sorted(slices.Values(z.policy.IdentityRoles))
		if !slices.Contains(roles, "#agent | a1") {
			t.Fatalf("share %s policy not compensated: %v", s.Name, roles)
		}
	}
}

// Cascades are per host. In the share {active a1, a2; passive p1}, p1 has
// lost its Ziti identity while its agent stays live. Deleting a2 must
// still take a2 off the share: p1 is a broken host, kept off the bind
// policy (without its override it would bind at required), and the
// hosting status reports it. An API update that names p1 still fails.
func TestCascadeSucceedsPastABrokenHost(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "a2", "p1")
	s := e.create("db", []string{"a1", "a2"}, []string{"p1"})
	e.fake.DeleteIdentity(e.ident["p1"]) // p1's agent stays live
	e.deleteAgent("a2")
	evs, err := e.svc.RemoveDeletedAgent(e.ctx, "a2")
	if err != nil {
		t.Fatalf("RemoveDeletedAgent(a2): %v", err)
	}
	if len(evs) != 1 || evs[0].Type != hosting.EventUpdated {
		t.Fatalf("events %+v", evs)
	}
	got, _ := e.store.Get(e.ctx, s.ID)
	if !got.Hosts.Equal(hosting.NewHosts([]string{"a1"}, []string{"p1"})) {
		t.Fatalf("hosts %+v, want {a1; p1}", got.Hosts)
	}
	z := e.zitiOf(s.ID)
	if roles := slices.Sorted(slices.Values(z.policy.IdentityRoles)); !slices.Equal(roles, []string{"#agent | a1"}) {
		t.Fatalf("bind policy roles %v, want only a1: a passive without its override must not be on it", roles)
	}
	if z.standby == nil || precedenceOf(z.standby) != ziti.PrecedenceDefault {
		t.Fatalf("standby config %+v", z.standby)
	}
	e.no500()
	v, err := e.svc.Get(e.ctx, s.ID)
	if err != nil || v.Hosting == nil {
		t.Fatalf("status %+v, %v", v.Hosting, err)
	}
	want := []hosting.HostStatus{
		{AgentID: "a1", Role: hosting.Active},
		{AgentID: "p1", Role: hosting.Passive, Problem: hosting.ProblemNoIdentity},
	}
	if !slices.Equal(v.Hosting.Hosts, want) || v.Hosting.State != hosting.Down {
		t.Fatalf("hosting %+v, want hosts %+v", v.Hosting, want)
	}
	// The API path keeps refusing a passive with no identity.
	_, err = e.svc.Update(e.ctx, s.ID, hosting.Update{Method: hosting.Patch, Name: ptr("renamed")})
	if !errors.Is(err, hosting.ErrNoIdentity) {
		t.Fatalf("API update with a broken passive: %v, want ErrNoIdentity", err)
	}
	// Once p1 has an identity again, the next update heals it: override,
	// then the bind policy.
	e.ident["p1"] = e.fake.AddIdentity("p1")
	healed, err := e.svc.Update(e.ctx, s.ID, hosting.Update{Method: hosting.Patch, Name: ptr("renamed")})
	if err != nil {
		t.Fatal(err)
	}
	e.checkModel(healed)
	if v, _ := e.svc.Get(e.ctx, s.ID); v.Hosting == nil || v.Hosting.Hosts[1].Problem != "" {
		t.Fatalf("healed status %+v", v.Hosting)
	}
}

// A passive whose agent-id tag is on two identities is broken the same
// way: the cascade of another host goes on, and the status says why.
func TestCascadeSucceedsPastAnAmbiguousHost(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "a2", "p1")
	s := e.create("db", []string{"a1", "a2"}, []string{"p1"})
	e.fake.AddIdentity("p1") // a second identity tagged p1
	e.deleteAgent("a2")
	if _, err := e.svc.RemoveDeletedAgent(e.ctx, "a2"); err != nil {
		t.Fatalf("RemoveDeletedAgent(a2): %v", err)
	}
	got, _ := e.store.Get(e.ctx, s.ID)
	if !got.Hosts.Equal(hosting.NewHosts([]string{"a1"}, []string{"p1"})) {
		t.Fatalf("hosts %+v", got.Hosts)
	}
	v, err := e.svc.Get(e.ctx, s.ID)
	if err != nil || v.Hosting == nil || v.Hosting.Hosts[1].Problem != hosting.ProblemManyIdentities {
		t.Fatalf("status %+v, %v", v.Hosting, err)
	}
}

func ptr[T any](v T) *T { return &v }
