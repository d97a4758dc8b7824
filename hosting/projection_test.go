package hosting_test

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/ziti"
)

// checkModel asserts that Ziti matches the share: actives at required,
// passives at default through their override, a standby config iff a
// passive exists, the bind policy equal to the hosts.
func (e *env) checkModel(s hosting.Share) {
	e.t.Helper()
	z := e.zitiOf(s.ID)
	if z.host == nil || precedenceOf(z.host) != ziti.PrecedenceRequired {
		e.t.Fatalf("share host.v1 = %+v, want precedence required", z.host)
	}
	if (z.standby != nil) != (len(s.Hosts.Passive) > 0) {
		e.t.Fatalf("standby config present=%v with passives %v", z.standby != nil, s.Hosts.Passive)
	}
	if z.standby != nil && precedenceOf(z.standby) != ziti.PrecedenceDefault {
		e.t.Fatalf("standby precedence %q", precedenceOf(z.standby))
	}
	want := map[string]string{}
	for _, a := range s.Hosts.Passive {
		want[e.ident[a]] = z.standby.ID
	}
	if fmt.Sprint(want) != fmt.Sprint(z.override) {
		e.t.Fatalf("overrides %v, want %v", z.override, want)
	}
	var roles []string
	for _, a := range s.Hosts.All() {
		roles = append(roles, "#agent | "+a)
	}
	got := slices.Sorted(slices.Values(z.policy.IdentityRoles))
	if !slices.Equal(got, roles) {
		e.t.Fatalf("bind policy roles %v, want %v", got, roles)
	}
	if z.policy.Type != "Bind" || !slices.Equal(z.policy.ServiceRoles, []string{"@" + z.service.ID}) {
		e.t.Fatalf("bind policy %+v", z.policy)
	}
}

func TestProjectionCreateActivePassive(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "a2", "p1")
	s := e.create("db", []string{"a1", "a2"}, []string{"p1"})
	e.checkModel(s)
	z := e.zitiOf(s.ID)
	if z.standby.Name != "db | standby | "+frontdoo+" | "+s.ID {
		t.Fatalf("standby name %q", z.standby.Name)
	}
	for _, c := range []*ziti.Config{z.host, z.standby} {
		pcs, _ := c.Data["portChecks"].([]any)
		if len(pcs) != 1 {
			t.Fatalf("%s: portChecks %v", c.Name, c.Data["portChecks"])
		}
		pc := pcs[0].(map[string]any)
		if pc["address"] != "10.0.0.5:5432" || pc["interval"] != "5s" || pc["timeout"] != "2s" {
			t.Fatalf("port check %v", pc)
		}
		acts := pc["actions"].([]any)
		if a := acts[0].(map[string]any); a["action"] != "mark unhealthy" || a["consecutiveEvents"] != float64(3) {
			t.Fatalf("fail action %v", a)
		}
	}
	e.no500()
}

func TestNoShareObjectCarriesAgentID(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1")
	s := e.create("db", []string{"a1"}, []string{"p1"})
	st := e.fake.Snapshot()
	n := 0
	check := func(kind string, tags ziti.Tags) {
		if tags[hosting.TagShare] != s.ID {
			return
		}
		n++
		if _, ok := tags[hosting.TagAgentID]; ok {
			t.Errorf("%s carries %s: %v", kind, hosting.TagAgentID, tags)
		}
	}
	for _, c := range st.Configs {
		check("config "+c.Name, c.Tags)
	}
	for _, c := range st.Services {
		check("service "+c.Name, c.Tags)
	}
	for _, c := range st.Policies {
		check("policy "+c.Name, c.Tags)
	}
	if n != 4 { // host.v1, standby, service, bind policy
		t.Fatalf("found %d share objects, want 4", n)
	}
}

