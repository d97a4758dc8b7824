package hosting_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// The projection's end state in Ziti, checked on the model controller:
// config bodies, who can bind, one override per passive, the removal order
// without a 500, and a delete that leaves no override.
func TestContainerListOnTheModelController(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "a2", "p1", "p2", "outsider")
	clk := transporttest.NewManualClock()
	tg := newTarget(t)
	agents := map[string]*zititest.HostAgent{}
	for _, a := range []string{"a1", "a2", "p1", "p2", "outsider"} {
		agents[a] = e.startAgent(a, clk, tg)
	}
	s := e.create("db", []string{"a1", "a2"}, []string{"p1", "p2"})
	z := e.zitiOf(s.ID)

	t.Run("both host.v1 bodies stored exactly as sent and valid", func(t *testing.T) {
		sent := map[string]map[string]any{}
		for _, c := range e.fake.Calls() {
			if c.OperationID != "createConfig" {
				continue
			}
			var body ziti.ConfigCreate
			if err := json.Unmarshal([]byte(c.Body), &body); err != nil {
				t.Fatal(err)
			}
			sent[body.Name] = body.Data
		}
		schema, err := zititest.LoadHostSchema()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []*ziti.Config{z.host, z.standby} {
			if !reflect.DeepEqual(sent[c.Name], c.Data) {
				t.Fatalf("%s stored %v, sent %v", c.Name, c.Data, sent[c.Name])
			}
			if pcs, _ := c.Data["portChecks"].([]any); len(pcs) != 1 {
				t.Fatalf("%s: no health check: %v", c.Name, c.Data)
			}
			if err := schema.Validate(c.Data); err != nil {
				t.Fatalf("%s breaks the schema: %v", c.Name, err)
			}
		}
	})

	t.Run("every host can bind and an agent outside the lists cannot", func(t *testing.T) {
		for _, a := range []string{"a1", "a2", "p1", "p2", "outsider"} {
			adv, err := e.fake.Client().PolicyAdvice(e.ctx, e.ident[a], z.service.ID)
			if err != nil {
				t.Fatal(err)
			}
			if adv.IsBindAllowed != (a != "outsider") {
				t.Fatalf("%s: isBindAllowed %v", a, adv.IsBindAllowed)
			}
		}
		e.waitTerminators(z.service.ID, map[string]string{e.ident["a1"]: "required", e.ident["a2"]: "required", e.ident["p1"]: "default", e.ident["p2"]: "default"})
	})

	t.Run("each passive has exactly one override for the service", func(t *testing.T) {
		st := e.fake.Snapshot()
		for _, a := range []string{"p1", "p2"} {
			n := 0
			for _, ov := range st.Overrides[e.ident[a]] {
				if ov.ServiceID == z.service.ID {
					n++
					if ov.ConfigID != z.standby.ID {
						t.Fatalf("%s overrides with %s, not the standby config", a, ov.ConfigID)
					}
				}
			}
			if n != 1 {
				t.Fatalf("%s has %d overrides for the service", a, n)
			}
		}
		for _, a := range []string{"a1", "a2", "outsider"} {
			if len(st.Overrides[e.ident[a]]) != 0 {
				t.Fatalf("%s has overrides %v", a, st.Overrides[e.ident[a]])
			}
		}
	})

	t.Run("removing the last passive removes its override and then the standby config, no 500", func(t *testing.T) {
		e.patch(s.ID, nil, list("p2"))
		e.fake.ResetCalls()
		e.patch(s.ID, nil, list())
		e.no500()
		var ops []string
		for _, c := range e.writes() {
			ops = append(ops, c.OperationID)
		}
		want := []string{"patchServicePolicy", "disassociateIdentitysServiceConfigs", "deleteConfig"}
		if !slices.Equal(ops, want) {
			t.Fatalf("writes %v, want %v", ops, want)
		}
		if z2 := e.zitiOf(s.ID); z2.standby != nil || len(z2.override) != 0 {
			t.Fatalf("standby %v, overrides %v left", z2.standby, z2.override)
		}
		e.waitTerminators(z.service.ID, map[string]string{e.ident["a1"]: "required", e.ident["a2"]: "required"})
	})

	t.Run("deleting the share leaves no override on any agent identity", func(t *testing.T) {
		e.patch(s.ID, nil, list("p1", "p2"))
		if err := e.svc.Delete(e.ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		e.no500()
		st := e.fake.Snapshot()
		for id, ovs := range st.Overrides {
			if len(ovs) != 0 {
				t.Fatalf("identity %s keeps overrides %v", id, ovs)
			}
		}
		if len(st.Configs)+len(st.Services)+len(st.Policies) != 0 {
			t.Fatalf("left: %+v", st)
		}
	})
}
