package events_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/events"
)

// rawEvent is an intake event as another service writes it.
func rawEvent(id, entity, typ string, data string, at time.Time) hosting.EventMessage {
	body := fmt.Sprintf(`{"id":%q,"type":%q,"entity":%q,"occurredAt":%q,"data":%s}`, id, typ, entity, at.UTC().Format(time.RFC3339Nano), data)
	return hosting.EventMessage{ID: id, RoutingKey: entity + "." + typ, Body: []byte(body), OccurredAt: at}
}

// The agent service creates an agent and says so on the bus: once the
// consumer handled agent.CREATED, the agent can host a share, with no
// other program writing it into the daemon's database.
func TestAgentCreatedMakesTheAgentHostable(t *testing.T) {
	e := newEnv(t)
	e.ident["n1"] = e.fake.AddIdentity("n1")
	c, _ := e.run(nil)
	e.publish(rawEvent(hosting.NewID(), "agent", "CREATED", `{"agentId":"n1","accountId":"`+acct+`"}`, time.Now()))
	var err error
	until(t, "n1 hostable", 30*time.Second, func() bool {
		_, err = e.svc.Create(e.ctx, hosting.Share{AccountID: acct, Name: "db", Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432},
			hosting.Update{Active: hosting.Of("n1")})
		if err != nil && !errors.Is(err, hosting.ErrInvalid) {
			t.Fatal(err)
		}
		return err == nil || c.Stats().DeadLettered > 0
	})
	if err != nil {
		t.Fatalf("agent.CREATED did not make n1 hostable (dead-lettered %d): %v", c.Stats().DeadLettered, err)
	}
}

// Bad messages are dead-lettered at once, each with the reason it failed
// the schema, and change nothing.
func TestBadIntakeIsDeadLetteredWithItsReason(t *testing.T) {
	e := newEnv(t)
	c, _ := e.run(nil)
	now := time.Now()
	bad := []struct {
		m    hosting.EventMessage
		want string
	}{
		{rawEvent(hosting.NewID(), "agent", "CREATED", `{"agentId":"n1"}`, now), "missing property 'accountId'"},
		{rawEvent(hosting.NewID(), "agent", "UPDATED", `{"agentId":7,"accountId":"a"}`, now), "agentId"},
		{rawEvent(hosting.NewID(), "account", "DELETED", `{"accountId":""}`, now), "accountId"},
		{rawEvent(hosting.NewID(), "frontdoor", "DELETED", `{}`, now), "missing property 'frontdoorId'"},
		{hosting.EventMessage{ID: hosting.NewID(), RoutingKey: hosting.RouteAgentDeleted, Body: []byte(`not json`)}, "not JSON"},
		{hosting.EventMessage{ID: hosting.NewID(), RoutingKey: hosting.RouteAgentDeleted, Body: []byte(`{"id":"x","type":"DELETED","entity":"agent","data":{"agentId":"a"}}`)}, "missing property 'occurredAt'"},
	}
	// The body says account, the routing key agent.
	wrongKey := rawEvent(hosting.NewID(), "account", "DELETED", `{"accountId":"acct-1"}`, now)
	wrongKey.RoutingKey = hosting.RouteAgentCreated
	bad = append(bad, struct {
		m    hosting.EventMessage
		want string
	}{wrongKey, `routing key "agent.CREATED" is not the body's account.DELETED`})
	for _, b := range bad {
		e.publish(b.m)
	}
	ds := e.dead(t, len(bad))
	byID := map[string]string{}
	for _, d := range ds {
		if deathReason(t, d) != "rejected" || d.Headers[events.HeaderQueue] != e.topo.Queue {
			t.Fatalf("dead letter %s headers %v", d.MessageId, d.Headers)
		}
		byID[d.MessageId], _ = d.Headers[events.HeaderError].(string)
	}
	for _, b := range bad {
		if r := byID[b.m.ID]; !strings.Contains(r, b.want) {
			t.Fatalf("%s: reason %q, want it to name %q", b.m.Body, r, b.want)
		}
	}
	// The consumer counts a dead letter after the broker confirmed it,
	// and the test can take it from the queue before that: wait for the
	// count, then check it is exact.
	until(t, "the dead letters counted", 30*time.Second, func() bool { return c.Stats().DeadLettered >= int64(len(bad)) })
	if s := c.Stats(); s.DeadLettered != int64(len(bad)) || s.Acked != 0 || s.Requeued != 0 {
		t.Fatalf("stats %+v", s)
	}
	var agents, inbox int
	_ = e.pool.QueryRow(e.ctx, "SELECT (SELECT count(*) FROM agent), (SELECT count(*) FROM inbox)").Scan(&agents, &inbox)
	if agents != 0 || inbox != 0 {
		t.Fatalf("bad events wrote %d agents, %d inbox rows", agents, inbox)
	}
}

func (e *env) handle(in hosting.Intake) []hosting.Event {
	e.t.Helper()
	if in.ID == "" {
		in.ID = hosting.NewID()
	}
	evs, err := e.svc.HandleIntake(e.ctx, in)
	if err != nil {
		e.t.Fatalf("%s: %v", in.RoutingKey(), err)
	}
	return evs
}

func (e *env) agentRow(id string) (account string, deleted bool) {
	e.t.Helper()
	if err := e.pool.QueryRow(e.ctx, "SELECT account_id, deleted_at IS NOT NULL FROM agent WHERE id = $1", id).Scan(&account, &deleted); err != nil {
		e.t.Fatalf("agent %s: %v", id, err)
	}
	return account, deleted
}

