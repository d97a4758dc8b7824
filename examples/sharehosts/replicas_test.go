package sharehosts_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vipkit/vipkit/examples/sharehosts"
	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/events"
	"github.com/vipkit/vipkit/hosting/events/rmqtest"
	"github.com/vipkit/vipkit/hosting/pgstore"
	"github.com/vipkit/vipkit/hosting/pgstore/pgtest"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/internal/zitifake"
)

// cascadeStep is hosting's failpoint in the middle of a cascade, after
// one share's Ziti writes, with more shares to go.
const cascadeStep = "hosting.service.cascade-step"

// Three daemons (processes) on one PostgreSQL, one RabbitMQ and the model
// controller. 110 agents arrive by agent.CREATED; 200 shares are made
// through the replicas' APIs; then 1,000 share changes go to the APIs
// while 100 agent deletions go on the bus, and the replica that holds
// the relay lock is killed with SIGKILL in the middle of its first
// cascade and started again. At the end every share is what its last
// event says, each event's effect happened once (an outbox row per
// change, an inbox row per consumed event, no agent removed twice), the
// outbox is empty and the reconciler finds no drift.
func TestReplicasShareTheWorkAndSurviveAKill(t *testing.T) {
	if testing.Short() {
		t.Skip("three daemons and 1,300 changes: not in -short")
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pg, err := pgtest.Start(ctx)
	if errors.Is(err, pgtest.ErrUnavailable) {
		testenv.Skip(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	rmq, err := rmqtest.Start(ctx)
	if errors.Is(err, rmqtest.ErrUnavailable) {
		testenv.Skip(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer rmq.Stop()
	f := zitifake.Start(t, zititest.Options{})
	f.AddUser("admin", "secret")
	dsn, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfgText := strings.NewReplacer(`"host=127.0.0.1"`, `"`+dsn+`"`, "amqp://guest:guest@127.0.0.1:5672/", rmq.URL(), "https://ctrl.example:1280", f.URL()).Replace(good) +
		"deployment-id: dep-replicas\nreconcile:\n  interval: 1h\n  orphan-grace: 1h\n"
	cfg := filepath.Join(t.TempDir(), "sharehosts.yaml")
	if err := os.WriteFile(cfg, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	// The test's own view of the bus: the topology, and a sink of every
	// share change, declared before any replica runs.
	conn, err := amqp.Dial(rmq.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	topo := events.DefaultTopology()
	if err := topo.Declare(ch); err != nil {
		t.Fatal(err)
	}
	const sink = "test.share-sink"
	if _, err := ch.QueueDeclare(sink, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"share.UPDATED", "share.DELETED"} {
		if err := ch.QueueBind(sink, key, topo.Exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	var pubMu sync.Mutex
	publish := func(in hosting.Intake) {
		m, err := in.Message()
		if err != nil {
			t.Error(err)
			return
		}
		pubMu.Lock()
		defer pubMu.Unlock()
		if err := events.Publish(ctx, ch, topo.Exchange, m); err != nil {
			t.Error(err)
		}
	}
	poll := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %s", what)
			}
			time.Sleep(20 * time.Millisecond) // poll interval
		}
	}
	count := func(sql string) int {
		var n int
		if err := pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The replica that will be killed starts first, so it takes the
	// relay lock: its death is the relay's failover too.
	reps := make([]*daemon, 3)
	var repMu sync.Mutex
	replica := func(i int) *daemon { repMu.Lock(); defer repMu.Unlock(); return reps[i] }
	reps[0] = startDaemon(t, cfg, failpointEnv+"="+cascadeStep+"=kill")
	poll("replica 0 holds the relay lock", func() bool { return strings.Contains(reps[0].logs.String(), "relay: holding the outbox lock") })
	reps[1], reps[2] = startDaemon(t, cfg), startDaemon(t, cfg)

	// 100 agents to delete and 10 that stay, by agent.CREATED.
	ident := map[string]string{}
	var doomed, stable []string
	for i := range 100 {
		doomed = append(doomed, fmt.Sprintf("d%02d", i))
	}
	for i := range 10 {
		stable = append(stable, fmt.Sprintf("s%d", i))
	}
	created := time.Now()
	for _, a := range append(slices.Clone(doomed), stable...) {
		ident[a] = f.AddIdentity(a)
		publish(hosting.Intake{ID: hosting.NewID(), Entity: hosting.EntityAgent, Type: hosting.EventCreated, AgentID: a, AccountID: "acct", At: created})
	}
	poll("110 agents", func() bool { return count("SELECT count(*) FROM agent WHERE deleted_at IS NULL") == 110 })

	// call sends one API request to replica i, or the next one up when
	// i is down (a refused connection, or one that broke mid-request: a
	// retry of the same PATCH is a no-op if the first committed).
	const base = "/accounts/acct/tcp-shares"
	call := func(i int, method, path, body string) (int, string) {
		for try := 0; ; try++ {
			d := replica((i + try) % 3)
			st, b, err := d.do(t, method, path, body)
			if err == nil {
				return st, b
			}
			if try > 50 {
				t.Errorf("%s %s: %v", method, path, err)
				return 0, ""
			}
		}
	}
	// 200 shares, each with two doomed actives and one stable passive.
	const nShares = 200
	type shareRec struct {
		id      string
		active  []string
		passive []string
		patches []int // the ports of the PATCHes that answered 200
	}
	shares := make([]*shareRec, nShares)
	byID := map[string]*shareRec{}
	work := func(n, workers int, fn func(w, k int)) {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := w; k < n; k += workers {
					fn(w, k)
				}
			}()
		}
		wg.Wait()
	}
	work(nShares, 6, func(_, i int) {
		a1, a2 := doomed[i%100], doomed[(i*7+3)%100]
		if a1 == a2 {
			a2 = doomed[(i+1)%100]
		}
		r := &shareRec{active: []string{a1, a2}, passive: []string{stable[i%10]}}
		st, body := call(i, "POST", base, fmt.Sprintf(`{"name":"s%d","targetAddress":"10.0.0.5","targetPort":1000,"activeAgentIds":[%q,%q],"passiveAgentIds":[%q]}`, i, a1, a2, r.passive[0]))
		if st != 201 {
			t.Errorf("create s%d: %d %s", i, st, body)
			return
		}
		r.id = regexp.MustCompile(`"id":"([0-9a-f-]{36})"`).FindStringSubmatch(body)[1]
		shares[i] = r
	})
	if t.Failed() {
		t.FailNow()
	}
	for _, r := range shares {
		byID[r.id] = r
	}
	setup := time.Since(began)

	// The storm: 1,000 PATCHes (five per share, in order per share, each
	// to a new port), and 100 agent deletions on the bus.
	churn := time.Now()
	var refused atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		work(nShares, 6, func(_, i int) {
			r := shares[i]
			for m := 1; m <= 5; m++ {
				port := 2000 + 10*i + m
				st, body := call(i*5+m, "PATCH", base+"/"+r.id, fmt.Sprintf(`{"targetPort":%d,"passiveAgentIds":[%q]}`, port, stable[(i+m)%10]))
				switch st {
				case 200:
					r.patches = append(r.patches, port)
				case 422: // the passive was promoted to active meanwhile: overlap
					refused.Add(1)
				default:
					t.Errorf("PATCH s%d: %d %s", i, st, body)
				}
			}
		})
	}()
	deleted := time.Now()
	for _, a := range doomed {
		f.DeleteIdentity(ident[a]) // the agent service deletes the identity, then says so
		publish(hosting.Intake{ID: hosting.NewID(), Entity: hosting.EntityAgent, Type: hosting.EventDeleted, AgentID: a, AccountID: "acct", At: deleted})
	}
	// Replica 0 dies in its first cascade of more than one share; it
	// comes back without the failpoint.
	reps[0].waitKilled(t)
	killedAt := time.Since(churn)
	if !strings.Contains(reps[0].logs.String(), "relay: holding the outbox lock") {
		t.Fatal("the killed replica did not hold the relay lock")
	}
	r0 := startDaemon(t, cfg)
	repMu.Lock()
	reps[0] = r0
	repMu.Unlock()
	<-done
	if t.Failed() {
		t.FailNow()
	}
	poll("every agent deletion applied", func() bool { return count("SELECT count(*) FROM agent WHERE deleted_at IS NOT NULL") == 100 })
	poll("the outbox drained", func() bool { return count("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0 })
	churnTook := time.Since(churn)
	for _, d := range reps {
		d.stop(t)
	}
	if q, err := ch.QueueDeclarePassive(topo.Queue, true, false, false, false, nil); err != nil || q.Messages != 0 {
		t.Fatalf("the intake queue holds %d messages (%v)", q.Messages, err)
	}
	if q, err := ch.QueueDeclarePassive(topo.DeadLetterQueue, true, false, false, false, nil); err != nil || q.Messages != 0 {
		t.Fatalf("%d dead letters (%v)", q.Messages, err)
	}

	// The events, first sightings in order (the relay publishes in commit
	// order; a failover republishes only what was sighted before).
	type sighting struct {
		key  string
		data hosting.ShareData
	}
	var evs []sighting
	seen := map[string]bool{}
	dups := 0
	for {
		m, ok, err := ch.Get(sink, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if seen[m.MessageId] {
			dups++
			continue
		}
		seen[m.MessageId] = true
		var env struct {
			Data hosting.ShareData `json:"data"`
		}
		if err := json.Unmarshal(m.Body, &env); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, sighting{m.RoutingKey, env.Data})
	}
	// Replay each share's events: a port change is one of its PATCHes,
	// in order; anything else is the cascade of exactly one doomed agent,
	// never twice.
	okPatches, removals := 0, 0
	st := pgstore.New(pool, pgstore.Options{})
	last := map[string]hosting.ShareData{}
	nextPatch := map[string]int{}
	removed := map[string]bool{}
	for _, r := range shares {
		last[r.id] = hosting.ShareData{ID: r.id, TargetPort: 1000, ActiveAgentIDs: hosting.NewHosts(r.active, nil).Active, PassiveAgentIDs: r.passive}
		okPatches += len(r.patches)
	}
	for _, e := range evs {
		r, prev := byID[e.data.ID], last[e.data.ID]
		if r == nil {
			t.Fatalf("an event of an unknown share %s", e.data.ID)
		}
		if e.key != "share.UPDATED" {
			t.Fatalf("share %s: %s: no share loses every host here", r.id, e.key)
		}
		if int(e.data.TargetPort) != int(prev.TargetPort) {
			k := nextPatch[r.id]
			if k >= len(r.patches) || int(e.data.TargetPort) != r.patches[k] {
				t.Fatalf("share %s: port %d is not its PATCH #%d (%v): a change applied twice or out of order", r.id, e.data.TargetPort, k+1, r.patches)
			}
			nextPatch[r.id] = k + 1
		} else {
			was := append(slices.Clone(prev.ActiveAgentIDs), prev.PassiveAgentIDs...)
			now := append(slices.Clone(e.data.ActiveAgentIDs), e.data.PassiveAgentIDs...)
			var gone []string
			for _, a := range was {
				if !slices.Contains(now, a) {
					gone = append(gone, a)
				}
			}
			if len(gone) != 1 || !slices.Contains(doomed, gone[0]) || removed[r.id+"/"+gone[0]] {
				t.Fatalf("share %s: %v -> %v is not one agent's cascade (gone %v, seen before %v)", r.id, was, now, gone, removed)
			}
			removed[r.id+"/"+gone[0]] = true
			removals++
		}
		last[r.id] = e.data
	}
	for _, r := range shares {
		if nextPatch[r.id] != len(r.patches) {
			t.Fatalf("share %s: %d of its %d PATCHes have an event", r.id, nextPatch[r.id], len(r.patches))
		}
		got, err := st.Get(ctx, r.id)
		if err != nil {
			t.Fatal(err)
		}
		want := last[r.id]
		if !got.Live() || int(got.TargetPort) != int(want.TargetPort) || !got.Hosts.Equal(hosting.NewHosts(want.ActiveAgentIDs, want.PassiveAgentIDs)) {
			t.Fatalf("share %s is %+v port %d, its last event says %+v", r.id, got.Hosts, got.TargetPort, want)
		}
		for _, a := range got.Hosts.All() {
			if !slices.Contains(stable, a) {
				t.Fatalf("share %s keeps the deleted agent %s", r.id, a)
			}
		}
	}
	// Once each: one outbox row per change, one inbox row per consumed
	// event, every doomed agent off every share it hosted.
	if removals != 2*nShares {
		t.Fatalf("%d agent removals, want %d", removals, 2*nShares)
	}
	if rows := count("SELECT count(*) FROM outbox"); rows != okPatches+removals || len(evs) != rows {
		t.Fatalf("%d outbox rows, %d events sighted, for %d PATCHes and %d removals", rows, len(evs), okPatches, removals)
	}
	if n := count("SELECT count(*) FROM inbox"); n != 210 {
		t.Fatalf("%d inbox rows for 210 consumed events", n)
	}
	// The reconciler finds Ziti as the store says.
	var out, errb strings.Builder
	if code := sharehosts.Main(ctx, []string{"reconcile", "-config", cfg, "-dry-run"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "0 drift(s) on 200 share(s)") {
		t.Fatalf("reconcile -dry-run: %d\n%s%s", code, out.String(), errb.String())
	}
	var repaired []string
	for i, d := range reps {
		for _, l := range strings.Split(d.logs.String(), "\n") {
			if strings.Contains(l, "reconciler: share") && strings.HasSuffix(l, "(repaired)") {
				repaired = append(repaired, fmt.Sprintf("replica %d: %s", i, l))
			}
		}
	}
	t.Logf("setup %v; churn %v (replica 0 killed after %v); %d PATCHes applied, %d refused (overlap after a promotion); %d removals; %d events, %d duplicate deliveries; repairs by the reconcilers: %d %v",
		setup.Round(time.Millisecond), churnTook.Round(time.Millisecond), killedAt.Round(time.Millisecond), okPatches, refused.Load(), removals, len(evs), dups, len(repaired), repaired)
}

// A daemon killed after an event's commit and before its ack: the broker
// redelivers the event to the next daemon, and the inbox makes it a
// no-op there (no second share event, no second Ziti write).
func TestKilledBeforeTheAckAppliesOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pg, err := pgtest.Start(ctx)
	if errors.Is(err, pgtest.ErrUnavailable) {
		testenv.Skip(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	rmq, err := rmqtest.Start(ctx)
	if errors.Is(err, rmqtest.ErrUnavailable) {
		testenv.Skip(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer rmq.Stop()
	f := zitifake.Start(t, zititest.Options{})
	f.AddUser("admin", "secret")
	dsn, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "sharehosts.yaml")
	cfgText := strings.NewReplacer(`"host=127.0.0.1"`, `"`+dsn+`"`, "amqp://guest:guest@127.0.0.1:5672/", rmq.URL(), "https://ctrl.example:1280", f.URL()).Replace(good) +
		"deployment-id: dep-ack\n"
	if err := os.WriteFile(cfg, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	conn, err := amqp.Dial(rmq.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	topo := events.DefaultTopology()
	if err := topo.Declare(ch); err != nil {
		t.Fatal(err)
	}
	publish := func(in hosting.Intake) {
		t.Helper()
		m, _ := in.Message()
		if err := events.Publish(ctx, ch, topo.Exchange, m); err != nil {
			t.Fatal(err)
		}
	}
	count := func(sql string) int {
		var n int
		if err := pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	poll := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %s", what)
			}
			time.Sleep(20 * time.Millisecond) // poll interval
		}
	}
	// a1 and a2 by agent.CREATED, two shares on them, through a daemon
	// that runs normally.
	d := startDaemon(t, cfg)
	for _, a := range []string{"a1", "a2"} {
		f.AddIdentity(a)
		publish(hosting.Intake{ID: hosting.NewID(), Entity: hosting.EntityAgent, Type: hosting.EventCreated, AgentID: a, AccountID: "acct", At: time.Now()})
	}
	poll("two agents", func() bool { return count("SELECT count(*) FROM agent WHERE deleted_at IS NULL") == 2 })
	for i, hosts := range []string{`"activeAgentIds":["a1"]`, `"activeAgentIds":["a1","a2"]`} {
		if st, body, err := d.do(t, "POST", "/accounts/acct/tcp-shares", fmt.Sprintf(`{"name":"s%d","targetAddress":"10.0.0.5","targetPort":80,%s}`, i, hosts)); err != nil || st != 201 {
			t.Fatalf("create: %d %s %v", st, body, err)
		}
	}
	d.stop(t)
	// The next daemon dies after the cascade of a1 committed, before the
	// ack.
	d = startDaemon(t, cfg, failpointEnv+"=hosting.events.before-ack=kill")
	publish(hosting.Intake{ID: hosting.NewID(), Entity: hosting.EntityAgent, Type: hosting.EventDeleted, AgentID: "a1", AccountID: "acct", At: time.Now()})
	d.waitKilled(t)
	if n := count("SELECT count(*) FROM outbox"); n != 2 {
		t.Fatalf("%d outbox rows after the committed cascade, want 2", n)
	}
	// The restarted daemon gets the redelivery, and it changes nothing.
	f.ResetCalls()
	d = startDaemon(t, cfg)
	poll("the redelivery acked", func() bool {
		q, err := ch.QueueDeclarePassive(topo.Queue, true, false, false, false, nil)
		return err == nil && q.Messages == 0 && q.Consumers == 1 && count("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0
	})
	d.stop(t)
	// Acked, not left for a next consumer: the queue is empty with no
	// consumer.
	if q, err := ch.QueueDeclarePassive(topo.Queue, true, false, false, false, nil); err != nil || q.Messages != 0 {
		t.Fatalf("the queue holds %d messages (%v): the redelivery was not acked", q.Messages, err)
	}
	if n := count("SELECT count(*) FROM outbox"); n != 2 {
		t.Fatalf("%d outbox rows after the redelivery, want 2: the cascade ran twice", n)
	}
	if n := count("SELECT count(*) FROM inbox"); n != 3 {
		t.Fatalf("%d inbox rows, want 3", n)
	}
	for _, c := range f.Calls() {
		if c.Method != "GET" && c.Path != "/authenticate" {
			t.Fatalf("the redelivery wrote %s %s", c.Method, c.Path)
		}
	}
}