func TestPortCheckIPv6InBrackets(t *testing.T) {
	if got := hosting.PortCheckAddress("fd00::5", 443); got != "[fd00::5]:443" {
		t.Fatalf("got %q", got)
	}
	if got := hosting.PortCheckAddress("db.internal", 443); got != "db.internal:443" {
		t.Fatalf("got %q", got)
	}
}

func TestTargetChangePatchesBothConfigs(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1")
	s := e.create("db", []string{"a1"}, []string{"p1"})
	addr, port := "fd00::7", uint16(6000)
	e.fake.ResetCalls()
	if _, err := e.svc.Update(e.ctx, s.ID, hosting.Update{Method: hosting.Patch, TargetAddress: &addr, TargetPort: &port}); err != nil {
		t.Fatal(err)
	}
	z := e.zitiOf(s.ID)
	for _, c := range []*ziti.Config{z.host, z.standby} {
		pc := c.Data["portChecks"].([]any)[0].(map[string]any)
		if c.Data["address"] != addr || c.Data["port"] != float64(port) || pc["address"] != "[fd00::7]:6000" {
			t.Fatalf("%s not patched: %v", c.Name, c.Data)
		}
	}
	var ops []string
	for _, c := range e.writes() {
		ops = append(ops, c.OperationID)
	}
	if !slices.Equal(ops, []string{"patchConfig", "patchConfig"}) {
		t.Fatalf("writes %v, want two patchConfig", ops)
	}
}

// writeOps returns "op path" of the writes, with ids of identities
// replaced by agent names.
func (e *env) writeOps() []string {
	names := map[string]string{}
	for a, id := range e.ident {
		names[id] = a
	}
	var out []string
	for _, c := range e.writes() {
		s := c.OperationID
		for id, a := range names {
			if strings.Contains(c.Path, "/"+id+"/") {
				s += " " + a
			}
		}
		out = append(out, s)
	}
	return out
}

func TestWriteOrder(t *testing.T) {
	cases := []struct {
		name            string
		active, passive []string
		toA, toP        []string
		want            []string
	}{
		{"create or add a passive", []string{"a1"}, nil, []string{"a1"}, []string{"p1"},
			[]string{"createConfig", "associateIdentitysServiceConfigs p1", "patchServicePolicy"}},
		{"remove the last passive", []string{"a1"}, []string{"p1"}, []string{"a1"}, nil,
			[]string{"patchServicePolicy", "disassociateIdentitysServiceConfigs p1", "deleteConfig"}},
		{"remove one of two passives", []string{"a1"}, []string{"p1", "p2"}, []string{"a1"}, []string{"p2"},
			[]string{"patchServicePolicy", "disassociateIdentitysServiceConfigs p1"}},
		{"passive to active", []string{"a1"}, []string{"p1", "p2"}, []string{"a1", "p1"}, []string{"p2"},
			[]string{"disassociateIdentitysServiceConfigs p1"}},
		{"active to passive", []string{"a1", "a2"}, []string{"p1"}, []string{"a1"}, []string{"a2", "p1"},
			[]string{"associateIdentitysServiceConfigs a2"}},
		{"swap roles", []string{"a1"}, []string{"p1"}, []string{"p1"}, []string{"a1"},
			[]string{"associateIdentitysServiceConfigs a1", "disassociateIdentitysServiceConfigs p1"}},
		{"add an active", []string{"a1"}, nil, []string{"a1", "a2"}, nil,
			[]string{"patchServicePolicy"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.agents(account, "a1", "a2", "p1", "p2")
			s := e.create("db", tc.active, tc.passive)
			e.fake.ResetCalls()
			s = e.patch(s.ID, &tc.toA, &tc.toP)
			if got := e.writeOps(); !slices.Equal(got, tc.want) {
				t.Fatalf("writes\n got %q\nwant %q", got, tc.want)
			}
			e.checkModel(s)
			e.no500()
		})
	}
}

func TestCreateWriteOrder(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1")
	e.create("db", []string{"a1"}, []string{"p1"})
	want := []string{"createConfig", "createService", "createConfig", "associateIdentitysServiceConfigs p1", "createServicePolicy"}
	if got := e.writeOps(); !slices.Equal(got, want) {
		t.Fatalf("writes\n got %q\nwant %q", got, want)
	}
}

