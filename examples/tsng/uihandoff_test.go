package tsng

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/vipkit/vipkit/internal/syncx"
)

// uiSignIn is the action that signs the browser in to d's editor the way
// `tsng ui` does (a sign-in page from writeHandoffFile, opened as a file)
// and waits until it shows the editor at frag ("" or "#/...").
func uiSignIn(t *testing.T, d *Daemon, frag string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		h, err := d.ui.Handoff()
		if err != nil {
			return chromedp.Void{}, err
		}
		h.Action += frag // the sign-in lands on "/" + its fragment
		path, remove, err := writeHandoffFile(t.TempDir(), &h)
		if err != nil {
			return chromedp.Void{}, err
		}
		defer remove()
		if _, err := chromedp.Navigate("file://"+path)(ctx, tg); err != nil {
			return chromedp.Void{}, err
		}
		return chromedp.Void{}, waitSignedIn(ctx, tg, d.UIURL()+frag)
	}
}

// waitSignedIn waits (15 s) until the page is at href (or at a fragment
// the editor moved on to from there) with a session token. The page
// navigates meanwhile, which ends a poll: it polls again.
func waitSignedIn(ctx context.Context, tg *chromedp.Target, href string) error {
	cond := fmt.Sprintf(`location.href.startsWith(%q) && location.search === "" && !!sessionStorage.getItem("tsng-token")`, href)
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := chromedp.Poll[bool](cond, chromedp.WithPollingTimeout(time.Until(deadline)))(ctx, tg)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				at, _ := chromedp.Evaluate[string](`location.href`)(ctx, tg)
				return fmt.Errorf("not signed in at %s (the browser is at %s): %w", href, at, err)
			}
			return nil
		}
	}
}

// manualClock is a clock that moves only when told.
type manualClock struct {
	mu syncx.Mutex
	// +checklocks:mu
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestUIHandoffCode: a sign-in code works once, only within its TTL, only
// from the hand-off file or the editor itself; a guessed, replayed or
// expired code is refused with its own error and counted; at most
// UIHandoffMaxPending codes are pending.
func TestUIHandoffCode(t *testing.T) {
	d, f := uiDaemon(t)
	clk := &manualClock{now: time.Unix(1_700_000_000, 0)}
	d.ui.setClock(clk.Now)
	var logs lockedBuffer
	d.ui.setLogger(slog.New(slog.NewTextHandler(&logs, nil)))
	c := NewClient(f.socket)
	ctx := context.Background()
	issue := func() UIHandoff {
		t.Helper()
		var h UIHandoff
		if err := c.Do(ctx, http.MethodPost, "/v1/ui/handoff", nil, &h); err != nil {
			t.Fatal(err)
		}
		if h.URL != d.UIURL() || h.Action != d.UIURL()+"handoff" || len(h.Code) != 64 || h.TTLMillis != UIHandoffTTL.Milliseconds() {
			t.Fatalf("POST /v1/ui/handoff: %+v", h)
		}
		return h
	}
	state := func(h UIHandoff) string {
		t.Helper()
		var st UIHandoffState
		if err := c.Do(ctx, http.MethodGet, "/v1/ui/handoff/"+h.ID, nil, &st); err != nil {
			t.Fatal(err)
		}
		return st.State
	}
	signIn := func(what string, h UIHandoff, code, origin string, want int, wantBody string) {
		t.Helper()
		status, body := postHandoff(t, h.Action, code, origin)
		if status != want || !strings.Contains(body, wantBody) {
			t.Errorf("%s: %d %q, want %d with %q", what, status, body, want, wantBody)
		}
		if want != http.StatusOK && strings.Contains(body, d.ui.token) {
			t.Errorf("%s: a refusal carries the token", what)
		}
	}

	// Used just before its TTL: signed in, with the token in the page.
	a := issue()
	if st := state(a); st != UIHandoffPending {
		t.Fatalf("a fresh code is %q", st)
	}
	clk.Advance(UIHandoffTTL - time.Millisecond)
	signIn("a code within its TTL", a, a.Code, "null", http.StatusOK, `<meta name="tsng-session" content="`+d.ui.token+`">`)
	if st := state(a); st != UIHandoffUsed {
		t.Errorf("a used code is %q", st)
	}
	signIn("the code replayed", a, a.Code, "null", http.StatusGone, "already used")

	// Unused until its TTL: expired.
	b := issue()
	clk.Advance(UIHandoffTTL)
	if st := state(b); st != UIHandoffExpired {
		t.Errorf("a code at its TTL is %q", st)
	}
	signIn("an expired code", b, b.Code, "null", http.StatusGone, "expired")

	// Guessed: unknown. From another page (another loopback port): refused
	// before the code is looked at, so the code still works after.
	g := issue()
	signIn("a guessed code", g, strings.Repeat("ab", 32), "null", http.StatusUnauthorized, "not one the editor issued")
	signIn("a code posted by another port's page", g, g.Code, "http://127.0.0.1:1", http.StatusForbidden, "Origin http://127.0.0.1:1")
	signIn("an empty code", g, "", "", http.StatusBadRequest, "no code")
	if st := state(g); st != UIHandoffPending {
		t.Errorf("after a foreign page posted it, the code is %q", st)
	}
	signIn("the code from the editor's own origin", g, g.Code, strings.TrimSuffix(d.UIURL(), "/"), http.StatusOK, d.ui.token)
	if resp, err := http.Get(g.Action); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /handoff: %d, want 405", resp.StatusCode)
	}

	// At most UIHandoffMaxPending pending; an expired one frees a place.
	for range UIHandoffMaxPending {
		issue()
	}
	var h UIHandoff
	err := c.Do(ctx, http.MethodPost, "/v1/ui/handoff", nil, &h)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != CodeLimit || !strings.Contains(ae.Message, "pending") {
		t.Fatalf("a code beyond %d pending: %v, want a limit error", UIHandoffMaxPending, err)
	}
	clk.Advance(UIHandoffTTL)
	issue()
	if err := c.Do(ctx, http.MethodGet, "/v1/ui/handoff/0000", nil, nil); !errors.As(err, &ae) || ae.Code != CodeNotFound {
		t.Errorf("the state of an unknown id: %v", err)
	}

	var stats UIHandoffStats
	if err := c.Do(ctx, http.MethodGet, "/v1/ui/handoff", nil, &stats); err != nil {
		t.Fatal(err)
	}
	want := UIHandoffStats{Issued: 3 + UIHandoffMaxPending + 1, SignedIn: 2, RefusedPending: 1, RefusedUnknown: 1, RefusedUsed: 1, RefusedExpired: 1, RefusedOrigin: 1}
	if stats != want {
		t.Errorf("stats %+v, want %+v", stats, want)
	}

	// Refusals are logged at most once a second (the replay, then the
	// expired code); the next line counts those in between.
	if n := strings.Count(logs.String(), "sign-in"); n != 2 {
		t.Errorf("%d refusals logged, want 2:\n%s", n, logs.String())
	}
	clk.Advance(uiHandoffLogEvery)
	signIn("a guessed code a second later", g, strings.Repeat("cd", 32), "", http.StatusUnauthorized, "not one the editor issued")
	if l := logs.String(); strings.Count(l, "sign-in") != 3 || !strings.Contains(l, "reason=unknown") || !strings.Contains(l, "refusals_not_logged=3") {
		t.Errorf("the log after a second:\n%s", l)
	}
}

