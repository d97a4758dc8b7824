package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/events"
	"github.com/vipkit/vipkit/hosting/events/rmqtest"
	"github.com/vipkit/vipkit/hosting/pgstore"
	"github.com/vipkit/vipkit/hosting/pgstore/pgtest"
	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/internal/zitifake"
)

var (
	pg            *pgtest.Server
	rmq           *rmqtest.Server
	pgErr, rmqErr error
)

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	pg, pgErr = pgtest.Start(ctx)
	rmq, rmqErr = rmqtest.Start(ctx)
	cancel()
	code := m.Run()
	if rmq != nil {
		if err := rmq.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "rmqtest stop:", err)
		}
	}
	if pg != nil {
		if err := pg.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest stop:", err)
		}
	}
	if code == 0 {
		if err := goleak.Find(testenv.IdleHTTP()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const acct = "acct-1"

// env is one test's world: a fresh database, the model controller, a
// service writing its events to the outbox, and a topology of its own on
// the shared broker.
type env struct {
	t     *testing.T
	ctx   context.Context
	store *pgstore.Store
	pool  *pgxpool.Pool
	fake  *zititest.Fake
	svc   *hosting.Service
	topo  events.Topology
	ident map[string]string
	conn  *amqp.Connection
	ch    *amqp.Channel // confirm mode
	sink  string        // a queue bound to share.*
}

func newEnv(t *testing.T) *env {
	t.Helper()
	if pg == nil {
		testenv.Skip(t, "PostgreSQL: %v", pgErr)
	}
	if rmq == nil {
		testenv.Skip(t, "RabbitMQ: %v", rmqErr)
	}
	ctx := t.Context()
	cs, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pgstore.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	st := pgstore.New(pool, pgstore.Options{})
	f := zitifake.Start(t, zititest.Options{})
	p, err := hosting.NewProjection(f.Client(), hosting.ProjectionOptions{FrontdoorID: "fd", HealthCheck: hosting.HealthCheck{Interval: time.Second, Timeout: time.Second, Failures: 1}})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := hosting.NewService(hosting.Options{Store: st, Projection: p, Outbox: true})
	if err != nil {
		t.Fatal(err)
	}
	n := hosting.NewID()[:8]
	topo := events.Topology{Exchange: "ex." + n, DeadLetterExchange: "dlx." + n, Queue: "q." + n, DeadLetterQueue: "dlq." + n, DeliveryLimit: 2}
	e := &env{t: t, ctx: ctx, store: st, pool: pool, fake: f, svc: svc, topo: topo, ident: map[string]string{}, sink: "sink." + n}
	e.dial()
	ch := e.ch
	if err := topo.Declare(ch); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(e.sink, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(e.sink, "share.*", topo.Exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if e.conn != nil {
			e.conn.Close()
		}
	})
	return e
}

// dial (re)opens the test's own connection and confirm channel.
func (e *env) dial() {
	e.t.Helper()
	if e.conn != nil {
		e.conn.Close()
	}
	c, err := amqp.Dial(rmq.URL())
	if err != nil {
		e.t.Fatal(err)
	}
	ch, err := c.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		e.t.Fatal(err)
	}
	e.conn, e.ch = c, ch
}

func (e *env) agents(ids ...string) {
	e.t.Helper()
	for _, id := range ids {
		if err := e.store.PutAgent(e.ctx, hosting.Agent{ID: id, AccountID: acct}); err != nil {
			e.t.Fatal(err)
		}
		e.ident[id] = e.fake.AddIdentity(id)
	}
}

func (e *env) share(name string, active, passive []string) hosting.Share {
	e.t.Helper()
	s, err := e.svc.Create(e.ctx, hosting.Share{AccountID: acct, Name: name, Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432},
		hosting.Update{Active: hosting.Of(active...), Passive: hosting.Of(passive...)})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// deleteAgent does what the agent service does: the agent row and its
// identity go, then agent DELETED is published (confirmed). It returns the
// message, for a redelivery.
func (e *env) deleteAgent(id string) hosting.EventMessage {
	e.t.Helper()
	if err := e.store.PutAgent(e.ctx, hosting.Agent{ID: id, AccountID: acct, Deleted: true}); err != nil {
		e.t.Fatal(err)
	}
	e.fake.DeleteIdentity(e.ident[id])
	m, err := hosting.AgentDeletedMessage(hosting.NewID(), hosting.AgentDeleted{AgentID: id, AccountID: acct}, time.Now())
	if err != nil {
		e.t.Fatal(err)
	}
	e.publish(m)
	return m
}

func (e *env) publish(m hosting.EventMessage) {
	e.t.Helper()
	if err := events.Publish(e.ctx, e.ch, e.topo.Exchange, m); err != nil {
		e.t.Fatal(err)
	}
}

// run starts the consumer (over h, or the service) and the relay until
// the test ends.
func (e *env) run(h events.Handler) (*events.Consumer, *events.Relay) {
	e.t.Helper()
	if h == nil {
		h = e.svc
	}
	c, err := events.NewConsumer(events.ConsumerOptions{URL: rmq.URL(), Handler: h, Topology: e.topo, Backoff: 50 * time.Millisecond, RetryDelay: time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	r, err := events.NewRelay(events.RelayOptions{URL: rmq.URL(), Outbox: e.store, Exchange: e.topo.Exchange, Poll: 10 * time.Millisecond, Backoff: 50 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = c.Run(ctx) }()
	go func() { defer wg.Done(); _ = r.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); wg.Wait() })
	return c, r
}

// until polls cond with a deadline.
func until(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-time.After(5 * time.Millisecond) // poll interval
	}
}

type got struct {
	id, key string
	data    hosting.ShareData
}

// drain reads every message waiting in a queue.
func (e *env) drain(q string) []got {
	e.t.Helper()
	var out []got
	for {
		m, ok, err := e.ch.Get(q, true)
		if err != nil {
			e.t.Fatal(err)
		}
		if !ok {
			return out
		}
		var env struct {
			Data hosting.ShareData `json:"data"`
		}
		_ = json.Unmarshal(m.Body, &env)
		out = append(out, got{m.MessageId, m.RoutingKey, env.Data})
	}
}

// outboxRows counts every outbox row, published or not.
func (e *env) outboxRows() int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.ctx, "SELECT count(*) FROM outbox").Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func TestAgentDeletedCascadesAndRedeliveryDoesNothing(t *testing.T) {
	e := newEnv(t)
	e.agents("a1", "a2", "p1")
	s1 := e.share("one", []string{"a1"}, nil)
	s2 := e.share("two", []string{"a1", "a2"}, []string{"p1"})
	c, r := e.run(nil)
	m := e.deleteAgent("a1")
	var all []got
	until(t, "two share events", 30*time.Second, func() bool { all = append(all, e.drain(e.sink)...); return len(all) >= 2 })
	byShare := map[string]got{}
	for _, g := range all {
		byShare[g.data.ID] = g
	}
	if g := byShare[s1.ID]; g.key != "share.DELETED" || g.data.DeletedAt.IsZero() || len(g.data.ActiveAgentIDs) != 1 {
		t.Fatalf("s1 event %+v", g)
	}
	if g := byShare[s2.ID]; g.key != "share.UPDATED" || fmt.Sprint(g.data.ActiveAgentIDs) != "[a2]" || fmt.Sprint(g.data.PassiveAgentIDs) != "[p1]" {
		t.Fatalf("s2 event %+v", g)
	}
	if got, _ := e.store.Get(e.ctx, s1.ID); got.Live() {
		t.Fatal("s1 still live")
	}
	// The same event again (a redelivery): acked, nothing written.
	e.fake.ResetCalls()
	e.publish(m)
	until(t, "the redelivery acked", 30*time.Second, func() bool { return c.Stats().Acked == 2 })
	for _, call := range e.fake.Calls() {
		if call.Method != "GET" {
			t.Fatalf("the redelivery wrote to Ziti: %+v", call)
		}
	}
	// The sink has the events as soon as the relay publishes them; the
	// relay marks and counts them after the broker's confirms. Wait for
	// that, then check that the redelivery (committed before its ack)
	// added nothing.
	until(t, "the relay marked its events", 30*time.Second, func() bool {
		p, _ := e.store.Pending(e.ctx, 10)
		return len(p) == 0 && r.Stats().Published >= 2
	})
	if p, _ := e.store.Pending(e.ctx, 10); len(p) != 0 || r.Stats().Published != 2 || e.outboxRows() != 2 {
		t.Fatalf("pending %v, published %d: the redelivery made events", p, r.Stats().Published)
	}
	if extra := e.drain(e.sink); len(extra) != 0 {
		t.Fatalf("the redelivery published %v", extra)
	}
}

// scripted fails as told and counts its calls.
type scripted struct {
	calls atomic.Int64
	err   error
}

func (s *scripted) HandleIntake(ctx context.Context, in hosting.Intake) ([]hosting.Event, error) {
	s.calls.Add(1)
	return nil, s.err
}

func deathReason(t *testing.T, d amqp.Delivery) string {
	t.Helper()
	// The broker's reason (delivery_limit), or the consumer's own
	// dead letter (rejected, with the error).
	if r, _ := d.Headers[events.HeaderDeathReason].(string); r != "" {
		return r
	}
	r, _ := d.Headers["x-first-death-reason"].(string)
	return r
}

func (e *env) dead(t *testing.T, n int) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	until(t, fmt.Sprintf("%d dead letters", n), 30*time.Second, func() bool {
		m, ok, err := e.ch.Get(e.topo.DeadLetterQueue, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			out = append(out, m)
		}
		return len(out) >= n
	})
	return out
}

