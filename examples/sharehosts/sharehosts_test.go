package sharehosts_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/examples/sharehosts"
	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/events"
	"github.com/vipkit/vipkit/hosting/events/rmqtest"
	"github.com/vipkit/vipkit/hosting/pgstore/pgtest"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/internal/zitifake"
)

func TestMain(m *testing.M) {
	if cfg := os.Getenv(daemonEnv); cfg != "" {
		os.Exit(runDaemon(cfg)) // a daemon that a test starts as a process
	}
	goleak.VerifyTestMain(m, testenv.IdleHTTP()...)
}

const good = `
frontdoor-id: fd-1
api:
  listen: 127.0.0.1:0
  tokens:
    ops:
      token: "ops-token-0123456789"
      accounts: all
    tenant-a:
      token: "tenant-a-token-0123456789"
      accounts: [acct-1, acct-3]
postgres:
  dsn: "host=127.0.0.1"
amqp.url: amqp://guest:guest@127.0.0.1:5672/
ziti:
  url: https://ctrl.example:1280
  username: admin
  password: secret
io.netfoundry.frontdoor.share:
  max-hosts: 4
  health-check:
    interval: 5s
    timeout: 2s
    failures: 3
`

func TestConfig(t *testing.T) {
	c, err := sharehosts.ParseConfig([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if c.HealthCheck != (hosting.HealthCheck{Interval: 5 * time.Second, Timeout: 2 * time.Second, Failures: 3}) || c.MaxHosts != 4 || c.AMQPURL == "" || len(c.Unscoped) != 0 {
		t.Fatalf("config %+v", c)
	}
	if c.DeploymentID != "" || c.Reconcile != (sharehosts.ReconcileConfig{}) {
		t.Fatalf("reconcile defaults %q %+v", c.DeploymentID, c.Reconcile)
	}
	withRec := good + "deployment-id: dep-1\nreconcile:\n  interval: 1m\n  orphan-grace: 20m\n  min-gap: 5s\n  max-repairs: 7\n"
	if c2, err := sharehosts.ParseConfig([]byte(withRec)); err != nil || c2.DeploymentID != "dep-1" ||
		c2.Reconcile != (sharehosts.ReconcileConfig{Interval: time.Minute, Grace: 20 * time.Minute, MinGap: 5 * time.Second, MaxRepairs: 7}) {
		t.Fatalf("reconcile settings: %+v %v", c2.Reconcile, err)
	}
	if len(c.Tokens) != 2 || c.Tokens[0].Principal != "ops" || c.Tokens[0].Secret != "ops-token-0123456789" || !c.Tokens[0].Scope.All() ||
		c.Tokens[1].Principal != "tenant-a" || c.Tokens[1].Scope.String() != "acct-1,acct-3" {
		t.Fatalf("tokens %v", c.Tokens)
	}
	// The dotted form reads the same.
	dotted := strings.Replace(good, "io.netfoundry.frontdoor.share:\n  max-hosts: 4\n  health-check:\n    interval: 5s\n    timeout: 2s\n    failures: 3\n",
		"io.netfoundry.frontdoor.share.max-hosts: 4\nio.netfoundry.frontdoor.share.health-check.interval: 5s\nio.netfoundry.frontdoor.share.health-check.timeout: 2s\nio.netfoundry.frontdoor.share.health-check.failures: 3\n", 1)
	if c2, err := sharehosts.ParseConfig([]byte(dotted)); err != nil || c2.HealthCheck != c.HealthCheck || c2.MaxHosts != 4 {
		t.Fatalf("dotted: %+v %v", c2, err)
	}
	cases := map[string]struct{ from, to, want string }{
		"no health check":      {"    interval: 5s\n", "", "io.netfoundry.frontdoor.share.health-check.interval is missing"},
		"interval under 1s":    {"interval: 5s", "interval: 500ms", "interval 500ms is under 1s"},
		"failures 0":           {"failures: 3", "failures: 0", "failures 0 is under 1"},
		"max-hosts 0":          {"max-hosts: 4", "max-hosts: 0", "max-hosts is 0, under 1"},
		"unknown key":          {"frontdoor-id: fd-1", "frontdoor-id: fd-1\nfrontdor: x", "unknown key frontdor"},
		"short token":          {`"ops-token-0123456789"`, `"short"`, "api.tokens.ops: a token needs at least 16 characters"},
		"token one under":      {`"ops-token-0123456789"`, `"0123456789abcde"`, "api.tokens.ops: a token needs at least 16 characters"},
		"no accounts":          {"      accounts: all\n", "", `api.tokens.ops.accounts is missing: list the accounts, or write "all" for every account`},
		"empty accounts":       {"accounts: [acct-1, acct-3]", "accounts: []", `api.tokens.tenant-a.accounts is empty: list the accounts, or write "all" for every account`},
		"null accounts":        {"accounts: [acct-1, acct-3]", "accounts:", `api.tokens.tenant-a.accounts is empty`},
		"empty account id":     {"accounts: [acct-1, acct-3]", `accounts: [acct-1, ""]`, "api.tokens.tenant-a.accounts: an account id is empty"},
		"all in a list":        {"accounts: [acct-1, acct-3]", "accounts: [acct-1, all]", `api.tokens.tenant-a.accounts: "all" is not an account; write api.tokens.tenant-a.accounts: all (not in a list)`},
		"account not a string": {"accounts: [acct-1, acct-3]", "accounts: [acct-1, {a: b}]", "api.tokens.tenant-a.accounts: an account id must be a string"},
		"unknown token field":  {"      accounts: all\n", "      accounts: all\n      scope: all\n", `api.tokens.ops.scope: unknown field "scope" of a token (its fields are token and accounts)`},
		"no secret":            {`      token: "ops-token-0123456789"` + "\n", "", "api.tokens.ops.token is missing"},
		"same token twice":     {`"tenant-a-token-0123456789"`, `"ops-token-0123456789"`, "api.tokens.tenant-a: the token of ops is given again"},
		"both forms":           {"frontdoor-id: fd-1", "frontdoor-id: fd-1\napi.tokens.tenant-a: \"legacy-token-0123456789\"", "api.tokens.tenant-a is given both as a token and with fields; write api.tokens.tenant-a.token and api.tokens.tenant-a.accounts"},
		"list elsewhere":       {"frontdoor-id: fd-1", "frontdoor-id: [fd-1]", "frontdoor-id: a list is not a setting"},
		"no tokens": {"  tokens:\n    ops:\n      token: \"ops-token-0123456789\"\n      accounts: all\n    tenant-a:\n      token: \"tenant-a-token-0123456789\"\n      accounts: [acct-1, acct-3]\n", "  tokens:\n",
			"api.tokens needs at least one token: api.tokens.<principal>.token and .accounts"},
		"no ziti credential":   {"  username: admin\n  password: secret\n", "", "give either ziti.username and ziti.password, or ziti.cert-file and ziti.key-file"},
		"no amqp":              {"amqp.url: amqp://guest:guest@127.0.0.1:5672/\n", "", "amqp.url is missing"},
		"reconcile interval":   {"frontdoor-id: fd-1", "frontdoor-id: fd-1\nreconcile.interval: 10ms", "reconcile.interval is 10ms, under 1s"},
		"reconcile grace bad":  {"frontdoor-id: fd-1", "frontdoor-id: fd-1\nreconcile.orphan-grace: soon", `reconcile.orphan-grace: time: invalid duration "soon"`},
		"metrics not loopback": {"frontdoor-id: fd-1", "frontdoor-id: fd-1\nmetrics.listen: 0.0.0.0:9000", `metrics.listen is "0.0.0.0:9000", want a loopback host:port`},
		"ingress url scheme":   {"frontdoor-id: fd-1", "frontdoor-id: fd-1\ningress.url: ftp://x", `ingress.url is "ftp://x", want an http or https URL with no query`},
		"network url query":    {"frontdoor-id: fd-1", "frontdoor-id: fd-1\nnetwork.url: http://n/?a=b", `network.url is "http://n/?a=b", want an http or https URL with no query`},
		"max repairs 0":        {"frontdoor-id: fd-1", "frontdoor-id: fd-1\nreconcile.max-repairs: 0", `reconcile.max-repairs is "0", want an integer of at least 1`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(good, tc.from) {
				t.Fatalf("fixture lacks %q", tc.from)
			}
			_, err := sharehosts.ParseConfig([]byte(strings.Replace(good, tc.from, tc.to, 1)))
			if !errors.Is(err, sharehosts.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestCheckConfigCommand(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := sharehosts.Main(t.Context(), []string{"check-config", "-config", p}, &out, &errb); code != 0 || !strings.Contains(out.String(), "ok (health check 5s/2s/3, max hosts 4)") {
		t.Fatalf("%d %q %q", code, out.String(), errb.String())
	}
	if code := sharehosts.Main(t.Context(), []string{"bogus"}, &out, &errb); code != 2 {
		t.Fatalf("unknown command: %d", code)
	}
}

type syncBuf struct {
	// mu guards b.
	mu sync.Mutex
	// +checklocks:mu
	b bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// The daemon against real PostgreSQL and RabbitMQ and the model
// controller: migrations on start, the API behind its token, the agent
// cascade from the bus, a graceful shutdown.
func TestServe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
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
	cfgText := strings.NewReplacer(`"host=127.0.0.1"`, `"`+dsn+`"`, "amqp://guest:guest@127.0.0.1:5672/", rmq.URL(), "https://ctrl.example:1280", f.URL()).Replace(good)
	// A deployment id, so that the reconciler may remove this
	// deployment's orphans and logs no warning about it.
	cfgText += "deployment-id: dep-serve\n"
	// The ingress and network gates: an ingress that is gone once torn
	// down, and a network that exists.
	var gmu sync.Mutex
	var calls []string
	torn := map[string]bool{}
	gates := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gmu.Lock()
		defer gmu.Unlock()
		calls = append(calls, r.Method+" "+r.URL.Path)
		switch {
		case r.Method == "DELETE":
			torn[r.URL.Path] = true
		case strings.HasPrefix(r.URL.Path, "/ingress/") && torn[r.URL.Path]:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer gates.Close()
	gateCalls := func() []string { gmu.Lock(); defer gmu.Unlock(); return slices.Clone(calls) }
	cfgText += "ingress.url: " + gates.URL + "/ingress/\nnetwork.url: " + gates.URL + "/net\n"
	c, err := sharehosts.ParseConfig([]byte(cfgText))
	if err != nil {
		t.Fatal(err)
	}
	// The daemon's own pool sees the agents the agent service would own.
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuf{}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sharehosts.Serve(sctx, c, l, logs) }()
	base := "http://" + l.Addr().String() + "/accounts/acct/tcp-shares"
	do := func(method, url, body, token string) (int, string) {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "serving the API") {
		if time.Now().After(deadline) {
			t.Fatalf("not serving: %s", logs.String())
		}
		<-time.After(10 * time.Millisecond)
	}
	var migrations int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM schema_migrations").Scan(&migrations); err != nil || migrations != 4 {
		t.Fatalf("migrations %d, %v", migrations, err)
	}
	for _, want := range []string{"ingress gate: " + gates.URL + "/ingress", "network gate: " + gates.URL + "/net"} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("log lacks %q: %s", want, logs.String())
		}
	}
	conn, err := amqp.Dial(rmq.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(60 * time.Second)
	// The consumer declares its queue and bindings; publish once they
	// exist (a message published before is routed nowhere).
	for {
		if _, err := ch.QueueDeclarePassive(events.DefaultTopology().Queue, true, false, false, false, nil); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the consumer did not declare its queue")
		}
		if ch, err = conn.Channel(); err != nil { // a failed passive declare closes the channel
			t.Fatal(err)
		}
		<-time.After(50 * time.Millisecond)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	// publishUntil publishes m (again every 3 s: the bindings follow the
	// queue by a moment, and a repeat is a no-op by the inbox) until done.
	publishUntil := func(what string, m hosting.EventMessage, done func() bool) {
		t.Helper()
		var last time.Time
		for !done() {
			if time.Since(last) > 3*time.Second {
				if err := events.Publish(ctx, ch, events.DefaultTopology().Exchange, m); err != nil {
					t.Fatal(err)
				}
				last = time.Now()
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s", what, logs.String())
			}
			<-time.After(20 * time.Millisecond)
		}
	}
	// The agent service creates a1 and says so on the bus: no other
	// program writes the daemon's agents.
	f.AddIdentity("a1")
	if st, _ := do("POST", base, `{"name":"db","targetAddress":"10.0.0.5","targetPort":5432,"activeAgentIds":["a1"]}`, ""); st != 401 {
		t.Fatalf("without a token: %d", st)
	}
	created, _ := (hosting.Intake{ID: hosting.NewID(), Entity: hosting.EntityAgent, Type: hosting.EventCreated, AgentID: "a1", AccountID: "acct", At: time.Now()}).Message()
	var id string
	publishUntil("agent.CREATED did not make a1 hostable", created, func() bool {
		st, body := do("POST", base, `{"name":"db","targetAddress":"10.0.0.5","targetPort":5432,"activeAgentIds":["a1"]}`, "ops-token-0123456789")
		if st == 201 && strings.Contains(body, `"createdBy":"ops"`) {
			id = regexp.MustCompile(`"id":"([0-9a-f-]{36})"`).FindStringSubmatch(body)[1]
			return true
		}
		if st != 422 { // 422 until the event is handled: "agent a1 does not exist"
			t.Fatalf("create: %d %s", st, body)
		}
		return false
	})
	// tenant-a's token acts on acct-1 and acct-3 only: acct's share is not there.
	if st, body := do("GET", base+"/"+id, "", "tenant-a-token-0123456789"); st != 404 || !strings.Contains(body, "share "+id+" does not exist") {
		t.Fatalf("tenant-a reads acct's share: %d %s", st, body)
	}
	if strings.Contains(logs.String(), "warning") {
		t.Fatalf("a warning with scoped tokens: %s", logs.String())
	}
	// The agent service deletes a1 and says so on the bus: the cascade
	// marks it deleted, tears the ingress down and deletes the share,
	// asking the network gate whether Ziti is cleaned up.
	m, _ := hosting.AgentDeletedMessage(hosting.NewID(), hosting.AgentDeleted{AgentID: "a1", AccountID: "acct"}, time.Now())
	publishUntil("the cascade did not run", m, func() bool {
		st, _ := do("GET", base+"/"+id, "", "ops-token-0123456789")
		var published int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND routing_key = 'share.DELETED'").Scan(&published)
		return st == 404 && published == 1
	})
	var deleted bool
	if err := pool.QueryRow(ctx, "SELECT deleted_at IS NOT NULL FROM agent WHERE id = 'a1'").Scan(&deleted); err != nil || !deleted {
		t.Fatalf("a1 deleted %v, %v", deleted, err)
	}
	for _, want := range []string{"DELETE /ingress/shares/" + id, "GET /ingress/shares/" + id, "GET /net/frontdoors/fd-1/network"} {
		if !slices.Contains(gateCalls(), want) {
			t.Fatalf("the gates saw %v, not %q", gateCalls(), want)
		}
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(sharehosts.ShutdownTimeout + 10*time.Second):
		t.Fatal("no graceful shutdown")
	}
	if !strings.Contains(logs.String(), "stopped") {
		t.Fatalf("log: %s", logs.String())
	}
}

func TestDemoShowsTheFailover(t *testing.T) {
	if _, err := pgtest.BinDir(); err != nil {
		testenv.Skip(t, "%v", err)
	}
	if _, err := zititest.LoadSpec(); err != nil {
		testenv.Skip(t, "%v", err)
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := sharehosts.Demo(ctx, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{
		"hosting HEALTHY: agent-a active at required, agent-b passive at default",
		`reaches "db on the host of agent-a"`,
		"FAILOVER after",
		"hosting FAILED_OVER: agent-a active at failed, agent-b passive at default",
		`reaches "db on the host of agent-b"`,
		"FAILBACK after",
		"share.UPDATED",
	} {
		if !strings.Contains(s, want) {
			t.Fatalf("output lacks %q:\n%s", want, s)
		}
	}
}

// A token written in the older form, without accounts, acts on every
// account; Serve says so once, at start, naming the principals and never
// the secrets.
func TestUnscopedTokensWarn(t *testing.T) {
	cfg := strings.Replace(good, "    tenant-a:\n      token: \"tenant-a-token-0123456789\"\n      accounts: [acct-1, acct-3]\n",
		"    tenant-a: \"tenant-a-token-0123456789\"\n    tenant-b: \"tenant-b-token-0123456789\"\n", 1)
	c, err := sharehosts.ParseConfig([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Tokens) != 3 || !slices.Equal(c.Unscoped, []string{"tenant-a", "tenant-b"}) {
		t.Fatalf("tokens %v, unscoped %v", c.Tokens, c.Unscoped)
	}
	for _, tok := range c.Tokens {
		if !tok.Scope.All() {
			t.Fatalf("%v is not scoped to all accounts", tok)
		}
	}
	// No database listens on port 1: Serve stops after its start-up
	// warning, at the first connection.
	c.PostgresDSN = "host=127.0.0.1 port=1 connect_timeout=5"
	var logs bytes.Buffer
	if err := sharehosts.Serve(t.Context(), c, nil, &logs); err == nil {
		t.Fatal("Serve without a database succeeded")
	}
	want := `warning: the tokens of tenant-a, tenant-b have no accounts and act on every account; write api.tokens.<principal>.token and .accounts ("all" or a list)`
	if n := strings.Count(logs.String(), "warning"); n != 1 || !strings.Contains(logs.String(), want) {
		t.Fatalf("%d warnings in %q", n, logs.String())
	}
	if strings.Contains(logs.String(), "-token-0123456789") {
		t.Fatalf("a secret in the log: %q", logs.String())
	}
}
