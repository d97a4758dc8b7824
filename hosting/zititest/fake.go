// Package zititest serves a fake OpenZiti controller for tests: the parts
// of the Edge Management API that package hosting uses, over real HTTP,
// enforcing the controller's documented behaviour.
//
// Every request is first checked against management.yml (loaded once per
// process with kin-openapi: openapi2 → openapi2conv.ToV3 → gorillamux
// router → openapi3filter.ValidateRequest, routed on the path after the
// basePath /edge/management/v1): an unknown path or method, a bad
// parameter, a body that breaks its schema or a missing zt-session is
// refused with the specification's error envelope, as the controller would.
//
// Config data is validated against its config type's JSON Schema (host.v1's
// from host.v1.schema.json, next to management.yml) on create and on patch,
// with santhosh-tekuri/jsonschema: a body that breaks it is refused with
// 400 COULD_NOT_VALIDATE and changes nothing.
//
// Then the fake applies the controller's rules for identities' service-config
// overrides:
//
//   - one override per (service, config type): a second one replaces the first;
//   - a remove works by type, but the config it names must exist;
//   - deleting a config that an override names answers 500 UNHANDLED "config
//     is in use by identity" and keeps the override;
//   - deleting a service removes its overrides;
//   - the override list has no paging and leaves out entries whose service or
//     config is gone;
//   - an empty assign or remove list is refused;
//   - both writes are idempotent.
//
// The fake is also a model of the data plane that routes. Terminators come
// from simulated hosting agents (StartAgent): an identity named on a Bind
// policy binds each service with the host.v1 it sees (its override, else
// the service's own) at that config's precedence, rebinds when that config
// changes, and runs the config's portChecks as real TCP connects, dropping
// its terminator to failed after the configured failures and back to its
// baseline on the first pass. Route and Dial send a new circuit to the
// highest band that holds a terminator (required > default > failed).
// Tests that need a terminator without an agent add it with AddTerminator.
//
// Usage:
//
//	f, err := zititest.Start(zititest.Options{})
//	defer f.Close()
//	c, _ := ziti.New(f.URL(), ziti.Options{Session: f.Session()})
package zititest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/internal/jsonx"
	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// Options configure a Fake.
type Options struct {
	// Session is a zt-session token the fake always accepts; "" means a
	// fixed test token. Sessions made by authenticate are accepted too,
	// until they expire.
	Session string
	// SessionTTL is the lifetime of a session made by authenticate; 0
	// means 30 minutes.
	SessionTTL time.Duration
	// Clock tells the sessions' age; nil means the real clock.
	Clock transport.Clock
	// TLS serves HTTPS and asks for a client certificate, for the cert
	// authentication method.
	TLS bool
}

// Call is one request the fake accepted (it passed the specification).
type Call struct {
	Method      string
	OperationID string
	Path        string // after the basePath
	Body        string
	Status      int
}

// Fake is a fake controller. Its methods are safe for concurrent use.
type Fake struct {
	srv     *httptest.Server
	spec    *Spec
	session string
	ttl     time.Duration
	clk     transport.Clock

	// mu guards every field below. The fields before termAgent carry no
	// checklocks annotation: the handlers hand closures that read them to
	// list, detail and the other helpers, which run them with mu held,
	// and the analyzer cannot follow a lock into a closure passed as a
	// value.
	mu        syncx.Mutex
	seq       int
	ctypes    map[string]ziti.ConfigType
	schemas   map[string]*ConfigSchema // config type id → its JSON Schema
	configs   map[string]ziti.Config
	services  map[string]ziti.Service
	policies  map[string]ziti.ServicePolicy
	idents    map[string]ziti.Identity
	overrides map[string]map[[2]string]string // identity → (service, config type) → config
	terms     map[string]ziti.Terminator
	changed   chan struct{} // closed at every change, for the agents
	rr        int           // round robin of Route

	// termAgent maps a terminator to the agent that bound it.
	// +checklocks:mu
	termAgent map[string]*HostAgent
	// +checklocks:mu
	agents map[*HostAgent]bool
	// sessions maps a token to its expiry.
	// +checklocks:mu
	sessions map[string]time.Time
	// users maps a username to its updb authenticator.
	// +checklocks:mu
	users map[string]user
	// certs maps a client certificate SHA-256 to its identity.
	// +checklocks:mu
	certs map[[32]byte]string
	// +checklocks:mu
	logins int
	// +checklocks:mu
	calls []Call
	// fail maps an operationId to the statuses to answer next.
	// +checklocks:mu
	fail map[string][]int
	// +checklocks:mu
	badAnswers []error
}

