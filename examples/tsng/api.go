package tsng

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/vipkit/vipkit/internal/jsonx"
	"github.com/vipkit/vipkit/vip"
)

// Network is one network as the local API sees it: its registry (readable
// even while the network is stopped) and whether it is up.
type Network struct {
	Name     string
	ID       string // hex
	Registry *vip.Registry
	// Up reports whether the network runs locally; configuration updates
	// need it.
	Up func() bool
	// Status returns this node's observation of a service, as a
	// JSON-encodable value (nil when the network is down or the service is
	// not routed).
	Status func(id vip.ServiceID) any
	// CountersSince, when set, returns when the counters in Status started
	// (the network's engine started); watchers take a change for a restart.
	CountersSince func() time.Time
	// BackendWarnings, when set, says which of a service's backends this
	// node will not serve (a netstack node's ports outside backend_ports).
	BackendWarnings func(svc vip.Service) []string
}

// Manager gives the local API the agent's networks.
type Manager interface {
	Networks() []*Network
}

// UIProvider is implemented by a Manager that serves the VIP editor.
type UIProvider interface {
	UIURL() string
}

// NetworkSwitch is implemented by a Manager that can start and stop its
// networks (the Daemon does); the API's up and down calls need it.
type NetworkSwitch interface {
	Up(ctx context.Context, name string) error
	Down(name string) error
}

// API error codes: the JSON error body's "code", the CLI's exit status
// (see ExitCode) and the HTTP status all follow from them.
const (
	CodeInvalid     = "invalid"
	CodeNotFound    = "not_found"
	CodeAmbiguous   = "ambiguous"
	CodeConflict    = "conflict"
	CodeLimit       = "limit"
	CodeExists      = "exists"
	CodeNetworkDown = "network_down"
	CodeDeleted     = "deleted"
	CodeBusy        = "busy"
	CodeInternal    = "internal"
)

// APIError is the local API's error body.
type APIError struct {
	Code    string `json:"code"`
	Message string `json:"error"`
	// Candidates lists what an ambiguous selector matched.
	Candidates []string `json:"candidates,omitempty"`
	// Current is the current revision, on a conflict.
	Current vip.Revision `json:"current_revision,omitempty"`
}

func (e *APIError) Error() string { return e.Message }