func TestDeleteShareOrderAndNoOverrideLeft(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1", "p2")
	s := e.create("db", []string{"a1"}, []string{"p1", "p2"})
	e.fake.ResetCalls()
	if err := e.svc.Delete(e.ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	want := []string{"deleteServicePolicy", "deleteService", "deleteConfig", "deleteConfig"}
	if got := e.writeOps(); !slices.Equal(got, want) {
		t.Fatalf("writes %q, want %q", got, want)
	}
	st := e.fake.Snapshot()
	if len(st.Overrides) != 0 || len(st.Configs) != 0 || len(st.Services) != 0 || len(st.Policies) != 0 {
		t.Fatalf("left in Ziti: %+v", st)
	}
	e.no500()
	got, err := e.svc.Get(e.ctx, s.ID)
	if err != nil || got.Live() || !got.Hosts.Equal(s.Hosts) || got.Hosting != nil {
		t.Fatalf("deleted share reads back as %+v, %v", got, err)
	}
	if len(e.pub.evs) != 1 || e.pub.evs[0].Type != hosting.EventDeleted {
		t.Fatalf("events %+v", e.pub.evs)
	}
}

func TestRoleChangeTouchesOnlyChangedIdentities(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "a2", "p1", "p2")
	s := e.create("db", []string{"a1", "a2"}, []string{"p1", "p2"})
	e.fake.ResetCalls()
	e.patch(s.ID, list("a1", "p1"), list("a2", "p2"))
	for _, c := range e.writes() {
		for _, untouched := range []string{"a1", "p2"} {
			if strings.Contains(c.Path, e.ident[untouched]) {
				t.Fatalf("write %s %s touches %s", c.OperationID, c.Path, untouched)
			}
		}
	}
	if got := e.writeOps(); !slices.Equal(got, []string{"associateIdentitysServiceConfigs a2", "disassociateIdentitysServiceConfigs p1"}) {
		t.Fatalf("writes %q", got)
	}
}

func TestUnchangedPatchWritesNothing(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1")
	s := e.create("db", []string{"a1"}, []string{"p1"})
	e.fake.ResetCalls()
	e.patch(s.ID, list("a1"), nil)
	if len(e.fake.Calls()) != 0 {
		t.Fatalf("calls %+v", e.fake.Calls())
	}
}

func TestFailedLookupLeavesNothing(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1")
	// p1 is live but has no identity.
	if err := e.store.PutAgent(e.ctx, hosting.Agent{ID: "p1", AccountID: account}); err != nil {
		t.Fatal(err)
	}
	s := e.create("db", []string{"a1"}, nil)
	e.fake.ResetCalls()
	_, err := e.svc.Update(e.ctx, s.ID, hosting.Update{Method: hosting.Patch, Passive: hosting.Of("p1")})
	if !errors.Is(err, hosting.ErrNoIdentity) {
		t.Fatalf("err = %v, want ErrNoIdentity", err)
	}
	if w := e.writes(); len(w) != 0 {
		t.Fatalf("writes after a failed lookup: %+v", w)
	}
	got, _ := e.store.Get(e.ctx, s.ID)
	if len(got.Hosts.Passive) != 0 {
		t.Fatalf("store kept the update: %+v", got.Hosts)
	}
	// A create fails the same way and leaves nothing.
	e.fake.ResetCalls()
	_, err = e.svc.Create(e.ctx, hosting.Share{AccountID: account, Name: "x", Kind: hosting.KindTCP, TargetAddress: "h", TargetPort: 1}, hosting.Update{Active: hosting.Of("a1"), Passive: hosting.Of("p1")})
	if !errors.Is(err, hosting.ErrNoIdentity) || len(e.writes()) != 0 {
		t.Fatalf("create: %v, writes %+v", err, e.writes())
	}
}