// Start loads the specification (once per process) and starts a fake on a
// loopback port. It fails with ErrNoSpec when management.yml is absent.
func Start(o Options) (*Fake, error) {
	s, err := LoadSpec()
	if err != nil {
		return nil, err
	}
	hs, err := LoadHostSchema()
	if err != nil {
		return nil, err
	}
	f := &Fake{
		spec: s, session: o.Session, schemas: map[string]*ConfigSchema{},
		ctypes: map[string]ziti.ConfigType{}, configs: map[string]ziti.Config{},
		services: map[string]ziti.Service{}, policies: map[string]ziti.ServicePolicy{},
		idents: map[string]ziti.Identity{}, overrides: map[string]map[[2]string]string{},
		terms: map[string]ziti.Terminator{}, fail: map[string][]int{},
		termAgent: map[string]*HostAgent{}, agents: map[*HostAgent]bool{}, changed: make(chan struct{}),
		sessions: map[string]time.Time{}, users: map[string]user{}, certs: map[[32]byte]string{},
		ttl: o.SessionTTL, clk: transport.Or(o.Clock),
	}
	if f.ttl <= 0 {
		f.ttl = 30 * time.Minute
	}
	if f.session == "" {
		f.session = "zititest-session"
	}
	for _, n := range []string{"host.v1", "intercept.v1", "ziti-tunneler-server.v1"} {
		id := f.newID("ct")
		f.ctypes[id] = ziti.ConfigType{ID: id, Name: n}
		if n == "host.v1" {
			f.schemas[id] = hs
		}
	}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	if o.TLS {
		f.srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
		f.srv.StartTLS()
	} else {
		f.srv.Start()
	}
	// The client keeps an idle connection for every request it may have
	// in flight (a hosting service sends several at once), as a
	// deployment's client does (ziti.MaxIdleConnsPerHost).
	if tr, ok := f.srv.Client().Transport.(*http.Transport); ok {
		tr.MaxIdleConnsPerHost = ziti.MaxIdleConnsPerHost
	}
	return f, nil
}

// URL is the controller's address (without the basePath).
func (f *Fake) URL() string { return f.srv.URL }

// Session is the token to send as zt-session.
func (f *Fake) Session() string { return f.session }

// Close stops the server and waits for its requests, and stops every
// simulated agent.
func (f *Fake) Close() {
	f.srv.Close()
	f.mu.Lock()
	agents := slices.Collect(maps.Keys(f.agents))
	f.mu.Unlock()
	for _, a := range agents {
		a.Stop()
	}
}

// Client returns a ziti.Client for the fake.
func (f *Fake) Client() *ziti.Client {
	c, err := ziti.New(f.URL(), ziti.Options{Session: f.session, HTTPClient: f.srv.Client()})
	if err != nil {
		panic(err) // the fake's own URL always parses
	}
	return c
}

func (f *Fake) newID(prefix string) string {
	f.seq++
	return fmt.Sprintf("%s-%06d", prefix, f.seq)
}

// AddIdentity creates an identity for an agent (tagged agent-id, with the
// role attribute "agent | <agent>") and returns its id.
func (f *Fake) AddIdentity(agent string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.newID("ident")
	f.idents[id] = ziti.Identity{ID: id, Name: "agent " + agent, RoleAttributes: []string{"agent | " + agent}, Tags: ziti.Tags{"agent-id": agent}}
	f.changedLocked()
	return id
}

// changedLocked wakes the agents; f.mu is held.
func (f *Fake) changedLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// DeleteIdentity deletes an identity and every override on it, as the
// controller does when an agent is deleted.
func (f *Fake) DeleteIdentity(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.idents, id)
	delete(f.overrides, id)
	f.changedLocked()
}

// AddTerminator adds a terminator of a service bound by the identity hostID
// at precedence, and returns its id.
func (f *Fake) AddTerminator(serviceID, hostID, precedence string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.newID("term")
	f.terms[id] = ziti.Terminator{ID: id, ServiceID: serviceID, HostID: hostID, Identity: hostID, Precedence: precedence, RouterID: "router-1", Binding: "edge", Address: "hosted:" + id}
	return id
}

// RemoveTerminator removes a terminator that AddTerminator added (a host
// that stopped, for a test of the hosting state).
func (f *Fake) RemoveTerminator(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.terms, id)
}

// FailNext makes the next calls of operationID answer the statuses, in
// order, with an error envelope (for fault injection); a 0 lets that call
// through.
func (f *Fake) FailNext(operationID string, statuses ...int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[operationID] = append(f.fail[operationID], statuses...)
}

// Calls returns the requests that passed the specification, and those
// refused 401 for their session, in order.
func (f *Fake) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// ResetCalls forgets the recorded calls.
func (f *Fake) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

// State is a copy of the fake's objects.
type State struct {
	Configs   map[string]ziti.Config
	Services  map[string]ziti.Service
	Policies  map[string]ziti.ServicePolicy
	Identity  map[string]ziti.Identity
	Overrides map[string][]ziti.ServiceConfig // identity → live overrides, sorted
	ConfigTyp map[string]ziti.ConfigType
}

