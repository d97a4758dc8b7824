package sharehosts_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vipkit/vipkit/examples/sharehosts"
	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/pgstore"
	"github.com/vipkit/vipkit/hosting/pgstore/pgtest"
	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/internal/zitifake"
)

// daemonEnv, set to a config file, makes the test binary run the daemon
// (sharehosts.Serve) instead of the tests, until SIGINT or SIGTERM.
const daemonEnv = "VIPKIT_SHAREHOSTS_TEST_DAEMON"

// failpointEnv and beforeCommit are hosting's failpoint variable and the
// point between a change's Ziti writes and its commit
// (hosting/internal/failpoint).
const (
	failpointEnv = "VIPKIT_FAILPOINTS"
	beforeCommit = "hosting.service.before-commit"
)

func runDaemon(cfg string) int {
	c, err := sharehosts.LoadConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := sharehosts.Serve(ctx, c, nil, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// daemon is a sharehosts daemon in its own process.
type daemon struct {
	cmd  *exec.Cmd
	logs *syncBuf
	base string // the API's address
}

// startDaemon runs the daemon on cfg, with extra environment, and waits
// until it serves.
func startDaemon(t *testing.T, cfg string, env ...string) *daemon {
	t.Helper()
	d := &daemon{logs: &syncBuf{}}
	d.cmd = exec.Command(os.Args[0], "-test.run=^$")
	d.cmd.Env = append(append(os.Environ(), daemonEnv+"="+cfg), env...)
	d.cmd.Stderr = d.logs
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			_ = d.cmd.Process.Kill()
			_ = d.cmd.Wait()
		}
	})
	re := regexp.MustCompile(`serving the API on (\S+)`)
	deadline := time.Now().Add(time.Minute)
	for {
		if m := re.FindStringSubmatch(d.logs.String()); m != nil {
			d.base = "http://" + m[1]
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon does not serve: %s", d.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (d *daemon) do(t *testing.T, method, path, body string) (int, string, error) {
	t.Helper()
	req, _ := http.NewRequest(method, d.base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer ops-token-0123456789")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String(), nil
}

// stop stops the daemon with SIGTERM and waits for it.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("daemon: %v\n%s", err, d.logs.String())
	}
}

// waitKilled waits for a daemon that a failpoint killed.
func (d *daemon) waitKilled(t *testing.T) {
	t.Helper()
	err := d.cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ProcessState.String() != "signal: killed" {
		t.Fatalf("the daemon was not killed: %v\n%s", err, d.logs.String())
	}
}

