package keelvip

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipkit/vipkit/claim"
)

func TestControllerMetrics(t *testing.T) {
	st := claim.Status{Role: claim.RoleHolder, Epoch: 3, Carried: true, Lease: 7, RenewalAge: 1500 * time.Millisecond}
	p := new(promoteCounts)
	p.ok.Add(2)
	p.failed.Add(1)
	c := controllerCollector{vip: "fd00::1:100", node: "a", ttl: 20 * time.Second,
		status: func() claim.Status { return st }, stats: func() claim.Stats { return claim.Stats{Renewals: 9, RenewErrors: 4, Fences: 1} },
		promotes: p}
	if probs, err := testutil.CollectAndLint(c); err != nil || len(probs) != 0 {
		t.Fatalf("lint: %v %v", probs, err)
	}
	want := `
# HELP keel_vip_carried 1 while the controller has the VIP carried on this node's interface.
# TYPE keel_vip_carried gauge
keel_vip_carried{node="a",vip="fd00::1:100"} 1
# HELP keel_vip_epoch Epoch of the newest claim the node took (0: none).
# TYPE keel_vip_epoch gauge
keel_vip_epoch{node="a",vip="fd00::1:100"} 3
# HELP keel_vip_fenced 1 while the node is fenced (or unchecked): it claims nothing by itself until a promote.
# TYPE keel_vip_fenced gauge
keel_vip_fenced{node="a",vip="fd00::1:100"} 0
# HELP keel_vip_lease_remaining_seconds Least time etcd keeps the node's lease: the TTL after the send of the last answered renewal, minus its age (0 once past). Absent without a renewal since start.
# TYPE keel_vip_lease_remaining_seconds gauge
keel_vip_lease_remaining_seconds{node="a",vip="fd00::1:100"} 18.5
# HELP keel_vip_promotes_total Promotes run on this node, by result (ok: it holds the VIP after it; error).
# TYPE keel_vip_promotes_total counter
keel_vip_promotes_total{node="a",result="error",vip="fd00::1:100"} 1
keel_vip_promotes_total{node="a",result="ok",vip="fd00::1:100"} 2
# HELP keel_vip_renewal_age_seconds Seconds since the send of the last renewal etcd answered. Absent without a renewal since start.
# TYPE keel_vip_renewal_age_seconds gauge
keel_vip_renewal_age_seconds{node="a",vip="fd00::1:100"} 1.5
# HELP keel_vip_renewal_failures_total Lease renewals that failed; each counts as no renewal.
# TYPE keel_vip_renewal_failures_total counter
keel_vip_renewal_failures_total{node="a",vip="fd00::1:100"} 4
# HELP keel_vip_role 1 for the node's role for the VIP (primary, replica or observer), 0 for the others.
# TYPE keel_vip_role gauge
keel_vip_role{node="a",role="observer",vip="fd00::1:100"} 0
keel_vip_role{node="a",role="primary",vip="fd00::1:100"} 1
keel_vip_role{node="a",role="replica",vip="fd00::1:100"} 0
`
	names := []string{"keel_vip_carried", "keel_vip_epoch", "keel_vip_fenced", "keel_vip_lease_remaining_seconds",
		"keel_vip_promotes_total", "keel_vip_renewal_age_seconds", "keel_vip_renewal_failures_total", "keel_vip_role"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	// A fenced node without a renewal since start: fenced 1, no age, no lease left.
	st = claim.Status{Role: claim.RoleReplica, Fenced: true, Unchecked: true, RenewalAge: -1}
	if n := testutil.CollectAndCount(c, "keel_vip_renewal_age_seconds", "keel_vip_lease_remaining_seconds"); n != 0 {
		t.Fatalf("age and lease series without a renewal: %d", n)
	}
	if v := testutil.ToFloat64(prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		for m := range collectOne(c, "keel_vip_fenced") {
			ch <- m
		}
	})); v != 1 {
		t.Fatalf("fenced %v", v)
	}
	// The handler answers loopback hosts only.
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	h := metricsHandler(reg)
	for host, code := range map[string]int{"127.0.0.1:9445": 200, "localhost": 200, "[::1]:9445": 200, "evil.example:9445": 403} {
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		r.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != code {
			t.Errorf("host %s: %d, want %d", host, w.Code, code)
		}
	}
}

// collectOne returns the metrics of c named name.
func collectOne(c prometheus.Collector, name string) chan prometheus.Metric {
	all := make(chan prometheus.Metric, 64)
	c.Collect(all)
	close(all)
	out := make(chan prometheus.Metric, 64)
	for m := range all {
		if strings.Contains(m.Desc().String(), `"`+name+`"`) {
			out <- m
		}
	}
	close(out)
	return out
}

// TestCertMetricsAndState: the etcd client certificate's expiry is a
// gauge in Unix seconds with the reloads by result, and its state turns
// expiring exactly certWarnBefore before the expiry and expired at it.
func TestCertMetricsAndState(t *testing.T) {
	na := time.Date(2027, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		now  time.Time
		want string
	}{
		{na.Add(-certWarnBefore - time.Nanosecond), "ok"},
		{na.Add(-certWarnBefore), "expiring"},
		{na.Add(-time.Nanosecond), "expiring"},
		{na, "expired"},
		{na.Add(time.Hour), "expired"},
	} {
		if got := certState(na, c.now); got != c.want {
			t.Errorf("certState at %v before expiry: %q, want %q", na.Sub(c.now), got, c.want)
		}
	}
	if got := certState(time.Time{}, na); got != "" {
		t.Errorf("certState without a certificate: %q", got)
	}
	rot := &etcdTLSRotator{}
	rot.cur.Store(&tlsMaterial{notAfter: na, subject: "member-a"})
	rl := new(tlsReloads)
	rl.ok.Add(2)
	rl.refused.Add(1)
	c := controllerCollector{vip: "fd00::1:100", node: "a", ttl: 20 * time.Second,
		status: func() claim.Status { return claim.Status{} }, stats: func() claim.Stats { return claim.Stats{} },
		promotes: new(promoteCounts), tls: rot, tlsReloads: rl}
	if probs, err := testutil.CollectAndLint(c); err != nil || len(probs) != 0 {
		t.Fatalf("lint: %v %v", probs, err)
	}
	want := `
# HELP keel_vip_etcd_cert_expiry_timestamp_seconds Expiry of the etcd client certificate in use, in Unix seconds. Absent without a client certificate.
# TYPE keel_vip_etcd_cert_expiry_timestamp_seconds gauge
keel_vip_etcd_cert_expiry_timestamp_seconds{node="a",vip="fd00::1:100"} 1.8039024e+09
# HELP keel_vip_etcd_tls_reloads_total New etcd TLS files the controller was handed, by result: ok (in use for new connections), refused (the current ones stay).
# TYPE keel_vip_etcd_tls_reloads_total counter
keel_vip_etcd_tls_reloads_total{node="a",result="ok",vip="fd00::1:100"} 2
keel_vip_etcd_tls_reloads_total{node="a",result="refused",vip="fd00::1:100"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "keel_vip_etcd_cert_expiry_timestamp_seconds", "keel_vip_etcd_tls_reloads_total"); err != nil {
		t.Fatal(err)
	}
	// Plain http: no series.
	c.tls, c.tlsReloads = nil, nil
	if n := testutil.CollectAndCount(c, "keel_vip_etcd_cert_expiry_timestamp_seconds", "keel_vip_etcd_tls_reloads_total"); n != 0 {
		t.Errorf("plain http: %d TLS series, want none", n)
	}
}
