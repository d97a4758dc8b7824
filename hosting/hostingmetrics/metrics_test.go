package hostingmetrics_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/api"
	"github.com/vipkit/vipkit/hosting/hostingmetrics"
	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/internal/zitifake"
	"github.com/vipkit/vipkit/transport/transporttest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IdleHTTP()...)
}

// Every metric, fed through hosting's hooks by a real API, Ziti client
// and reconciler over the model controller, checked with testutil.
func TestMetrics(t *testing.T) {
	ctx := context.Background()
	f := zitifake.Start(t, zititest.Options{})
	clk := transporttest.NewManualClock()
	st := hosting.NewMemStore()
	dead := int64(3)
	m := hostingmetrics.New(hostingmetrics.Options{Outbox: st, DeadLettered: func() int64 { return dead }, Clock: clk})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	zc, err := ziti.New(f.URL(), ziti.Options{Session: f.Session(), OnError: m.ZitiError})
	if err != nil {
		t.Fatal(err)
	}
	hc := hosting.HealthCheck{Interval: 5 * time.Second, Timeout: 2 * time.Second, Failures: 3}
	p, err := hosting.NewProjection(zc, hosting.ProjectionOptions{FrontdoorID: "fd-1", HealthCheck: hc, DeploymentID: "dep-1"})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := hosting.NewService(hosting.Options{Store: st, Projection: p, Outbox: true, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := hosting.NewReconciler(hosting.ReconcilerOptions{Store: st, Projection: p, Clock: clk, WatchStates: true, OnDrift: m.Drift, OnPass: m.Pass})
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.New(api.Options{Service: svc, Observe: m.Request, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, a := range []string{"a1", "p1"} {
		if err := st.PutAgent(ctx, hosting.Agent{ID: a, AccountID: "acct"}); err != nil {
			t.Fatal(err)
		}
	}
	ia, ip := f.AddIdentity("a1"), f.AddIdentity("p1")
	post := func(body string) int {
		resp, err := http.Post(srv.URL+"/accounts/acct/tcp-shares", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := post(`{"name":"db","targetAddress":"10.0.0.5","targetPort":5432,"activeAgentIds":["a1"],"passiveAgentIds":["p1"]}`); c != 201 {
		t.Fatalf("create: %d", c)
	}
	if c := post(`{"name":"db"}`); c != 422 {
		t.Fatalf("invalid create: %d", c)
	}
	resp, err := http.Get(srv.URL + "/nowhere")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := testutil.CollectAndCompare(m, strings.NewReader(`
# HELP hosting_api_requests_total API requests answered, by route (the pattern matched) and status code.
# TYPE hosting_api_requests_total counter
hosting_api_requests_total{code="201",route="POST /accounts/{account}/{kind}"} 1
hosting_api_requests_total{code="404",route="/"} 1
hosting_api_requests_total{code="422",route="POST /accounts/{account}/{kind}"} 1
`), "hosting_api_requests_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m, "hosting_api_request_duration_seconds"); n != 2 {
		t.Fatalf("latency series: %d", n)
	}
	// The outbox holds one event, 90s old by the clock; the consumer
	// dead-lettered 3.
	msg, err := hosting.Event{ID: hosting.NewID(), Type: hosting.EventUpdated, Share: hosting.Share{ID: hosting.NewID()}, At: clk.Now()}.Message()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
		return tx.(hosting.OutboxTx).AddEvents(ctx, []hosting.EventMessage{msg})
	}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(90 * time.Second)
	if err := testutil.CollectAndCompare(m, strings.NewReader(`
# HELP hosting_events_dead_lettered_total Agent DELETED messages sent to the dead-letter exchange.
# TYPE hosting_events_dead_lettered_total counter
hosting_events_dead_lettered_total 3
# HELP hosting_outbox_lag_seconds Age of the oldest unpublished outbox entry; 0 when none.
# TYPE hosting_outbox_lag_seconds gauge
hosting_outbox_lag_seconds 90
# HELP hosting_outbox_pending Unpublished outbox entries, up to 1000.
# TYPE hosting_outbox_pending gauge
hosting_outbox_pending 1
`), "hosting_events_dead_lettered_total", "hosting_outbox_lag_seconds", "hosting_outbox_pending"); err != nil {
		t.Fatal(err)
	}
	// A failed Ziti call is counted by its operation.
	f.FailNext("listServices", 503)
	if _, err := zc.ListServices(ctx, ""); err == nil {
		t.Fatal("no failure")
	}
	if err := testutil.CollectAndCompare(m, strings.NewReader(`
# HELP hosting_ziti_errors_total Ziti controller calls that failed, by operation.
# TYPE hosting_ziti_errors_total counter
hosting_ziti_errors_total{operation="listServices"} 1
`), "hosting_ziti_errors_total"); err != nil {
		t.Fatal(err)
	}
	// Drift repaired by the reconciler, and the shares per state: the
	// passive's override is gone and the active is bound.
	snap := f.Snapshot()
	var svcID, standby string
	for _, s := range snap.Services {
		svcID = s.ID
	}
	for _, c := range snap.Configs {
		if c.Tags[hosting.TagObject] == hosting.TagStandbyHost {
			standby = c.ID
		}
	}
	if err := zc.RemoveServiceConfigs(ctx, ip, []ziti.ServiceConfig{{ServiceID: svcID, ConfigID: standby}}); err != nil {
		t.Fatal(err)
	}
	f.AddTerminator(svcID, ia, ziti.PrecedenceRequired)
	if _, err := rec.Pass(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := testutil.CollectAndCompare(m, strings.NewReader(`
# HELP hosting_reconciler_repairs_total Drift the reconciler repaired, by kind.
# TYPE hosting_reconciler_repairs_total counter
hosting_reconciler_repairs_total{kind="OVERRIDE_MISSING"} 1
# HELP hosting_reconciler_passes_total Reconciler passes made (dry runs and passes that found the lock held elsewhere not counted).
# TYPE hosting_reconciler_passes_total counter
hosting_reconciler_passes_total 1
# HELP hosting_shares Live shares by hosting state, as the last reconciler pass read them.
# TYPE hosting_shares gauge
hosting_shares{state="DEGRADED"} 1
hosting_shares{state="DOWN"} 0
hosting_shares{state="FAILED_OVER"} 0
hosting_shares{state="HEALTHY"} 0
hosting_shares{state="MISCONFIGURED"} 0
hosting_shares{state="UNKNOWN"} 0
`), "hosting_reconciler_repairs_total", "hosting_reconciler_passes_total", "hosting_shares"); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.CollectAndLint(m)
	if err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("pedantic registry: %v", err)
	}
}