func TestHealsOlderHostConfigBeforeStandby(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1")
	s := e.create("db", []string{"a1"}, nil)
	// An older build wrote the share's host.v1 without precedence or check.
	z := e.zitiOf(s.ID)
	if err := e.fake.Client().PatchConfig(e.ctx, z.host.ID, ziti.ConfigPatch{Data: map[string]any{"protocol": "tcp", "address": "10.0.0.5", "port": 5432}}); err != nil {
		t.Fatal(err)
	}
	e.fake.ResetCalls()
	s = e.patch(s.ID, nil, list("p1"))
	got := e.writeOps()
	want := []string{"patchConfig", "createConfig", "associateIdentitysServiceConfigs p1", "patchServicePolicy"}
	if !slices.Equal(got, want) {
		t.Fatalf("writes %q, want %q", got, want)
	}
	e.checkModel(s)
	// The standby config is left alone when the share's own is patched.
	z = e.zitiOf(s.ID)
	name := "renamed"
	e.fake.ResetCalls()
	if _, err := e.svc.Update(e.ctx, s.ID, hosting.Update{Method: hosting.Patch, Name: &name}); err != nil {
		t.Fatal(err)
	}
	for _, c := range e.writes() {
		if c.OperationID == "patchConfig" && strings.HasSuffix(c.Path, z.host.ID) && strings.Contains(c.Body, "standby") {
			t.Fatalf("share host.v1 patched with the standby body: %s", c.Body)
		}
	}
	z2 := e.zitiOf(s.ID)
	if precedenceOf(z2.host) != "required" || precedenceOf(z2.standby) != "default" || !strings.HasPrefix(z2.standby.Name, "renamed | standby") {
		t.Fatalf("after rename: host %v standby %v", z2.host, z2.standby)
	}
}

func TestOverrideLostWithRecreatedIdentityComesBack(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "a2", "p1")
	s := e.create("db", []string{"a1"}, []string{"p1"})
	e.fake.DeleteIdentity(e.ident["p1"])
	e.ident["p1"] = e.fake.AddIdentity("p1")
	s = e.patch(s.ID, list("a1", "a2"), nil) // an unrelated change
	e.checkModel(s)
}

func TestCompensationOnZitiFailure(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1")
	s := e.create("db", []string{"a1"}, nil)
	e.fake.FailNext("patchServicePolicy", 503)
	_, err := e.svc.Update(e.ctx, s.ID, hosting.Update{Method: hosting.Patch, Passive: hosting.Of("p1")})
	if !errors.Is(err, ziti.ErrServer) {
		t.Fatalf("err = %v", err)
	}
	got, _ := e.store.Get(e.ctx, s.ID)
	e.checkModel(got)
	if len(got.Hosts.Passive) != 0 {
		t.Fatalf("store kept the failed update")
	}
}

// TestRoundTripAgainstFake checks the projection's end state in Ziti
// (as TestContainerListOnTheModelController does), against the fake
// controller over HTTP.
func TestRoundTripAgainstFake(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "a2", "p1", "p2", "outsider")
	s := e.create("db", []string{"a1", "a2"}, []string{"p1", "p2"})
	z := e.zitiOf(s.ID)
	// Both host.v1 bodies, health check included, stored exactly as sent.
	if !reflect.DeepEqual(z.host.Data, e.proj.HostConfigData(s, "required")) || !reflect.DeepEqual(z.standby.Data, e.proj.HostConfigData(s, "default")) {
		t.Fatalf("stored bodies differ:\n%v\n%v", z.host.Data, z.standby.Data)
	}
	// Every host can bind; an agent outside the lists cannot.
	c := e.fake.Client()
	for _, a := range []string{"a1", "a2", "p1", "p2", "outsider"} {
		adv, err := c.PolicyAdvice(e.ctx, e.ident[a], z.service.ID)
		if err != nil {
			t.Fatal(err)
		}
		if adv.IsBindAllowed != (a != "outsider") {
			t.Fatalf("%s: bind allowed = %v", a, adv.IsBindAllowed)
		}
	}
	// Each passive has exactly one override for the service (zitiOf fails on two).
	if len(z.override) != 2 {
		t.Fatalf("overrides %v", z.override)
	}
	// Removing the last passives removes their overrides, then the standby config, with no 500.
	s = e.patch(s.ID, nil, list())
	e.checkModel(s)
	// Deleting the share leaves no override on any agent identity.
	s = e.patch(s.ID, nil, list("p1"))
	if err := e.svc.Delete(e.ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if st := e.fake.Snapshot(); len(st.Overrides) != 0 {
		t.Fatalf("overrides left: %v", st.Overrides)
	}
	e.no500()
}