// Snapshot returns a copy of the objects.
func (f *Fake) Snapshot() State {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := State{Configs: maps.Clone(f.configs), Services: maps.Clone(f.services), Policies: maps.Clone(f.policies), Identity: maps.Clone(f.idents), Overrides: map[string][]ziti.ServiceConfig{}, ConfigTyp: maps.Clone(f.ctypes)}
	for id := range f.overrides {
		if l := f.liveOverrides(id); len(l) > 0 {
			st.Overrides[id] = l
		}
	}
	return st
}

func (f *Fake) liveOverrides(ident string) []ziti.ServiceConfig {
	out := []ziti.ServiceConfig{}
	for k, cfg := range f.overrides[ident] {
		if _, ok := f.services[k[0]]; !ok {
			continue
		}
		if _, ok := f.configs[cfg]; !ok {
			continue
		}
		out = append(out, ziti.ServiceConfig{ServiceID: k[0], ConfigID: cfg})
	}
	slices.SortFunc(out, func(a, b ziti.ServiceConfig) int {
		return strings.Compare(a.ServiceID+"\x00"+a.ConfigID, b.ServiceID+"\x00"+b.ConfigID)
	})
	return out
}

// apiError is the error object of the envelope.
type apiError struct {
	Args struct {
		URLVars map[string]string `json:"urlVars"`
	} `json:"args"`
	CauseMessage string `json:"causeMessage"`
	Code         string `json:"code"`
	Message      string `json:"message"`
	RequestID    string `json:"requestId"`
}

var metaBody = map[string]any{"apiVersion": "0.29.0", "apiEnrollmentVersion": "0.0.1"}

func (f *Fake) writeError(w http.ResponseWriter, status int, code, msg, cause string, vars map[string]string) {
	e := apiError{Code: code, Message: msg, CauseMessage: cause}
	e.Args.URLVars = vars
	if e.Args.URLVars == nil {
		e.Args.URLVars = map[string]string{}
	}
	f.mu.Lock()
	e.RequestID = f.newID("req")
	f.mu.Unlock()
	jsonx.Write(w, status, map[string]any{"error": e, "meta": metaBody})
}

// Error codes and messages of the controller's envelope.
const (
	codeNotFound   = "NOT_FOUND"
	msgNotFound    = "The resource requested was not found or is no longer available"
	codeInvalid    = "COULD_NOT_VALIDATE"
	msgInvalid     = "The supplied request contains an invalid document"
	codeUnauth     = "UNAUTHORIZED"
	msgUnauth      = "The request could not be completed. The session is not authorized or the credentials are invalid"
	codeUnhandled  = "UNHANDLED"
	codeFilter     = "INVALID_FILTER"
	codeMethod     = "METHOD_NOT_ALLOWED"
	codeNotImpl    = "NOT_IMPLEMENTED"
	msgConfigInUse = "config is in use by identity"
)

const maxBody = 1 << 20

func (f *Fake) serve(w http.ResponseWriter, r *http.Request) {
	path, ok := strings.CutPrefix(r.URL.Path, ziti.BasePath)
	if !ok || path == "" {
		f.writeError(w, http.StatusNotFound, codeNotFound, msgNotFound, "not under "+ziti.BasePath, nil)
		return
	}
	body, err := jsonx.ReadAll(r.Body, maxBody)
	if err != nil {
		f.writeError(w, http.StatusBadRequest, codeInvalid, msgInvalid, "body unreadable or too long", nil)
		return
	}
	// Route and validate a copy of the request on the path after basePath.
	vr := r.Clone(r.Context())
	vr.URL.Path, vr.URL.RawPath = path, ""
	vr.RequestURI = ""
	vr.Body = io.NopCloser(bytes.NewReader(body))
	route, params, err := f.spec.Router.FindRoute(vr)
	if err != nil {
		if errors.Is(err, routers.ErrMethodNotAllowed) {
			f.writeError(w, http.StatusMethodNotAllowed, codeMethod, "method not allowed", err.Error(), nil)
			return
		}
		f.writeError(w, http.StatusNotFound, codeNotFound, msgNotFound, err.Error(), nil)
		return
	}
	in := &openapi3filter.RequestValidationInput{Request: vr, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: f.authenticate}}
	if err := openapi3filter.ValidateRequest(r.Context(), in); err != nil {
		var se *openapi3filter.SecurityRequirementsError
		if errors.As(err, &se) {
			f.writeError(w, http.StatusUnauthorized, codeUnauth, msgUnauth, "", nil)
			f.mu.Lock()
			f.calls = append(f.calls, Call{Method: r.Method, OperationID: route.Operation.OperationID, Path: path, Body: string(body), Status: http.StatusUnauthorized})
			f.mu.Unlock()
			return
		}
		f.writeError(w, http.StatusBadRequest, codeInvalid, msgInvalid, err.Error(), params)
		return
	}
	op := route.Operation.OperationID
	f.mu.Lock()
	if st := f.fail[op]; len(st) > 0 {
		f.fail[op] = st[1:]
		if st[0] != 0 {
			f.mu.Unlock()
			f.writeError(w, st[0], codeUnhandled, "injected failure", op, params)
			return
		}
	}
	f.mu.Unlock()
	rec := &recorder{ResponseWriter: w, status: http.StatusOK}
	f.dispatch(rec, r, op, params, body)
	if r.Method != http.MethodGet && rec.status < 300 {
		f.bump()
	}
	// The fake's own answers must satisfy the specification too.
	rin := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: rec.status, Header: w.Header(),
		Body: io.NopCloser(bytes.NewReader(rec.body.Bytes())), Options: &openapi3filter.Options{}}
	// A status the specification does not list (the controller's 500
	// "config is in use by identity") is not checked.
	rerr := openapi3filter.ValidateResponse(r.Context(), rin)
	f.mu.Lock()
	f.calls = append(f.calls, Call{Method: r.Method, OperationID: op, Path: path, Body: string(body), Status: rec.status})
	if rerr != nil {
		f.badAnswers = append(f.badAnswers, fmt.Errorf("%s %s → %d: %w", op, path, rec.status, rerr))
	}
	f.mu.Unlock()
}

type recorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (r *recorder) Write(b []byte) (int, error) {
	r.body.Write(b)
	return r.ResponseWriter.Write(b)
}

// BadAnswers returns the fake's own answers that did not satisfy the
// specification's response schemas (a bug of the fake); tests assert it
// is empty.
func (f *Fake) BadAnswers() []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.badAnswers)
}

func (r *recorder) WriteHeader(s int) {
	r.status = s
	r.ResponseWriter.WriteHeader(s)
}

func (f *Fake) authenticate(ctx context.Context, in *openapi3filter.AuthenticationInput) error {
	if in.SecuritySchemeName != "ztSession" {
		return in.NewError(fmt.Errorf("zititest accepts only ztSession"))
	}
	tok := in.RequestValidationInput.Request.Header.Get("zt-session")
	if tok == f.session {
		return nil
	}
	f.mu.Lock()
	exp, ok := f.sessions[tok]
	f.mu.Unlock()
	if !ok || !f.clk.Now().Before(exp) {
		return in.NewError(nil)
	}
	return nil
}

func created(w http.ResponseWriter, id, kind string) {
	jsonx.Write(w, http.StatusCreated, map[string]any{"data": map[string]any{"id": id, "_links": map[string]any{"self": map[string]any{"href": "./" + kind + "/" + id}}}, "meta": metaBody})
}

func empty(w http.ResponseWriter) {
	jsonx.Write(w, http.StatusOK, map[string]any{"data": map[string]any{}, "meta": metaBody})
}

