package api_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/api"
	"github.com/vipkit/vipkit/internal/testenv"
)

func TestBearerAuthentication(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(acct, "a1")
	h, err := api.New(api.Options{Service: e.svc})
	if err != nil {
		t.Fatal(err)
	}
	b, err := api.NewBearer([]api.Token{{Secret: "secret-token-0123456789", Principal: "alice", Scope: api.AllAccounts()}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(b.Wrap(h))
	defer srv.Close()
	e.srv = srv
	path := "/accounts/" + acct + "/tcp-shares"
	for _, auth := range []string{"", "Bearer wrong-token-0123456789", "Basic c2VjcmV0", "Bearer"} {
		a := e.do("POST", path, body(full([]string{"a1"}, nil)), map[string]string{"Authorization": auth})
		if a.status != 401 || a.header.Get("WWW-Authenticate") != `Bearer realm="vipkit-hosting"` || a.problem(t).Type != api.TypeUnauth {
			t.Fatalf("%q: %d %v %s", auth, a.status, a.header, a.body)
		}
	}
	if l, _ := e.svc.List(t.Context(), hosting.Filter{}); len(l) != 0 {
		t.Fatalf("an unauthenticated request wrote: %v", l)
	}
	a := e.do("POST", path, body(full([]string{"a1"}, nil)), map[string]string{"Authorization": "Bearer secret-token-0123456789"})
	if a.status != 201 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	if v := a.share(t); v.CreatedBy != "alice" || v.UpdatedBy != "alice" {
		t.Fatalf("audit %q %q", v.CreatedBy, v.UpdatedBy)
	}
	all := api.AllAccounts()
	for name, tc := range map[string]struct {
		toks []api.Token
		want string
	}{
		"none":         {nil, "api: bad bearer token: no token"},
		"short":        {[]api.Token{{Secret: "short", Principal: "p", Scope: all}}, "api: bad bearer token: p: a token needs at least 16 characters"},
		"one under":    {[]api.Token{{Secret: "0123456789abcde", Principal: "p", Scope: all}}, "api: bad bearer token: p: a token needs at least 16 characters"},
		"no principal": {[]api.Token{{Secret: "long-enough-token-000", Scope: all}}, "api: bad bearer token: a token without a principal"},
		"empty scope":  {[]api.Token{{Secret: "long-enough-token-000", Principal: "p"}}, "api: bad bearer token: p: an empty scope; give accounts or AllAccounts"},
		"twice": {[]api.Token{{Secret: "long-enough-token-000", Principal: "p", Scope: all}, {Secret: "long-enough-token-000", Principal: "q", Scope: all}},
			"api: bad bearer token: q: a token is given twice"},
	} {
		_, err := api.NewBearer(tc.toks)
		if !errors.Is(err, api.ErrToken) || err.Error() != tc.want {
			t.Fatalf("%s: %v, want %q", name, err, tc.want)
		}
	}
	// Exactly MinTokenLength characters is enough.
	if _, err := api.NewBearer([]api.Token{{Secret: "0123456789abcdef", Principal: "p", Scope: all}}); err != nil {
		t.Fatal(err)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"name":"db","targetAddress":"10.0.0.5","targetPort":5432,"activeAgentIds":["a"],"passiveAgentIds":["b"]}`,
		`{"passiveAgentIds":null}`, `{}`, `{"targetPort":70000}`, `{"targetPort":1e400}`, `{"targetPort":-1}`, `{"id":"x"}`,
		`{"activeAgentIds":[""]}`, `null`, `{"name":null}`, `{} {}`, `[]`, `{"targetPort":1.5}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, m := range []hosting.Method{hosting.Put, hosting.Patch} {
			for _, create := range []bool{false, true} {
				req, err := api.DecodeRequest(b, m, create)
				if err != nil {
					continue
				}
				// What was decoded encodes back and decodes to the same request.
				enc := map[string]any{}
				if req.ID != "" {
					enc["id"] = req.ID
				}
				u := req.Update
				if u.Name != nil {
					enc["name"] = *u.Name
				}
				if u.TargetAddress != nil {
					enc["targetAddress"] = *u.TargetAddress
				}
				if u.TargetPort != nil {
					enc["targetPort"] = *u.TargetPort
				}
				if u.Active.Present {
					enc["activeAgentIds"] = u.Active
				}
				if u.Passive.Present {
					enc["passiveAgentIds"] = u.Passive
				}
				eb, err := json.Marshal(enc)
				if err != nil {
					t.Fatalf("encode %+v: %v", req, err)
				}
				again, err := api.DecodeRequest(eb, m, create)
				if err != nil {
					t.Fatalf("%s decoded, its encoding %s does not: %v", b, eb, err)
				}
				if !reflect.DeepEqual(norm(req), norm(again)) {
					t.Fatalf("%s: %+v, after a round trip %+v", b, req, again)
				}
			}
		}
	})
}

