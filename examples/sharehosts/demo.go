package sharehosts

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/api"
	"github.com/vipkit/vipkit/hosting/pgstore"
	"github.com/vipkit/vipkit/hosting/pgstore/pgtest"
	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/syncx"
)

// DemoHealthCheck is the demo's health check: the shortest the settings
// allow, so that a failover shows within seconds.
var DemoHealthCheck = hosting.HealthCheck{Interval: time.Second, Timeout: time.Second, Failures: 2}

// loopTarget is the share's target on one host: a loopback listener that
// answers each connection with the host's name.
type loopTarget struct {
	name string
	// mu guards addr and l.
	mu syncx.Mutex
	// +checklocks:mu
	addr string
	// +checklocks:mu
	l  net.Listener
	wg sync.WaitGroup
}

func (t *loopTarget) start() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	addr := t.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	t.l, t.addr = l, l.Addr().String()
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, t.name+"\n")
			c.Close()
		}
	}()
	return nil
}

func (t *loopTarget) stop() {
	t.mu.Lock()
	l := t.l
	t.l = nil
	t.mu.Unlock()
	if l != nil {
		l.Close()
		t.wg.Wait()
	}
}

func (t *loopTarget) address() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.addr
}

// Demo runs the whole service in one process, with no external Ziti and
// no broker: PostgreSQL started as the tests start it, the model
// controller, two simulated agents on loopback targets, and the API on a
// loopback port. It creates a share with an active and a passive through
// the API, stops the target on the active's host, and prints the failover
// to the passive and the failback, then the events left in the outbox.
func Demo(ctx context.Context, out io.Writer) error {
	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(out, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	pg, err := pgtest.Start(ctx)
	if err != nil {
		return fmt.Errorf("sharehosts demo: PostgreSQL: %w", err)
	}
	defer pg.Stop()
	dsn, err := pg.NewDatabase(ctx)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool, ""); err != nil {
		return err
	}
	say("PostgreSQL on port %d, migrated", pg.Port)
	f, err := zititest.Start(zititest.Options{})
	if err != nil {
		return fmt.Errorf("sharehosts demo: model controller: %w", err)
	}
	defer f.Close()
	f.AddUser("admin", "demo-password")
	zc, err := ziti.New(f.URL(), ziti.Options{HTTPClient: f.HTTPClient(nil), Login: ziti.PasswordLogin("admin", "demo-password")})
	if err != nil {
		return err
	}
	say("model controller at %s (logged in as admin)", f.URL())
	proj, err := hosting.NewProjection(zc, hosting.ProjectionOptions{FrontdoorID: "demo", HealthCheck: DemoHealthCheck})
	if err != nil {
		return err
	}
	st := pgstore.New(pool, pgstore.Options{})
	svc, err := hosting.NewService(hosting.Options{Store: st, Projection: proj, Outbox: true})
	if err != nil {
		return err
	}
	targets := map[string]*loopTarget{}
	agents := map[string]*zititest.HostAgent{}
	idents := map[string]string{}
	for _, a := range []string{"agent-a", "agent-b"} {
		if err := st.PutAgent(ctx, hosting.Agent{ID: a, AccountID: "acct"}); err != nil {
			return err
		}
		idents[a] = f.AddIdentity(a)
		t := &loopTarget{name: "db on the host of " + a}
		if err := t.start(); err != nil {
			return err
		}
		defer t.stop()
		targets[a] = t
		ha, err := f.StartAgent(zititest.AgentOptions{Identity: idents[a], Resolve: func(string) string { return t.address() }})
		if err != nil {
			return err
		}
		agents[a] = ha
		say("%s runs a simulated tunneler (identity %s); its host's target is %s", a, idents[a], t.address())
	}
	h, err := api.New(api.Options{Service: svc})
	if err != nil {
		return err
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	token := hex.EncodeToString(raw[:])
	auth, err := api.NewBearer([]api.Token{{Secret: token, Principal: "demo", Scope: api.AllAccounts()}})
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: auth.Wrap(h), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	base := "http://" + l.Addr().String() + "/accounts/acct/tcp-shares"
	say("API on http://%s", l.Addr())

	call := func(method, url, body string) (int, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	status, b, err := call("POST", base, `{"name":"db","targetAddress":"db.internal","targetPort":5432,"activeAgentIds":["agent-a"],"passiveAgentIds":["agent-b"]}`)
	if err != nil || status != http.StatusCreated {
		return fmt.Errorf("sharehosts demo: create: %d %s %v", status, b, err)
	}
	var v api.ShareView
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	say("POST %s → 201: share %s, active %v, passive %v", base, v.ID, v.ActiveAgentIDs, v.PassiveAgentIDs)
	var service string
	for _, s := range f.Snapshot().Services {
		if s.Tags[hosting.TagShare] == v.ID {
			service = s.ID
		}
	}
	// state polls the single read until the hosting block says want.
	state := func(want hosting.State, within time.Duration) (hosting.Hosting, error) {
		deadline := time.Now().Add(within)
		var last hosting.Hosting
		for {
			status, b, err := call("GET", base+"/"+v.ID, "")
			if err != nil {
				return last, err
			}
			var sv api.ShareView
			if status == http.StatusOK && json.Unmarshal(b, &sv) == nil && sv.Hosting != nil {
				last = *sv.Hosting
				if last.State == want {
					return last, nil
				}
			}
			if time.Now().After(deadline) {
				return last, fmt.Errorf("sharehosts demo: hosting state %s after %v, want %s", last.State, within, want)
			}
			select {
			case <-ctx.Done():
				return last, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	show := func(hs hosting.Hosting) {
		var parts []string
		for _, x := range hs.Hosts {
			parts = append(parts, fmt.Sprintf("%s %s at %s", x.AgentID, strings.ToLower(string(x.Role)), orNone(x.Precedence)))
		}
		say("  hosting %s: %s", hs.State, strings.Join(parts, ", "))
	}
	circuit := func() error {
		c, host, err := f.Dial(ctx, service)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, _ := io.ReadAll(c)
		say("  a new circuit lands on identity %s and reaches %q", host, strings.TrimSpace(string(line)))
		return nil
	}
	hs, err := state(hosting.Healthy, 10*time.Second)
	if err != nil {
		return err
	}
	show(hs)
	if err := circuit(); err != nil {
		return err
	}
	say("stopping the target on agent-a's host (health check every %v, %d failures)", DemoHealthCheck.Interval, DemoHealthCheck.Failures)
	t0 := time.Now()
	targets["agent-a"].stop()
	if hs, err = state(hosting.FailedOver, 15*time.Second); err != nil {
		return err
	}
	say("FAILOVER after %.1fs: agent-a's terminator is failed, agent-b's default is now the highest band", time.Since(t0).Seconds())
	show(hs)
	if err := circuit(); err != nil {
		return err
	}
	say("starting the target on agent-a's host again")
	t0 = time.Now()
	if err := targets["agent-a"].start(); err != nil {
		return err
	}
	if hs, err = state(hosting.Healthy, 15*time.Second); err != nil {
		return err
	}
	say("FAILBACK after %.1fs: agent-a's first passing check returns it to required", time.Since(t0).Seconds())
	show(hs)
	if err := circuit(); err != nil {
		return err
	}
	say("swapping the roles with PATCH")
	if status, b, err = call("PATCH", base+"/"+v.ID, `{"activeAgentIds":["agent-b"],"passiveAgentIds":["agent-a"]}`); err != nil || status != http.StatusOK {
		return fmt.Errorf("sharehosts demo: patch: %d %s %v", status, b, err)
	}
	if hs, err = state(hosting.Healthy, 10*time.Second); err != nil {
		return err
	}
	show(hs)
	if err := circuit(); err != nil {
		return err
	}
	say("stopping agent-b's tunneler")
	agents["agent-b"].Stop()
	if hs, err = state(hosting.FailedOver, 10*time.Second); err != nil {
		return err
	}
	show(hs)
	if err := circuit(); err != nil {
		return err
	}
	pend, err := st.Pending(ctx, 100)
	if err != nil {
		return err
	}
	say("outbox (published by the relay when a broker is configured):")
	for _, e := range pend {
		var env struct {
			Data hosting.ShareData `json:"data"`
		}
		_ = json.Unmarshal(e.Body, &env)
		say("  #%d %s %s active %v passive %v", e.Seq, e.RoutingKey, e.ID, env.Data.ActiveAgentIDs, env.Data.PassiveAgentIDs)
	}
	_ = srv.Shutdown(ctx)
	say("done")
	return nil
}

func orNone(p string) string {
	if p == "" {
		return "(not bound)"
	}
	return p
}
