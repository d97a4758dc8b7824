package api_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/api"
	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/zitifake"
)

// GET /reconciler/drift is the reconciler's dry run: it lists the drift
// and repairs nothing; a token scoped to accounts does not see it.
func TestReconcilerDriftDryRun(t *testing.T) {
	f := zitifake.Start(t, zititest.Options{})
	st := hosting.NewMemStore()
	p, err := hosting.NewProjection(f.Client(), hosting.ProjectionOptions{FrontdoorID: "fd-1", HealthCheck: hc, DeploymentID: "dep-1"})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := hosting.NewService(hosting.Options{Store: st, Projection: p})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := hosting.NewReconciler(hosting.ReconcilerOptions{Store: st, Projection: p})
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.New(api.Options{Service: svc, BasePath: "/v1", Reconciler: rec})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, fake: f, svc: svc, store: st, h: h, ident: map[string]string{}, srv: httptest.NewServer(h)}
	t.Cleanup(e.srv.Close)
	e.withBearer()
	e.agents(acct, "a1", "p1")
	s, err := svc.Create(t.Context(), hosting.Share{AccountID: acct, Name: "db", Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432},
		hosting.Update{Active: hosting.Of("a1"), Passive: hosting.Of("p1")})
	if err != nil {
		t.Fatal(err)
	}
	zs := f.Snapshot()
	var svcID, standby string
	for _, x := range zs.Services {
		svcID = x.ID
	}
	for _, c := range zs.Configs {
		if c.Tags[hosting.TagObject] == hosting.TagStandbyHost {
			standby = c.ID
		}
	}
	if err := f.Client().RemoveServiceConfigs(t.Context(), e.ident["p1"], []ziti.ServiceConfig{{ServiceID: svcID, ConfigID: standby}}); err != nil {
		t.Fatal(err)
	}
	f.ResetCalls()
	a := e.do("GET", "/v1/reconciler/drift", "", map[string]string{"Authorization": "Bearer " + opsToken})
	var rep hosting.Report
	if err := json.Unmarshal(a.body, &rep); a.status != http.StatusOK || err != nil {
		t.Fatalf("%d %s", a.status, a.body)
	}
	if !rep.DryRun || len(rep.Drifts) != 1 || rep.Drifts[0].Kind != hosting.DriftOverrideMissing || rep.Drifts[0].ShareID != s.ID ||
		rep.Drifts[0].AgentID != "p1" || rep.Drifts[0].Held != hosting.HeldDryRun || rep.Drifts[0].Repaired {
		t.Fatalf("report %s", a.body)
	}
	for _, c := range f.Calls() {
		if c.Method != "GET" {
			t.Fatalf("the dry run wrote %s %s", c.Method, c.Path)
		}
	}
	if a := e.do("GET", "/v1/reconciler/drift", "", nil); a.status != http.StatusNotFound || a.problem(t).Type != api.TypeNotFound {
		t.Fatalf("tenant-a: %d %s", a.status, a.body)
	}
	if a := e.do("POST", "/v1/reconciler/drift", "", map[string]string{"Authorization": "Bearer " + opsToken}); a.status != http.StatusMethodNotAllowed || a.problem(t).Type != api.TypeMethod || a.header.Get("Allow") != "GET" {
		t.Fatalf("POST: %d %s", a.status, a.body)
	}
}