// A real daemon killed with SIGKILL between its Ziti writes and the
// commit, then restarted: the restarted daemon's reconciler repairs the
// drift that the crash left, on its start pass, and deletes the orphans
// of a create that never committed once they are older than the grace.
// The broker is not needed here: the daemons' AMQP URL points at a
// closed port, and the outbox keeps the events.
func TestReconcilerRepairsAfterSIGKILL(t *testing.T) {
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
	f := zitifake.Start(t, zititest.Options{})
	f.AddUser("admin", "secret")
	dsn, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfgText := strings.NewReplacer(`"host=127.0.0.1"`, `"`+dsn+`"`, "amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:guest@127.0.0.1:1/", "https://ctrl.example:1280", f.URL()).Replace(good) +
		"deployment-id: dep-test\n"
	dir := t.TempDir()
	// The daemons that crash reconcile on start only; the last one every
	// 2s, with a grace of 1s.
	slow, cfg := filepath.Join(dir, "slow.yaml"), filepath.Join(dir, "sharehosts.yaml")
	if err := os.WriteFile(slow, []byte(cfgText+"reconcile:\n  interval: 1h\n  orphan-grace: 1h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte(cfgText+"reconcile:\n  interval: 2s\n  orphan-grace: 1s\nmetrics.listen: 127.0.0.1:0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	base := "/accounts/acct/tcp-shares"

	// 1. A share with an active and a passive, made by a daemon that
	// runs normally.
	d := startDaemon(t, slow)
	if _, err := pool.Exec(ctx, "INSERT INTO agent (id, account_id) VALUES ('a1', 'acct'), ('p1', 'acct')"); err != nil {
		t.Fatal(err)
	}
	ia, ip := f.AddIdentity("a1"), f.AddIdentity("p1")
	st, body, err := d.do(t, "POST", base, `{"name":"db","targetAddress":"10.0.0.5","targetPort":5432,"activeAgentIds":["a1"],"passiveAgentIds":["p1"]}`)
	if err != nil || st != 201 {
		t.Fatalf("create: %d %s %v", st, body, err)
	}
	id := regexp.MustCompile(`"id":"([0-9a-f-]{36})"`).FindStringSubmatch(body)[1]
	d.stop(t)

	// 2. A daemon with the failpoint is killed in a create, after its
	// Ziti objects and before the commit.
	ghost := hosting.NewID()
	d = startDaemon(t, slow, failpointEnv+"="+beforeCommit+"=kill")
	if st, body, err := d.do(t, "POST", base, `{"id":"`+ghost+`","name":"ghost","targetAddress":"10.0.0.6","targetPort":80,"activeAgentIds":["a1"]}`); err == nil {
		t.Fatalf("the create answered %d %s", st, body)
	}
	d.waitKilled(t)
	// 3. Another swaps the roles: it writes Ziti (p1's override goes, a1
	// gets one) and is killed before the commit.
	d = startDaemon(t, slow, failpointEnv+"="+beforeCommit+"=kill")
	if st, body, err := d.do(t, "PATCH", base+"/"+id, `{"activeAgentIds":["p1"],"passiveAgentIds":["a1"]}`); err == nil {
		t.Fatalf("the swap answered %d %s", st, body)
	}
	d.waitKilled(t)

	// What the crashes left: the store has a1 active and p1 passive,
	// Ziti has the override on the active a1 and none on p1, and the
	// ghost's objects with no share.
	sh, err := pgstore.New(pool, pgstore.Options{}).Get(ctx, id)
	if err != nil || !sh.Hosts.Equal(hosting.NewHosts([]string{"a1"}, []string{"p1"})) {
		t.Fatalf("stored share %+v %v", sh.Hosts, err)
	}
	overrides := func() (onA, onP bool, ghostObjects int) {
		s := f.Snapshot()
		var svc string
		for _, x := range s.Services {
			switch x.Tags[hosting.TagShare] {
			case id:
				svc = x.ID
			case ghost:
				ghostObjects++
			}
		}
		for _, x := range s.Configs {
			if x.Tags[hosting.TagShare] == ghost {
				ghostObjects++
			}
		}
		for _, x := range s.Policies {
			if x.Tags[hosting.TagShare] == ghost {
				ghostObjects++
			}
		}
		has := func(ident string) bool {
			return slices.ContainsFunc(s.Overrides[ident], func(sc ziti.ServiceConfig) bool { return sc.ServiceID == svc })
		}
		return has(ia), has(ip), ghostObjects
	}
	if onA, onP, g := overrides(); !onA || onP || g != 3 {
		t.Fatalf("after the crashes: override on a1 %v, on p1 %v, ghost objects %d", onA, onP, g)
	}

	// 4. The dry run lists the drift and repairs nothing.
	f.ResetCalls()
	var out, errb bytes.Buffer
	if code := sharehosts.Main(ctx, []string{"reconcile", "-config", cfg, "-dry-run"}, &out, &errb); code != 0 {
		t.Fatalf("reconcile -dry-run: %d %s %s", code, out.String(), errb.String())
	}
	for _, want := range []string{"share " + id + ": OVERRIDE_STRAY agent a1", "share " + id + ": OVERRIDE_MISSING agent p1", "share " + ghost + ": ORPHAN"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("dry run lacks %q:\n%s", want, out.String())
		}
	}
	for _, call := range f.Calls() {
		if call.Method != "GET" && call.Path != "/authenticate" {
			t.Fatalf("the dry run wrote %s %s", call.Method, call.Path)
		}
	}

	// 5. The restarted daemon repairs it.
	d = startDaemon(t, cfg)
	deadline := time.Now().Add(time.Minute)
	for {
		onA, onP, g := overrides()
		if !onA && onP && g == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not repaired: override on a1 %v, on p1 %v, ghost objects %d\n%s", onA, onP, g, d.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st, body, err := d.do(t, "GET", base+"/"+id, ""); err != nil || st != 200 || !strings.Contains(body, `"activeAgentIds":["a1"]`) || strings.Contains(body, `"problem"`) {
		t.Fatalf("get: %d %s %v", st, body, err)
	}
	// Its metrics count the repairs.
	ma := regexp.MustCompile(`serving metrics on (\S+)`).FindStringSubmatch(d.logs.String())
	if ma == nil {
		t.Fatalf("no metrics: %s", d.logs.String())
	}
	resp, err := http.Get("http://" + ma[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var mb bytes.Buffer
	_, _ = mb.ReadFrom(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`hosting_reconciler_repairs_total{kind="OVERRIDE_STRAY"} 1`, `hosting_reconciler_repairs_total{kind="OVERRIDE_MISSING"} 1`,
		`hosting_reconciler_repairs_total{kind="ORPHAN"} 3`, `hosting_api_requests_total{code="200",route="GET /accounts/{account}/{kind}/{id}"} 1`} {
		if !strings.Contains(mb.String(), want) {
			t.Fatalf("metrics lack %s:\n%s", want, mb.String())
		}
	}
	d.stop(t)
	logs := d.logs.String()
	for _, want := range []string{"OVERRIDE_STRAY agent a1", "OVERRIDE_MISSING agent p1", "(repaired)", "ORPHAN"} {
		if !strings.Contains(logs, want) {
			t.Fatalf("log lacks %q:\n%s", want, logs)
		}
	}
}
