package tsng

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/vip"
)

// statusFixture is an API fixture whose home network reports st for
// every VIP, as the daemon's engine would.
func statusFixture(t *testing.T, st vip.ServiceStatus) *apiFixture {
	t.Helper()
	f := newAPIFixture(t)
	f.must("vip", "create", "home", "api")
	f.nets[0].Status = func(vip.ServiceID) any { return st }
	return f
}

// backendRow is the status table's row of backend name:port.
func backendRow(t *testing.T, table, backend string) []string {
	t.Helper()
	for _, ln := range strings.Split(table, "\n") {
		if f := strings.Fields(ln); len(f) > 1 && f[1] == backend {
			return f
		}
	}
	t.Fatalf("no row for %s in\n%s", backend, table)
	return nil
}

// column is the value of the named column in row, by the header's words.
func column(t *testing.T, table string, row []string, name string) string {
	t.Helper()
	hdr := strings.Fields(strings.Split(table, "\n")[1])
	for i, h := range hdr {
		if h == name && i < len(row) {
			return row[i]
		}
	}
	t.Fatalf("no column %s in %q", name, hdr)
	return ""
}

// TestCLIStatusSampleAge: a backend whose probes stopped answering keeps
// no RTT on show: the table prints - for it and the age of its last
// sample, and the API's JSON has rtt_known false with the age kept. An
// eligible backend shows both; one never measured shows neither.
func TestCLIStatusSampleAge(t *testing.T) {
	n1, n2, n3 := vip.NodeID{0xa0, 1}, vip.NodeID{0xa0, 2}, vip.NodeID{0xa0, 3}
	st := vip.ServiceStatus{Name: "api", Listeners: []vip.ListenerStatus{{Listener: "tcp/443", Routed: true,
		Backends: []vip.BackendStatus{
			{BackendRef: vip.BackendRef{Node: n1, NodeName: "fast", Port: 6443}, Reason: "ok", Eligible: true, RTTKnown: true, RTTMillis: 5.25, SampleAgeMillis: 400},
			{BackendRef: vip.BackendRef{Node: n2, NodeName: "failed", Port: 7443}, Reason: "probe-timeout", RTTKnown: true, RTTMillis: 7.5, SampleAgeMillis: 4200},
			{BackendRef: vip.BackendRef{Node: n3, NodeName: "new", Port: 8443}, Reason: "rtt-unknown", Eligible: true, SampleAgeMillis: -1},
		}}}}
	f := statusFixture(t, st)
	table := f.must("vip", "status", "home", "api")
	for _, c := range []struct{ backend, rtt, age string }{
		{"fast:6443", "5.25ms", "0.4s"},
		{"failed:7443", "-", "4.2s"},
		{"new:8443", "-", "-"},
	} {
		row := backendRow(t, table, c.backend)
		if got := column(t, table, row, "RTT"); got != c.rtt {
			t.Errorf("%s: RTT %q, want %q\n%s", c.backend, got, c.rtt, table)
		}
		if got := column(t, table, row, "AGE"); got != c.age {
			t.Errorf("%s: AGE %q, want %q\n%s", c.backend, got, c.age, table)
		}
	}
	if regexp.MustCompile(`7\.50?ms`).MatchString(table) {
		t.Errorf("the failed backend's last RTT is shown:\n%s", table)
	}

	var s struct {
		Status vip.ServiceStatus `json:"status"`
	}
	if err := json.Unmarshal([]byte(f.must("vip", "status", "home", "api", "--json")), &s); err != nil {
		t.Fatal(err)
	}
	bs := s.Status.Listeners[0].Backends
	if !bs[0].RTTKnown || bs[0].RTTMillis != 5.25 || bs[0].SampleAgeMillis != 400 {
		t.Errorf("eligible backend in the JSON: %+v", bs[0])
	}
	if bs[1].RTTKnown || bs[1].RTTMillis != 0 || bs[1].SampleAgeMillis != 4200 {
		t.Errorf("failed backend in the JSON: rtt_known %v rtt_ms %v sample_age_ms %v, want false, 0, 4200", bs[1].RTTKnown, bs[1].RTTMillis, bs[1].SampleAgeMillis)
	}
}
