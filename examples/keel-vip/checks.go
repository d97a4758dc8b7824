package keelvip

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// Checks is the mesh file's "checks" section: one service check that the
// controller runs on this node, with exactly one of exec, tcp or http.
//
//	"checks": {"http": "http://[::1]:8080/healthz", "interval_ms": 2000,
//	           "timeout_ms": 1000, "rise": 2, "fall": 3, "min_move_interval_s": 60}
//
// A check passes when the command exits 0 (exec), the connection is made
// (tcp) or the answer's status is 2xx or 3xx (http, redirects not
// followed). Fall consecutive failures make the check failing, rise
// consecutive passes make it passing; until either, its status is unknown.
// A holder whose check is failing hands the VIP over to the other member
// only if that member's own check passes (see the README's "Service
// checks"); an exec check runs as a hook does (runHookCommand): the
// controller's own unprivileged user, a clean environment, bounded output
// and its process group killed at the timeout.
type Checks struct {
	// Exec is the program (an absolute path) and its arguments.
	Exec []string
	// TCP is host:port to connect to.
	TCP string
	// HTTP is the http:// URL to GET.
	HTTP string
	// Interval between the starts of two runs; Timeout bounds one run.
	Interval, Timeout time.Duration
	// Rise and Fall are the consecutive passes and failures that change
	// the status.
	Rise, Fall int
	// MinMoveInterval is how long a node must have held the VIP before its
	// failing check may hand it over: the least time between two moves
	// caused by checks.
	MinMoveInterval time.Duration
}

// Defaults and limits of the checks section (docs/defaults.md).
const (
	DefaultCheckInterval        = 2 * time.Second
	DefaultCheckTimeout         = time.Second
	DefaultCheckRise            = 2
	DefaultCheckFall            = 3
	DefaultCheckMinMoveInterval = 60 * time.Second
	// MinCheckInterval and MaxCheckInterval bound interval_ms.
	MinCheckInterval, MaxCheckInterval = 100 * time.Millisecond, 10 * time.Minute
	// MaxCheckCount bounds rise and fall.
	MaxCheckCount = 100
	// MinCheckMoveInterval and MaxCheckMoveInterval bound
	// min_move_interval_s.
	MinCheckMoveInterval, MaxCheckMoveInterval = time.Second, 24 * time.Hour
	// CheckBodyMax is how much of an http check's answer is read.
	CheckBodyMax = 64 << 10
)

// Enabled reports whether the section names a check.
func (c Checks) Enabled() bool { return len(c.Exec) > 0 || c.TCP != "" || c.HTTP != "" }

// Kind names the check's kind: exec, tcp or http ("" when none).
func (c Checks) Kind() string {
	switch {
	case len(c.Exec) > 0:
		return "exec"
	case c.TCP != "":
		return "tcp"
	case c.HTTP != "":
		return "http"
	}
	return ""
}

// withDefaults fills the zero fields of an enabled section.
func (c Checks) withDefaults() Checks {
	if c.Interval == 0 {
		c.Interval = DefaultCheckInterval
	}
	if c.Timeout == 0 {
		c.Timeout = min(DefaultCheckTimeout, c.Interval)
	}
	if c.Rise == 0 {
		c.Rise = DefaultCheckRise
	}
	if c.Fall == 0 {
		c.Fall = DefaultCheckFall
	}
	if c.MinMoveInterval == 0 {
		c.MinMoveInterval = DefaultCheckMinMoveInterval
	}
	return c
}

// MaxResultAge is how old the last result may be and still count: two
// intervals plus one timeout. An older result (a check that stopped
// running) is stale and counts as neither passing nor failing.
func (c Checks) MaxResultAge() time.Duration { return 2*c.Interval + c.Timeout }

