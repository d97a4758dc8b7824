//go:build linux

package keelvip

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/transporttest"
)

var errProbe = errors.New("probe failed")

// TestCheckRiseFall: fall consecutive failures make a check failing and
// rise consecutive passes make it passing; one result of the other kind
// restarts the count; before either the status is unknown.
func TestCheckRiseFall(t *testing.T) {
	s := checkState{rise: 2, fall: 3}
	now := transporttest.Epoch
	step := func(err error, want CheckStatus, changed bool) {
		t.Helper()
		now = now.Add(time.Second)
		if got := s.observe(now, err); got != changed || s.status != want {
			t.Fatalf("after %v: status %v changed %v, want %v %v", err, s.status, got, want, changed)
		}
	}
	step(nil, CheckUnknown, false)
	step(nil, CheckPassing, true) // rise 2
	step(nil, CheckPassing, false)
	step(errProbe, CheckPassing, false)
	step(errProbe, CheckPassing, false)
	step(nil, CheckPassing, false) // a pass restarts the fall count
	step(errProbe, CheckPassing, false)
	step(errProbe, CheckPassing, false)
	step(errProbe, CheckFailing, true) // fall 3
	step(errProbe, CheckFailing, false)
	step(nil, CheckFailing, false)
	step(errProbe, CheckFailing, false) // a failure restarts the rise count
	step(nil, CheckFailing, false)
	step(nil, CheckPassing, true)
	if s.runs != 14 || s.failed != 7 || s.lastErr != "" {
		t.Fatalf("runs %d failed %d lastErr %q", s.runs, s.failed, s.lastErr)
	}
	// Unknown goes to failing after fall failures too.
	u := checkState{rise: 1, fall: 2}
	u.observe(now, errProbe)
	if u.status != CheckUnknown || !u.observe(now, errProbe) || u.status != CheckFailing || u.lastErr != errProbe.Error() {
		t.Fatalf("unknown after two failures: %v %q", u.status, u.lastErr)
	}
}

