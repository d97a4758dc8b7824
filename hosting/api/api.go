// Package api is the HTTP API of share hosts: an http.Handler that a
// service mounts, over a *hosting.Service.
//
// Resources, for each share kind (tcp, ipsec, http), under an account:
//
//	POST   /accounts/{account}/{kind}-shares        create              201, Location
//	GET    /accounts/{account}/{kind}-shares        list (filters, sort) 200
//	GET    /accounts/{account}/{kind}-shares/{id}   single read + hosting 200
//	PUT    /accounts/{account}/{kind}-shares/{id}   replace             200
//	PATCH  /accounts/{account}/{kind}-shares/{id}   merge               200
//	DELETE /accounts/{account}/{kind}-shares/{id}   delete              204
//
// With Options.Reconciler, the reconciler's dry run, for a request whose
// scope is every account (any other answers 404):
//
//	GET    /reconciler/drift                         dry run: drift listed, nothing repaired 200
//
// A POST, PUT or PATCH with the header "nf-validate: true" is the dry run:
// it validates the share the request would make, with the same rules and
// messages, writes nothing, and answers 204 or 422.
//
// Bodies are JSON. A create carries name, targetAddress, targetPort,
// activeAgentIds and passiveAgentIds (an omitted list is empty) and may
// carry an id (a UUID). A PUT replaces every field: one it omits is empty
// and judged by the validator; so a PUT without activeAgentIds reports
// the first rule. A PATCH changes what it carries: a list replaces that
// list, an absent list leaves it, and null on passiveAgentIds clears it.
// Unknown fields are refused.
//
// Answers are HAL+JSON (application/hal+json): every share carries
// _links.self and one _links.agents link per host, in both roles (the role
// is in the body: activeAgentIds, passiveAgentIds). A single read carries
// the hosting block when the controller answered; a listing never does.
// Listings take agentId (a host in either role), activeAgentId and
// passiveAgentId filters, sort=field,-field over id, name,
// targetAddress, targetPort, createdAt and updatedAt (the host sets are
// not sortable), and limit (1 to 1000, default 100) and offset, with a
// next link while more remain.
//
// A request acts on the accounts of its Scope (WithScope; Bearer sets the
// token's). Out of scope, an account answers as one that holds nothing: a
// share of it answers the 404 of a missing share, its listing is empty,
// and a create is refused as for an account that does not exist. A
// request without a scope acts on every account.
//
// Errors are problem+json (RFC 9457): 400 for a body or query that cannot
// be read, 401 without valid credentials (Bearer), 404 for a share that is
// not there (or not in the path's account or kind, or of an account out of
// scope), 405, 409 for a
// conflict with the state (an id in use, a passive's agent without a Ziti
// identity, a share whose ingress is still up), 413 for a body over the
// limit, 415 for a body that is not JSON, 422 with the validator's pinned
// messages in "violations", 502 when the Ziti controller failed.
package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/internal/jsonx"
	"github.com/vipkit/vipkit/transport"
)

// DefaultMaxBodyBytes is the default limit of a request body.
const DefaultMaxBodyBytes = 64 << 10

// Media types.
const (
	MediaHAL     = "application/hal+json"
	MediaProblem = "application/problem+json"
)

// ValidateHeader is the dry-run header: "nf-validate: true".
const ValidateHeader = "nf-validate"

// Problem types, relative to the API's root.
const (
	TypeValidation  = "/problems/validation-failed"
	TypeBadRequest  = "/problems/bad-request"
	TypeNotFound    = "/problems/not-found"
	TypeConflict    = "/problems/conflict"
	TypeTooLarge    = "/problems/body-too-large"
	TypeMediaType   = "/problems/unsupported-media-type"
	TypeMethod      = "/problems/method-not-allowed"
	TypeUnauth      = "/problems/unauthorized"
	TypeUpstream    = "/problems/ziti-controller-failed"
	TypeInternal    = "/problems/internal-error"
	TypeUnavailable = "/problems/unavailable"
)

// Problem is a problem+json body.
type Problem struct {
	Type       string              `json:"type"`
	Title      string              `json:"title"`
	Status     int                 `json:"status"`
	Detail     string              `json:"detail,omitempty"`
	Instance   string              `json:"instance,omitempty"`
	Violations []hosting.Violation `json:"violations,omitempty"`
}

