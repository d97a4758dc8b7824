package api_test

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/api"
)

// The finding: tenant-a's token is meant for acct-1 only, yet it read a
// share of acct-2.
func TestScopedTokenCannotReadAnotherAccount(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(other, "b1")
	s, err := e.svc.Create(t.Context(), hosting.Share{AccountID: other, Name: "theirs", Kind: hosting.KindTCP, TargetAddress: "10.0.0.9", TargetPort: 80},
		hosting.Update{Active: hosting.Of("b1")})
	if err != nil {
		t.Fatal(err)
	}
	e.withBearer()
	a := e.do("GET", "/v1/accounts/"+other+"/tcp-shares/"+s.ID, "", nil)
	if a.status != 404 {
		t.Fatalf("tenant-a's token reads acct-2's share: status %d", a.status)
	}
	if a := e.do("GET", "/v1/accounts/"+other+"/tcp-shares/"+s.ID, "", map[string]string{"Authorization": "Bearer " + opsToken}); a.status != 200 {
		t.Fatalf("ops's token reads acct-2's share: status %d", a.status)
	}
}

func TestScope(t *testing.T) {
	if _, err := api.AccountScope(); !errors.Is(err, api.ErrScope) {
		t.Fatalf("no account: %v", err)
	}
	if _, err := api.AccountScope("a", ""); !errors.Is(err, api.ErrScope) {
		t.Fatalf("empty account: %v", err)
	}
	s, err := api.AccountScope("b", "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Allows("a") || !s.Allows("b") || s.Allows("c") || s.Allows("") || s.All() || s.Empty() || s.String() != "a,b" || !slices.Equal(s.Accounts(), []string{"a", "b"}) {
		t.Fatalf("scope %v", s)
	}
	all := api.AllAccounts()
	if !all.Allows("anything") || !all.Allows("") || !all.All() || all.Empty() || all.String() != "all" || all.Accounts() != nil {
		t.Fatalf("all %v", all)
	}
	var zero api.Scope
	if zero.Allows("a") || !zero.Empty() {
		t.Fatalf("the zero scope allows a")
	}
	tok := api.Token{Secret: "do-not-print-this-secret", Principal: "p", Scope: s}
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		for _, v := range []any{tok, []api.Token{tok}, &tok} {
			if out := fmt.Sprintf(f, v); strings.Contains(out, tok.Secret) || !strings.Contains(out, "p (accounts: a,b)") {
				t.Fatalf("%s of %T prints %q", f, v, out)
			}
		}
	}
}

// normal is an answer with the path-dependent parts replaced: the share id
// and the account segment.
func normal(a answer, id, account string) string {
	h := a.header.Clone()
	h.Del("Date")
	b := string(a.body)
	if id != "" {
		b = strings.ReplaceAll(b, id, "{id}")
	}
	b = strings.ReplaceAll(b, "/accounts/"+account+"/", "/accounts/{account}/")
	return fmt.Sprintf("%d %v %s", a.status, h, b)
}

// Out of scope, a share that exists answers as one that does not: same
// status, headers and body, on every route that takes a share, for every
// body. The refused writes change nothing.
func TestOutOfScopeShareIsMissing(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(other, "b1", "b2")
	s, err := e.svc.Create(t.Context(), hosting.Share{AccountID: other, Name: "theirs", Kind: hosting.KindTCP, TargetAddress: "10.0.0.9", TargetPort: 80},
		hosting.Update{Active: hosting.Of("b1")})
	if err != nil {
		t.Fatal(err)
	}
	e.withBearer()
	missing := hosting.NewID()
	path := func(id string) string { return "/v1/accounts/" + other + "/tcp-shares/" + id }
	dry := map[string]string{api.ValidateHeader: "true"}
	for _, r := range []struct {
		method, body string
		hdr          map[string]string
	}{
		{"GET", "", nil}, {"DELETE", "", nil},
		{"PUT", body(full([]string{"b1"}, nil)), nil}, {"PUT", body(full([]string{"b1"}, nil)), dry}, {"PUT", `{}`, nil}, {"PUT", `{"bogus":1}`, nil},
		{"PATCH", `{"name":"mine"}`, nil}, {"PATCH", `{"name":"mine"}`, dry}, {"PATCH", `{"targetPort":0}`, nil}, {"PATCH", `{"activeAgentIds":[]}`, nil},
		{"PATCH", "x", map[string]string{"Content-Type": "text/plain"}}, {"PATCH", "{", nil},
	} {
		got := normal(e.do(r.method, path(s.ID), r.body, r.hdr), s.ID, other)
		want := normal(e.do(r.method, path(missing), r.body, r.hdr), missing, other)
		if got != want {
			t.Fatalf("%s %s %v:\nout of scope: %s\nmissing:      %s", r.method, r.body, r.hdr, got, want)
		}
	}
	if cur, err := e.store.Get(t.Context(), s.ID); err != nil || !cur.Live() || cur.Name != "theirs" || !cur.Hosts.Equal(hosting.NewHosts([]string{"b1"}, nil)) {
		t.Fatalf("after refused writes: %+v %v", cur, err)
	}
	// A listing out of scope is an account without shares.
	got := normal(e.do("GET", "/v1/accounts/"+other+"/tcp-shares?sort=name", "", nil), "", other)
	want := normal(e.do("GET", "/v1/accounts/acct-9/tcp-shares?sort=name", "", map[string]string{"Authorization": "Bearer " + opsToken}), "", "acct-9")
	if got != want || !strings.Contains(got, `"count":0`) {
		t.Fatalf("list:\nout of scope: %s\nunknown:      %s", got, want)
	}
}

