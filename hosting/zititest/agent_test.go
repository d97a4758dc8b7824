package zititest_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// terms polls until the service's terminators satisfy ok, and returns them.
func terms(t *testing.T, c *ziti.Client, svc string, ok func([]ziti.Terminator) bool) []ziti.Terminator {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ts, err := c.ListTerminators(context.Background(), ziti.Eq("service", svc))
		if err != nil {
			t.Fatal(err)
		}
		if ok(ts) {
			return ts
		}
		if time.Now().After(deadline) {
			t.Fatalf("terminators %+v", ts)
		}
		<-time.After(2 * time.Millisecond) // poll interval
	}
}

func one(prec string) func([]ziti.Terminator) bool {
	return func(ts []ziti.Terminator) bool { return len(ts) == 1 && ts[0].Precedence == prec }
}

// An agent binds with the host.v1 it sees, rebinds when that changes (its
// override, or the config's data), and unbinds when its policy or identity
// goes.
func TestAgentBindsRebindsAndUnbinds(t *testing.T) {
	f, c := start(t)
	ctx := context.Background()
	ct := hostType(t, c)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	data := func(prec string) map[string]any {
		return map[string]any{"protocol": "tcp", "address": "127.0.0.1", "port": l.Addr().(*net.TCPAddr).Port, "listenOptions": map[string]any{"precedence": prec}}
	}
	own, _ := c.CreateConfig(ctx, ziti.ConfigCreate{Name: "own", ConfigTypeID: ct, Data: data("required")})
	standby, _ := c.CreateConfig(ctx, ziti.ConfigCreate{Name: "standby", ConfigTypeID: ct, Data: data("default")})
	svc, err := c.CreateService(ctx, ziti.ServiceCreate{Name: "svc", Configs: []string{own}, EncryptionRequired: true})
	if err != nil {
		t.Fatal(err)
	}
	ident := f.AddIdentity("a1")
	outsider := f.AddIdentity("outsider")
	a, err := f.StartAgent(zititest.AgentOptions{Identity: ident, Clock: transporttest.NewManualClock()})
	if err != nil {
		t.Fatal(err)
	}
	o, err := f.StartAgent(zititest.AgentOptions{Identity: outsider, Clock: transporttest.NewManualClock()})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Stop()
	// Not on a bind policy: nothing bound.
	if ts, _ := c.ListTerminators(ctx, ""); len(ts) != 0 {
		t.Fatalf("bound without a policy: %+v", ts)
	}
	pol, err := c.CreateServicePolicy(ctx, ziti.ServicePolicyCreate{Name: "bind", Type: ziti.PolicyBind, Semantic: ziti.AnyOf, ServiceRoles: []string{"@" + svc}, IdentityRoles: []string{"#agent | a1"}})
	if err != nil {
		t.Fatal(err)
	}
	first := terms(t, c, svc, one("required"))[0]
	if first.HostID != ident {
		t.Fatalf("bound by %s", first.HostID)
	}
	// The override changes what it sees: a rebind at default.
	if err := c.AssignServiceConfigs(ctx, ident, []ziti.ServiceConfig{{ServiceID: svc, ConfigID: standby}}); err != nil {
		t.Fatal(err)
	}
	second := terms(t, c, svc, one("default"))[0]
	if second.ID == first.ID {
		t.Fatal("no rebind: the terminator is the same")
	}
	// A change of the config it sees (the standby's data): another rebind.
	if err := c.PatchConfig(ctx, standby, ziti.ConfigPatch{Data: data("failed")}); err != nil {
		t.Fatal(err)
	}
	terms(t, c, svc, one("failed"))
	// The override goes: back to the service's own config.
	if err := c.RemoveServiceConfigs(ctx, ident, []ziti.ServiceConfig{{ServiceID: svc, ConfigID: standby}}); err != nil {
		t.Fatal(err)
	}
	terms(t, c, svc, one("required"))
	// A circuit reaches the target through it.
	conn, host, err := f.Dial(ctx, svc)
	if err != nil || host != ident {
		t.Fatalf("dial: %v %s", err, host)
	}
	conn.Close()
	// Off the policy: unbound.
	if err := c.PatchServicePolicy(ctx, pol, ziti.ServicePolicyPatch{IdentityRoles: &[]string{}}); err != nil {
		t.Fatal(err)
	}
	terms(t, c, svc, func(ts []ziti.Terminator) bool { return len(ts) == 0 })
	// Back on, then the identity is deleted: unbound again.
	if err := c.PatchServicePolicy(ctx, pol, ziti.ServicePolicyPatch{IdentityRoles: &[]string{"#agent | a1"}}); err != nil {
		t.Fatal(err)
	}
	terms(t, c, svc, one("required"))
	f.DeleteIdentity(ident)
	terms(t, c, svc, func(ts []ziti.Terminator) bool { return len(ts) == 0 })
	a.Stop()
}
