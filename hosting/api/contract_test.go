package api_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/api"
)

func body(v map[string]any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func full(active, passive []string) map[string]any {
	m := map[string]any{"name": "db", "targetAddress": "10.0.0.5", "targetPort": 5432, "activeAgentIds": active}
	if passive != nil {
		m["passiveAgentIds"] = passive
	}
	return m
}

func with(m map[string]any, k string, v any) map[string]any {
	out := map[string]any{}
	for kk, vv := range m {
		out[kk] = vv
	}
	if v == nil {
		delete(out, k)
	} else {
		out[k] = v
	}
	return out
}

// TestContract: every route × success, validation failure, not found and
// conflict, with the status and the message pinned. Where a route cannot
// meet a class, the row says why and pins what it answers instead. The
// API runs behind bearer tokens; a row sends tenant-a's token (scope
// acct-1) unless it says otherwise, and every route has rows for a token
// in scope, out of scope, scoped to all accounts, no token and a wrong
// one.
func TestContract(t *testing.T) {
	e := newEnv(t, nil)
	e.withBearer()
	e.agents(acct, "a1", "a2", "p1", "p2")
	e.agents(other, "elsewhere")
	// A live agent that has no Ziti identity yet.
	if err := e.store.PutAgent(t.Context(), hosting.Agent{ID: "noident", AccountID: acct}); err != nil {
		t.Fatal(err)
	}
	mk := func(kind hosting.Kind, active, passive []string) hosting.Share {
		s, err := e.svc.Create(t.Context(), hosting.Share{AccountID: acct, Name: "fixture", Kind: kind, TargetAddress: "10.0.0.9", TargetPort: 80},
			hosting.Update{Active: hosting.Of(active...), Passive: hosting.Of(passive...)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	sA := mk(hosting.KindTCP, []string{"a1"}, []string{"p1"})
	sDel := mk(hosting.KindTCP, []string{"a2"}, nil)
	sStuck := mk(hosting.KindTCP, []string{"a2"}, nil)
	e.ing.mu.Lock()
	e.ing.stuck[sStuck.ID] = true
	e.ing.mu.Unlock()
	sIP := mk(hosting.KindIPsec, []string{"a1"}, nil)
	// Scope fixtures: sIn and sInDel in acct-1, sOut and sOutDel in acct-2.
	mkIn := func(account, agent string) hosting.Share {
		s, err := e.svc.Create(t.Context(), hosting.Share{AccountID: account, Name: "scoped", Kind: hosting.KindTCP, TargetAddress: "10.0.0.9", TargetPort: 80},
			hosting.Update{Active: hosting.Of(agent)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	sIn, sInDel := mkIn(acct, "a1"), mkIn(acct, "a1")
	sOut, sOutDel := mkIn(other, "elsewhere"), mkIn(other, "elsewhere")
	ocol := "/v1/accounts/" + other + "/tcp-shares"
	oitem := func(id string) string { return ocol + "/" + id }
	ops := map[string]string{"Authorization": "Bearer " + opsToken}
	none := map[string]string{"Authorization": ""}
	wrong := map[string]string{"Authorization": "Bearer wrong-token-0123456789"}
	const unauth = "a valid bearer token is required"
	listed := func(account string, want ...string) func(t *testing.T, a answer) {
		return func(t *testing.T, a answer) {
			var l api.ListView
			if err := json.Unmarshal(a.body, &l); err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, s := range l.Embedded.Shares {
				if s.AccountID != account {
					t.Fatalf("listed %+v of another account", s)
				}
				ids = append(ids, s.ID)
			}
			for _, id := range want {
				if !slices.Contains(ids, id) {
					t.Fatalf("%s not listed in %v", id, ids)
				}
			}
			if want == nil && l.Count != 0 {
				t.Fatalf("out of scope lists %+v", l)
			}
		}
	}
	live := func(id string) func(t *testing.T, a answer) {
		return func(t *testing.T, a answer) {
			if s, err := e.store.Get(t.Context(), id); err != nil || !s.Live() || s.Name != "scoped" {
				t.Fatalf("%s after a refused write: %+v %v", id, s, err)
			}
		}
	}
	const col = "/v1/accounts/" + acct + "/tcp-shares"
	item := func(id string) string { return col + "/" + id }
	missing := hosting.NewID()
	dry := map[string]string{api.ValidateHeader: "true"}
	noActive := []hosting.Violation{{Field: "activeAgentIds", Message: hosting.MsgNoActive}}

	type row struct {
		route, class  string
		method, path  string
		body          string
		hdr           map[string]string
		status        int
		ptype, detail string              // problem type and detail, when an error
		violations    []hosting.Violation // pinned, for 422
		check         func(t *testing.T, a answer)
	}
	rows := []row{
		// create
		{"create", "success", "POST", col, body(full([]string{"a1"}, []string{"p1"})), nil, 201, "", "", nil, func(t *testing.T, a answer) {
			v := a.share(t)
			if a.header.Get("Location") != v.Links.Self.Href || v.Links.Self.Href != item(v.ID) || a.header.Get("Content-Type") != api.MediaHAL {
				t.Fatalf("location %q self %q ct %q", a.header.Get("Location"), v.Links.Self.Href, a.header.Get("Content-Type"))
			}
			if v.Kind != hosting.KindTCP || !slices.Equal(v.ActiveAgentIDs, []string{"a1"}) || !slices.Equal(v.PassiveAgentIDs, []string{"p1"}) || v.Hosting != nil || v.CreatedBy != "tenant-a" {
				t.Fatalf("view %+v", v)
			}
			want := []api.Link{{Href: "/v1/accounts/acct-1/agents/a1", Name: "a1"}, {Href: "/v1/accounts/acct-1/agents/p1", Name: "p1"}}
			if !slices.Equal(v.Links.Agents, want) {
				t.Fatalf("agents links %v, want %v", v.Links.Agents, want)
			}
		}},
		{"create", "validation: no active", "POST", col, body(full(nil, []string{"p1"})), nil, 422, api.TypeValidation, "activeAgentIds: at least one active host is required", noActive, nil},
		{"create", "validation: agent elsewhere", "POST", col, body(full([]string{"a1", "elsewhere"}, nil)), nil, 422, api.TypeValidation, "activeAgentIds: agent elsewhere does not exist",
			[]hosting.Violation{{Field: "activeAgentIds", Message: "agent elsewhere does not exist"}}, nil},
		{"create", "validation: fields", "POST", col, body(map[string]any{"name": "", "targetAddress": "bad host!", "targetPort": 0, "activeAgentIds": []string{"a1"}}), nil, 422, api.TypeValidation,
			"name: name must have 1 to 164 characters; targetAddress: " + hosting.MsgTarget + "; targetPort: " + hosting.MsgPort,
			[]hosting.Violation{{Field: "name", Message: "name must have 1 to 164 characters"}, {Field: "targetAddress", Message: hosting.MsgTarget}, {Field: "targetPort", Message: hosting.MsgPort}}, nil},
		{"create", "validation: bad id", "POST", col, body(with(full([]string{"a1"}, nil), "id", "NOT-A-UUID")), nil, 422, api.TypeValidation, "id: " + api.MsgID, []hosting.Violation{{Field: "id", Message: api.MsgID}}, nil},
		{"create", "bad body: unknown field", "POST", col, `{"agentId":"a1"}`, nil, 400, api.TypeBadRequest, `api: bad request body: json: unknown field "agentId"`, nil, nil},
		{"create", "bad body: port not an integer", "POST", col, body(with(full([]string{"a1"}, nil), "targetPort", 1.5)), nil, 400, api.TypeBadRequest, "api: bad request body: targetPort must be an integer, got 1.5", nil, nil},
		{"create", "not found: unknown kind", "POST", "/v1/accounts/" + acct + "/udp-shares", body(full([]string{"a1"}, nil)), nil, 404, api.TypeNotFound, "no resource at /accounts/acct-1/udp-shares", nil, nil},
		{"create", "conflict: id in use", "POST", col, body(with(full([]string{"a1"}, nil), "id", sA.ID)), nil, 409, api.TypeConflict, "a share with this id exists", nil, nil},
		{"create", "dry run: valid", "POST", col, body(full([]string{"a1"}, nil)), dry, 204, "", "", nil, nil},
		{"create", "dry run: same violations", "POST", col, body(full(nil, []string{"p1"})), dry, 422, api.TypeValidation, "activeAgentIds: at least one active host is required", noActive, nil},
		{"create", "media type", "POST", col, "x", map[string]string{"Content-Type": "text/plain"}, 415, api.TypeMediaType, "the body must be application/json", nil, nil},
		{"create", "size limit", "POST", col, `{"name":"` + strings.Repeat("x", api.DefaultMaxBodyBytes) + `"}`, nil, 413, api.TypeTooLarge, fmt.Sprintf("the body is over %d bytes", api.DefaultMaxBodyBytes), nil, nil},
		// list
		{"list", "success: passive filter", "GET", col + "?passiveAgentId=p1&sort=-createdAt,name", "", nil, 200, "", "", nil, func(t *testing.T, a answer) {
			var l api.ListView
			if err := json.Unmarshal(a.body, &l); err != nil {
				t.Fatal(err)
			}
			for _, s := range l.Embedded.Shares {
				if !slices.Contains(s.PassiveAgentIDs, "p1") || s.Hosting != nil || len(s.Links.Agents) != len(s.ActiveAgentIDs)+len(s.PassiveAgentIDs) {
					t.Fatalf("listed %+v", s)
				}
			}
			if l.Count != len(l.Embedded.Shares) || l.Count < 1 || l.Links.Self.Href != col+"?passiveAgentId=p1&sort=-createdAt,name" {
				t.Fatalf("list %+v", l)
			}
		}},
		{"list", "validation: host sets are not sortable", "GET", col + "?sort=activeAgentIds", "", nil, 400, api.TypeBadRequest, `api: bad query: cannot sort by "activeAgentIds": sortable fields are createdAt, id, name, targetAddress, targetPort, updatedAt`, nil, nil},
		{"list", "validation: limit over the maximum", "GET", col + "?limit=1001", "", nil, 400, api.TypeBadRequest, "api: bad query: limit must be 1 to 1000 and offset at least 0", nil, nil},
		{"list", "validation: negative offset", "GET", col + "?offset=-1", "", nil, 400, api.TypeBadRequest, "api: bad query: limit must be 1 to 1000 and offset at least 0", nil, nil},
		{"list", "success: paging", "GET", col + "?limit=1&sort=id", "", nil, 200, "", "", nil, func(t *testing.T, a answer) {
			var l api.ListView
			if err := json.Unmarshal(a.body, &l); err != nil {
				t.Fatal(err)
			}
			if len(l.Embedded.Shares) != 1 || l.Count < 2 || l.Links.Next == nil || l.Links.Next.Href != col+"?limit=1&offset=1&sort=id" {
				t.Fatalf("page %+v next %+v", l, l.Links.Next)
			}
			b := e.do("GET", l.Links.Next.Href, "", nil)
			var l2 api.ListView
			_ = json.Unmarshal(b.body, &l2)
			if len(l2.Embedded.Shares) != 1 || l2.Embedded.Shares[0].ID <= l.Embedded.Shares[0].ID || l2.Offset != 1 {
				t.Fatalf("next page %+v", l2)
			}
		}},
		{"list", "validation: unknown parameter", "GET", col + "?agent=a1", "", nil, 400, api.TypeBadRequest, `api: bad query: unknown query parameter "agent"`, nil, nil},
		{"list", "not found: unknown kind", "GET", "/v1/accounts/" + acct + "/udp-shares", "", nil, 404, api.TypeNotFound, "no resource at /accounts/acct-1/udp-shares", nil, nil},
		{"list", "conflict: none (a read); another account lists nothing", "GET", "/v1/accounts/nobody/tcp-shares", "", nil, 200, "", "", nil, func(t *testing.T, a answer) {
			if !strings.Contains(string(a.body), `"count":0`) {
				t.Fatalf("%s", a.body)
			}
		}},
		// get
		{"get", "success: hosting block", "GET", item(sA.ID), "", nil, 200, "", "", nil, func(t *testing.T, a answer) {
			v := a.share(t)
			if v.Hosting == nil || v.Hosting.State != hosting.Down || len(v.Hosting.Hosts) != 2 || len(v.Links.Agents) != 2 {
				t.Fatalf("view %+v", v)
			}
		}},
		{"get", "validation: a malformed id is not found", "GET", item("not-a-uuid"), "", nil, 404, api.TypeNotFound, "share not-a-uuid does not exist", nil, nil},
		{"get", "not found", "GET", item(missing), "", nil, 404, api.TypeNotFound, "share " + missing + " does not exist", nil, nil},
		{"get", "not found: another kind", "GET", item(sIP.ID), "", nil, 404, api.TypeNotFound, "share " + sIP.ID + " does not exist", nil, nil},
		{"get", "not found: another account", "GET", "/v1/accounts/" + other + "/tcp-shares/" + sA.ID, "", nil, 404, api.TypeNotFound, "share " + sA.ID + " does not exist", nil, nil},
		{"get", "conflict: none (a read); a method not allowed", "POST", item(sA.ID), "{}", nil, 405, api.TypeMethod, "POST is not allowed here; allowed: GET, PUT, PATCH, DELETE", nil, nil},
		// put
		{"put", "success: roles swapped", "PUT", item(sA.ID), body(full([]string{"p1"}, []string{"a1"})), nil, 200, "", "", nil, func(t *testing.T, a answer) {
			v := a.share(t)
			if !slices.Equal(v.ActiveAgentIDs, []string{"p1"}) || !slices.Equal(v.PassiveAgentIDs, []string{"a1"}) || v.Name != "db" || v.TargetPort != 5432 {
				t.Fatalf("view %+v", v)
			}
		}},
		{"put", "validation: no activeAgentIds", "PUT", item(sA.ID), body(with(full(nil, []string{"p1"}), "activeAgentIds", nil)), nil, 422, api.TypeValidation, "activeAgentIds: at least one active host is required", noActive, nil},
		{"put", "validation: a PUT replaces every field", "PUT", item(sA.ID), `{"activeAgentIds":["a1"]}`, nil, 422, api.TypeValidation,
			"name: name must have 1 to 164 characters; targetAddress: " + hosting.MsgTarget + "; targetPort: " + hosting.MsgPort,
			[]hosting.Violation{{Field: "name", Message: "name must have 1 to 164 characters"}, {Field: "targetAddress", Message: hosting.MsgTarget}, {Field: "targetPort", Message: hosting.MsgPort}}, nil},
		{"put", "dry run: no activeAgentIds", "PUT", item(sA.ID), body(with(full(nil, nil), "activeAgentIds", nil)), dry, 422, api.TypeValidation, "activeAgentIds: at least one active host is required", noActive, nil},
		{"put", "not found", "PUT", item(missing), body(full([]string{"a1"}, nil)), nil, 404, api.TypeNotFound, "share " + missing + " does not exist", nil, nil},
		{"put", "conflict: passive without identity", "PUT", item(sA.ID), body(full([]string{"a1"}, []string{"noident"})), nil, 409, api.TypeConflict, "a passive's agent has no Ziti identity yet; retry once it is enrolled", nil, nil},
		// patch
		{"patch", "success: a list replaces, an absent list leaves", "PATCH", item(sA.ID), `{"activeAgentIds":["p1","a2"]}`, nil, 200, "", "", nil, func(t *testing.T, a answer) {
			v := a.share(t)
			if !slices.Equal(v.ActiveAgentIDs, []string{"a2", "p1"}) || !slices.Equal(v.PassiveAgentIDs, []string{"a1"}) {
				t.Fatalf("view %+v", v)
			}
		}},
		{"patch", "success: null clears passives", "PATCH", item(sA.ID), `{"passiveAgentIds":null}`, nil, 200, "", "", nil, func(t *testing.T, a answer) {
			v := a.share(t)
			if !slices.Equal(v.ActiveAgentIDs, []string{"a2", "p1"}) || len(v.PassiveAgentIDs) != 0 || len(v.Links.Agents) != 2 {
				t.Fatalf("view %+v", v)
			}
		}},
		{"patch", "validation: overlap", "PATCH", item(sA.ID), `{"passiveAgentIds":["a2"]}`, nil, 422, api.TypeValidation, "passiveAgentIds: agent a2 cannot be both active and passive",
			[]hosting.Violation{{Field: "passiveAgentIds", Message: "agent a2 cannot be both active and passive"}}, nil},
		{"patch", "validation: port out of range", "PATCH", item(sA.ID), `{"targetPort":70000}`, nil, 422, api.TypeValidation, "targetPort: " + hosting.MsgPort, []hosting.Violation{{Field: "targetPort", Message: hosting.MsgPort}}, nil},
		{"patch", "success: targetPort at its maximum", "PATCH", item(sA.ID), `{"targetPort":65535}`, nil, 200, "", "", nil, func(t *testing.T, a answer) {
			if v := a.share(t); v.TargetPort != 65535 {
				t.Fatalf("port %d", v.TargetPort)
			}
		}},
		{"patch", "validation: targetPort one over", "PATCH", item(sA.ID), `{"targetPort":65536}`, nil, 422, api.TypeValidation, "targetPort: " + hosting.MsgPort, []hosting.Violation{{Field: "targetPort", Message: hosting.MsgPort}}, nil},
		{"patch", "validation: targetPort past int64", "PATCH", item(sA.ID), `{"targetPort":1e30}`, nil, 422, api.TypeValidation, "targetPort: " + hosting.MsgPort, []hosting.Violation{{Field: "targetPort", Message: hosting.MsgPort}}, nil},
		{"patch", "validation: targetPort 0", "PATCH", item(sA.ID), `{"targetPort":0}`, nil, 422, api.TypeValidation, "targetPort: " + hosting.MsgPort, []hosting.Violation{{Field: "targetPort", Message: hosting.MsgPort}}, nil},
		{"patch", "success: targetPort back", "PATCH", item(sA.ID), `{"targetPort":5432}`, nil, 200, "", "", nil, nil},
		{"patch", "validation: over the cap", "PATCH", item(sA.ID), `{"passiveAgentIds":["p2","n1","n2","n3","n4","n5","n6"]}`, nil, 422, api.TypeValidation, "hosts: a share has at most 8 hosts, got 9",
			[]hosting.Violation{{Field: "hosts", Message: "a share has at most 8 hosts, got 9"}}, nil},
		{"patch", "dry run: valid, writes nothing", "PATCH", item(sA.ID), `{"passiveAgentIds":["p2"]}`, dry, 204, "", "", nil, nil},
		{"patch", "not found", "PATCH", item(missing), `{}`, nil, 404, api.TypeNotFound, "share " + missing + " does not exist", nil, nil},
		{"patch", "conflict: passive without identity", "PATCH", item(sA.ID), `{"passiveAgentIds":["noident"]}`, nil, 409, api.TypeConflict, "a passive's agent has no Ziti identity yet; retry once it is enrolled", nil, nil},
		// delete
		{"delete", "success", "DELETE", item(sDel.ID), "", nil, 204, "", "", nil, func(t *testing.T, a answer) {
			if g := e.do("GET", item(sDel.ID), "", nil); g.status != 404 {
				t.Fatalf("deleted share reads %d", g.status)
			}
		}},
		{"delete", "validation: none (no body); a deleted share is not found", "DELETE", item(sDel.ID), "", nil, 404, api.TypeNotFound, "share " + sDel.ID + " does not exist", nil, nil},
		{"delete", "not found", "DELETE", item(missing), "", nil, 404, api.TypeNotFound, "share " + missing + " does not exist", nil, nil},
		{"delete", "conflict: ingress still up", "DELETE", item(sStuck.ID), "", nil, 409, api.TypeConflict, "the share's ingress is still up; retry", nil, nil},
	}
	rows = append(rows, []row{
		// scopes: create
		{"create", "scope: in scope", "POST", col, body(full([]string{"a1"}, nil)), nil, 201, "", "", nil, nil},
		{"create", "scope: out of scope answers as an unknown account", "POST", ocol, body(full([]string{"elsewhere"}, nil)), nil, 422, api.TypeValidation,
			"activeAgentIds: agent elsewhere does not exist", []hosting.Violation{{Field: "activeAgentIds", Message: "agent elsewhere does not exist"}}, nil},
		{"create", "scope: all accounts", "POST", ocol, body(full([]string{"elsewhere"}, nil)), ops, 201, "", "", nil, func(t *testing.T, a answer) {
			if v := a.share(t); v.AccountID != other || v.CreatedBy != "ops" {
				t.Fatalf("view %+v", v)
			}
		}},
		{"create", "scope: no token", "POST", col, body(full([]string{"a1"}, nil)), none, 401, api.TypeUnauth, unauth, nil, nil},
		{"create", "scope: wrong token", "POST", col, body(full([]string{"a1"}, nil)), wrong, 401, api.TypeUnauth, unauth, nil, nil},
		// scopes: list
		{"list", "scope: in scope", "GET", col, "", nil, 200, "", "", nil, listed(acct, sIn.ID)},
		{"list", "scope: out of scope lists nothing", "GET", ocol, "", nil, 200, "", "", nil, listed(other)},
		{"list", "scope: all accounts", "GET", ocol, "", ops, 200, "", "", nil, listed(other, sOut.ID)},
		{"list", "scope: no token", "GET", col, "", none, 401, api.TypeUnauth, unauth, nil, nil},
		{"list", "scope: wrong token", "GET", col, "", wrong, 401, api.TypeUnauth, unauth, nil, nil},
		// scopes: get
		{"get", "scope: in scope", "GET", item(sIn.ID), "", nil, 200, "", "", nil, nil},
		{"get", "scope: out of scope is not found", "GET", oitem(sOut.ID), "", nil, 404, api.TypeNotFound, "share " + sOut.ID + " does not exist", nil, nil},
		{"get", "scope: all accounts", "GET", oitem(sOut.ID), "", ops, 200, "", "", nil, nil},
		{"get", "scope: no token", "GET", item(sIn.ID), "", none, 401, api.TypeUnauth, unauth, nil, nil},
		{"get", "scope: wrong token", "GET", item(sIn.ID), "", wrong, 401, api.TypeUnauth, unauth, nil, nil},
		// scopes: put (the out-of-scope row first: it must leave sOut as it is)
		{"put", "scope: out of scope is not found", "PUT", oitem(sOut.ID), body(full([]string{"elsewhere"}, nil)), nil, 404, api.TypeNotFound, "share " + sOut.ID + " does not exist", nil, live(sOut.ID)},
		{"put", "scope: no token", "PUT", item(sIn.ID), body(full([]string{"a1"}, nil)), none, 401, api.TypeUnauth, unauth, nil, live(sIn.ID)},
		{"put", "scope: wrong token", "PUT", item(sIn.ID), body(full([]string{"a1"}, nil)), wrong, 401, api.TypeUnauth, unauth, nil, live(sIn.ID)},
		// scopes: patch
		{"patch", "scope: out of scope is not found", "PATCH", oitem(sOut.ID), `{"name":"mine"}`, nil, 404, api.TypeNotFound, "share " + sOut.ID + " does not exist", nil, live(sOut.ID)},
		{"patch", "scope: no token", "PATCH", item(sIn.ID), `{"name":"mine"}`, none, 401, api.TypeUnauth, unauth, nil, live(sIn.ID)},
		{"patch", "scope: wrong token", "PATCH", item(sIn.ID), `{"name":"mine"}`, wrong, 401, api.TypeUnauth, unauth, nil, live(sIn.ID)},
		// scopes: delete
		{"delete", "scope: out of scope is not found", "DELETE", oitem(sOut.ID), "", nil, 404, api.TypeNotFound, "share " + sOut.ID + " does not exist", nil, live(sOut.ID)},
		{"delete", "scope: no token", "DELETE", item(sIn.ID), "", none, 401, api.TypeUnauth, unauth, nil, live(sIn.ID)},
		{"delete", "scope: wrong token", "DELETE", item(sIn.ID), "", wrong, 401, api.TypeUnauth, unauth, nil, live(sIn.ID)},
		// scopes: the writes that succeed, last
		{"put", "scope: in scope", "PUT", item(sIn.ID), body(full([]string{"a1"}, nil)), nil, 200, "", "", nil, nil},
		{"put", "scope: all accounts", "PUT", oitem(sOut.ID), body(full([]string{"elsewhere"}, nil)), ops, 200, "", "", nil, nil},
		{"patch", "scope: in scope", "PATCH", item(sIn.ID), `{"name":"mine"}`, nil, 200, "", "", nil, nil},
		{"patch", "scope: all accounts", "PATCH", oitem(sOut.ID), `{"name":"theirs"}`, ops, 200, "", "", nil, func(t *testing.T, a answer) {
			if v := a.share(t); v.Name != "theirs" || v.UpdatedBy != "ops" {
				t.Fatalf("view %+v", v)
			}
		}},
		{"delete", "scope: in scope", "DELETE", item(sInDel.ID), "", nil, 204, "", "", nil, nil},
		{"delete", "scope: all accounts", "DELETE", oitem(sOutDel.ID), "", ops, 204, "", "", nil, func(t *testing.T, a answer) {
			if s, _ := e.store.Get(t.Context(), sOutDel.ID); s.Live() {
				t.Fatalf("still live: %+v", s)
			}
		}},
	}...)
	for _, r := range rows {
		t.Run(r.route+"/"+r.class, func(t *testing.T) {
			hdr := r.hdr
			if r.body != "" && hdr["Content-Type"] == "" {
				m := map[string]string{"Content-Type": "application/json"}
				for k, v := range hdr {
					m[k] = v
				}
				hdr = m
			}
			a := e.do(r.method, r.path, r.body, hdr)
			if a.status != r.status {
				t.Fatalf("%s %s: status %d, want %d: %s", r.method, r.path, a.status, r.status, a.body)
			}
			if r.ptype != "" {
				p := a.problem(t)
				if p.Type != r.ptype || p.Status != r.status || p.Detail != r.detail || fmt.Sprint(p.Violations) != fmt.Sprint(r.violations) {
					t.Fatalf("problem %+v, want type %s detail %q violations %v", p, r.ptype, r.detail, r.violations)
				}
			}
			if r.check != nil {
				r.check(t, a)
			}
		})
	}
	// The dry runs and refused writes changed nothing of sA.
	got, _ := e.store.Get(t.Context(), sA.ID)
	if !got.Hosts.Equal(hosting.NewHosts([]string{"a2", "p1"}, nil)) || got.TargetPort != 5432 {
		t.Fatalf("sA is %+v", got)
	}
}