// A create for an account out of scope answers exactly what a create for
// an account that does not exist answers, through every rule of the
// validator, and writes nothing.
func TestOutOfScopeCreateIsUnknownAccount(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(acct, "a1")
	e.agents(other, "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9")
	// An agent whose account looks like the one the API validates under.
	if err := e.store.PutAgent(t.Context(), hosting.Agent{ID: "nul", AccountID: other + "\x00"}); err != nil {
		t.Fatal(err)
	}
	taken, err := e.svc.Create(t.Context(), hosting.Share{AccountID: other, Name: "theirs", Kind: hosting.KindTCP, TargetAddress: "10.0.0.9", TargetPort: 80},
		hosting.Update{Active: hosting.Of("b1")})
	if err != nil {
		t.Fatal(err)
	}
	e.withBearer()
	nine := []string{"b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9"}
	bodies := []string{
		body(full([]string{"b1"}, []string{"b2"})),
		body(full([]string{"b1", "a1", "ghost"}, []string{"nul"})),
		body(full(nil, []string{"b1"})),
		body(full([]string{"b1"}, []string{"b1"})),
		body(full(nine[:5], nine[5:])),
		body(full(nine[:4], nine[4:8])),
		body(with(full([]string{"b1"}, nil), "targetPort", 70000)),
		body(with(full([]string{"b1"}, nil), "targetPort", 0)),
		body(map[string]any{"name": "", "targetAddress": "bad host!", "activeAgentIds": []string{"b1"}}),
		body(with(full([]string{"b1"}, nil), "id", taken.ID)),
		body(with(full([]string{"b1"}, nil), "id", "NOT-A-UUID")),
		body(with(full([]string{"b1"}, nil), "targetPort", 1.5)),
		`{"activeAgentIds":["b1"],"x":1}`, `{}`, `null`,
	}
	for i, b := range bodies {
		for _, hdr := range []map[string]string{nil, {api.ValidateHeader: "true"}} {
			a := e.do("POST", "/v1/accounts/"+other+"/tcp-shares", b, hdr)
			u := map[string]string{"Authorization": "Bearer " + opsToken}
			for k, v := range hdr {
				u[k] = v
			}
			got, want := normal(a, "", other), normal(e.do("POST", "/v1/accounts/acct-9/tcp-shares", b, u), "", "acct-9")
			if got != want || a.status < 400 {
				t.Fatalf("body %d %s %v:\nout of scope: %s\nunknown:      %s", i, b, hdr, got, want)
			}
		}
	}
	if l, _ := e.svc.List(t.Context(), hosting.Filter{AccountID: other}); len(l) != 1 {
		t.Fatalf("acct-2 holds %d shares", len(l))
	}
	if l, _ := e.svc.List(t.Context(), hosting.Filter{}); len(l) != 1 {
		t.Fatalf("the store holds %d shares", len(l))
	}
}

// Without a scope in the request (no authentication middleware), the
// handler acts on every account.
func TestNoScopeIsOpen(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(other, "b1")
	if a := e.do("POST", "/v1/accounts/"+other+"/tcp-shares", body(full([]string{"b1"}, nil)), nil); a.status != http.StatusCreated {
		t.Fatalf("%d %s", a.status, a.body)
	}
}
