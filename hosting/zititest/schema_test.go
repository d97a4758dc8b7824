package zititest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/vipkit/vipkit/hosting/ziti"
)

// hostData is a valid host.v1 body.
func hostData(port int) map[string]any {
	return map[string]any{"protocol": "tcp", "address": "127.0.0.1", "port": port}
}

// The controller refuses a config whose data breaks its type's JSON Schema,
// on create and on patch, and keeps what it had.
func TestConfigDataIsValidatedAgainstTheTypeSchema(t *testing.T) {
	_, c := start(t)
	ctx := context.Background()
	ct := hostType(t, c)
	good := func(mut func(m map[string]any)) map[string]any {
		m := hostData(5432)
		m["listenOptions"] = map[string]any{"precedence": "required"}
		m["portChecks"] = []any{map[string]any{"address": "127.0.0.1:5432", "interval": "5s", "timeout": "2s",
			"actions": []any{map[string]any{"trigger": "fail", "consecutiveEvents": 3, "action": "mark unhealthy"}, map[string]any{"trigger": "pass", "action": "mark healthy"}}}}
		if mut != nil {
			mut(m)
		}
		return m
	}
	bad := map[string]func(m map[string]any){
		"precedence bogus":      func(m map[string]any) { m["listenOptions"] = map[string]any{"precedence": "bogus"} },
		"no address":            func(m map[string]any) { delete(m, "address") },
		"no protocol":           func(m map[string]any) { delete(m, "protocol") },
		"port out of range":     func(m map[string]any) { m["port"] = 70000 },
		"unknown property":      func(m map[string]any) { m["colour"] = "blue" },
		"interval not duration": func(m map[string]any) { m["portChecks"].([]any)[0].(map[string]any)["interval"] = "five" },
		"bad action": func(m map[string]any) {
			m["portChecks"].([]any)[0].(map[string]any)["actions"] = []any{map[string]any{"trigger": "fail", "action": "reboot"}}
		},
		"empty address":   func(m map[string]any) { m["address"] = "" },
		"cost over 65535": func(m map[string]any) { m["listenOptions"] = map[string]any{"cost": 65536} },
	}
	for name, mut := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := c.CreateConfig(ctx, ziti.ConfigCreate{Name: "bad " + name, ConfigTypeID: ct, Data: good(mut)})
			var ae *ziti.APIError
			if !errors.Is(err, ziti.ErrInvalid) || !errors.As(err, &ae) || ae.Code != "COULD_NOT_VALIDATE" {
				t.Fatalf("create: err = %v, want 400 COULD_NOT_VALIDATE", err)
			}
		})
	}
	for _, addr := range []string{"10.0.0.5", "fd00::1", "db.internal"} {
		if _, err := c.CreateConfig(ctx, ziti.ConfigCreate{Name: "good " + addr, ConfigTypeID: ct, Data: good(func(m map[string]any) { m["address"] = addr })}); err != nil {
			t.Fatalf("%s refused: %v", addr, err)
		}
	}
	id, err := c.CreateConfig(ctx, ziti.ConfigCreate{Name: "patched", ConfigTypeID: ct, Data: good(nil)})
	if err != nil {
		t.Fatal(err)
	}
	err = c.PatchConfig(ctx, id, ziti.ConfigPatch{Data: good(bad["precedence bogus"])})
	if !errors.Is(err, ziti.ErrInvalid) {
		t.Fatalf("patch: err = %v, want ErrInvalid", err)
	}
	cfgs, _ := c.ListConfigs(ctx, ziti.Eq("name", "patched"))
	if len(cfgs) != 1 || cfgs[0].Data["listenOptions"].(map[string]any)["precedence"] != "required" {
		t.Fatalf("a refused patch changed the config: %+v", cfgs)
	}
}