// Options configure the handler.
type Options struct {
	// Service is the share-host service (required).
	Service *hosting.Service
	// BasePath is the path the handler is mounted at ("" for the root);
	// links carry it.
	BasePath string
	// MaxBodyBytes limits a request body; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// AgentHref is the href of an agent's link; nil means
	// BasePath + "/accounts/{account}/agents/{agent}".
	AgentHref func(account, agent string) string
	// Reconciler, when set, serves GET /reconciler/drift: a dry run of
	// one pass (hosting.Report as JSON).
	Reconciler *hosting.Reconciler
	// Observe, when set, is told of every request answered: its route
	// (the pattern it matched, such as "GET /accounts/{account}/{kind}/{id}",
	// or "/" for no resource), status code and latency, for metrics. It
	// must not block.
	Observe func(route string, code int, d time.Duration)
	// Clock times the requests for Observe; nil means the real clock.
	Clock transport.Clock
}

// Handler serves the API. It is safe for concurrent use.
type Handler struct {
	svc   *hosting.Service
	base  string
	max   int64
	agent func(account, agent string) string
	mux   *http.ServeMux
	obs   func(route string, code int, d time.Duration)
	clk   transport.Clock
}

// New returns the API handler.
func New(o Options) (*Handler, error) {
	if o.Service == nil {
		return nil, fmt.Errorf("%w: no service", ErrInvalidOptions)
	}
	h := &Handler{svc: o.Service, base: strings.TrimSuffix(o.BasePath, "/"), max: o.MaxBodyBytes, agent: o.AgentHref, mux: http.NewServeMux(), obs: o.Observe, clk: transport.Or(o.Clock)}
	if h.max <= 0 {
		h.max = DefaultMaxBodyBytes
	}
	if h.agent == nil {
		h.agent = func(account, agent string) string {
			return h.base + "/accounts/" + pathEscape(account) + "/agents/" + pathEscape(agent)
		}
	}
	h.handle("POST /accounts/{account}/{kind}", h.create)
	h.handle("GET /accounts/{account}/{kind}", h.list)
	h.handle("/accounts/{account}/{kind}", h.notAllowed("GET, POST"))
	h.handle("GET /accounts/{account}/{kind}/{id}", h.get)
	h.handle("PUT /accounts/{account}/{kind}/{id}", h.update(hosting.Put))
	h.handle("PATCH /accounts/{account}/{kind}/{id}", h.update(hosting.Patch))
	h.handle("DELETE /accounts/{account}/{kind}/{id}", h.delete)
	h.handle("/accounts/{account}/{kind}/{id}", h.notAllowed("GET, PUT, PATCH, DELETE"))
	if o.Reconciler != nil {
		h.handle("GET /reconciler/drift", h.drift(o.Reconciler))
		h.handle("/reconciler/drift", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", "GET")
			writeProblem(w, r, Problem{Type: TypeMethod, Title: "Method not allowed", Status: http.StatusMethodNotAllowed, Detail: r.Method + " is not allowed here; allowed: GET"})
		})
	}
	h.handle("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, Problem{Type: TypeNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: "no resource at " + r.URL.Path})
	})
	return h, nil
}

// handle registers fn at pattern, observed under that route.
func (h *Handler) handle(pattern string, fn http.HandlerFunc) {
	if h.obs == nil {
		h.mux.HandleFunc(pattern, fn)
		return
	}
	h.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := h.clk.Now()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		fn(sw, r)
		h.obs(pattern, sw.code, h.clk.Now().Sub(start))
	})
}

// statusWriter remembers the status code written.
type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.base != "" {
		rest, ok := strings.CutPrefix(r.URL.Path, h.base)
		if !ok || rest != "" && rest[0] != '/' {
			writeProblem(w, r, Problem{Type: TypeNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: "no resource at " + r.URL.Path})
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path, r2.URL.RawPath = rest, ""
		r = r2
	}
	h.mux.ServeHTTP(w, r)
}

func (h *Handler) notAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, ok := kindOf(r.PathValue("kind")); !ok {
			writeProblem(w, r, Problem{Type: TypeNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: "no resource at " + r.URL.Path})
			return
		}
		w.Header().Set("Allow", allow)
		writeProblem(w, r, Problem{Type: TypeMethod, Title: "Method not allowed", Status: http.StatusMethodNotAllowed, Detail: r.Method + " is not allowed here; allowed: " + allow})
	}
}

// Path segments of the share collections.
var kinds = map[string]hosting.Kind{"tcp-shares": hosting.KindTCP, "ipsec-shares": hosting.KindIPsec, "http-shares": hosting.KindHTTP}

func kindOf(seg string) (hosting.Kind, bool) {
	k, ok := kinds[seg]
	return k, ok
}

func collection(k hosting.Kind) string { return string(k) + "-shares" }

