package tsng

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"html"
	"log/slog"
	"net/http"
	"time"

	"github.com/vipkit/vipkit/internal/jsonx"
	"github.com/vipkit/vipkit/internal/syncx"
)

// The editor's sign-in hand-off. `tsng ui` asks the agent, over the local
// API's socket, for a sign-in code (POST /v1/ui/handoff), writes a page
// that holds it to a file of mode 0600 in a fresh directory of mode 0700,
// and gives the browser that file's path. The page posts the code to the
// editor's /handoff; the editor answers once with a page that keeps the
// session token in the editor origin's session storage and replaces itself
// with the editor. No command line, environment or URL holds the code or
// the token, so the process table shows other local users nothing usable.

const (
	// UIHandoffTTL is how long a sign-in code may be used after `tsng ui`
	// asked for it.
	UIHandoffTTL = 30 * time.Second
	// UIHandoffMaxPending bounds the sign-in codes issued and neither used
	// nor expired; one more is refused until one of them is.
	UIHandoffMaxPending = 8
	// uiHandoffKept bounds the codes remembered, used and expired ones
	// included, so that a replay is told "already used" and not "unknown".
	uiHandoffKept = 64
	// uiHandoffPath is where the sign-in page posts its code.
	uiHandoffPath = "/handoff"
	// uiHandoffMaxBody bounds the sign-in form.
	uiHandoffMaxBody = 4 << 10
	// uiHandoffLogEvery bounds how often refusals are logged, so that a
	// local user posting codes cannot flood the agent's log; the refusals
	// in between are counted and the next log line says how many.
	uiHandoffLogEvery = time.Second
)

// UIHandoff is the local API's answer to POST /v1/ui/handoff: one sign-in
// code and where to use it.
type UIHandoff struct {
	// URL is the editor's address. It carries no secret.
	URL string `json:"url"`
	// Action is where the sign-in page posts the code.
	Action string `json:"action"`
	// ID names the code in GET /v1/ui/handoff/{id}; it is no secret.
	ID string `json:"id"`
	// Code is the secret: it signs one browser in, once, within TTLMillis.
	Code string `json:"code"`
	// TTLMillis is the code's lifetime in milliseconds.
	TTLMillis int64 `json:"ttl_ms"`
}

// Sign-in code states, as GET /v1/ui/handoff/{id} reports them.
const (
	UIHandoffPending = "pending" // issued, not used yet
	UIHandoffUsed    = "used"    // a browser signed in with it
	UIHandoffExpired = "expired" // its TTL passed unused
)

// UIHandoffState is the local API's answer to GET /v1/ui/handoff/{id}.
type UIHandoffState struct {
	// ID names the code.
	ID string `json:"id"`
	// State is UIHandoffPending, UIHandoffUsed or UIHandoffExpired.
	State string `json:"state"`
}

// UIHandoffStats counts sign-in codes since the agent started: issued,
// used, and refused by reason. GET /v1/ui/handoff answers it.
type UIHandoffStats struct {
	// Issued counts codes handed to `tsng ui`.
	Issued uint64 `json:"issued"`
	// SignedIn counts codes that signed a browser in.
	SignedIn uint64 `json:"signed_in"`
	// RefusedPending counts requests for a code refused because
	// UIHandoffMaxPending codes were pending.
	RefusedPending uint64 `json:"refused_pending"`
	// RefusedUnknown counts codes the editor never issued (or forgot).
	RefusedUnknown uint64 `json:"refused_unknown"`
	// RefusedUsed counts replays of a used code.
	RefusedUsed uint64 `json:"refused_used"`
	// RefusedExpired counts codes presented after their TTL.
	RefusedExpired uint64 `json:"refused_expired"`
	// RefusedOrigin counts sign-ins posted from a page other than the
	// hand-off file or the editor itself.
	RefusedOrigin uint64 `json:"refused_origin"`
}

// uiHandoffs holds the editor's sign-in codes. Its zero value is ready.
type uiHandoffs struct {
	// mu guards every field below.
	mu syncx.Mutex
	// codes holds the remembered codes by the SHA-256 of the code, so that
	// looking one up reveals nothing of the code through timing.
	// +checklocks:mu
	codes map[[sha256.Size]byte]*uiHandoffCode
	// byID holds the same codes by id.
	// +checklocks:mu
	byID map[string]*uiHandoffCode
	// order is the remembered codes, oldest first.
	// +checklocks:mu
	order []*uiHandoffCode
	// now is the clock (time.Now when nil).
	// +checklocks:mu
	now func() time.Time
	// +checklocks:mu
	log *slog.Logger
	// lastLog is when a refusal was last logged; unlogged counts those
	// refused since.
	// +checklocks:mu
	lastLog time.Time
	// +checklocks:mu
	unlogged uint64
	// +checklocks:mu
	stats UIHandoffStats
}

