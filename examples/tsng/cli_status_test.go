package tsng

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

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

// tableRow is the status table's line whose LISTENER and BACKEND cells
// are listener and backend.
func tableRow(t *testing.T, table, listener, backend string) string {
	t.Helper()
	for _, ln := range strings.Split(table, "\n") {
		if f := strings.Fields(ln); len(f) > 1 && f[0] == listener && f[1] == backend {
			return ln
		}
	}
	t.Fatalf("no row for %s %s in\n%s", listener, backend, table)
	return ""
}

// column is the cell of row under the header's column name: tabwriter
// starts every cell of a column where its header starts.
func column(t *testing.T, table, row, name string) string {
	t.Helper()
	hdr := strings.Split(table, "\n")[1]
	i := strings.Index(hdr+"  ", "  "+name+"  ")
	if i < 0 && strings.HasPrefix(hdr, name+"  ") {
		i = -2
	}
	if i == -1 {
		t.Fatalf("no column %s in %q", name, hdr)
	}
	i += 2
	if i >= len(row) {
		return ""
	}
	cell, _, _ := strings.Cut(row[i:], "  ")
	return strings.TrimSpace(cell)
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
		row := tableRow(t, table, "tcp/443", c.backend)
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

// TestCLIStatusCounters: the status table shows drops and UDP failovers
// per listener, backend and VIP, as the engine counts them, and names a
// departed backend by its stored node id, with the name it had where this
// agent knew one.
func TestCLIStatusCounters(t *testing.T) {
	n1 := vip.NodeID{0xa0, 1}
	gone, anon := vip.NodeID{0xa0, 2, 0x55}, vip.NodeID{0xa0, 3, 0x66}
	st := vip.ServiceStatus{Name: "api",
		Totals: vip.Totals{Failovers: 7, Drops: map[string]uint64{"capacity": 4, "no-backend": 5}},
		Listeners: []vip.ListenerStatus{
			{Listener: "udp/53", Routed: true, Failovers: 6, Drops: map[string]uint64{"capacity": 3, "no-backend": 5},
				Backends: []vip.BackendStatus{
					{BackendRef: vip.BackendRef{Node: n1, NodeName: "server1", Port: 5353}, Reason: "ok", Eligible: true, Failovers: 2, Drops: map[string]uint64{"capacity": 3}},
					{BackendRef: vip.BackendRef{Node: gone, NodeName: "server2", Port: 5353}, Reason: "departed", Departed: true, Failovers: 4, SampleAgeMillis: -1},
					{BackendRef: vip.BackendRef{Node: anon, Port: 5354}, Reason: "departed", Departed: true, SampleAgeMillis: -1},
				}},
			{Listener: "tcp/443", Routed: true, Drops: map[string]uint64{"capacity": 1},
				Backends: []vip.BackendStatus{
					{BackendRef: vip.BackendRef{Node: n1, NodeName: "server1", Port: 6443}, Reason: "ok", Eligible: true, Drops: map[string]uint64{"capacity": 1}},
				}},
		}}
	f := statusFixture(t, st)
	table := f.must("vip", "status", "home", "api")
	for _, c := range []struct{ listener, backend, drops, failovers string }{
		{"udp/53", "-", "8", "6"},
		{"udp/53", "server1:5353", "3", "2"},
		{"udp/53", gone.String()[:12] + ":5353", "0", "4"},
		{"udp/53", anon.String()[:12] + ":5354", "0", "0"},
		{"tcp/443", "-", "1", "-"}, // TCP bindings never fail over
		{"tcp/443", "server1:6443", "1", "-"},
		{"total", "", "9", "7"},
	} {
		var row string
		if c.listener == "total" {
			for _, ln := range strings.Split(table, "\n") {
				if strings.HasPrefix(ln, "total") {
					row = ln
				}
			}
		} else {
			row = tableRow(t, table, c.listener, c.backend)
		}
		if got := column(t, table, row, "DROPS"); got != c.drops {
			t.Errorf("%s %s: DROPS %q, want %q\n%s", c.listener, c.backend, got, c.drops, table)
		}
		if got := column(t, table, row, "FAILOVERS"); got != c.failovers {
			t.Errorf("%s %s: FAILOVERS %q, want %q\n%s", c.listener, c.backend, got, c.failovers, table)
		}
	}
	// Drops by reason, and the departed backends' full ids and names.
	for _, want := range []string{
		"drops: capacity 4, no-backend 5",
		"udp/53 " + gone.String()[:12] + ":5353: departed node " + gone.String() + ", formerly server2",
		"udp/53 " + anon.String()[:12] + ":5354: departed node " + anon.String() + " (no former name known)",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("no %q in\n%s", want, table)
		}
	}
	if t.Failed() {
		return
	}
	// The API's JSON carries the engine's counters as they are.
	var s struct {
		Status vip.ServiceStatus `json:"status"`
	}
	if err := json.Unmarshal([]byte(f.must("vip", "show", "home", "api", "--json")), &s); err != nil {
		t.Fatal(err)
	}
	l := s.Status.Listeners[0]
	if s.Status.Totals.Failovers != 7 || s.Status.Totals.Drops["no-backend"] != 5 || l.Failovers != 6 || l.Drops["capacity"] != 3 ||
		l.Backends[0].Failovers != 2 || l.Backends[0].Drops["capacity"] != 3 || l.Backends[1].Node != gone || !l.Backends[1].Departed {
		t.Errorf("status JSON: %+v", s.Status)
	}
}