func pathEscape(s string) string {
	return strings.NewReplacer("%", "%25", "/", "%2F", "?", "%3F", "#", "%23", " ", "%20").Replace(s)
}

// shareBody is a request body. Pointers tell absent from present.
type shareBody struct {
	ID            *string      `json:"id,omitempty"`
	Name          *string      `json:"name,omitempty"`
	TargetAddress *string      `json:"targetAddress,omitempty"`
	TargetPort    *json.Number `json:"targetPort,omitempty"`
	Active        hosting.List `json:"activeAgentIds,omitzero"`
	Passive       hosting.List `json:"passiveAgentIds,omitzero"`
}

// Request is a decoded create, PUT or PATCH body.
type Request struct {
	ID     string         // create only; "" makes one
	Update hosting.Update // the fields and lists, with their method
	// PortViolation is set when targetPort is absent from a PUT or a number
	// outside 1..65535 (decoded as 0): a validation failure, reported with
	// the validator's message.
	PortViolation bool
}

var (
	// ErrDecode means a request body cannot be read as a share request.
	ErrDecode = errors.New("api: bad request body")
	// ErrInvalidOptions is returned by New for options it cannot use (no
	// Service).
	ErrInvalidOptions = errors.New("api: invalid options")
)

// DecodeRequest decodes a request body for method m (create decodes as
// Put plus an id). It refuses unknown fields, trailing data, a targetPort
// that is not an integer and bad agent ids, with ErrDecode; it never
// panics.
func DecodeRequest(b []byte, m hosting.Method, create bool) (Request, error) {
	var sb shareBody
	if err := jsonx.Decode(b, &sb, jsonx.UseNumber); err != nil {
		return Request{}, fmt.Errorf("%w: %v", ErrDecode, err)
	}
	if sb.ID != nil && !create {
		return Request{}, fmt.Errorf("%w: json: unknown field \"id\"", ErrDecode)
	}
	req := Request{Update: hosting.Update{Method: m, Name: sb.Name, TargetAddress: sb.TargetAddress, Active: sb.Active, Passive: sb.Passive}}
	if sb.ID != nil {
		req.ID = *sb.ID
	}
	if sb.TargetPort != nil {
		n, err := sb.TargetPort.Int64()
		if err != nil {
			f, ferr := sb.TargetPort.Float64()
			if ferr != nil || f != math.Trunc(f) {
				return Request{}, fmt.Errorf("%w: targetPort must be an integer, got %s", ErrDecode, sb.TargetPort.String())
			}
			n = math.MaxInt64 // an integer too large for int64: out of range
		}
		if n < 1 || n > 65535 {
			n = 0
		}
		p := uint16(n)
		req.Update.TargetPort = &p
	}
	if m == hosting.Put { // a PUT replaces every field: absent is empty
		empty, zero := "", uint16(0)
		if req.Update.Name == nil {
			req.Update.Name = &empty
		}
		if req.Update.TargetAddress == nil {
			req.Update.TargetAddress = &empty
		}
		if req.Update.TargetPort == nil {
			req.Update.TargetPort = &zero
		}
	}
	req.PortViolation = req.Update.TargetPort != nil && *req.Update.TargetPort == 0
	return req, nil
}

// readBody reads a JSON body within the limit.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if ct == "" || err != nil || mt != "application/json" && mt != "application/merge-patch+json" && !strings.HasSuffix(mt, "+json") {
		writeProblem(w, r, Problem{Type: TypeMediaType, Title: "Unsupported media type", Status: http.StatusUnsupportedMediaType, Detail: "the body must be application/json"})
		return nil, false
	}
	b, err := jsonx.ReadBody(w, r, h.max)
	if errors.Is(err, jsonx.ErrTooLarge) {
		writeProblem(w, r, Problem{Type: TypeTooLarge, Title: "Body too large", Status: http.StatusRequestEntityTooLarge, Detail: fmt.Sprintf("the body is over %d bytes", h.max)})
		return nil, false
	}
	if err != nil {
		writeProblem(w, r, Problem{Type: TypeBadRequest, Title: "Bad request", Status: http.StatusBadRequest, Detail: "the body could not be read"})
		return nil, false
	}
	return b, true
}

func dryRun(r *http.Request) bool { return strings.EqualFold(r.Header.Get(ValidateHeader), "true") }

// pathKind returns the path's kind, answering 404 for an unknown one.
func pathKind(w http.ResponseWriter, r *http.Request) (hosting.Kind, bool) {
	k, ok := kindOf(r.PathValue("kind"))
	if !ok {
		writeProblem(w, r, Problem{Type: TypeNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: "no resource at " + r.URL.Path})
	}
	return k, ok
}

