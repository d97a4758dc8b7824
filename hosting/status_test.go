package hosting_test

import (
	"fmt"
	"testing"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/ziti"
)

func TestClassifyEveryCell(t *testing.T) {
	cases := []struct {
		prec   string
		role   hosting.Role
		want   hosting.Condition
		bound  bool
		reason string
	}{
		{"required", hosting.Active, hosting.Serving, true, "serving"},
		{"required", hosting.Passive, hosting.WrongBaseline, true, "misconfigured"},
		{"default", hosting.Active, hosting.WrongBaseline, true, "misconfigured"},
		{"default", hosting.Passive, hosting.Serving, true, "serving"},
		{"failed", hosting.Active, hosting.Failing, true, "bound, health check failing"},
		{"failed", hosting.Passive, hosting.Failing, true, "bound, health check failing"},
		{"", hosting.Active, hosting.NotBound, false, "not bound"},
		{"", hosting.Passive, hosting.NotBound, false, "not bound"},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s/%s", tc.prec, tc.role), func(t *testing.T) {
			var precs []string
			if tc.prec != "" {
				precs = []string{tc.prec}
			}
			c, shown := hosting.Classify(tc.role, precs)
			if c != tc.want || shown != tc.prec {
				t.Fatalf("got %v %q, want %v (%s)", c, shown, tc.want, tc.reason)
			}
			// The same cell through DeriveStatus: bound and precedence.
			h := hosting.NewHosts([]string{"a"}, nil)
			if tc.role == hosting.Passive {
				h = hosting.NewHosts([]string{"x"}, []string{"a"})
			}
			var terms []ziti.Terminator
			if tc.prec != "" {
				terms = append(terms, ziti.Terminator{HostID: "id-a", Precedence: tc.prec})
			}
			st := hosting.DeriveStatus(h, map[string]string{"a": "id-a"}, terms)
			for _, hs := range st.Hosts {
				if hs.AgentID == "a" && (hs.Bound != tc.bound || hs.Precedence != tc.prec || hs.Role != tc.role) {
					t.Fatalf("host status %+v", hs)
				}
			}
		})
	}
}

func TestDeriveStatusStates(t *testing.T) {
	ids := map[string]string{"a1": "i-a1", "a2": "i-a2", "p1": "i-p1"}
	term := func(agent, prec string) ziti.Terminator {
		return ziti.Terminator{HostID: ids[agent], Precedence: prec}
	}
	ap := hosting.NewHosts([]string{"a1", "a2"}, []string{"p1"})
	cases := []struct {
		name  string
		h     hosting.Hosts
		terms []ziti.Terminator
		want  hosting.State
	}{
		{"healthy", ap, []ziti.Terminator{term("a1", "required"), term("a2", "required"), term("p1", "default")}, hosting.Healthy},
		{"healthy single host", hosting.NewHosts([]string{"a1"}, nil), []ziti.Terminator{term("a1", "required")}, hosting.Healthy},
		{"degraded: a passive not bound", ap, []ziti.Terminator{term("a1", "required"), term("a2", "required")}, hosting.Degraded},
		{"degraded: an active failing", ap, []ziti.Terminator{term("a1", "required"), term("a2", "failed"), term("p1", "default")}, hosting.Degraded},
		{"failed over", ap, []ziti.Terminator{term("a1", "failed"), term("p1", "default")}, hosting.FailedOver},
		{"down: all failing", ap, []ziti.Terminator{term("a1", "failed"), term("a2", "failed"), term("p1", "failed")}, hosting.Down},
		{"down: none bound", ap, nil, hosting.Down},
		{"misconfigured passive at required wins", ap, []ziti.Terminator{term("a1", "required"), term("a2", "required"), term("p1", "required")}, hosting.Misconfigured},
		{"misconfigured active at default wins over down", ap, []ziti.Terminator{term("a1", "default")}, hosting.Misconfigured},
		{"terminator of another host is ignored", hosting.NewHosts([]string{"a1"}, nil), []ziti.Terminator{{HostID: "stranger", Precedence: "default"}}, hosting.Down},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := hosting.DeriveStatus(tc.h, ids, tc.terms)
			if got.State != tc.want {
				t.Fatalf("state %s, want %s (%+v)", got.State, tc.want, got.Hosts)
			}
			if len(got.Hosts) != tc.h.Len() {
				t.Fatalf("hosts %+v", got.Hosts)
			}
		})
	}
}

func TestStatusOnSingleReadOnly(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1")
	s := e.create("db", []string{"a1"}, []string{"p1"})
	z := e.zitiOf(s.ID)
	e.fake.AddTerminator(z.service.ID, e.ident["a1"], "required")
	e.fake.AddTerminator(z.service.ID, e.ident["p1"], "default")
	v, err := e.svc.Get(e.ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Hosting == nil || v.Hosting.State != hosting.Healthy || len(v.Hosting.Hosts) != 2 || !v.Hosting.Hosts[1].Bound || v.Hosting.Hosts[1].Precedence != "default" {
		t.Fatalf("hosting %+v", v.Hosting)
	}
	// The listing never asks Ziti and never carries the block.
	e.fake.ResetCalls()
	vs, err := e.svc.List(e.ctx, hosting.Filter{AgentID: "p1"})
	if err != nil || len(vs) != 1 || vs[0].Hosting != nil || len(e.fake.Calls()) != 0 {
		t.Fatalf("list %+v %v calls %d", vs, err, len(e.fake.Calls()))
	}
	// The controller cannot be asked: the block is absent.
	e.fake.FailNext("listTerminators", 503)
	v, err = e.svc.Get(e.ctx, s.ID)
	if err != nil || v.Hosting != nil {
		t.Fatalf("hosting %+v, %v", v.Hosting, err)
	}
	if len(v.ActiveAgentIDs) != 1 || len(v.PassiveAgentIDs) != 1 {
		t.Fatalf("view %+v", v)
	}
}