// validate checks the section (with its defaults filled) and names the
// field at fault.
func (c Checks) validate() error {
	n := 0
	for _, set := range []bool{len(c.Exec) > 0, c.TCP != "", c.HTTP != ""} {
		if set {
			n++
		}
	}
	if n == 0 {
		if c.Interval != 0 || c.Timeout != 0 || c.Rise != 0 || c.Fall != 0 || c.MinMoveInterval != 0 {
			return errors.New("checks: name one of checks.exec, checks.tcp or checks.http")
		}
		return nil
	}
	if n > 1 {
		return errors.New("checks: checks.exec, checks.tcp and checks.http are exclusive")
	}
	switch {
	case len(c.Exec) > 0:
		if err := validateCommand("checks.exec", c.Exec); err != nil {
			return err
		}
	case c.TCP != "":
		if _, port, err := net.SplitHostPort(c.TCP); err != nil || port == "" || port == "0" {
			return fmt.Errorf("checks.tcp %q: want host:port", c.TCP)
		}
	case c.HTTP != "":
		u, err := url.Parse(c.HTTP)
		if err != nil || u.Scheme != "http" || u.Host == "" || u.User != nil {
			return fmt.Errorf("checks.http %q: want an http:// URL with a host and no user", c.HTTP)
		}
	}
	switch {
	case c.Interval < MinCheckInterval || c.Interval > MaxCheckInterval:
		return fmt.Errorf("checks.interval_ms: %d, want %d to %d", c.Interval.Milliseconds(), MinCheckInterval.Milliseconds(), MaxCheckInterval.Milliseconds())
	case c.Timeout <= 0 || c.Timeout > c.Interval:
		return fmt.Errorf("checks.timeout_ms: %d, want 1 to interval_ms (%d)", c.Timeout.Milliseconds(), c.Interval.Milliseconds())
	case c.Rise < 1 || c.Rise > MaxCheckCount:
		return fmt.Errorf("checks.rise: %d, want 1 to %d", c.Rise, MaxCheckCount)
	case c.Fall < 1 || c.Fall > MaxCheckCount:
		return fmt.Errorf("checks.fall: %d, want 1 to %d", c.Fall, MaxCheckCount)
	case c.MinMoveInterval < MinCheckMoveInterval || c.MinMoveInterval > MaxCheckMoveInterval:
		return fmt.Errorf("checks.min_move_interval_s: %v, want %d to %d", c.MinMoveInterval.Seconds(), int(MinCheckMoveInterval/time.Second), int(MaxCheckMoveInterval/time.Second))
	}
	return nil
}

// CheckStatus is a check's status after rise and fall.
type CheckStatus uint8

// Check statuses.
const (
	CheckUnknown CheckStatus = iota // neither rise passes nor fall failures yet
	CheckPassing
	CheckFailing
)

func (s CheckStatus) String() string {
	switch s {
	case CheckPassing:
		return "passing"
	case CheckFailing:
		return "failing"
	}
	return "unknown"
}

// checkState counts consecutive results; it is pure (the time is given).
type checkState struct {
	rise, fall    int
	status        CheckStatus
	passes, fails int // consecutive
	last          time.Time
	lastErr       string
	runs, failed  uint64
}

// observe records one result at now and reports whether the status
// changed.
func (s *checkState) observe(now time.Time, err error) bool {
	s.runs++
	s.last = now
	if err == nil {
		s.passes, s.fails, s.lastErr = s.passes+1, 0, ""
		if s.status != CheckPassing && s.passes >= s.rise {
			s.status = CheckPassing
			return true
		}
		return false
	}
	s.failed++
	s.passes, s.fails, s.lastErr = 0, s.fails+1, err.Error()
	if s.status != CheckFailing && s.fails >= s.fall {
		s.status = CheckFailing
		return true
	}
	return false
}

// CheckResult is a check's status as of now.
type CheckResult struct {
	Status CheckStatus
	// Age is the time since the last result; -1 when none.
	Age time.Duration
	// Fresh is set when the last result is at most MaxResultAge old.
	Fresh   bool
	LastErr string
	// Runs and Failed count the runs and the failed runs.
	Runs, Failed uint64
}

// Passing reports whether the check passes on a fresh result.
func (r CheckResult) Passing() bool { return r.Fresh && r.Status == CheckPassing }

// Failing reports whether the check fails on a fresh result.
func (r CheckResult) Failing() bool { return r.Fresh && r.Status == CheckFailing }

// checkRunner runs one check every Interval on its clock and keeps its
// rise/fall state. It never touches the controller: the hand-over
// decision reads Result.
type checkRunner struct {
	cfg        Checks
	privileged func() bool // reports whether this process may not run an exec check
	clock      transport.Clock
	probe      func(ctx context.Context) error
	onResult   func() // after every result, outside mu; nil: none

	mu syncx.Mutex
	// +checklocks:mu
	st checkState
}