func TestTransientFailureIsRedeliveredThenDeadLettered(t *testing.T) {
	e := newEnv(t)
	h := &scripted{err: fmt.Errorf("cascade: %w", ziti.ErrServer)}
	c, _ := e.run(h)
	m, _ := hosting.AgentDeletedMessage(hosting.NewID(), hosting.AgentDeleted{AgentID: "a1"}, time.Now())
	e.publish(m)
	d := e.dead(t, 1)[0]
	if d.MessageId != m.ID || deathReason(t, d) != "delivery_limit" {
		t.Fatalf("dead letter %s, reason %q (headers %v)", d.MessageId, deathReason(t, d), d.Headers)
	}
	// Delivered once, then redelivered up to the limit.
	if n := h.calls.Load(); n != int64(e.topo.DeliveryLimit)+1 {
		t.Fatalf("handler ran %d times, want %d", n, e.topo.DeliveryLimit+1)
	}
	// The consumer counts a requeue after its nack, on which the broker
	// may dead-letter the delivery before the count: wait for it.
	until(t, "the requeues counted", 30*time.Second, func() bool { return c.Stats().Requeued >= int64(e.topo.DeliveryLimit)+1 })
	if s := c.Stats(); s.Requeued != int64(e.topo.DeliveryLimit)+1 || s.Acked != 0 || s.DeadLettered != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestPermanentFailureGoesStraightToTheDeadLetterExchange(t *testing.T) {
	e := newEnv(t)
	h := &scripted{err: fmt.Errorf("cascade: %w", &ziti.APIError{Status: 500, Code: "UNHANDLED", Message: "config is in use by identity"})}
	c, _ := e.run(h)
	m, _ := hosting.AgentDeletedMessage(hosting.NewID(), hosting.AgentDeleted{AgentID: "a1"}, time.Now())
	e.publish(m)
	// A body that is not the contract goes the same way, unhandled.
	e.publish(hosting.EventMessage{ID: hosting.NewID(), RoutingKey: hosting.RouteAgentDeleted, Body: []byte(`{"id":"x","entity":"agent","type":"DELETED","data":{}}`)})
	ds := e.dead(t, 2)
	for _, d := range ds {
		if deathReason(t, d) != "rejected" {
			t.Fatalf("dead letter %s reason %q", d.MessageId, deathReason(t, d))
		}
	}
	if n := h.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1: an ordering fault is not retried", n)
	}
	// Counted after the broker's confirm, which may come after the test
	// took the dead letter: wait for the count.
	until(t, "the dead letters counted", 30*time.Second, func() bool { return c.Stats().DeadLettered >= 2 })
	if s := c.Stats(); s.DeadLettered != 2 || s.Requeued != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// counting runs the service and counts completed cascades.
type counting struct {
	svc  *hosting.Service
	done atomic.Int64
}

func (c *counting) HandleIntake(ctx context.Context, in hosting.Intake) ([]hosting.Event, error) {
	evs, err := c.svc.HandleIntake(ctx, in)
	if err == nil {
		c.done.Add(1)
	}
	return evs, err
}

func TestBrokerRestartMidStreamLosesNothingAndAppliesNothingTwice(t *testing.T) {
	e := newEnv(t)
	const n = 12
	var agents []string
	shares := map[string]bool{}
	for i := 0; i < n; i++ {
		a := fmt.Sprint("agent-", i)
		agents = append(agents, a)
		e.agents(a)
		shares[e.share(fmt.Sprint("s", i), []string{a}, nil).ID] = true
	}
	for _, a := range agents {
		e.deleteAgent(a)
	}
	h := &counting{svc: e.svc}
	c, r := e.run(h)
	until(t, "a third of the stream", 60*time.Second, func() bool { return h.done.Load() >= n/3 })
	if err := rmq.Restart(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.dial()
	seen := map[string]int{}
	var evs []got
	until(t, "every share event after the restart", 120*time.Second, func() bool {
		for _, g := range e.drain(e.sink) {
			seen[g.id]++
			evs = append(evs, g)
		}
		return len(seen) >= n
	})
	// Nothing applied twice: one outbox row per share, all published.
	until(t, "the outbox drained", 30*time.Second, func() bool { p, _ := e.store.Pending(e.ctx, 100); return len(p) == 0 })
	if rows := e.outboxRows(); rows != n {
		t.Fatalf("%d outbox rows for %d cascades: a cascade was applied twice", rows, n)
	}
	deleted := map[string]bool{}
	for _, g := range evs {
		if g.key != "share.DELETED" || !shares[g.data.ID] {
			t.Fatalf("unexpected event %+v", g)
		}
		deleted[g.data.ID] = true
	}
	if len(deleted) != n || len(seen) != n {
		t.Fatalf("events for %d shares (%d ids), want %d: lost some", len(deleted), len(seen), n)
	}
	for id := range shares {
		if s, _ := e.store.Get(e.ctx, id); s.Live() {
			t.Fatalf("share %s still live", id)
		}
	}
	if c.Stats().Connects < 2 || r.Stats().Connects < 2 {
		t.Fatalf("no reconnect: consumer %+v relay %+v", c.Stats(), r.Stats())
	}
	t.Logf("consumer %+v, relay %+v, duplicate deliveries %d", c.Stats(), r.Stats(), len(evs)-len(seen))
}

// Cascades are per host, over the bus: in {active a1, a2; passive p1}
// with p1's identity lost (its agent live), agent DELETED for a2 is
// handled and acked once, not requeued to the delivery limit and
// dead-lettered.
func TestABrokenPassiveDoesNotDeadLetterAnotherHostsCascade(t *testing.T) {
	e := newEnv(t)
	e.agents("a1", "a2", "p1")
	s := e.share("db", []string{"a1", "a2"}, []string{"p1"})
	e.fake.DeleteIdentity(e.ident["p1"])
	c, _ := e.run(nil)
	e.deleteAgent("a2")
	limit := int64(e.topo.DeliveryLimit) + 1
	until(t, "the cascade settled", 60*time.Second, func() bool { st := c.Stats(); return st.Acked > 0 || st.Requeued >= limit })
	if st := c.Stats(); st.Acked != 1 || st.Requeued != 0 || st.DeadLettered != 0 {
		reason := ""
		if st.Requeued >= limit {
			reason = deathReason(t, e.dead(t, 1)[0])
		}
		t.Fatalf("agent DELETED a2: stats %+v, dead-letter reason %q; want acked once", st, reason)
	}
	got, _ := e.store.Get(e.ctx, s.ID)
	if fmt.Sprint(got.Hosts.Active) != "[a1]" || fmt.Sprint(got.Hosts.Passive) != "[p1]" {
		t.Fatalf("hosts %+v, want {a1; p1}", got.Hosts)
	}
}