// refusedLog returns the logger to log a refusal with and the number of
// refusals not logged before it, or nil when it is too soon to log again.
// +checklocks:h.mu
func (h *uiHandoffs) refusedLog() (*slog.Logger, uint64) {
	now := h.clock()
	if h.log == nil || (!h.lastLog.IsZero() && now.Sub(h.lastLog) < uiHandoffLogEvery) {
		h.unlogged++
		return nil, 0
	}
	n := h.unlogged
	h.lastLog, h.unlogged = now, 0
	return h.log, n
}

type uiHandoffCode struct {
	id      string
	sum     [sha256.Size]byte
	expires time.Time
	used    bool
}

func (c *uiHandoffCode) state(now time.Time) string {
	switch {
	case c.used:
		return UIHandoffUsed
	case !now.Before(c.expires):
		return UIHandoffExpired
	}
	return UIHandoffPending
}

// +checklocks:h.mu
func (h *uiHandoffs) clock() time.Time {
	if h.now != nil {
		return h.now()
	}
	return time.Now()
}

// errHandoff is a refused sign-in: its status and its message.
type errHandoff struct {
	status int
	msg    string
}

func (e *errHandoff) Error() string { return e.msg }

// issue makes a sign-in code valid for UIHandoffTTL.
func (h *uiHandoffs) issue() (id, code string, err error) {
	var idb [8]byte
	var cb [32]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return "", "", err
	}
	if _, err := rand.Read(cb[:]); err != nil {
		return "", "", err
	}
	id, code = hex.EncodeToString(idb[:]), hex.EncodeToString(cb[:])
	h.mu.Lock()
	now := h.clock()
	pending := 0
	for _, c := range h.order {
		if c.state(now) == UIHandoffPending {
			pending++
		}
	}
	if pending >= UIHandoffMaxPending {
		h.stats.RefusedPending++
		log, unlogged := h.refusedLog()
		h.mu.Unlock()
		err := &APIError{Code: CodeLimit, Message: fmt.Sprintf("tsng: %d sign-ins to the editor are pending (the limit; each expires %s after `tsng ui` asked for it): try again shortly", pending, UIHandoffTTL)}
		if log != nil {
			log.Warn("ui: sign-in code refused", "reason", "pending", "pending", pending, "refusals_not_logged", unlogged)
		}
		return "", "", err
	}
	if h.codes == nil {
		h.codes = map[[sha256.Size]byte]*uiHandoffCode{}
		h.byID = map[string]*uiHandoffCode{}
	}
	c := &uiHandoffCode{id: id, sum: sha256.Sum256([]byte(code)), expires: now.Add(UIHandoffTTL)}
	h.codes[c.sum] = c
	h.byID[id] = c
	h.order = append(h.order, c)
	// Forget the oldest used or expired codes beyond the bound; at most
	// UIHandoffMaxPending of the remembered ones are pending.
	for i := 0; len(h.order) > uiHandoffKept && i < len(h.order); {
		if old := h.order[i]; old.state(now) != UIHandoffPending {
			delete(h.codes, old.sum)
			delete(h.byID, old.id)
			h.order = append(h.order[:i], h.order[i+1:]...)
			continue
		}
		i++
	}
	h.stats.Issued++
	h.mu.Unlock()
	return id, code, nil
}

// redeem uses code once. It returns an *errHandoff when the code is
// unknown, already used or expired; each refusal is counted and logged.
func (h *uiHandoffs) redeem(code string) error {
	sum := sha256.Sum256([]byte(code))
	h.mu.Lock()
	c := h.codes[sum]
	var err *errHandoff
	reason := ""
	switch {
	case c == nil:
		h.stats.RefusedUnknown++
		reason = "unknown"
		err = &errHandoff{http.StatusUnauthorized, "tsng ui: this sign-in code is not one the editor issued; run `tsng ui` to open the editor"}
	default:
		switch c.state(h.clock()) {
		case UIHandoffUsed:
			h.stats.RefusedUsed++
			reason = "used"
			err = &errHandoff{http.StatusGone, "tsng ui: this sign-in code was already used (each works once); run `tsng ui` again"}
		case UIHandoffExpired:
			h.stats.RefusedExpired++
			reason = "expired"
			err = &errHandoff{http.StatusGone, fmt.Sprintf("tsng ui: this sign-in code expired (each works for %s); run `tsng ui` again", UIHandoffTTL)}
		default:
			c.used = true
			h.stats.SignedIn++
		}
	}
	if err == nil {
		h.mu.Unlock()
		return nil
	}
	log, unlogged := h.refusedLog()
	h.mu.Unlock()
	if log != nil {
		id := ""
		if c != nil {
			id = c.id
		}
		log.Warn("ui: sign-in refused", "reason", reason, "id", id, "refusals_not_logged", unlogged)
	}
	return err
}

// refuseOrigin counts and logs a sign-in posted from a foreign page.
func (h *uiHandoffs) refuseOrigin(origin string) {
	h.mu.Lock()
	h.stats.RefusedOrigin++
	log, unlogged := h.refusedLog()
	h.mu.Unlock()
	if log != nil {
		log.Warn("ui: sign-in refused", "reason", "origin", "origin", printable(origin), "refusals_not_logged", unlogged)
	}
}