// Agent events may arrive out of order when replicas compete: the newest
// applied wins, a deletion is final, and an event handled twice (the
// same id) is applied once.
func TestAgentEventsApplyInEventOrderAndOnce(t *testing.T) {
	e := newEnv(t)
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	ev := func(typ hosting.EventType, agent, account string, at time.Time) hosting.Intake {
		return hosting.Intake{ID: hosting.NewID(), Entity: hosting.EntityAgent, Type: typ, AgentID: agent, AccountID: account, At: at}
	}
	// UPDATED (newer) before CREATED (older): the update stays.
	e.handle(ev(hosting.EventUpdated, "n1", "acct-2", t0.Add(time.Second)))
	e.handle(ev(hosting.EventCreated, "n1", acct, t0))
	if a, d := e.agentRow("n1"); a != "acct-2" || d {
		t.Fatalf("n1 in %s deleted %v, want acct-2 live", a, d)
	}
	// DELETED, then a late UPDATED: still deleted.
	e.handle(ev(hosting.EventDeleted, "n1", "", t0.Add(2*time.Second)))
	e.handle(ev(hosting.EventUpdated, "n1", acct, t0.Add(3*time.Second)))
	if _, d := e.agentRow("n1"); !d {
		t.Fatal("a late UPDATED brought n1 back")
	}
	// DELETED of an agent never created: a row, deleted, so its late
	// CREATED does not make it hostable.
	e.handle(ev(hosting.EventDeleted, "n2", acct, t0.Add(2*time.Second)))
	e.handle(ev(hosting.EventCreated, "n2", acct, t0))
	if _, d := e.agentRow("n2"); !d {
		t.Fatal("a late CREATED made n2 live")
	}
	// The same event twice: the second is a no-op, though it would
	// change the row were it new.
	up := ev(hosting.EventUpdated, "n3", acct, t0)
	e.handle(up)
	if _, err := e.pool.Exec(e.ctx, "UPDATE agent SET account_id = 'moved' WHERE id = 'n3'"); err != nil {
		t.Fatal(err)
	}
	up.At = t0.Add(time.Hour) // same id, so the inbox decides
	e.handle(up)
	if a, _ := e.agentRow("n3"); a != "moved" {
		t.Fatalf("the second handling of event %s applied it again (account %s)", up.ID, a)
	}
	var inbox int
	_ = e.pool.QueryRow(e.ctx, "SELECT count(*) FROM inbox").Scan(&inbox)
	if inbox != 7 {
		t.Fatalf("%d inbox rows for 7 events", inbox)
	}
}

// account DELETED deletes every share and agent of the account, once;
// frontdoor DELETED deletes every share of this frontdoor, and another
// frontdoor's changes nothing.
func TestAccountAndFrontdoorDeletedCascade(t *testing.T) {
	e := newEnv(t)
	e.agents("a1", "a2")
	if err := e.store.PutAgent(e.ctx, hosting.Agent{ID: "o1", AccountID: "acct-2"}); err != nil {
		t.Fatal(err)
	}
	e.ident["o1"] = e.fake.AddIdentity("o1")
	s1 := e.share("one", []string{"a1"}, []string{"a2"})
	s2 := e.share("two", []string{"a2"}, nil)
	other, err := e.svc.Create(e.ctx, hosting.Share{AccountID: "acct-2", Name: "other", Kind: hosting.KindTCP, TargetAddress: "10.0.0.9", TargetPort: 80},
		hosting.Update{Active: hosting.Of("o1")})
	if err != nil {
		t.Fatal(err)
	}
	acc := hosting.Intake{ID: hosting.NewID(), Entity: hosting.EntityAccount, Type: hosting.EventDeleted, AccountID: acct, At: time.Now()}
	if evs := e.handle(acc); len(evs) != 2 || evs[0].Type != hosting.EventDeleted || evs[1].Type != hosting.EventDeleted {
		t.Fatalf("account DELETED events %+v", evs)
	}
	for _, id := range []string{s1.ID, s2.ID} {
		if s, _ := e.store.Get(e.ctx, id); s.Live() {
			t.Fatalf("share %s of the deleted account is live", id)
		}
	}
	if _, d := e.agentRow("a1"); !d {
		t.Fatal("agent a1 of the deleted account is live")
	}
	if _, d := e.agentRow("o1"); d {
		t.Fatal("another account's agent was deleted")
	}
	if evs := e.handle(acc); len(evs) != 0 {
		t.Fatalf("the redelivered account DELETED made %d events", len(evs))
	}
	if evs := e.handle(hosting.Intake{Entity: hosting.EntityFrontdoor, Type: hosting.EventDeleted, FrontdoorID: "fd-other", At: time.Now()}); len(evs) != 0 {
		t.Fatalf("another frontdoor's deletion made %+v", evs)
	}
	if s, _ := e.store.Get(e.ctx, other.ID); !s.Live() {
		t.Fatal("another frontdoor's deletion deleted a share")
	}
	if evs := e.handle(hosting.Intake{Entity: hosting.EntityFrontdoor, Type: hosting.EventDeleted, FrontdoorID: "fd", At: time.Now()}); len(evs) != 1 || evs[0].Share.ID != other.ID {
		t.Fatalf("frontdoor DELETED events %+v", evs)
	}
	if s, _ := e.store.Get(e.ctx, other.ID); s.Live() {
		t.Fatal("the frontdoor's share survived its deletion")
	}
	if n := len(e.fake.Snapshot().Services); n != 0 {
		t.Fatalf("%d services left in Ziti", n)
	}
}