// TestCheckRunnerManualClock: the runner runs every interval on its clock;
// a result older than MaxResultAge is stale (neither passing nor
// failing).
func TestCheckRunnerManualClock(t *testing.T) {
	clk := transporttest.NewManualClock()
	cfg := Checks{TCP: "[::1]:1", Interval: time.Second, Timeout: 500 * time.Millisecond, Rise: 2, Fall: 2}
	r := newCheckRunner(cfg, clk, nil)
	var fail atomic.Bool
	var calls atomic.Int64
	r.probe = func(ctx context.Context) error {
		calls.Add(1)
		if fail.Load() {
			return errProbe
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.run(ctx) }()
	waitCalls := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for calls.Load() < n || clk.Pending() == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("probe ran %d times, want %d", calls.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitCalls(1)
	if res := r.Result(); res.Status != CheckUnknown || !res.Fresh || res.Age != 0 {
		t.Fatalf("after one pass: %+v", res)
	}
	clk.Advance(time.Second)
	waitCalls(2)
	if res := r.Result(); !res.Passing() {
		t.Fatalf("after two passes: %+v", res)
	}
	fail.Store(true)
	clk.Advance(time.Second)
	waitCalls(3)
	clk.Advance(time.Second)
	waitCalls(4)
	if res := r.Result(); !res.Failing() || res.Failed != 2 || res.Runs != 4 {
		t.Fatalf("after two failures: %+v", res)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// No more results: stale at MaxResultAge plus a nanosecond.
	clk.Advance(cfg.MaxResultAge())
	if res := r.Result(); !res.Fresh {
		t.Fatalf("at MaxResultAge: %+v", res)
	}
	clk.Advance(time.Nanosecond)
	if res := r.Result(); res.Fresh || res.Failing() || res.Passing() {
		t.Fatalf("past MaxResultAge: %+v", res)
	}
}

func runProbe(t *testing.T, cfg Checks) error {
	t.Helper()
	r := newCheckRunner(cfg, nil, checkEnv("m1", "a", "fd00:1::1:100"))
	start := time.Now()
	r.once(context.Background())
	if took := time.Since(start); took > r.cfg.Timeout+2*time.Second {
		t.Fatalf("one run took %v, timeout %v", took, r.cfg.Timeout)
	}
	res := r.Result()
	if res.Runs != 1 {
		t.Fatalf("runs %d", res.Runs)
	}
	if res.LastErr != "" {
		return errors.New(res.LastErr)
	}
	return nil
}

// TestCheckKinds: exec passes on exit 0, tcp on a connection, http on a
// 2xx or 3xx answer (a redirect is not followed).
func TestCheckKinds(t *testing.T) {
	if err := runProbe(t, Checks{Exec: []string{"/bin/true"}}); err != nil {
		t.Fatalf("exec true: %v", err)
	}
	if err := runProbe(t, Checks{Exec: []string{"/bin/sh", "-c", "echo broken; exit 3"}}); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("exec exit 3: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := runProbe(t, Checks{TCP: addr}); err != nil {
		t.Fatalf("tcp open: %v", err)
	}
	l.Close()
	if err := runProbe(t, Checks{TCP: addr}); err == nil {
		t.Fatal("tcp closed port passed")
	}
	var followed atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			w.Write([]byte(strings.Repeat("x", 2*CheckBodyMax)))
		case "/redirect":
			http.Redirect(w, r, "/followed", http.StatusFound)
		case "/followed":
			followed.Store(true)
		default:
			http.Error(w, "down", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	if err := runProbe(t, Checks{HTTP: srv.URL + "/ok"}); err != nil {
		t.Fatalf("http 200: %v", err)
	}
	if err := runProbe(t, Checks{HTTP: srv.URL + "/redirect"}); err != nil || followed.Load() {
		t.Fatalf("http 302: %v, followed %v", err, followed.Load())
	}
	if err := runProbe(t, Checks{HTTP: srv.URL + "/down"}); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("http 503: %v", err)
	}
}

// TestCheckExecBounded: an exec check sees only its clean environment, and
// one that outlives its timeout is killed with its process group (a child
// it left in the background too) and counts as failed.
func TestCheckExecBounded(t *testing.T) {
	t.Setenv("KEEL_SECRET", "leak")
	dir := t.TempDir()
	envFile := filepath.Join(dir, "env")
	if err := runProbe(t, Checks{Exec: []string{"/bin/sh", "-c", "env > " + envFile}}); err != nil {
		t.Fatal(err)
	}
	env, _ := os.ReadFile(envFile)
	if strings.Contains(string(env), "KEEL_SECRET") || !strings.Contains(string(env), "KEEL_VIP=fd00:1::1:100") {
		t.Fatalf("exec environment:\n%s", env)
	}
	pidFile := filepath.Join(dir, "pid")
	err := runProbe(t, Checks{Exec: []string{"/bin/sh", "-c", "sleep 30 & echo $! > " + pidFile + "; wait"}, Interval: time.Second, Timeout: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("a hanging exec: %v", err)
	}
	pid, _ := os.ReadFile(pidFile)
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/stat")
		if err != nil || strings.Contains(string(st), ") Z ") {
			break // gone (or a zombie awaiting its reaper)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the background child %s outlived the check's timeout", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCheckExecRefusedWhenPrivileged: an exec check never runs in a
// process with privileges (root or a capability), as tend is.
func TestCheckExecRefusedWhenPrivileged(t *testing.T) {
	r := newCheckRunner(Checks{Exec: []string{"/bin/true"}}, transporttest.NewManualClock(), nil)
	r.privileged = func() bool { return true }
	if err := r.run(context.Background()); !errors.Is(err, errPrivilegedCheck) {
		t.Fatalf("privileged exec check: %v, want errPrivilegedCheck", err)
	}
	if r.Result().Runs != 0 {
		t.Fatal("the privileged exec check ran")
	}
}