// lockedBuffer is a log destination that goroutines share.
type lockedBuffer struct {
	mu syncx.Mutex
	// +checklocks:mu
	b strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestUIHandoffFile: the sign-in page is a new 0600 file in a fresh 0700
// directory, never a file or link already there, and `tsng ui` removes it
// when its code expires unused, with an error that says so.
func TestUIHandoffFile(t *testing.T) {
	base := t.TempDir()
	h := &UIHandoff{Action: "http://127.0.0.1:1/handoff", Code: "c0de", TTLMillis: 1000}
	p1, rm1, err := writeHandoffFile(base, h)
	if err != nil {
		t.Fatal(err)
	}
	p2, rm2, err := writeHandoffFile(base, h)
	if err != nil {
		t.Fatal(err)
	}
	if p1 == p2 {
		t.Fatalf("two sign-ins share %s", p1)
	}
	rm1()
	rm2()
	// A runtime directory that others may write is not used.
	shared := t.TempDir()
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	getenv := func(dir string) func(string) string {
		return func(k string) string {
			if k == "XDG_RUNTIME_DIR" {
				return dir
			}
			return ""
		}
	}
	if got := handoffBase(getenv(shared)); got != os.TempDir() {
		t.Errorf("a world-writable XDG_RUNTIME_DIR was used: %s", got)
	}
	if got := handoffBase(getenv(base)); got != base {
		t.Errorf("a private XDG_RUNTIME_DIR was not used: %s", got)
	}

	// Nobody opens the page: the code expires, `tsng ui` says so and
	// removes the page.
	d, f := uiDaemon(t)
	clk := &manualClock{now: time.Unix(1_700_000_000, 0)}
	d.ui.setClock(clk.Now)
	var page string
	env := &Env{OpenBrowser: func(p string) error { page = p; clk.Advance(UIHandoffTTL); return nil }}
	code, out, errs := f.run(env, "ui")
	if code != ExitError || !strings.Contains(errs, "no browser opened the sign-in page within 30s") {
		t.Errorf("an unused sign-in: exit %d: %s%s", code, out, errs)
	}
	if _, err := os.Lstat(page); !os.IsNotExist(err) {
		t.Errorf("the unused sign-in page %q is still there (%v)", page, err)
	}
}