func portViolation(req Request, err error) error {
	if !req.PortViolation {
		return err
	}
	v := hosting.Violation{Field: "targetPort", Message: hosting.MsgPort}
	var ve *hosting.ValidationError
	if errors.As(err, &ve) {
		if !slices.Contains(ve.Violations, v) {
			ve.Violations = append(ve.Violations, v)
		}
		return ve
	}
	if err == nil {
		return &hosting.ValidationError{Violations: []hosting.Violation{v}}
	}
	return err
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request) {
	kind, ok := pathKind(w, r)
	if !ok {
		return
	}
	body, ok := h.readBody(w, r)
	if !ok {
		return
	}
	req, err := DecodeRequest(body, hosting.Put, true)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if req.ID != "" && !hosting.ValidUUID(req.ID) {
		h.fail(w, r, &hosting.ValidationError{Violations: []hosting.Violation{{Field: "id", Message: MsgID}}})
		return
	}
	s := hosting.Share{ID: req.ID, AccountID: r.PathValue("account"), Kind: kind}
	if p := req.Update.Name; p != nil {
		s.Name = *p
	}
	if p := req.Update.TargetAddress; p != nil {
		s.TargetAddress = *p
	}
	if p := req.Update.TargetPort; p != nil {
		s.TargetPort = *p
	}
	u := hosting.Update{Active: req.Update.Active, Passive: req.Update.Passive}
	if !allows(r, s.AccountID) {
		h.createOutOfScope(w, r, req, s, u)
		return
	}
	if dryRun(r) {
		if err := portViolation(req, h.svc.DryRunCreate(r.Context(), s, u)); err != nil {
			h.fail(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if req.PortViolation {
		h.fail(w, r, portViolation(req, h.svc.DryRunCreate(r.Context(), s, u)))
		return
	}
	out, err := h.svc.Create(r.Context(), s, u)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	v := h.view(hosting.View{Share: out, ActiveAgentIDs: out.Hosts.Active, PassiveAgentIDs: out.Hosts.Passive})
	w.Header().Set("Location", v.Links.Self.Href)
	writeJSON(w, http.StatusCreated, v)
}

// createOutOfScope answers a create (or its dry run) for an account out
// of the request's scope exactly as for an account that does not exist:
// the service validates the share under an account that none of its
// agents is in, so every rule, message and limit is the service's own.
// Such a create always fails validation (at least one active host is
// required, and none is in that account); it writes nothing.
func (h *Handler) createOutOfScope(w http.ResponseWriter, r *http.Request, req Request, s hosting.Share, u hosting.Update) {
	ids := append(slices.Clone(u.Active.IDs), u.Passive.IDs...)
	found, err := h.svc.Store().Agents(r.Context(), ids)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	s.AccountID = noAgentsAccount(s.AccountID, found)
	err = portViolation(req, h.svc.DryRunCreate(r.Context(), s, u))
	if err == nil { // cannot happen (see above); refuse all the same
		err = &hosting.ValidationError{Violations: []hosting.Violation{{Field: "activeAgentIds", Message: hosting.MsgNoActive}}}
	}
	h.fail(w, r, err)
}

// noAgentsAccount returns an account id that none of the found agents is
// in: base, extended with NUL bytes until it differs from all of them.
// It ends after at most len(found)+1 tries.
func noAgentsAccount(base string, found map[string]hosting.Agent) string {
	in := make(map[string]bool, len(found))
	for _, a := range found {
		in[a.AccountID] = true
	}
	acc := base + "\x00"
	for in[acc] {
		acc += "\x00"
	}
	return acc
}

// MsgID is the message of a create whose id is not a UUID.
const MsgID = "id must be a lowercase UUID"

// owned reads share id and checks that it is in the path's account and
// kind (account and kind never change, so the unlocked read decides). A
// single read (withHosting) asks the controller for the hosting block; a
// write only checks the path.
func (h *Handler) owned(w http.ResponseWriter, r *http.Request, kind hosting.Kind, withHosting bool) (hosting.View, bool) {
	id := r.PathValue("id")
	var v hosting.View
	var err error
	if withHosting {
		v, err = h.svc.Get(r.Context(), id)
	} else {
		v.Share, err = h.svc.Store().Get(r.Context(), id)
	}
	if err == nil && (v.AccountID != r.PathValue("account") || v.Kind != kind || !v.Live() || !allows(r, v.AccountID)) {
		err = fmt.Errorf("%w: %s", hosting.ErrNotFound, id)
	}
	if err != nil {
		h.fail(w, r, err)
		return hosting.View{}, false
	}
	return v, true
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) {
	kind, ok := pathKind(w, r)
	if !ok {
		return
	}
	v, ok := h.owned(w, r, kind, true)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, h.view(v))
}

func (h *Handler) update(m hosting.Method) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		kind, ok := pathKind(w, r)
		if !ok {
			return
		}
		body, ok := h.readBody(w, r)
		if !ok {
			return
		}
		req, err := DecodeRequest(body, m, false)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		if _, ok := h.owned(w, r, kind, false); !ok {
			return
		}
		id := r.PathValue("id")
		if dryRun(r) || req.PortViolation {
			if err := portViolation(req, h.svc.DryRun(r.Context(), id, req.Update)); err != nil {
				h.fail(w, r, err)
				return
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		out, err := h.svc.Update(r.Context(), id, req.Update)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, h.view(hosting.View{Share: out, ActiveAgentIDs: out.Hosts.Active, PassiveAgentIDs: out.Hosts.Passive}))
	}
}

func (h *Handler) delete(w http.ResponseWriter, r *http.Request) {
	kind, ok := pathKind(w, r)
	if !ok {
		return
	}
	if _, ok := h.owned(w, r, kind, false); !ok {
		return
	}
	if err := h.svc.Delete(r.Context(), r.PathValue("id")); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// drift answers the reconciler's dry run.
func (h *Handler) drift(rec *hosting.Reconciler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s, ok := ScopeOf(r.Context()); ok && !s.All() {
			writeProblem(w, r, Problem{Type: TypeNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: "no resource at " + r.URL.Path})
			return
		}
		rep, err := rec.Pass(r.Context(), true)
		if err != nil && len(rep.Errors) == 0 {
			h.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, rep)
	}
}

// fail answers err as a problem.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	var ve *hosting.ValidationError
	p := Problem{Type: TypeInternal, Title: "Internal error", Status: http.StatusInternalServerError, Detail: "the request failed; it can be retried"}
	switch {
	case errors.As(err, &ve):
		msgs := make([]string, 0, len(ve.Violations))
		for _, v := range ve.Violations {
			msgs = append(msgs, v.Field+": "+v.Message)
		}
		p = Problem{Type: TypeValidation, Title: "Validation failed", Status: http.StatusUnprocessableEntity, Detail: strings.Join(msgs, "; "), Violations: ve.Violations}
	case errors.Is(err, ErrDecode), errors.Is(err, hosting.ErrBadUpdate), errors.Is(err, errQuery):
		p = Problem{Type: TypeBadRequest, Title: "Bad request", Status: http.StatusBadRequest, Detail: err.Error()}
	case errors.Is(err, hosting.ErrNotFound):
		p = Problem{Type: TypeNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: "share " + r.PathValue("id") + " does not exist"}
	case errors.Is(err, hosting.ErrExists):
		p = Problem{Type: TypeConflict, Title: "Conflict", Status: http.StatusConflict, Detail: "a share with this id exists"}
	case errors.Is(err, hosting.ErrNoIdentity):
		p = Problem{Type: TypeConflict, Title: "Conflict", Status: http.StatusConflict, Detail: "a passive's agent has no Ziti identity yet; retry once it is enrolled"}
	case errors.Is(err, hosting.ErrIngressUp):
		p = Problem{Type: TypeConflict, Title: "Conflict", Status: http.StatusConflict, Detail: "the share's ingress is still up; retry"}
	case isZiti(err):
		p = Problem{Type: TypeUpstream, Title: "Ziti controller failed", Status: http.StatusBadGateway, Detail: "the Ziti controller failed; nothing was changed"}
	case errors.Is(err, hosting.ErrClosed), errors.Is(err, r.Context().Err()) && r.Context().Err() != nil:
		p = Problem{Type: TypeUnavailable, Title: "Unavailable", Status: http.StatusServiceUnavailable, Detail: "the service is shutting down or the request was cancelled"}
	}
	writeProblem(w, r, p)
}

func isZiti(err error) bool {
	for _, e := range []error{ziti.ErrNotFound, ziti.ErrInvalid, ziti.ErrUnauthorized, ziti.ErrConflict, ziti.ErrConfigInUse, ziti.ErrServer, ziti.ErrProtocol, hosting.ErrZitiState} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ae *ziti.APIError
	return errors.As(err, &ae)
}

func writeProblem(w http.ResponseWriter, r *http.Request, p Problem) {
	if p.Instance == "" {
		p.Instance = r.URL.Path
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	jsonx.WriteAs(w, p.Status, MediaProblem, p)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	jsonx.WriteAs(w, status, MediaHAL, v)
}