func (f *Fake) dispatch(w http.ResponseWriter, r *http.Request, op string, params map[string]string, body []byte) {
	id := params["id"]
	switch op {
	case "authenticate":
		f.authenticateOp(w, r, body)
	case "listConfigTypes":
		f.list(w, r, "config-types", func(Filter) []any { return values(f.ctypes, f.ctypeJSON) })
	case "createConfig":
		var c ziti.ConfigCreate
		if !f.decode(w, body, &c) {
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.ctypes[c.ConfigTypeID]; !ok {
			f.unlockedError(w, http.StatusBadRequest, codeInvalid, msgInvalid, "configTypeId not found: "+c.ConfigTypeID)
			return
		}
		if err := f.validateData(c.ConfigTypeID, c.Data); err != nil {
			f.unlockedError(w, http.StatusBadRequest, codeInvalid, msgInvalid, err.Error())
			return
		}
		if slices.ContainsFunc(slices.Collect(maps.Values(f.configs)), func(x ziti.Config) bool { return x.Name == c.Name }) {
			f.unlockedError(w, http.StatusBadRequest, codeInvalid, msgInvalid, "name is must be unique: "+c.Name)
			return
		}
		nid := f.newID("cfg")
		f.configs[nid] = ziti.Config{ID: nid, Name: c.Name, ConfigTypeID: c.ConfigTypeID, Data: c.Data, Tags: c.Tags}
		created(w, nid, "configs")
	case "listConfigs":
		f.list(w, r, "configs", func(flt Filter) []any {
			return valuesWhere(f.configs, configJSON, flt, func(c ziti.Config) ziti.Tags { return c.Tags })
		})
	case "detailConfig":
		f.detail(w, id, func() (any, bool) { c, ok := f.configs[id]; return configJSON(c), ok })
	case "patchConfig":
		var p struct {
			Name *string         `json:"name"`
			Data map[string]any  `json:"data"`
			Tags *map[string]any `json:"tags"`
		}
		if !f.decode(w, body, &p) {
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		c, ok := f.configs[id]
		if !ok {
			f.notFound(w, id)
			return
		}
		if p.Name != nil {
			c.Name = *p.Name
		}
		if p.Data != nil {
			if err := f.validateData(c.ConfigTypeID, p.Data); err != nil {
				f.unlockedError(w, http.StatusBadRequest, codeInvalid, msgInvalid, err.Error())
				return
			}
			c.Data = p.Data
		}
		if p.Tags != nil {
			c.Tags = *p.Tags
		}
		f.configs[id] = c
		empty(w)
	case "deleteConfig":
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.configs[id]; !ok {
			f.notFound(w, id)
			return
		}
		for ident, ov := range f.overrides {
			if _, ok := f.idents[ident]; !ok {
				continue
			}
			for k, cfg := range ov {
				if _, svc := f.services[k[0]]; cfg == id && svc {
					f.unlockedError(w, http.StatusInternalServerError, codeUnhandled, msgConfigInUse, msgConfigInUse+" "+ident)
					return
				}
			}
		}
		for _, s := range f.services {
			if slices.Contains(s.Configs, id) {
				f.unlockedError(w, http.StatusConflict, "CONFLICT_CANNOT_MODIFY_REFERENCED", "The resource cannot be deleted/modified. Remove all referencing resources first.", "referenced by /services/"+s.ID)
				return
			}
		}
		delete(f.configs, id)
		empty(w)
	case "createService":
		var s ziti.ServiceCreate
		if !f.decode(w, body, &s) {
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		types := map[string]bool{}
		for _, c := range s.Configs {
			cfg, ok := f.configs[c]
			if !ok {
				f.unlockedError(w, http.StatusBadRequest, codeInvalid, msgInvalid, "config not found: "+c)
				return
			}
			if types[cfg.ConfigTypeID] {
				f.unlockedError(w, http.StatusBadRequest, codeInvalid, msgInvalid, "duplicate config type on service")
				return
			}
			types[cfg.ConfigTypeID] = true
		}
		for _, x := range f.services {
			if x.Name == s.Name {
				f.unlockedError(w, http.StatusBadRequest, codeInvalid, msgInvalid, "name is must be unique: "+s.Name)
				return
			}
		}
		nid := f.newID("svc")
		f.services[nid] = ziti.Service{ID: nid, Name: s.Name, Configs: slices.Clone(s.Configs), EncryptionRequired: s.EncryptionRequired, TerminatorStrategy: "smartrouting", Tags: s.Tags}
		created(w, nid, "services")
	case "listServices":
		f.list(w, r, "services", func(flt Filter) []any {
			return valuesWhere(f.services, serviceJSON, flt, func(s ziti.Service) ziti.Tags { return s.Tags })
		})
	case "detailService":
		f.detail(w, id, func() (any, bool) { s, ok := f.services[id]; return serviceJSON(s), ok })
	case "patchService":
		var p struct {
			Name    *string         `json:"name"`
			Configs *[]string       `json:"configs"`
			Tags    *map[string]any `json:"tags"`
		}
		if !f.decode(w, body, &p) {
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		svc, ok := f.services[id]
		if !ok {
			f.notFound(w, id)
			return
		}
		if p.Name != nil {
			for _, x := range f.services {
				if x.ID != id && x.Name == *p.Name {
					f.unlockedError(w, http.StatusBadRequest, codeInvalid, msgInvalid, "name is must be unique: "+*p.Name)
					return
				}
			}
			svc.Name = *p.Name
		}
		if p.Configs != nil {
			types := map[string]bool{}
			for _, c := range *p.Configs {
				cfg, ok := f.configs[c]
				if !ok {
					f.unlockedError(w, http.StatusBadRequest, codeInvalid, msgInvalid, "config not found: "+c)
					return
				}
				if types[cfg.ConfigTypeID] {
					f.unlockedError(w, http.StatusBadRequest, codeInvalid, msgInvalid, "duplicate config type on service")
					return
				}
				types[cfg.ConfigTypeID] = true
			}
			svc.Configs = slices.Clone(*p.Configs)
		}
		if p.Tags != nil {
			svc.Tags = *p.Tags
		}
		f.services[id] = svc
		empty(w)
	case "deleteService":
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.services[id]; !ok {
			f.notFound(w, id)
			return
		}
		delete(f.services, id)
		for _, ov := range f.overrides {
			for k := range ov {
				if k[0] == id {
					delete(ov, k)
				}
			}
		}
		for tid, t := range f.terms {
			if t.ServiceID == id {
				delete(f.terms, tid)
			}
		}
		empty(w)
	case "createServicePolicy":
		var p ziti.ServicePolicyCreate
		if !f.decode(w, body, &p) {
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, x := range f.policies {
			if x.Name == p.Name {
				f.unlockedError(w, http.StatusBadRequest, codeInvalid, msgInvalid, "name is must be unique: "+p.Name)
				return
			}
		}
		nid := f.newID("pol")
		f.policies[nid] = ziti.ServicePolicy{ID: nid, Name: p.Name, Type: p.Type, Semantic: p.Semantic, ServiceRoles: nonNil(p.ServiceRoles), IdentityRoles: nonNil(p.IdentityRoles), Tags: p.Tags}
		created(w, nid, "service-policies")
	case "listServicePolicies":
		f.list(w, r, "service-policies", func(flt Filter) []any {
			return valuesWhere(f.policies, policyJSON, flt, func(p ziti.ServicePolicy) ziti.Tags { return p.Tags })
		})
	case "detailServicePolicy":
		f.detail(w, id, func() (any, bool) { p, ok := f.policies[id]; return policyJSON(p), ok })
	case "patchServicePolicy":
		var p struct {
			Name          *string         `json:"name"`
			IdentityRoles *[]string       `json:"identityRoles"`
			ServiceRoles  *[]string       `json:"serviceRoles"`
			Tags          *map[string]any `json:"tags"`
		}
		if !f.decode(w, body, &p) {
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		pol, ok := f.policies[id]
		if !ok {
			f.notFound(w, id)
			return
		}
		if p.Name != nil {
			for _, x := range f.policies {
				if x.ID != id && x.Name == *p.Name {
					f.unlockedError(w, http.StatusBadRequest, codeInvalid, msgInvalid, "name is must be unique: "+*p.Name)
					return
				}
			}
			pol.Name = *p.Name
		}
		if p.IdentityRoles != nil {
			pol.IdentityRoles = nonNil(*p.IdentityRoles)
		}
		if p.ServiceRoles != nil {
			pol.ServiceRoles = nonNil(*p.ServiceRoles)
		}
		if p.Tags != nil {
			pol.Tags = *p.Tags
		}
		f.policies[id] = pol
		empty(w)
	case "deleteServicePolicy":
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.policies[id]; !ok {
			f.notFound(w, id)
			return
		}
		delete(f.policies, id)
		empty(w)
	case "listIdentities":
		f.list(w, r, "identities", func(Filter) []any { return values(f.idents, identJSON) })
	case "detailIdentity":
		f.detail(w, id, func() (any, bool) { x, ok := f.idents[id]; return identJSON(x), ok })
	case "listIdentitysServiceConfigs":
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.idents[id]; !ok {
			f.notFound(w, id)
			return
		}
		out := []any{}
		for _, sc := range f.liveOverrides(id) {
			out = append(out, map[string]any{
				"serviceId": sc.ServiceID, "configId": sc.ConfigID,
				"service": map[string]any{"id": sc.ServiceID, "name": f.services[sc.ServiceID].Name, "entity": "services"},
				"config":  map[string]any{"id": sc.ConfigID, "name": f.configs[sc.ConfigID].Name, "entity": "configs"},
			})
		}
		jsonx.Write(w, http.StatusOK, map[string]any{"data": out, "meta": metaBody})
	case "associateIdentitysServiceConfigs", "disassociateIdentitysServiceConfigs":
		var scs []ziti.ServiceConfig
		if len(bytes.TrimSpace(body)) > 0 && !f.decode(w, body, &scs) {
			return
		}
		if len(scs) == 0 {
			f.writeError(w, http.StatusBadRequest, codeInvalid, msgInvalid, "serviceConfigs must not be null or empty", params)
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.idents[id]; !ok {
			f.notFound(w, id)
			return
		}
		for _, sc := range scs {
			if _, ok := f.services[sc.ServiceID]; !ok {
				f.unlockedError(w, http.StatusNotFound, codeNotFound, msgNotFound, "service not found: "+sc.ServiceID)
				return
			}
			if _, ok := f.configs[sc.ConfigID]; !ok {
				f.unlockedError(w, http.StatusNotFound, codeNotFound, msgNotFound, "config not found: "+sc.ConfigID)
				return
			}
		}
		ov := f.overrides[id]
		if ov == nil {
			ov = map[[2]string]string{}
			f.overrides[id] = ov
		}
		for _, sc := range scs {
			k := [2]string{sc.ServiceID, f.configs[sc.ConfigID].ConfigTypeID}
			if op == "associateIdentitysServiceConfigs" {
				ov[k] = sc.ConfigID
			} else {
				delete(ov, k)
			}
		}
		empty(w)
	case "getIdentityPolicyAdvice":
		f.mu.Lock()
		defer f.mu.Unlock()
		ident, ok := f.idents[id]
		if !ok {
			f.notFound(w, id)
			return
		}
		svcID := params["serviceId"]
		if _, ok := f.services[svcID]; !ok {
			f.notFound(w, svcID)
			return
		}
		adv := map[string]any{"identityId": id, "serviceId": svcID,
			"isBindAllowed": f.allowed(ident, svcID, ziti.PolicyBind), "isDialAllowed": f.allowed(ident, svcID, ziti.PolicyDial),
			"identityRouterCount": 1, "serviceRouterCount": 1, "commonRouters": []any{}}
		jsonx.Write(w, http.StatusOK, map[string]any{"data": adv, "meta": metaBody})
	case "listTerminators":
		f.list(w, r, "terminators", func(Filter) []any { return values(f.terms, termJSON) })
	case "listServiceTerminators":
		f.list(w, r, "terminators", func(Filter) []any {
			var out []any
			for _, t := range f.terms {
				if t.ServiceID == id {
					out = append(out, termJSON(t))
				}
			}
			return out
		})
	default:
		f.writeError(w, http.StatusNotImplemented, codeNotImpl, "the fake controller does not implement "+op, "", params)
	}
}

// allowed evaluates the service policies of type typ for an identity and
// a service: roles "@id" name an object, "#attr" a role attribute, "#all"
// everything; AnyOf needs one match, AllOf every attribute role.
func (f *Fake) allowed(ident ziti.Identity, svcID, typ string) bool {
	matches := func(roles []string, id string, attrs []string, semantic string) bool {
		any, all := false, len(roles) > 0
		for _, r := range roles {
			ok := r == "#all" || r == "@"+id || strings.HasPrefix(r, "#") && slices.Contains(attrs, r[1:])
			any = any || ok
			all = all && ok
		}
		if semantic == ziti.AllOf {
			return all
		}
		return any
	}
	for _, p := range f.policies {
		if p.Type == typ && matches(p.ServiceRoles, svcID, nil, ziti.AnyOf) && matches(p.IdentityRoles, ident.ID, ident.RoleAttributes, p.Semantic) {
			return true
		}
	}
	return false
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return slices.Clone(s)
}

// unlockedError writes an error while f.mu is held.
func (f *Fake) unlockedError(w http.ResponseWriter, status int, code, msg, cause string) {
	e := apiError{Code: code, Message: msg, CauseMessage: cause}
	e.Args.URLVars = map[string]string{}
	e.RequestID = f.newID("req")
	jsonx.Write(w, status, map[string]any{"error": e, "meta": metaBody})
}

func (f *Fake) notFound(w http.ResponseWriter, id string) {
	e := apiError{Code: codeNotFound, Message: msgNotFound}
	e.Args.URLVars = map[string]string{"id": id}
	e.RequestID = f.newID("req")
	jsonx.Write(w, http.StatusNotFound, map[string]any{"error": e, "meta": metaBody})
}

func (f *Fake) decode(w http.ResponseWriter, body []byte, v any) bool {
	if err := json.Unmarshal(body, v); err != nil {
		f.writeError(w, http.StatusBadRequest, codeInvalid, msgInvalid, err.Error(), nil)
		return false
	}
	return true
}

func (f *Fake) detail(w http.ResponseWriter, id string, get func() (any, bool)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := get()
	if !ok {
		f.notFound(w, id)
		return
	}
	jsonx.Write(w, http.StatusOK, map[string]any{"data": v, "meta": metaBody})
}

// list answers a list operation: filter, then sort by id, then page.
func (f *Fake) list(w http.ResponseWriter, r *http.Request, kind string, all func(Filter) []any) {
	q := r.URL.Query()
	flt, err := ParseFilter(q.Get("filter"))
	if err != nil {
		f.writeError(w, http.StatusBadRequest, codeFilter, "The filter query supplied is invalid", err.Error(), nil)
		return
	}
	limit, offset := 10, 0
	if v := q.Get("limit"); v != "" {
		limit, _ = strconv.Atoi(v) // the specification already checked it is an integer
	}
	if v := q.Get("offset"); v != "" {
		offset, _ = strconv.Atoi(v)
	}
	if limit <= 0 || limit > 500 {
		limit = 500
	}
	if offset < 0 {
		offset = 0
	}
	f.mu.Lock()
	items := all(flt)
	f.mu.Unlock()
	var out []any
	for _, it := range items {
		if flt.Match(it.(map[string]any)) {
			out = append(out, it)
		}
	}
	slices.SortFunc(out, func(a, b any) int {
		return strings.Compare(a.(map[string]any)["id"].(string), b.(map[string]any)["id"].(string))
	})
	total := len(out)
	page := []any{}
	if offset < total {
		page = out[offset:min(total, offset+limit)]
	}
	meta := maps.Clone(metaBody)
	meta["pagination"] = map[string]any{"limit": limit, "offset": offset, "totalCount": total}
	jsonx.Write(w, http.StatusOK, map[string]any{"data": page, "meta": meta})
	_ = kind
}

// valuesWhere is values for the objects whose tags may match flt: a
// "tags.k = v" clause is checked on the typed object first, so that a
// filtered list does not build the answer of every object.
func valuesWhere[T any](m map[string]T, conv func(T) any, flt Filter, tags func(T) ziti.Tags) []any {
	out := []any{}
	for _, v := range m {
		if flt.mayMatchTags(tags(v)) {
			out = append(out, conv(v))
		}
	}
	return out
}

func values[T any](m map[string]T, conv func(T) any) []any {
	out := make([]any, 0, len(m))
	for _, v := range m {
		out = append(out, conv(v))
	}
	return out
}

func base(id string, tags ziti.Tags, kind string) map[string]any {
	if tags == nil {
		tags = ziti.Tags{}
	}
	return map[string]any{"id": id, "tags": map[string]any(tags), "createdAt": "2026-01-01T00:00:00Z", "updatedAt": "2026-01-01T00:00:00Z",
		"_links": map[string]any{"self": map[string]any{"href": "./" + kind + "/" + id}}}
}

func (f *Fake) ctypeJSON(c ziti.ConfigType) any {
	m := base(c.ID, nil, "config-types")
	m["name"], m["schema"] = c.Name, map[string]any{}
	if s := f.schemas[c.ID]; s != nil {
		m["schema"] = s.Raw
	}
	return m
}

// validateData checks config data against its type's schema, as the
// controller does on create and on patch. f.mu is held.
func (f *Fake) validateData(typeID string, data map[string]any) error {
	s := f.schemas[typeID]
	if s == nil {
		return nil
	}
	if err := s.Validate(data); err != nil {
		return fmt.Errorf("schema validation failed: %w", err)
	}
	return nil
}

func configJSON(c ziti.Config) any {
	m := base(c.ID, c.Tags, "configs")
	m["name"], m["configTypeId"], m["data"] = c.Name, c.ConfigTypeID, c.Data
	m["configType"] = map[string]any{"id": c.ConfigTypeID, "entity": "config-types"}
	return m
}

func serviceJSON(s ziti.Service) any {
	m := base(s.ID, s.Tags, "services")
	m["name"], m["configs"], m["encryptionRequired"], m["terminatorStrategy"] = s.Name, nonNil(s.Configs), s.EncryptionRequired, s.TerminatorStrategy
	m["maxIdleTimeMillis"], m["roleAttributes"], m["permissions"], m["config"], m["postureQueries"] = 0, []string{}, []string{"Bind", "Dial"}, map[string]any{}, []any{}
	return m
}

func policyJSON(p ziti.ServicePolicy) any {
	m := base(p.ID, p.Tags, "service-policies")
	m["name"], m["type"], m["semantic"], m["serviceRoles"], m["identityRoles"] = p.Name, p.Type, p.Semantic, nonNil(p.ServiceRoles), nonNil(p.IdentityRoles)
	m["postureCheckRoles"], m["serviceRolesDisplay"], m["identityRolesDisplay"], m["postureCheckRolesDisplay"] = []string{}, []any{}, []any{}, []any{}
	return m
}

func identJSON(i ziti.Identity) any {
	m := base(i.ID, i.Tags, "identities")
	m["name"], m["roleAttributes"] = i.Name, nonNil(i.RoleAttributes)
	m["type"], m["typeId"] = map[string]any{"id": "Default", "name": "Default", "entity": "identity-types"}, "Default"
	m["isDefaultAdmin"], m["isAdmin"], m["hasEdgeRouterConnection"], m["hasApiSession"], m["isMfaEnabled"], m["disabled"] = false, false, true, true, false, false
	m["authenticators"], m["enrollment"], m["envInfo"], m["sdkInfo"] = map[string]any{}, map[string]any{}, map[string]any{}, map[string]any{}
	m["edgeRouterConnectionStatus"] = "online"
	m["serviceHostingPrecedences"], m["serviceHostingCosts"], m["defaultHostingCost"] = map[string]any{}, map[string]any{}, 0
	m["authPolicyId"], m["authPolicy"], m["externalId"], m["permissions"] = "default", map[string]any{"id": "default", "entity": "auth-policies"}, nil, []string{}
	return m
}

func termJSON(t ziti.Terminator) any {
	m := base(t.ID, nil, "terminators")
	m["serviceId"], m["hostId"], m["identity"], m["precedence"], m["routerId"], m["binding"], m["address"] = t.ServiceID, t.HostID, t.Identity, t.Precedence, t.RouterID, t.Binding, t.Address
	m["service"] = map[string]any{"id": t.ServiceID, "entity": "services"}
	m["router"] = map[string]any{"id": t.RouterID, "entity": "edge-routers"}
	m["cost"], m["dynamicCost"] = t.Cost, t.Cost
	// "service" as a filter field is the service id, as in the controller.
	return m
}