func norm(r api.Request) api.Request {
	for _, l := range []*hosting.List{&r.Update.Active, &r.Update.Passive} {
		if l.IDs == nil {
			l.IDs = []string{}
		}
		if l.Null {
			l.IDs = nil
		}
	}
	return r
}

// Concurrent API writers and agent cascades on shares hosted by the same
// agents: every request is answered with a status of the contract, and at
// the end every live share has live hosts only, and Ziti matches it.
func TestConcurrentCascadesThroughTheAPI(t *testing.T) {
	e := newEnv(t, nil)
	agents := []string{"a0", "a1", "a2", "a3", "a4", "a5"}
	e.agents(acct, agents...)
	seed := testenv.Seed(t, 21)
	var shares []string
	for i := 0; i < 6; i++ {
		act := []string{agents[i%6], agents[(i+1)%6]}
		pas := []string{agents[(i+2)%6]}
		a := e.do("POST", "/v1/accounts/"+acct+"/tcp-shares", body(map[string]any{"name": fmt.Sprint("s", i), "targetAddress": "10.0.0.1", "targetPort": 22, "activeAgentIds": act, "passiveAgentIds": pas}), nil)
		if a.status != 201 {
			t.Fatalf("%d %s", a.status, a.body)
		}
		shares = append(shares, a.share(t).ID)
	}
	// Agents a0 and a1 are deleted while clients keep patching.
	for _, g := range []string{"a0", "a1"} {
		if err := e.store.PutAgent(t.Context(), hosting.Agent{ID: g, AccountID: acct, Deleted: true}); err != nil {
			t.Fatal(err)
		}
		e.fake.DeleteIdentity(e.ident[g])
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 6; k++ {
				id := shares[(int(seed)+c*7+k)%len(shares)]
				pas := []string{agents[2+(c+k)%4]}
				a := e.do("PATCH", "/v1/accounts/"+acct+"/tcp-shares/"+id, body(map[string]any{"passiveAgentIds": pas}), nil)
				switch a.status {
				case 200, 404, 422: // written; deleted by a cascade; overlap with an active
				default:
					errs <- fmt.Errorf("PATCH %s: %d %s", id, a.status, a.body)
				}
			}
		}()
	}
	for _, g := range []string{"a0", "a1"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.svc.RemoveDeletedAgent(t.Context(), g); err != nil {
				errs <- fmt.Errorf("cascade %s: %w", g, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := e.fake.Snapshot()
	for _, id := range shares {
		s, err := e.store.Get(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		if !s.Live() {
			continue
		}
		for _, h := range s.Hosts.All() {
			if h == "a0" || h == "a1" {
				t.Fatalf("share %s keeps deleted host %s: %+v", id, h, s.Hosts)
			}
		}
		var svc string
		for _, x := range st.Services {
			if x.Tags["frontdoorShareId"] == id {
				svc = x.ID
			}
		}
		var roles []string
		for _, p := range st.Policies {
			if p.Tags["frontdoorShareId"] == id {
				roles = slices.Sorted(slices.Values(p.IdentityRoles))
			}
		}
		var want []string
		for _, h := range s.Hosts.All() {
			want = append(want, hosting.AgentRole(h))
		}
		if !slices.Equal(roles, want) {
			t.Fatalf("share %s: bind roles %v, hosts %+v", id, roles, s.Hosts)
		}
		for _, a := range agents[2:] {
			r, _ := s.Hosts.RoleOf(a)
			has := false
			for _, ov := range st.Overrides[e.ident[a]] {
				has = has || ov.ServiceID == svc
			}
			if has != (r == hosting.Passive) {
				t.Fatalf("share %s: %s role %q, override %v", id, a, r, has)
			}
		}
	}
}

// A controller failure answers 502, and the change is rolled back.
func TestControllerFailureIs502(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(acct, "a1", "p1")
	e.fake.FailNext("createServicePolicy", 503)
	a := e.do("POST", "/v1/accounts/"+acct+"/tcp-shares", body(full([]string{"a1"}, []string{"p1"})), nil)
	if p := a.problem(t); a.status != 502 || p.Type != api.TypeUpstream || p.Detail != "the Ziti controller failed; nothing was changed" {
		t.Fatalf("%d %+v", a.status, p)
	}
	if l, _ := e.svc.List(t.Context(), hosting.Filter{}); len(l) != 0 {
		t.Fatalf("stored: %v", l)
	}
	if st := e.fake.Snapshot(); len(st.Configs)+len(st.Services)+len(st.Policies) != 0 {
		t.Fatalf("left in Ziti: %+v", st)
	}
}
