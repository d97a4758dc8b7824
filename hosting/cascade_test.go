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
