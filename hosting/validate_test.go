package hosting_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/zitifake"
)

func violations(err error) []hosting.Violation {
	var ve *hosting.ValidationError
	if errors.As(err, &ve) {
		return ve.Violations
	}
	return nil
}

func TestValidatorRulesInOrder(t *testing.T) {
	ctx := context.Background()
	st := hosting.NewMemStore()
	for _, a := range []hosting.Agent{{ID: "a1", AccountID: account}, {ID: "a2", AccountID: account}, {ID: "p1", AccountID: account},
		{ID: "gone", AccountID: account, Deleted: true}, {ID: "elsewhere", AccountID: other}} {
		if err := st.PutAgent(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 9; i++ {
		_ = st.PutAgent(ctx, hosting.Agent{ID: fmt.Sprintf("n%d", i), AccountID: account})
	}
	many := func(n int) []string {
		var out []string
		for i := 0; i < n; i++ {
			out = append(out, fmt.Sprintf("n%d", i))
		}
		return out
	}
	cases := []struct {
		name            string
		active, passive []string
		want            []hosting.Violation
	}{
		{"valid", []string{"a1"}, []string{"p1"}, nil},
		{"no active", nil, []string{"p1", "unknown"}, []hosting.Violation{{"activeAgentIds", "at least one active host is required"}}},
		{"overlap (before the cap and agents)", []string{"a1", "unknown"}, []string{"a1"}, []hosting.Violation{{"passiveAgentIds", "agent a1 cannot be both active and passive"}}},
		{"over the cap (before agents)", []string{"unknown"}, many(8), []hosting.Violation{{"hosts", "a share has at most 8 hosts, got 9"}}},
		{"at the cap", many(4), many(9)[4:8], nil},
		{"agent in another account", []string{"a1", "elsewhere"}, nil, []hosting.Violation{{"activeAgentIds", "agent elsewhere does not exist"}}},
		{"deleted agent", []string{"a1"}, []string{"gone"}, []hosting.Violation{{"passiveAgentIds", "agent gone does not exist"}}},
		{"every bad agent, on its list", []string{"unknown", "a1"}, []string{"gone", "elsewhere"}, []hosting.Violation{
			{"activeAgentIds", "agent unknown does not exist"},
			{"passiveAgentIds", "agent elsewhere does not exist"},
			{"passiveAgentIds", "agent gone does not exist"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := hosting.Share{AccountID: account, Name: "n", Kind: hosting.KindTCP, TargetAddress: "10.0.0.1", TargetPort: 1, Hosts: hosting.NewHosts(tc.active, tc.passive)}
			err := hosting.Validator{}.Validate(ctx, s, st)
			if got := violations(err); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %v, want %v (err %v)", got, tc.want, err)
			}
			if tc.want != nil && !errors.Is(err, hosting.ErrInvalid) {
				t.Fatalf("err %v does not match ErrInvalid", err)
			}
		})
	}
}

func TestValidatorSameMessageForEveryAgentFailure(t *testing.T) {
	ctx := context.Background()
	st := hosting.NewMemStore()

	msg := func(agent string, deleted bool) string {
		_ = st.PutAgent(ctx, hosting.Agent{ID: agent, AccountID: other, Deleted: deleted})
		err := hosting.Validator{}.Validate(ctx, hosting.Share{AccountID: account, Name: "n", Kind: hosting.KindTCP, TargetAddress: "h", TargetPort: 1, Hosts: hosting.NewHosts([]string{agent}, nil)}, st)
		return strings.ReplaceAll(violations(err)[0].Message, agent, "ID")
	}
	unknown := hosting.Validator{}.Validate(ctx, hosting.Share{AccountID: account, Name: "n", Kind: hosting.KindTCP, TargetAddress: "h", TargetPort: 1, Hosts: hosting.NewHosts([]string{"nobody"}, nil)}, st)
	u := strings.ReplaceAll(violations(unknown)[0].Message, "nobody", "ID")
	if a, b := msg("agent-x", false), msg("agent-y", true); a != u || b != u {
		t.Fatalf("messages differ: %q %q %q", a, b, u)
	}
}

func TestValidatorShareFields(t *testing.T) {
	ctx := context.Background()
	st := hosting.NewMemStore()
	_ = st.PutAgent(ctx, hosting.Agent{ID: "a", AccountID: account})
	s := hosting.Share{AccountID: account, Name: strings.Repeat("é", hosting.MaxShareNameLength+1), Kind: "udp", TargetAddress: "bad host!", Hosts: hosting.NewHosts([]string{"a"}, nil)}
	got := violations(hosting.Validator{}.Validate(ctx, s, st))
	want := []hosting.Violation{{"name", "name must have 1 to 164 characters"}, {"kind", "kind must be tcp, ipsec or http"}, {"targetAddress", hosting.MsgTarget}, {"targetPort", hosting.MsgPort}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v", got)
	}
	s.Name = strings.Repeat("é", hosting.MaxShareNameLength)
	s.Kind, s.TargetAddress, s.TargetPort = hosting.KindIPsec, "fd00::1", 500
	if err := (hosting.Validator{}).Validate(ctx, s, st); err != nil {
		t.Fatalf("164 characters: %v", err)
	}
}

func TestDryRunReportsTheSameViolations(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1")
	e.agents(other, "elsewhere")
	s := e.create("db", []string{"a1"}, []string{"p1"})
	u := hosting.Update{Method: hosting.Patch, Passive: hosting.Of("a1", "elsewhere")}
	dry := e.svc.DryRun(e.ctx, s.ID, u)
	_, real := e.svc.Update(e.ctx, s.ID, u)
	if fmt.Sprint(violations(dry)) != fmt.Sprint(violations(real)) || len(violations(dry)) != 1 {
		t.Fatalf("dry run %v, update %v", dry, real)
	}
	u = hosting.Update{Method: hosting.Patch, Passive: hosting.Of("elsewhere")}
	dry = e.svc.DryRun(e.ctx, s.ID, u)
	if got := violations(dry); len(got) != 1 || got[0].Message != "agent elsewhere does not exist" {
		t.Fatalf("dry run %v", dry)
	}
	got, _ := e.store.Get(e.ctx, s.ID)
	if !got.Hosts.Equal(s.Hosts) {
		t.Fatal("dry run wrote")
	}
}

func TestHealthCheckSettings(t *testing.T) {
	full := map[string]string{hosting.SettingInterval: "5s", hosting.SettingTimeout: "2s", hosting.SettingFailures: "3"}
	get := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	h, err := hosting.HealthCheckFromSettings(get(full))
	if err != nil || h != testHC {
		t.Fatalf("got %+v, %v", h, err)
	}
	for k, bad := range map[string]string{hosting.SettingInterval: "", hosting.SettingTimeout: "999ms", hosting.SettingFailures: "0"} {
		m := map[string]string{}
		for kk, v := range full {
			m[kk] = v
		}
		if bad == "" {
			delete(m, k)
		} else {
			m[k] = bad
		}
		if _, err := hosting.HealthCheckFromSettings(get(m)); !errors.Is(err, hosting.ErrSettings) {
			t.Errorf("%s=%q: err = %v", k, bad, err)
		}
	}
	if _, err := hosting.NewProjection(nil, hosting.ProjectionOptions{}); !errors.Is(err, hosting.ErrSettings) {
		t.Fatal(err)
	}
	f := zitifake.Start(t, zititest.Options{})
	if _, err := hosting.NewProjection(f.Client(), hosting.ProjectionOptions{FrontdoorID: "fd"}); !errors.Is(err, hosting.ErrSettings) {
		t.Fatalf("zero health check accepted: %v", err)
	}
}