// state reports the state of the code named id.
func (h *uiHandoffs) state(id string) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, ok := h.byID[id]
	if !ok {
		return "", false
	}
	return c.state(h.clock()), true
}

// HandoffStats returns the editor's sign-in counters.
func (u *UIServer) HandoffStats() UIHandoffStats {
	u.ho.mu.Lock()
	defer u.ho.mu.Unlock()
	return u.ho.stats
}

// setClock replaces the sign-in codes' clock (tests).
func (u *UIServer) setClock(now func() time.Time) {
	u.ho.mu.Lock()
	u.ho.now = now
	u.ho.mu.Unlock()
}

// setLogger sets where refused sign-ins are logged.
func (u *UIServer) setLogger(l *slog.Logger) {
	u.ho.mu.Lock()
	u.ho.log = l
	u.ho.mu.Unlock()
}

// Handoff issues a sign-in code for one browser.
func (u *UIServer) Handoff() (UIHandoff, error) {
	id, code, err := u.ho.issue()
	if err != nil {
		return UIHandoff{}, err
	}
	return UIHandoff{URL: u.URL(), Action: "http://" + u.ln.Addr().String() + uiHandoffPath, ID: id, Code: code, TTLMillis: UIHandoffTTL.Milliseconds()}, nil
}

// serveHandoff answers the sign-in page's POST: once per code, within its
// TTL, with a page that stores the session token in this origin's session
// storage (webui/handoff.js) and replaces itself with the editor.
func (u *UIServer) serveHandoff(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "tsng ui: sign in by opening the page that `tsng ui` writes (it posts here)", http.StatusMethodNotAllowed)
		return
	}
	// The hand-off file is a file: page, whose Origin is "null"; the
	// editor itself is same-origin. Any other page is refused before the
	// code is looked at, so that it cannot spend one.
	if o := r.Header.Get("Origin"); o != "" && o != "null" && !u.sameOrigin(o) {
		u.ho.refuseOrigin(o)
		http.Error(w, "tsng ui: a sign-in comes only from the page that `tsng ui` writes (Origin "+o+")", http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, uiHandoffMaxBody)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "tsng ui: bad sign-in form: "+err.Error(), http.StatusBadRequest)
		return
	}
	code := r.PostForm.Get("code")
	if code == "" {
		http.Error(w, "tsng ui: the sign-in form has no code", http.StatusBadRequest)
		return
	}
	if err := u.ho.redeem(code); err != nil {
		var he *errHandoff
		if errors.As(err, &he) {
			http.Error(w, he.msg, he.status)
			return
		}
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprintf(w, `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="tsng-session" content="%s">
<title>tsng — signing in</title>
</head>
<body>
<p>Opening the editor…</p>
<script src="/handoff.js"></script>
</body>
</html>
`, html.EscapeString(u.token))
}

// uiServerOf is implemented by a Manager that serves the editor.
type uiServerOf interface{ uiServer() *UIServer }

func (d *Daemon) uiServer() *UIServer { return d.ui }

// editor returns the Manager's editor, or a not-found error when it has
// none.
func (s *APIServer) editor() (*UIServer, error) {
	if p, ok := s.m.(uiServerOf); ok {
		if u := p.uiServer(); u != nil {
			return u, nil
		}
	}
	return nil, &APIError{Code: CodeNotFound, Message: "tsng: this agent does not serve the editor (config \"ui\": \"off\")"}
}

// uiHandoff answers POST /v1/ui/handoff with a fresh sign-in code.
func (s *APIServer) uiHandoff(w http.ResponseWriter, _ *http.Request) {
	u, err := s.editor()
	if err == nil {
		var h UIHandoff
		if h, err = u.Handoff(); err == nil {
			jsonx.WriteIndent(w, http.StatusCreated, h)
			return
		}
	}
	writeErr(w, err)
}

// uiHandoffState answers GET /v1/ui/handoff/{id}.
func (s *APIServer) uiHandoffState(w http.ResponseWriter, r *http.Request) {
	u, err := s.editor()
	if err != nil {
		writeErr(w, err)
		return
	}
	id := r.PathValue("id")
	st, ok := u.ho.state(id)
	if !ok {
		writeErr(w, &APIError{Code: CodeNotFound, Message: "tsng: the editor knows no sign-in code " + id + " (did the agent restart?)"})
		return
	}
	jsonx.WriteIndent(w, http.StatusOK, UIHandoffState{ID: id, State: st})
}

// uiHandoffStats answers GET /v1/ui/handoff.
func (s *APIServer) uiHandoffStats(w http.ResponseWriter, _ *http.Request) {
	u, err := s.editor()
	if err != nil {
		writeErr(w, err)
		return
	}
	jsonx.WriteIndent(w, http.StatusOK, u.HandoffStats())
}
