package tsng

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/vip"
)

// TestCLIStatusOverview: `tsng status` summarises every network (up or
// down, its members, its VIPs with their health), as text and as one JSON
// object per network.
func TestCLIStatusOverview(t *testing.T) {
	f := newAPIFixture(t)
	f.must("vip", "create", "home", "api")
	f.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443", "--backend", "server2:7443")
	f.must("vip", "create", "home", "empty")
	f.must("vip", "create", "lab", "db")
	f.must("vip", "port", "add", "lab", "db", "tcp/5432", "--backend", "server3:5432")
	f.up["lab"].Store(false)

	var nets []NetworkOverview
	for _, line := range strings.Split(strings.TrimSpace(f.must("status", "--json")), "\n") {
		var n NetworkOverview
		if err := json.Unmarshal([]byte(line), &n); err != nil {
			t.Fatalf("status --json line %q: %v", line, err)
		}
		nets = append(nets, n)
	}
	if len(nets) != 2 || nets[0].Name != "home" || nets[1].Name != "lab" {
		t.Fatalf("status --json: %+v", nets)
	}
	home, lab := nets[0], nets[1]
	if !home.Up || lab.Up || len(home.Members) != 3 || home.Members[0].Name != "server1" || len(home.VIPs) != 2 || len(lab.VIPs) != 1 {
		t.Fatalf("status --json: home %+v, lab %+v", home, lab)
	}
	api := home.VIPs[0]
	if api.Name != "api" || !api.Addr.IsValid() || api.Listeners != 1 || api.Backends != 2 {
		t.Errorf("api: %+v", api)
	}
	if home.VIPs[1].Name != "empty" || home.VIPs[1].Health != HealthNoBackends {
		t.Errorf("empty: %+v", home.VIPs[1])
	}
	if lab.VIPs[0].Health != HealthUnknown || lab.VIPs[0].State != "network down" {
		t.Errorf("db on a stopped network: %+v", lab.VIPs[0])
	}

	out := f.must("status")
	for _, want := range []string{"network home", "up", "3 members", "server1", "2 VIPs", "network lab", "down", "api", "empty", "no backends", "db", "network down"} {
		if !strings.Contains(out, want) {
			t.Errorf("status: no %q in\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if len(line) > 80 {
			t.Errorf("status line over 80 columns: %q", line)
		}
	}
}

// TestVIPHealth: a VIP is ok when every configured backend is eligible,
// down when none is, degraded in between, and unknown without this
// node's observation.
func TestVIPHealth(t *testing.T) {
	n1, n2 := vip.NodeID{1}, vip.NodeID{2}
	listener := func(port uint16, nodes ...vip.NodeID) vip.Listener {
		l := vip.Listener{Proto: vip.TCP, Port: port}
		for _, n := range nodes {
			l.Backends = append(l.Backends, vip.Backend{Node: n, Port: 1})
		}
		return l
	}
	observed := func(ls ...[]bool) any {
		st := vip.ServiceStatus{}
		for i, el := range ls {
			ls := vip.ListenerStatus{Listener: "tcp/" + string(rune('0'+i))}
			for _, e := range el {
				ls.Backends = append(ls.Backends, vip.BackendStatus{Eligible: e})
			}
			st.Listeners = append(st.Listeners, ls)
		}
		var v any
		b, _ := json.Marshal(st)
		json.Unmarshal(b, &v)
		return v
	}
	for _, c := range []struct {
		name      string
		listeners []vip.Listener
		up        bool
		status    any
		health    string
		eligible  int
	}{
		{"no listeners", nil, true, observed(), HealthNoBackends, 0},
		{"listener without backends", []vip.Listener{listener(1)}, true, observed([]bool{}), HealthNoBackends, 0},
		{"all eligible", []vip.Listener{listener(1, n1, n2)}, true, observed([]bool{true, true}), HealthOK, 2},
		{"one of two", []vip.Listener{listener(1, n1, n2)}, true, observed([]bool{true, false}), HealthDegraded, 1},
		{"none", []vip.Listener{listener(1, n1, n2)}, true, observed([]bool{false, false}), HealthDown, 0},
		{"one listener down, one ok", []vip.Listener{listener(1, n1), listener(2, n2)}, true, observed([]bool{false}, []bool{true}), HealthDegraded, 1},
		{"two listeners, none eligible", []vip.Listener{listener(1, n1), listener(2, n2)}, true, observed([]bool{false}, []bool{false}), HealthDown, 0},
		{"observed, but no listener yet", []vip.Listener{listener(1, n1)}, true, observed(), HealthUnknown, 0},
		{"network down", []vip.Listener{listener(1, n1)}, false, observed([]bool{true}), HealthUnknown, 0},
		{"no observation", []vip.Listener{listener(1, n1)}, true, nil, HealthUnknown, 0},
		{"unreadable observation", []vip.Listener{listener(1, n1)}, true, "garbage", HealthUnknown, 0},
	} {
		d := ServiceDoc{NetworkUp: c.up, Status: c.status}
		d.Name = "api"
		d.Listeners = c.listeners
		v := overviewVIP(d)
		if v.Health != c.health || v.Eligible != c.eligible {
			t.Errorf("%s: health %q, %d eligible; want %q, %d", c.name, v.Health, v.Eligible, c.health, c.eligible)
		}
	}
}