func httpStatus(code string) int {
	switch code {
	case CodeInvalid:
		return http.StatusBadRequest
	case CodeNotFound, CodeDeleted:
		return http.StatusNotFound
	case CodeAmbiguous, CodeConflict, CodeExists, CodeBusy:
		return http.StatusConflict
	case CodeLimit:
		return http.StatusUnprocessableEntity
	case CodeNetworkDown:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// toAPIError classifies an error from vip.
func toAPIError(err error) *APIError {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae
	}
	e := &APIError{Code: CodeInternal, Message: err.Error()}
	var amb *vip.AmbiguousError
	var conf *vip.ConflictError
	switch {
	case errors.As(err, &amb):
		e.Code = CodeAmbiguous
		for _, c := range amb.Candidates {
			e.Candidates = append(e.Candidates, c.String())
		}
	case errors.As(err, &conf):
		e.Code, e.Current = CodeConflict, conf.Current
	case errors.Is(err, vip.ErrNetworkDown):
		e.Code = CodeNetworkDown
	case errors.Is(err, vip.ErrDeleted):
		e.Code = CodeDeleted
	case errors.Is(err, vip.ErrNotFound):
		e.Code = CodeNotFound
	case errors.Is(err, vip.ErrExists):
		e.Code = CodeExists
	case errors.Is(err, vip.ErrLimit):
		e.Code = CodeLimit
	case errors.Is(err, vip.ErrInvalid):
		e.Code = CodeInvalid
	}
	return e
}

// NetworkSummary is one line of `tsng vip list` without a network.
type NetworkSummary struct {
	Name     string `json:"name"`
	ID       string `json:"id"`
	Up       bool   `json:"up"`
	Services int    `json:"services"`
	// AddrCollisions describes each member whose address is a VIP's
	// stored reservation.
	AddrCollisions []string `json:"addr_collisions,omitempty"`
}

// ServiceDoc is a service as the API returns it: configuration, revision,
// derived state and, when the network is up, this node's observation.
type ServiceDoc struct {
	Network string `json:"network"`
	// NetworkUp is whether the network runs on this node; a stopped
	// network's VIPs route nothing here.
	NetworkUp bool `json:"network_up"`
	vip.ServiceView
	// NodeNames maps the id (hex) of each backend node to its name (a
	// departed node's as this agent knew it).
	NodeNames map[string]string `json:"node_names,omitempty"`
	Status    any               `json:"status,omitempty"`
	// AddrCollision is set when a member's address is the VIP's stored
	// reservation: the VIP then uses another address (addr_moved).
	AddrCollision *vip.AddrCollision `json:"addr_collision,omitempty"`
	// CountersSince is when the cumulative counters in Status started:
	// they reset only when the agent (or the network on it) restarts.
	CountersSince time.Time `json:"counters_since,omitzero"`
	// Warnings name the service's backends on this node that it will not
	// serve (in netstack mode, ports its backend_ports does not allow).
	Warnings []string `json:"warnings,omitempty"`
}

// APIServer serves the local API over HTTP on a Unix socket.
type APIServer struct {
	m   Manager
	mux *http.ServeMux
	// MaxBody bounds request bodies (1 MiB).
	maxBody int64
}

// NewAPIServer returns the local API's handler for m.
func NewAPIServer(m Manager) *APIServer {
	s := &APIServer{m: m, mux: http.NewServeMux(), maxBody: 1 << 20}
	s.mux.HandleFunc("GET /v1/networks", s.listNetworks)
	s.mux.HandleFunc("POST /v1/reload", s.reload)
	s.mux.HandleFunc("GET /v1/ui", s.ui)
	s.mux.HandleFunc("GET /v1/ui/handoff", s.uiHandoffStats)
	s.mux.HandleFunc("POST /v1/ui/handoff", s.uiHandoff)
	s.mux.HandleFunc("GET /v1/ui/handoff/{id}", s.uiHandoffState)
	s.mux.HandleFunc("POST /v1/networks/{net}/up", s.upDown(true))
	s.mux.HandleFunc("POST /v1/networks/{net}/down", s.upDown(false))
	s.mux.HandleFunc("GET /v1/networks/{net}/nodes", s.listNodes)
	s.mux.HandleFunc("GET /v1/networks/{net}/reservations", s.reservations)
	s.mux.HandleFunc("POST /v1/networks/{net}/forward", s.forward)
	s.mux.HandleFunc("GET /v1/networks/{net}/vips", s.listVIPs)
	s.mux.HandleFunc("POST /v1/networks/{net}/vips", mutation(s, http.StatusCreated, create))
	s.mux.HandleFunc("GET /v1/networks/{net}/vips/{vip}", s.show)
	s.mux.HandleFunc("PUT /v1/networks/{net}/vips/{vip}", mutation(s, http.StatusOK, save))
	s.mux.HandleFunc("DELETE /v1/networks/{net}/vips/{vip}", s.remove)
	s.mux.HandleFunc("POST /v1/networks/{net}/vips/{vip}/ports", mutation(s, http.StatusOK, portAdd))
	s.mux.HandleFunc("PATCH /v1/networks/{net}/vips/{vip}/ports/{proto}/{port}", listenerMutation(s, portSet))
	s.mux.HandleFunc("DELETE /v1/networks/{net}/vips/{vip}/ports/{proto}/{port}", listenerMutation(s, portRemove))
	s.mux.HandleFunc("POST /v1/networks/{net}/vips/{vip}/ports/{proto}/{port}/backends", listenerMutation(s, backendAdd))
	s.mux.HandleFunc("DELETE /v1/networks/{net}/vips/{vip}/ports/{proto}/{port}/backends/{backend}", listenerMutation(s, backendRemove))
	s.mux.HandleFunc("PUT /v1/networks/{net}/vips/{vip}/ports/{proto}/{port}/backends/{backend}/drain", listenerMutation(s, backendDrain(true)))
	s.mux.HandleFunc("DELETE /v1/networks/{net}/vips/{vip}/ports/{proto}/{port}/backends/{backend}/drain", listenerMutation(s, backendDrain(false)))
	return s
}

// ServeHTTP implements http.Handler.
func (s *APIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// ListenUnix listens on a Unix socket at path with mode 0600 (its directory
// is created 0700 if missing). A stale socket file is replaced.
func ListenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if c, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
		c.Close()
		return nil, fmt.Errorf("tsng: another agent is listening on %s", path)
	}
	_ = os.Remove(path)
	old := umask(0o177)
	l, err := net.Listen("unix", path)
	umask(old)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func writeErr(w http.ResponseWriter, err error) {
	e := toAPIError(err)
	jsonx.WriteIndent(w, httpStatus(e.Code), e)
}

func (s *APIServer) decode(r *http.Request, v any) error {
	data, err := jsonx.ReadAll(r.Body, s.maxBody)
	if err == nil {
		err = jsonx.Decode(data, v)
	}
	if err != nil {
		return &APIError{Code: CodeInvalid, Message: "tsng: bad request body: " + err.Error()}
	}
	return nil
}

// network resolves a network selector: exact name, full id or unique id
// prefix.
func (s *APIServer) network(sel string) (*Network, error) {
	nets := s.m.Networks()
	cands := make([]vip.Candidate, len(nets))
	for i, n := range nets {
		cands[i] = vip.Candidate{ID: n.ID, Name: n.Name}
	}
	c, err := vip.Resolve("network", sel, cands)
	if err != nil {
		return nil, err
	}
	for _, n := range nets {
		if n.ID == c.ID {
			return n, nil
		}
	}
	return nil, fmt.Errorf("%w: network %q", vip.ErrNotFound, sel)
}

func (s *APIServer) upNetwork(sel string) (*Network, error) {
	n, err := s.network(sel)
	if err != nil {
		return nil, err
	}
	if !n.Up() {
		return nil, fmt.Errorf("%w: network %s is stopped on this node; start it to change its configuration (saved configuration stays readable)", vip.ErrNetworkDown, n.Name)
	}
	return n, nil
}

func (s *APIServer) doc(n *Network, v vip.ServiceView) ServiceDoc {
	d := ServiceDoc{Network: n.Name, NetworkUp: n.Up(), ServiceView: v, AddrCollision: collisionOf(n.Registry, v.ID)}
	if n.BackendWarnings != nil {
		d.Warnings = n.BackendWarnings(v.Service)
	}
	for _, l := range v.Listeners {
		for _, b := range l.Backends {
			if name, _ := n.Registry.NodeName(b.Node); name != "" {
				if d.NodeNames == nil {
					d.NodeNames = map[string]string{}
				}
				d.NodeNames[b.Node.String()] = name
			}
		}
	}
	if n.Up() && n.Status != nil {
		d.Status = n.Status(v.ID)
		if st, ok := d.Status.(vip.ServiceStatus); ok {
			d.Status = withoutFailedRTT(st)
		}
		if n.CountersSince != nil && d.Status != nil {
			d.CountersSince = n.CountersSince()
		}
	}
	return d
}

func (s *APIServer) listNetworks(w http.ResponseWriter, r *http.Request) {
	var out []NetworkSummary
	for _, n := range s.m.Networks() {
		ns := NetworkSummary{Name: n.Name, ID: n.ID, Up: n.Up(), Services: len(n.Registry.List())}
		for _, c := range n.Registry.AddrCollisions() {
			ns.AddrCollisions = append(ns.AddrCollisions, c.String())
		}
		out = append(out, ns)
	}
	jsonx.WriteIndent(w, http.StatusOK, out)
}

func (s *APIServer) ui(w http.ResponseWriter, _ *http.Request) {
	p, ok := s.m.(UIProvider)
	if !ok || p.UIURL() == "" {
		writeErr(w, &APIError{Code: CodeNotFound, Message: "tsng: this agent does not serve the editor (config \"ui\": \"off\")"})
		return
	}
	jsonx.WriteIndent(w, http.StatusOK, uiInfo{URL: p.UIURL()})
}

func (s *APIServer) upDown(up bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n, err := s.network(r.PathValue("net"))
		if err != nil {
			writeErr(w, err)
			return
		}
		sw, ok := s.m.(NetworkSwitch)
		if !ok {
			writeErr(w, &APIError{Code: CodeInternal, Message: "tsng: this agent cannot start or stop networks"})
			return
		}
		if up {
			err = sw.Up(r.Context(), n.Name)
		} else {
			err = sw.Down(n.Name)
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		jsonx.WriteIndent(w, http.StatusOK, NetworkSummary{Name: n.Name, ID: n.ID, Up: n.Up(), Services: len(n.Registry.List())})
	}
}

// reload re-reads the agent's config file and applies it (Reloader). A
// refused config is CodeInvalid, naming the field; one that needs a
// restart too; a reload while another runs is CodeBusy.
func (s *APIServer) reload(w http.ResponseWriter, r *http.Request) {
	rl, ok := s.m.(Reloader)
	if !ok {
		writeErr(w, &APIError{Code: CodeInternal, Message: "tsng: this agent cannot reload its config"})
		return
	}
	res, err := rl.Reload(r.Context())
	switch {
	case err == nil:
		jsonx.WriteIndent(w, http.StatusOK, res)
	case errors.Is(err, ErrReloadBusy):
		writeErr(w, &APIError{Code: CodeBusy, Message: err.Error()})
	case errors.Is(err, ErrConfig), errors.Is(err, ErrRestartNeeded):
		writeErr(w, &APIError{Code: CodeInvalid, Message: err.Error()})
	default:
		writeErr(w, err)
	}
}

// NodeDoc is a member of a network as the API lists it.
type NodeDoc struct {
	ID   vip.NodeID `json:"id"`
	Name string     `json:"name"`
	Addr string     `json:"addr"`
}

func (s *APIServer) listNodes(w http.ResponseWriter, r *http.Request) {
	n, err := s.network(r.PathValue("net"))
	if err != nil {
		writeErr(w, err)
		return
	}
	out := []NodeDoc{}
	for _, m := range n.Registry.Nodes() {
		out = append(out, NodeDoc{ID: m.ID, Name: m.Name, Addr: m.Addr.String()})
	}
	jsonx.WriteIndent(w, http.StatusOK, out)
}

func (s *APIServer) listVIPs(w http.ResponseWriter, r *http.Request) {
	n, err := s.network(r.PathValue("net"))
	if err != nil {
		writeErr(w, err)
		return
	}
	out := []ServiceDoc{}
	for _, v := range n.Registry.List() {
		out = append(out, s.doc(n, v))
	}
	jsonx.WriteIndent(w, http.StatusOK, out)
}

func (s *APIServer) show(w http.ResponseWriter, r *http.Request) {
	n, err := s.network(r.PathValue("net"))
	if err != nil {
		writeErr(w, err)
		return
	}
	v, err := n.Registry.Get(r.PathValue("vip"))
	if err != nil {
		writeErr(w, err)
		return
	}
	jsonx.WriteIndent(w, http.StatusOK, s.doc(n, v))
}

func (s *APIServer) remove(w http.ResponseWriter, r *http.Request) {
	n, err := s.upNetwork(r.PathValue("net"))
	if err != nil {
		writeErr(w, err)
		return
	}
	if err := n.Registry.Remove(r.Context(), r.PathValue("vip"), vip.Revision(r.URL.Query().Get("revision"))); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// CreateRequest is the body of POST /v1/networks/{net}/vips: a new VIP's
// name and, from the editor's New VIP draft, its initial listeners.
type CreateRequest struct {
	Name      string         `json:"name"`
	Listeners []vip.Listener `json:"listeners,omitempty"`
}

// SaveRequest is the body of PUT /v1/networks/{net}/vips/{vip}: a whole
// draft and the revision it was read at.
type SaveRequest struct {
	Service  vip.Service  `json:"service"`
	Revision vip.Revision `json:"revision"`
}

// PortAddRequest is the body of POST .../ports.
type PortAddRequest struct {
	Listener string   `json:"listener"` // "tcp/443"
	Backends []string `json:"backends"` // "NODE:PORT"
}

// PortSetRequest is the body of PATCH .../ports/{proto}/{port}; absent
// fields are left alone.
type PortSetRequest struct {
	PortCheck       *bool  `json:"port_check,omitempty"`
	CheckIntervalMS *int64 `json:"check_interval_ms,omitempty"`
	CheckTimeoutMS  *int64 `json:"check_timeout_ms,omitempty"`
	Failures        *int   `json:"failures,omitempty"`
	Successes       *int   `json:"successes,omitempty"`
	IdleTimeoutS    *int64 `json:"idle_timeout_s,omitempty"`
}

func (p PortSetRequest) settings() vip.PortSettings {
	ms := func(v *int64, unit time.Duration) *vip.Duration {
		if v == nil {
			return nil
		}
		d := vip.Duration(time.Duration(*v) * unit)
		return &d
	}
	return vip.PortSettings{PortCheck: p.PortCheck, Interval: ms(p.CheckIntervalMS, time.Millisecond), Timeout: ms(p.CheckTimeoutMS, time.Millisecond),
		Failures: p.Failures, Successes: p.Successes, IdleTimeout: ms(p.IdleTimeoutS, time.Second)}
}

// BackendRequest is the body of POST .../backends.
type BackendRequest struct {
	Backend string `json:"backend"` // "NODE:PORT"
}

// noBody is the request type of calls without a body.
type noBody struct{}

// mutation is the handler of a configuration update: it decodes the body
// (unless Req is noBody), refuses a network that is not up, applies fn and
// answers with the service.
func mutation[Req any](s *APIServer, status int, fn func(ctx context.Context, reg *vip.Registry, r *http.Request, req Req) (vip.ServiceView, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if _, none := any(req).(noBody); !none {
			if err := s.decode(r, &req); err != nil {
				writeErr(w, err)
				return
			}
		}
		n, err := s.upNetwork(r.PathValue("net"))
		if err != nil {
			writeErr(w, err)
			return
		}
		v, err := fn(r.Context(), n.Registry, r, req)
		if err != nil {
			writeErr(w, err)
			return
		}
		jsonx.WriteIndent(w, status, s.doc(n, v))
	}
}

// listenerMutation is mutation for calls on one listener of a service
// (.../ports/{proto}/{port}...).
func listenerMutation[Req any](s *APIServer, fn func(ctx context.Context, reg *vip.Registry, r *http.Request, k vip.PortKey, req Req) (vip.ServiceView, error)) http.HandlerFunc {
	return mutation(s, http.StatusOK, func(ctx context.Context, reg *vip.Registry, r *http.Request, req Req) (vip.ServiceView, error) {
		k, err := vip.ParsePortKey(r.PathValue("proto") + "/" + r.PathValue("port"))
		if err != nil {
			return vip.ServiceView{}, err
		}
		return fn(ctx, reg, r, k, req)
	})
}

// create makes a new VIP. With listeners (the editor's New VIP draft) the
// whole draft is validated before anything is written, so an invalid draft
// creates nothing; the listeners are then saved against the new service's
// first revision. Should that save still fail (a concurrent change of the
// network's limits), the error names the created, empty VIP.
func create(ctx context.Context, reg *vip.Registry, _ *http.Request, req CreateRequest) (vip.ServiceView, error) {
	if len(req.Listeners) == 0 {
		return reg.Create(ctx, req.Name)
	}
	draft := vip.Service{ID: vip.ServiceID{1}, Name: req.Name, Network: reg.Network(), Listeners: req.Listeners}
	member := func(id vip.NodeID) bool {
		for _, n := range reg.Nodes() {
			if n.ID == id {
				return true
			}
		}
		return false
	}
	if err := draft.Validate(reg.Limits(), member); err != nil {
		return vip.ServiceView{}, err
	}
	others := []vip.Service{draft}
	for _, v := range reg.List() {
		if v.Routable {
			others = append(others, v.Service)
		}
	}
	if err := vip.ValidateNetwork(others, reg.Limits()); err != nil {
		return vip.ServiceView{}, err
	}
	v, err := reg.Create(ctx, req.Name)
	if err != nil {
		return vip.ServiceView{}, err
	}
	draft.ID = v.ID
	saved, err := reg.Save(ctx, draft, v.Revision)
	if err != nil {
		return vip.ServiceView{}, fmt.Errorf("tsng: created %s (%s) without its listeners: %w", v.Name, v.ID, err)
	}
	return saved, nil
}

func save(ctx context.Context, reg *vip.Registry, r *http.Request, req SaveRequest) (vip.ServiceView, error) {
	cur, err := reg.Get(r.PathValue("vip"))
	if err != nil {
		return vip.ServiceView{}, err
	}
	if req.Service.ID != cur.ID {
		return vip.ServiceView{}, &APIError{Code: CodeInvalid, Message: fmt.Sprintf("tsng: draft id %s is not the id of %s (%s); ids cannot change", req.Service.ID, cur.Name, cur.ID)}
	}
	return reg.Save(ctx, req.Service, req.Revision)
}

func portAdd(ctx context.Context, reg *vip.Registry, r *http.Request, req PortAddRequest) (vip.ServiceView, error) {
	k, err := vip.ParsePortKey(req.Listener)
	if err != nil {
		return vip.ServiceView{}, err
	}
	var bs []vip.Backend
	for _, sel := range req.Backends {
		b, err := reg.ResolveBackend(sel)
		if err != nil {
			return vip.ServiceView{}, err
		}
		bs = append(bs, b)
	}
	return reg.PortAdd(ctx, r.PathValue("vip"), k, bs)
}

func portSet(ctx context.Context, reg *vip.Registry, r *http.Request, k vip.PortKey, req PortSetRequest) (vip.ServiceView, error) {
	return reg.PortSet(ctx, r.PathValue("vip"), k, req.settings())
}

func portRemove(ctx context.Context, reg *vip.Registry, r *http.Request, k vip.PortKey, _ noBody) (vip.ServiceView, error) {
	return reg.PortRemove(ctx, r.PathValue("vip"), k)
}

func backendAdd(ctx context.Context, reg *vip.Registry, r *http.Request, k vip.PortKey, req BackendRequest) (vip.ServiceView, error) {
	b, err := reg.ResolveBackend(req.Backend)
	if err != nil {
		return vip.ServiceView{}, err
	}
	return reg.BackendAdd(ctx, r.PathValue("vip"), k, b)
}

func backendRemove(ctx context.Context, reg *vip.Registry, r *http.Request, k vip.PortKey, _ noBody) (vip.ServiceView, error) {
	b, err := reg.ResolveBackend(r.PathValue("backend"))
	if err != nil {
		return vip.ServiceView{}, err
	}
	return reg.BackendRemove(ctx, r.PathValue("vip"), k, b)
}

// ExitCode maps an API error code to the CLI's exit status (documented in
// the package doc).
func ExitCode(code string) int {
	switch code {
	case CodeNotFound, CodeDeleted:
		return ExitNotFound
	case CodeAmbiguous:
		return ExitAmbiguous
	case CodeConflict:
		return ExitConflict
	case CodeInvalid:
		return ExitInvalid
	case CodeLimit:
		return ExitLimit
	case CodeExists:
		return ExitExists
	case CodeNetworkDown:
		return ExitNetworkDown
	}
	return ExitError
}