func TestStandbyToldApartByTagNotName(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1")
	// A share whose own config name looks like a standby config's name.
	s := e.create("x | standby | y", []string{"a1"}, []string{"p1"})
	port := uint16(7000)
	if _, err := e.svc.Update(e.ctx, s.ID, hosting.Update{Method: hosting.Patch, TargetPort: &port}); err != nil {
		t.Fatal(err)
	}
	z := e.zitiOf(s.ID)
	if precedenceOf(z.host) != "required" || precedenceOf(z.standby) != "default" || z.host.Data["port"] != float64(7000) || z.standby.Data["port"] != float64(7000) {
		t.Fatalf("host %v\nstandby %v", z.host.Data, z.standby.Data)
	}
	got, _ := e.store.Get(e.ctx, s.ID)
	e.checkModel(got)
}

// names returns the names of the share's four Ziti objects.
func (e *env) names(id string) map[string]string {
	e.t.Helper()
	z := e.zitiOf(id)
	if z.standby == nil {
		e.t.Fatal("no standby config")
	}
	return map[string]string{"service": z.service.Name, "host.v1": z.host.Name, "standby": z.standby.Name, "bind policy": z.policy.Name}
}

func wantNames(name, id string) map[string]string {
	return map[string]string{
		"service":     name + " | " + frontdoo + " | " + id,
		"host.v1":     name + " | host | " + frontdoo + " | " + id,
		"standby":     name + " | standby | " + frontdoo + " | " + id,
		"bind policy": name + " | bind | " + frontdoo + " | " + id,
	}
}

// A rename renames every Ziti object of the share: the service, both
// host.v1 configs and the bind policy, and nothing else is written. A
// rename that fails half-way is compensated back to the old names.
func TestRenameRenamesEveryObject(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1")
	s := e.create("db", []string{"a1"}, []string{"p1"})
	if got := e.names(s.ID); !maps.Equal(got, wantNames("db", s.ID)) {
		t.Fatalf("created with names %v", got)
	}
	e.fake.ResetCalls()
	renamed, err := e.svc.Update(e.ctx, s.ID, hosting.Update{Method: hosting.Patch, Name: ptr("orders")})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.names(s.ID); !maps.Equal(got, wantNames("orders", s.ID)) {
		t.Fatalf("after the rename: names\n got %v\nwant %v", got, wantNames("orders", s.ID))
	}
	if got := e.writeOps(); !slices.Equal(got, []string{"patchService", "patchConfig", "patchConfig", "patchServicePolicy"}) {
		t.Fatalf("rename writes %q", got)
	}
	e.checkModel(renamed)
	// The bind policy patch fails: the service and both configs go back.
	e.fake.FailNext("patchServicePolicy", 503)
	if _, err := e.svc.Update(e.ctx, s.ID, hosting.Update{Method: hosting.Patch, Name: ptr("billing")}); !errors.Is(err, ziti.ErrServer) {
		t.Fatalf("err = %v, want ErrServer", err)
	}
	if got := e.names(s.ID); !maps.Equal(got, wantNames("orders", s.ID)) {
		t.Fatalf("after a failed rename: names %v, want the old ones", got)
	}
}