// TestWebEditorStatusInFull: the editor's status table shows what the
// CLI's does: RTT only while current, each backend's sample age, drops
// and UDP failovers per listener, backend and VIP, the drops by reason,
// and a departed backend by its stored id with its former name.
func TestWebEditorStatusInFull(t *testing.T) {
	ctx := browser(t)
	d, _ := uiDaemon(t)
	n1 := vip.NodeID{0xa0, 1}
	gone, anon := vip.NodeID{0xa0, 2, 0x55}, vip.NodeID{0xa0, 3, 0x66}
	st := vip.ServiceStatus{Name: "api",
		Totals: vip.Totals{Failovers: 7, Drops: map[string]uint64{"capacity": 4, "no-backend": 5}},
		Listeners: []vip.ListenerStatus{
			{Listener: "udp/53", Routed: true, Failovers: 6, Drops: map[string]uint64{"capacity": 3, "no-backend": 5},
				Backends: []vip.BackendStatus{
					{BackendRef: vip.BackendRef{Node: n1, NodeName: "fast", Port: 5353}, Reason: "ok", Eligible: true, RTTKnown: true, RTTMillis: 5.25, SampleAgeMillis: 400, Failovers: 2, Drops: map[string]uint64{"capacity": 3}},
					{BackendRef: vip.BackendRef{Node: n1, NodeName: "fast", Port: 5354}, Reason: "probe-timeout", SampleAgeMillis: 4200},
					{BackendRef: vip.BackendRef{Node: gone, NodeName: "server2", Port: 5353}, Reason: "departed", Departed: true, Failovers: 4, SampleAgeMillis: -1},
					{BackendRef: vip.BackendRef{Node: anon, Port: 5355}, Reason: "departed", Departed: true, SampleAgeMillis: -1},
				}},
			{Listener: "tcp/443", Routed: true, Drops: map[string]uint64{"capacity": 1},
				Backends: []vip.BackendStatus{
					{BackendRef: vip.BackendRef{Node: n1, NodeName: "fast", Port: 6443}, Reason: "ok", Eligible: true, RTTKnown: true, RTTMillis: 1, SampleAgeMillis: 65000, Drops: map[string]uint64{"capacity": 1}},
				}},
		}}
	stJSON, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, uiSignIn(t, d, ""), waitJS(`typeof window.tsngStatusTable === "function"`)); err != nil {
		t.Fatal(err)
	}
	type row struct {
		Key, Backend, Title, RTT, Age, Drops, Failovers string
	}
	js := fmt.Sprintf(`(() => { const box = document.createElement("div"); box.replaceChildren(...window.tsngStatusTable(%s));
		const cell = (r, c) => { const e = r.querySelector("." + c); return e ? e.textContent : ""; };
		const rows = [...box.querySelectorAll("tr.status-row")].map((r) => ({Key: r.dataset.backend || r.dataset.statusListener || "total",
			Backend: r.children[1].textContent, Title: r.children[1].title || "", RTT: cell(r, "rtt"), Age: cell(r, "age"),
			Drops: cell(r, "drops"), Failovers: cell(r, "failovers")}));
		const reasons = box.querySelector("#drop-reasons");
		rows.push({Key: "reasons", Backend: reasons ? reasons.textContent : ""});
		return rows; })()`, stJSON)
	got, err := chromedp.Run(ctx, chromedp.Evaluate[[]row](js))
	if err != nil {
		t.Fatal(err)
	}
	fast := n1.String()[:12] // data-backend names nodes as the network's node list does
	byKey := map[string]row{}
	for _, r := range got {
		byKey[r.Key] = r
	}
	want := []row{
		{Key: "udp/53", RTT: "", Age: "", Drops: "8", Failovers: "6"},
		{Key: fast + ":5353", RTT: "5.25 ms", Age: "0.4s", Drops: "3", Failovers: "2"},
		{Key: fast + ":5354", RTT: "—", Age: "4.2s", Drops: "0", Failovers: "0"},
		{Key: gone.String()[:12] + ":5353", Title: gone.String(), RTT: "unknown", Age: "—", Drops: "0", Failovers: "4"},
		{Key: anon.String()[:12] + ":5355", Title: anon.String(), RTT: "unknown", Age: "—", Drops: "0", Failovers: "0"},
		{Key: "tcp/443", RTT: "", Age: "", Drops: "1", Failovers: "—"},
		{Key: fast + ":6443", RTT: "1.00 ms", Age: "1m5s", Drops: "1", Failovers: "—"},
		{Key: "total", RTT: "", Age: "", Drops: "9", Failovers: "7"},
	}
	for _, w := range want {
		g, ok := byKey[w.Key]
		if !ok {
			t.Errorf("no status row %s in %+v", w.Key, got)
			continue
		}
		g.Backend = "" // checked below
		if w.Title == "" {
			g.Title = ""
		}
		if g != w {
			t.Errorf("row %s: got %+v, want %+v", w.Key, g, w)
		}
	}
	if b := byKey[gone.String()[:12]+":5353"].Backend; !strings.Contains(b, "formerly server2") {
		t.Errorf("departed backend with a known name: %q", b)
	}
	if b := byKey[anon.String()[:12]+":5355"].Backend; !strings.Contains(b, "departed") || strings.Contains(b, "formerly") {
		t.Errorf("departed backend without a known name: %q", b)
	}
	if r := byKey["reasons"].Backend; r != "drops: capacity 4, no-backend 5" {
		t.Errorf("drops by reason: %q", r)
	}
}
