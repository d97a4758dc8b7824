package zititest_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/internal/zitifake"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IdleHTTP()...)
}

func start(t *testing.T) (*zititest.Fake, *ziti.Client) {
	t.Helper()
	f := zitifake.Start(t, zititest.Options{})
	return f, f.Client()
}

func TestSpecLoadsWithOneKnownFault(t *testing.T) {
	start(t)
	s, err := zititest.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	if s.ValidateErr == nil || !strings.Contains(s.ValidateErr.Error(), "controllerSettingsList") {
		t.Fatalf("Validate = %v, want the controllerSettingsList fault", s.ValidateErr)
	}
}

type envelope struct {
	Error struct {
		Code         string `json:"code"`
		Message      string `json:"message"`
		CauseMessage string `json:"causeMessage"`
		RequestID    string `json:"requestId"`
	} `json:"error"`
	Meta map[string]any `json:"meta"`
}

func raw(t *testing.T, f *zititest.Fake, method, path, body string, session bool) (int, envelope) {
	t.Helper()
	req, err := http.NewRequest(method, f.URL()+ziti.BasePath+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if session {
		req.Header.Set("zt-session", f.Session())
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var env envelope
	_ = json.Unmarshal(b, &env)
	return resp.StatusCode, env
}

func TestFakeRejectsWhatTheSpecRejects(t *testing.T) {
	f, _ := start(t)
	cases := []struct {
		name, method, path, body string
		session                  bool
		status                   int
		code                     string
	}{
		{"missing required field", "POST", "/configs", `{"name":"x","data":{}}`, true, 400, "COULD_NOT_VALIDATE"},
		{"wrong type", "POST", "/configs", `{"name":1,"configTypeId":"t","data":{}}`, true, 400, "COULD_NOT_VALIDATE"},
		{"data not an object", "POST", "/configs", `{"name":"x","configTypeId":"t","data":[]}`, true, 400, "COULD_NOT_VALIDATE"},
		{"tag value an object", "POST", "/configs", `{"name":"x","configTypeId":"t","data":{},"tags":{"k":{"a":1}}}`, true, 400, "COULD_NOT_VALIDATE"},
		{"bad enum", "POST", "/service-policies", `{"name":"p","type":"Host","semantic":"AnyOf"}`, true, 400, "COULD_NOT_VALIDATE"},
		{"missing body", "POST", "/identities/x/service-configs", ``, true, 400, "COULD_NOT_VALIDATE"},
		{"assign item without configId", "POST", "/identities/x/service-configs", `[{"serviceId":"s"}]`, true, 400, "COULD_NOT_VALIDATE"},
		{"non-integer limit", "GET", "/configs?limit=ten", ``, true, 400, "COULD_NOT_VALIDATE"},
		{"no session", "GET", "/configs", ``, false, 401, "UNAUTHORIZED"},
		{"unknown path", "GET", "/no-such-thing", ``, true, 404, "NOT_FOUND"},
		{"bad filter", "GET", "/configs?filter=name%20~%20x", ``, true, 400, "INVALID_FILTER"},
		{"empty override list", "POST", "/identities/x/service-configs", `[]`, true, 400, "COULD_NOT_VALIDATE"},
		{"empty override remove", "DELETE", "/identities/x/service-configs", `[]`, true, 400, "COULD_NOT_VALIDATE"},
		{"null override remove", "DELETE", "/identities/x/service-configs", ``, true, 400, "COULD_NOT_VALIDATE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, env := raw(t, f, tc.method, tc.path, tc.body, tc.session)
			if st != tc.status || env.Error.Code != tc.code || env.Error.Message == "" || env.Error.RequestID == "" || env.Meta["apiVersion"] == nil {
				t.Fatalf("got %d %+v, want %d %s", st, env, tc.status, tc.code)
			}
		})
	}
	// A string tag, as the controller documents, is accepted.
	ct := hostType(t, f.Client())
	body := `{"name":"x","configTypeId":"` + ct + `","data":{"protocol":"tcp","address":"h","port":1},"tags":{"k":"v","b":true,"n":null}}`
	if st, env := raw(t, f, "POST", "/configs", body, true); st != 201 {
		t.Fatalf("string tags refused: %d %+v", st, env)
	}
}

func hostType(t *testing.T, c *ziti.Client) string {
	t.Helper()
	cts, err := c.ListConfigTypes(context.Background(), ziti.Eq("name", "host.v1"))
	if err != nil || len(cts) != 1 {
		t.Fatalf("config types %v %v", cts, err)
	}
	return cts[0].ID
}

func TestOverrideRules(t *testing.T) {
	f, c := start(t)
	ctx := context.Background()
	ct := hostType(t, c)
	mk := func(name string) string {
		id, err := c.CreateConfig(ctx, ziti.ConfigCreate{Name: name, ConfigTypeID: ct, Data: hostData(1)})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	own, standby, third := mk("own"), mk("standby"), mk("third")
	svc, err := c.CreateService(ctx, ziti.ServiceCreate{Name: "svc", Configs: []string{own}, EncryptionRequired: true})
	if err != nil {
		t.Fatal(err)
	}
	ident := f.AddIdentity("agent-1")
	list := func() []ziti.ServiceConfig {
		t.Helper()
		l, err := c.ListServiceConfigs(ctx, ident)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	pair := ziti.ServiceConfig{ServiceID: svc, ConfigID: standby}
	// Idempotent assign.
	for i := 0; i < 2; i++ {
		if err := c.AssignServiceConfigs(ctx, ident, []ziti.ServiceConfig{pair}); err != nil {
			t.Fatal(err)
		}
	}
	if l := list(); len(l) != 1 || l[0] != pair {
		t.Fatalf("overrides %v", l)
	}
	// A second override of the same (service, type) replaces the first.
	if err := c.AssignServiceConfigs(ctx, ident, []ziti.ServiceConfig{{ServiceID: svc, ConfigID: third}}); err != nil {
		t.Fatal(err)
	}
	if l := list(); len(l) != 1 || l[0].ConfigID != third {
		t.Fatalf("overrides %v", l)
	}
	// A config an override names cannot be deleted: 500, override kept.
	err = c.DeleteConfig(ctx, third)
	var ae *ziti.APIError
	if !errors.Is(err, ziti.ErrConfigInUse) || !errors.As(err, &ae) || ae.Status != 500 || ae.Code != "UNHANDLED" {
		t.Fatalf("delete in-use config: %v", err)
	}
	if l := list(); len(l) != 1 {
		t.Fatalf("override lost: %v", l)
	}
	// A remove works by type: naming another existing config of the type removes it.
	for i := 0; i < 2; i++ { // idempotent
		if err := c.RemoveServiceConfigs(ctx, ident, []ziti.ServiceConfig{pair}); err != nil {
			t.Fatal(err)
		}
	}
	if l := list(); len(l) != 0 {
		t.Fatalf("overrides after remove %v", l)
	}
	// ... but the config it names must exist.
	if err := c.RemoveServiceConfigs(ctx, ident, []ziti.ServiceConfig{{ServiceID: svc, ConfigID: "cfg-missing"}}); !errors.Is(err, ziti.ErrNotFound) {
		t.Fatalf("remove naming a missing config: %v", err)
	}
	if err := c.DeleteConfig(ctx, third); err != nil {
		t.Fatal(err)
	}
	// Deleting a service removes its overrides.
	if err := c.AssignServiceConfigs(ctx, ident, []ziti.ServiceConfig{pair}); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteService(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if l := list(); len(l) != 0 {
		t.Fatalf("overrides after service delete %v", l)
	}
	if err := c.DeleteConfig(ctx, standby); err != nil {
		t.Fatalf("standby still in use after the service went: %v", err)
	}
	// The client refuses an empty list before sending it.
	if err := c.AssignServiceConfigs(ctx, ident, nil); !errors.Is(err, ziti.ErrInvalid) {
		t.Fatal(err)
	}
	for _, call := range f.Calls() {
		if call.Status >= 500 && call.OperationID != "deleteConfig" {
			t.Fatalf("unexpected %d on %s", call.Status, call.OperationID)
		}
	}
}

func TestTerminatorsCarryPrecedenceAndHostID(t *testing.T) {
	f, c := start(t)
	ctx := context.Background()
	ct := hostType(t, c)
	cfg, _ := c.CreateConfig(ctx, ziti.ConfigCreate{Name: "h", ConfigTypeID: ct, Data: hostData(2)})
	svc, err := c.CreateService(ctx, ziti.ServiceCreate{Name: "s", Configs: []string{cfg}, EncryptionRequired: true})
	if err != nil {
		t.Fatal(err)
	}
	ident := f.AddIdentity("a")
	f.AddTerminator(svc, ident, ziti.PrecedenceDefault)
	f.AddTerminator("other-service", ident, ziti.PrecedenceRequired)
	ts, err := c.ListTerminators(ctx, ziti.Eq("service", svc))
	if err != nil || len(ts) != 1 || ts[0].HostID != ident || ts[0].Precedence != "default" || ts[0].ServiceID != svc {
		t.Fatalf("terminators %+v %v", ts, err)
	}
}

func TestListPaging(t *testing.T) {
	f, c := start(t)
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		f.AddIdentity("same")
	}
	st, env := raw(t, f, "GET", "/identities?limit=2&offset=4", "", true)
	pg, _ := env.Meta["pagination"].(map[string]any)
	if st != 200 || pg["totalCount"] != float64(5) || pg["offset"] != float64(4) {
		t.Fatalf("%d %+v", st, env.Meta)
	}
	all, err := c.ListIdentities(ctx, ziti.AnyOfEq("roleAttributes", "agent | same"))
	if err != nil || len(all) != 5 {
		t.Fatalf("%d %v", len(all), err)
	}
}

func TestFakeAnswersSatisfyTheSpec(t *testing.T) {
	f, c := start(t)
	ctx := context.Background()
	ct := hostType(t, c)
	cfg, err := c.CreateConfig(ctx, ziti.ConfigCreate{Name: "h", ConfigTypeID: ct, Data: hostData(1), Tags: ziti.Tags{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	svc, _ := c.CreateService(ctx, ziti.ServiceCreate{Name: "s", Configs: []string{cfg}, EncryptionRequired: true})
	pol, _ := c.CreateServicePolicy(ctx, ziti.ServicePolicyCreate{Name: "p", Type: ziti.PolicyBind, Semantic: ziti.AnyOf, ServiceRoles: []string{"@" + svc}, IdentityRoles: []string{"#agent | a"}})
	ident := f.AddIdentity("a")
	f.AddTerminator(svc, ident, "required")
	_ = c.AssignServiceConfigs(ctx, ident, []ziti.ServiceConfig{{ServiceID: svc, ConfigID: cfg}})
	_, _ = c.ListConfigs(ctx, "")
	_, _ = c.ListServices(ctx, "")
	_, _ = c.ListServicePolicies(ctx, "")
	_, _ = c.ListIdentities(ctx, "")
	_, _ = c.ListServiceConfigs(ctx, ident)
	_, _ = c.ListTerminators(ctx, "")
	_, _ = c.PolicyAdvice(ctx, ident, svc)
	_ = c.PatchServicePolicy(ctx, pol, ziti.ServicePolicyPatch{IdentityRoles: &[]string{}})
	_ = c.DeleteConfig(ctx, cfg) // 500: in use
	_ = c.DeleteService(ctx, svc)
	_ = c.DeleteConfig(ctx, "missing") // 404
	for _, path := range []string{"/configs/" + cfg, "/services/" + svc, "/service-policies/" + pol, "/identities/" + ident} {
		raw(t, f, "GET", path, "", true)
	}
	for _, err := range f.BadAnswers() {
		t.Error(err)
	}
}

// patchService and patchServicePolicy rename, and refuse a name another
// object of the kind holds, as the controller's unique index does.
func TestRenameServiceAndPolicy(t *testing.T) {
	f, c := start(t)
	ctx := t.Context()
	s1, err := c.CreateService(ctx, ziti.ServiceCreate{Name: "one", Configs: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateService(ctx, ziti.ServiceCreate{Name: "two", Configs: []string{}}); err != nil {
		t.Fatal(err)
	}
	p1, err := c.CreateServicePolicy(ctx, ziti.ServicePolicyCreate{Name: "bind one", Type: ziti.PolicyBind, Semantic: ziti.AnyOf, ServiceRoles: []string{}, IdentityRoles: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateServicePolicy(ctx, ziti.ServicePolicyCreate{Name: "bind two", Type: ziti.PolicyBind, Semantic: ziti.AnyOf, ServiceRoles: []string{}, IdentityRoles: []string{}}); err != nil {
		t.Fatal(err)
	}
	taken, fresh := "two", "uno"
	if err := c.PatchService(ctx, s1, ziti.ServicePatch{Name: &taken}); !errors.Is(err, ziti.ErrInvalid) {
		t.Fatalf("rename to a taken name: %v", err)
	}
	if err := c.PatchService(ctx, s1, ziti.ServicePatch{Name: &fresh}); err != nil {
		t.Fatal(err)
	}
	if err := c.PatchService(ctx, "nope", ziti.ServicePatch{Name: &fresh}); !ziti.IsNotFound(err) {
		t.Fatalf("unknown service: %v", err)
	}
	taken, fresh = "bind two", "bind uno"
	if err := c.PatchServicePolicy(ctx, p1, ziti.ServicePolicyPatch{Name: &taken}); !errors.Is(err, ziti.ErrInvalid) {
		t.Fatalf("policy rename to a taken name: %v", err)
	}
	if err := c.PatchServicePolicy(ctx, p1, ziti.ServicePolicyPatch{Name: &fresh}); err != nil {
		t.Fatal(err)
	}
	st := f.Snapshot()
	if st.Services[s1].Name != "uno" || st.Policies[p1].Name != "bind uno" {
		t.Fatalf("names %q %q", st.Services[s1].Name, st.Policies[p1].Name)
	}
}
