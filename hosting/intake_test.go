package hosting_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vipkit/vipkit/hosting"
)

func TestDecodeIntake(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	for _, in := range []hosting.Intake{
		{ID: hosting.NewID(), Entity: hosting.EntityAgent, Type: hosting.EventCreated, AgentID: "a1", AccountID: "acct", At: at},
		{ID: hosting.NewID(), Entity: hosting.EntityAgent, Type: hosting.EventUpdated, AgentID: "a1", AccountID: "acct", At: at},
		{ID: hosting.NewID(), Entity: hosting.EntityAgent, Type: hosting.EventDeleted, AgentID: "a1", At: at},
		{ID: hosting.NewID(), Entity: hosting.EntityAccount, Type: hosting.EventDeleted, AccountID: "acct", At: at},
		{ID: hosting.NewID(), Entity: hosting.EntityFrontdoor, Type: hosting.EventDeleted, FrontdoorID: "fd", At: at},
	} {
		m, err := in.Message()
		if err != nil {
			t.Fatal(err)
		}
		got, err := hosting.DecodeIntake(m.Body)
		if err != nil || got != in || m.RoutingKey != in.RoutingKey() {
			t.Fatalf("%s: got %+v %v, want %+v", m.Body, got, err, in)
		}
	}
	long := strings.Repeat("x", 129)
	for body, want := range map[string]string{
		`{"id":"1","type":"CREATED","entity":"agent","occurredAt":"2026-12-01T09:30:00Z","data":{"agentId":"a1"}}`:           "missing property 'accountId'",
		`{"id":"1","type":"DELETED","entity":"agent","occurredAt":"2026-12-01T09:30:00Z","data":{"agentId":"` + long + `"}}`: "maxLength",
		`{"id":"1","type":"DELETED","entity":"share","occurredAt":"2026-12-01T09:30:00Z","data":{}}`:                         "entity",
		`{"id":"1","type":"CREATED","entity":"account","occurredAt":"2026-12-01T09:30:00Z","data":{"accountId":"a"}}`:        "oneOf",
		`{"id":"1","type":"DELETED","entity":"account","occurredAt":"yesterday","data":{"accountId":"a"}}`:                   "date-time",
		`{"id":"","type":"DELETED","entity":"account","occurredAt":"2026-12-01T09:30:00Z","data":{"accountId":"a"}}`:         "minLength",
		`{"id":"1","type":"DELETED","entity":"agent","occurredAt":"2026-12-01T09:30:00Z","data":{"agentId":"a\u0001"}}`:      "pattern",
		`[1]`:        "want object",
		`not json`:   "not JSON",
		`{"id":"1"}`: "missing properties",
	} {
		_, err := hosting.DecodeIntake([]byte(body))
		if !errors.Is(err, hosting.ErrEvent) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want ErrEvent naming %q", body, err, want)
		}
	}
	if _, err := hosting.DecodeIntake(make([]byte, 64<<10+1)); !errors.Is(err, hosting.ErrEvent) {
		t.Fatalf("over the bound: %v", err)
	}
}

// The in-memory store keeps the intake contract: agents by event time,
// deletion final, each event id applied once, the cascade with the
// agent's deletion in one transaction.
func TestHandleIntakeOnMemStore(t *testing.T) {
	e := newEnv(t, nil)
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	h := func(in hosting.Intake) []hosting.Event {
		t.Helper()
		evs, err := e.svc.HandleIntake(e.ctx, in)
		if err != nil {
			t.Fatalf("%s: %v", in.RoutingKey(), err)
		}
		return evs
	}
	agent := func(id string) hosting.Agent {
		t.Helper()
		m, err := e.store.Agents(e.ctx, []string{id})
		if err != nil {
			t.Fatal(err)
		}
		return m[id]
	}
	h(hosting.Intake{ID: "e1", Entity: hosting.EntityAgent, Type: hosting.EventUpdated, AgentID: "n1", AccountID: account, At: t0.Add(time.Second)})
	h(hosting.Intake{ID: "e2", Entity: hosting.EntityAgent, Type: hosting.EventCreated, AgentID: "n1", AccountID: "elsewhere", At: t0})
	if a := agent("n1"); a.AccountID != account || a.Deleted {
		t.Fatalf("n1 %+v: the older CREATED won", a)
	}
	e.ident["n1"] = e.fake.AddIdentity("n1")
	s := e.create("db", []string{"n1"}, nil)
	del := hosting.Intake{ID: "e3", Entity: hosting.EntityAgent, Type: hosting.EventDeleted, AgentID: "n1", At: t0.Add(2 * time.Second)}
	if evs := h(del); len(evs) != 1 || evs[0].Type != hosting.EventDeleted || evs[0].Share.ID != s.ID {
		t.Fatalf("agent DELETED events %+v", evs)
	}
	if !agent("n1").Deleted {
		t.Fatal("n1 not marked deleted")
	}
	h(hosting.Intake{ID: "e4", Entity: hosting.EntityAgent, Type: hosting.EventUpdated, AgentID: "n1", AccountID: account, At: t0.Add(time.Hour)})
	if !agent("n1").Deleted {
		t.Fatal("a late UPDATED brought n1 back")
	}
	if evs := h(del); len(evs) != 0 {
		t.Fatalf("the same event twice made %+v", evs)
	}
	if _, err := e.svc.HandleIntake(e.ctx, hosting.Intake{Entity: hosting.EntityAgent, Type: hosting.EventCreated}); !errors.Is(err, hosting.ErrEvent) {
		t.Fatalf("an event without id: %v", err)
	}
}