// newCheckRunner returns a runner for cfg (defaults filled) with the probe
// of its kind; env is the environment of an exec check.
func newCheckRunner(cfg Checks, clock transport.Clock, env []string) *checkRunner {
	cfg = cfg.withDefaults()
	r := &checkRunner{cfg: cfg, clock: transport.Or(clock), privileged: processPrivileged, st: checkState{rise: cfg.Rise, fall: cfg.Fall}}
	switch cfg.Kind() {
	case "exec":
		r.probe = func(ctx context.Context) error { return execProbe(ctx, cfg, env) }
	case "tcp":
		r.probe = func(ctx context.Context) error { return tcpProbe(ctx, cfg) }
	case "http":
		r.probe = httpProbe(cfg)
	}
	return r
}

// Result returns the status as of the clock's now.
func (r *checkRunner) Result() CheckResult {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	res := CheckResult{Status: r.st.status, Age: -1, LastErr: r.st.lastErr, Runs: r.st.runs, Failed: r.st.failed}
	if !r.st.last.IsZero() {
		res.Age = now.Sub(r.st.last)
		res.Fresh = res.Age <= r.cfg.MaxResultAge()
	}
	return res
}

// once runs the probe one time, bounded by Timeout, and records its
// result.
func (r *checkRunner) once(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	err := r.probe(pctx)
	cancel()
	if ctx.Err() != nil {
		return // stopping: not the service's result
	}
	now := r.clock.Now()
	r.mu.Lock()
	r.st.observe(now, err)
	r.mu.Unlock()
	if r.onResult != nil {
		r.onResult()
	}
}

// errPrivilegedCheck refuses to run an exec check in a privileged process.
var errPrivilegedCheck = errors.New("keelvip: exec checks run only in an unprivileged controller (not root, no capability)")

// run runs the check every Interval (from one start to the next) until ctx
// ends. An exec check in a privileged process never runs
// (errPrivilegedCheck): its status stays unknown.
func (r *checkRunner) run(ctx context.Context) error {
	if r.cfg.Kind() == "exec" && r.privileged() {
		return errPrivilegedCheck
	}
	for ctx.Err() == nil {
		start := r.clock.Now()
		r.once(ctx)
		wait := r.cfg.Interval - r.clock.Now().Sub(start)
		if !transport.Sleep(r.clock, max(wait, 0), ctx.Done()) {
			return nil
		}
	}
	return nil
}

// execProbe runs the exec check as a hook runs (its own process group,
// killed at the timeout; env is its whole environment).
func execProbe(ctx context.Context, cfg Checks, env []string) error {
	res, err := runHookCommand(ctx, Hooks{Command: cfg.Exec, Timeout: cfg.Timeout}, env)
	if res.timedOut {
		return fmt.Errorf("exec: killed at its timeout %v", cfg.Timeout)
	}
	if err != nil {
		if len(res.output) > 0 {
			return fmt.Errorf("exec: %w: %.200s", err, res.output)
		}
		return fmt.Errorf("exec: %w", err)
	}
	return nil
}

func tcpProbe(ctx context.Context, cfg Checks) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", cfg.TCP)
	if err != nil {
		return fmt.Errorf("tcp: %w", err)
	}
	return conn.Close()
}

// httpProbe returns the http check's probe: one GET without proxy,
// keep-alive or redirects, CheckBodyMax of the body read.
func httpProbe(cfg Checks) func(ctx context.Context) error {
	hc := &http.Client{
		Transport:     &http.Transport{Proxy: nil, DisableKeepAlives: true, MaxResponseHeaderBytes: 16 << 10},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.HTTP, nil)
		if err != nil {
			return fmt.Errorf("http: %w", err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("http: %w", err)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, CheckBodyMax))
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode > 399 {
			return fmt.Errorf("http: status %d", resp.StatusCode)
		}
		return nil
	}
}

// checkEnv is the whole environment of an exec check.
func checkEnv(mesh, node, vip string) []string {
	return []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"KEEL_VIP=" + vip,
		"KEEL_NODE=" + node,
		"KEEL_MESH=" + mesh,
	}
}
