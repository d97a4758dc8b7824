package vip

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/internal/syncx"
)

// NodeInfo is a member of a network as the agent knows it: its identity,
// its current name and its overlay address.
type NodeInfo struct {
	ID   NodeID
	Name string
	Addr netip.Addr
}

// RegistryOptions configures a Registry.
type RegistryOptions struct {
	// Network is the network's name, which is also its DNS domain
	// (api.home for network "home"). Required.
	Network string
	// Prefix is the network's agreed overlay range (IPv4). Required.
	Prefix netip.Prefix
	// Replica holds the signed registers. Open it with the schema's hooks,
	// crdt.Config{Obsolete: vip.Obsolete, Check: vip.CheckField, Rank:
	// vip.Rank}, so that fields of removed listener generations are
	// dropped, fields that break the schema are refused on merge, and a
	// removed generation stays removed. Required. The Registry does not
	// close it.
	Replica *crdt.Replica
	// Nodes returns the network's members (names, identities, addresses).
	// Required; called on every read and mutation, with the Registry's
	// mutation lock held during a mutation: it must return promptly and
	// must not call the Registry (a membership table's snapshot).
	Nodes func() []NodeInfo
	// FormerNodes, when set, returns nodes this agent knew as members
	// that may have left (only ID and Name are read). A backend whose
	// node left the member list (a departed backend) is addressable by
	// its stored node id on every agent; with FormerNodes it is also
	// addressable by the name this agent knew. A name of a current
	// member takes precedence.
	// Like Nodes, it may run under the mutation lock.
	FormerNodes func() []NodeInfo
	// Limits bounds the configuration; zero fields take their defaults.
	Limits Limits
	// Rand is no longer read: a new service's id is bound to this node's
	// key and creation counter (crdt.Replica.Create), so that deleted
	// services can be compacted (docs/crdt.md). It is kept so that
	// existing callers compile.
	Rand io.Reader
	// OnChange, when set, is called after a change is committed to the
	// store, with the services that changed; local is true for this node's
	// own mutations (which the replicator publishes at once) and false for
	// merged snapshots. It runs on the goroutine that made the change,
	// after the mutation returned its lock, so it may call any method of
	// the Registry. Calls for concurrent changes may arrive in either
	// order; each follows its own commit, so a receiver that reads the
	// current state (Engine.Apply) ends on the newest.
	OnChange func(changed []ServiceID, local bool)
}

// ServiceView is a service as this node holds it: the configuration and
// what the network's state makes of it.
type ServiceView struct {
	Service
	Revision Revision `json:"revision"`
	// Addr is the effective VIP address; AddrMoved reports that it differs
	// from the stored reservation (a collision after partitions merged).
	Addr      netip.Addr `json:"addr"`
	AddrMoved bool       `json:"addr_moved,omitempty"`
	// NameConflict is set when another service of lower id, or a node,
	// holds the name; the service then resolves only by id.
	NameConflict string `json:"name_conflict,omitempty"`
	// Err is set when the merged configuration breaks the schema or a limit:
	// the service is then reported and left out of routing.
	Err string `json:"error,omitempty"`
	// Routable reports whether the engine routes the service's traffic.
	Routable bool `json:"routable"`
	err      error
}

// Error returns the service's error state, or nil.
func (v ServiceView) Error() error { return v.err }

// Registry is one network's VIP configuration on this node: reads with
// revisions, atomic mutations, whole-draft saves checked against the
// revision the editor was shown, and the derived state (effective
// addresses, names, limits). It stores everything in a crdt.Replica, so
// every mutation is signed, committed durably before it is visible, and
// merges with concurrent edits made elsewhere.
//
// A Registry is safe for concurrent use. Mutations are serialized.
type Registry struct {
	o  RegistryOptions
	mu syncx.Mutex // serializes mutations (read, validate, edit)
	// +checklocks:mu
	pending []ServiceID // local changes committed under mu, for OnChange after it

	// refreshGen numbers Refresh calls in the order they read the replica;
	// a Refresh stores its views only when no later one stored first.
	refreshGen atomic.Uint64

	// viewMu guards the derived state, rebuilt after every change.
	viewMu syncx.RWMutex
	// +checklocks:viewMu
	views []ServiceView
	// +checklocks:viewMu
	byID map[ServiceID]int
	// +checklocks:viewMu
	viewsGen uint64
}

// NewRegistry returns a Registry over o.Replica.
func NewRegistry(o RegistryOptions) (*Registry, error) {
	if o.Replica == nil || o.Nodes == nil {
		return nil, fmt.Errorf("%w: RegistryOptions needs Replica and Nodes", ErrInvalidOptions)
	}
	if err := ValidName(o.Network); err != nil {
		// The network is an option and a name: both sentinels match.
		return nil, fmt.Errorf("%w: %w: network: %v", ErrInvalidOptions, ErrInvalid, err)
	}
	if _, _, err := hostRange(o.Prefix); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	o.Limits = o.Limits.WithDefaults()
	r := &Registry{o: o}
	r.Refresh()
	return r, nil
}

// Network returns the network's name.
func (r *Registry) Network() string { return r.o.Network }

// Prefix returns the network's overlay range.
func (r *Registry) Prefix() netip.Prefix { return r.o.Prefix }

// Limits returns the limits in force.
func (r *Registry) Limits() Limits { return r.o.Limits }

// Refresh rebuilds the derived state from the replica. The Registry calls it
// after its own mutations and merges; call it after changing membership.
func (r *Registry) Refresh() {
	gen := r.refreshGen.Add(1)
	views := r.derive()
	byID := make(map[ServiceID]int, len(views))
	for i, v := range views {
		byID[v.ID] = i
	}
	r.viewMu.Lock()
	// A later Refresh read the replica after this one did: its views are
	// at least as new, so an earlier one that finishes last is dropped.
	if gen > r.viewsGen {
		r.views, r.byID, r.viewsGen = views, byID, gen
	}
	r.viewMu.Unlock()
}

// derive decodes every active service and decides addresses, names and
// routability deterministically from the held state alone.
func (r *Registry) derive() []ServiceView {
	nodes := r.o.Nodes()
	infos := r.o.Replica.Services()
	var views []ServiceView
	var addrClaims []AddrClaim
	var nameClaims []NameClaim
	for _, info := range infos {
		if info.Deleted {
			continue
		}
		id := ServiceID(info.ID)
		d, err := decodeService(r.o.Network, id, r.o.Replica.Fields(info.ID))
		v := ServiceView{Service: d.svc, Revision: revisionString(info.Revision)}
		if err == nil {
			err = d.svc.validateMerged(r.o.Limits)
		}
		if info.Err != nil {
			err = errors.Join(err, info.Err)
		}
		v.err = err
		views = append(views, v)
		addrClaims = append(addrClaims, AddrClaim{ID: id, Preferred: d.addr})
		if d.svc.Name != "" {
			nameClaims = append(nameClaims, NameClaim{ID: id, Name: d.svc.Name})
		}
	}
	slices.SortFunc(views, func(a, b ServiceView) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	var nodeAddrs []netip.Addr
	nodeNames := map[string]NodeID{}
	for _, n := range nodes {
		if n.Addr.IsValid() {
			nodeAddrs = append(nodeAddrs, n.Addr)
		}
		if n.Name != "" {
			nodeNames[n.Name] = n.ID
		}
	}
	addrs := ResolveAddresses(r.o.Prefix, nodeAddrs, addrClaims)
	_, conflicts := ResolveNames(nodeNames, nameClaims)
	conflictOf := map[ServiceID]string{}
	for _, c := range conflicts {
		conflictOf[c.Service] = c.String()
	}
	// Network-wide check budget: services in id order take their checks
	// while they fit; one that would overflow is left out of routing and
	// reported, never chosen by arrival order.
	checks := map[CheckKey]bool{}
	for i := range views {
		v := &views[i]
		a := addrs[v.ID]
		v.Addr, v.AddrMoved = a.Addr, a.Moved
		if a.Err != nil {
			v.err = errors.Join(v.err, a.Err)
		}
		v.NameConflict = conflictOf[v.ID]
		if v.err == nil {
			need := ActiveChecks([]Service{v.Service})
			added := 0
			for _, k := range need {
				if !checks[k] {
					added++
				}
			}
			if len(checks)+added > r.o.Limits.ActiveTCPChecks {
				v.err = &LimitError{Limit: "ActiveTCPChecks", Max: r.o.Limits.ActiveTCPChecks, Have: len(checks) + added, Where: "network " + r.o.Network + " with service " + v.Name}
			} else {
				for _, k := range need {
					checks[k] = true
				}
			}
		}
		if v.err != nil {
			v.Err = v.err.Error()
		}
		v.Routable = v.err == nil && v.Addr.IsValid()
	}
	return views
}

// validateMerged checks a merged configuration against the per-service
// limits; unlike Validate it does not reject fields a writer could not have
// known to be wrong (unknown nodes: membership may still be converging).
func (s *Service) validateMerged(lim Limits) error {
	if len(s.Listeners) > lim.Listeners {
		return &LimitError{Limit: "Listeners", Max: lim.Listeners, Have: len(s.Listeners), Where: "service " + s.Name}
	}
	for _, l := range s.Listeners {
		if len(l.Backends) > lim.BackendsPerListener {
			return &LimitError{Limit: "BackendsPerListener", Max: lim.BackendsPerListener, Have: len(l.Backends), Where: fmt.Sprintf("listener %s of %s", l.Key(), s.Name)}
		}
	}
	return nil
}

func revisionString(r crdt.Revision) Revision {
	if r == crdt.NoRevision {
		return ""
	}
	return Revision(fmt.Sprintf("%016x", uint64(r)))
}

func parseRevision(r Revision) (crdt.Revision, error) {
	if r == "" {
		return crdt.NoRevision, nil
	}
	v, err := strconv.ParseUint(string(r), 16, 64)
	if err != nil || len(r) != 16 {
		return 0, fmt.Errorf("%w: revision %q", ErrInvalid, r)
	}
	return crdt.Revision(v), nil
}

// List returns every active service, in id order.
func (r *Registry) List() []ServiceView {
	r.viewMu.RLock()
	defer r.viewMu.RUnlock()
	out := make([]ServiceView, len(r.views))
	for i, v := range r.views {
		v.Service = v.Service.Clone()
		out[i] = v
	}
	return out
}

// ByID returns the service with id.
func (r *Registry) ByID(id ServiceID) (ServiceView, bool) {
	r.viewMu.RLock()
	defer r.viewMu.RUnlock()
	i, ok := r.byID[id]
	if !ok {
		return ServiceView{}, false
	}
	v := r.views[i]
	v.Service = v.Service.Clone()
	return v, true
}

// Get resolves a service selector (exact name, full id or unique id
// prefix) and returns the service with its revision.
func (r *Registry) Get(sel string) (ServiceView, error) {
	views := r.List()
	cands := make([]Candidate, len(views))
	for i, v := range views {
		cands[i] = Candidate{ID: v.ID.String(), Name: v.Name}
	}
	c, err := Resolve("service", sel, cands)
	if err != nil {
		return ServiceView{}, err
	}
	id, _ := ParseServiceID(c.ID)
	v, _ := r.ByID(id)
	return v, nil
}

// ResolveNode resolves a node selector: an exact node name, a full id or a
// unique id prefix. Besides the members, it resolves departed nodes: the
// node of a stored backend that is no member (Addr invalid), named as
// FormerNodes knew it, so that its backends can be removed. Whether a
// departed node may be written as a new backend is the save's business
// (it may not).
func (r *Registry) ResolveNode(sel string) (NodeInfo, error) {
	nodes := r.nodeCandidates()
	cands := make([]Candidate, len(nodes))
	for i, n := range nodes {
		cands[i] = Candidate{ID: n.ID.String(), Name: n.Name}
	}
	c, err := Resolve("node", sel, cands)
	if err != nil {
		return NodeInfo{}, err
	}
	for _, n := range nodes {
		if n.ID.String() == c.ID {
			return n, nil
		}
	}
	return NodeInfo{}, fmt.Errorf("%w: node %q", ErrNotFound, sel)
}

// nodeCandidates returns the members, then the departed nodes: every
// node of a stored backend that is no member, and every former node,
// with the former name unless a member holds it.
func (r *Registry) nodeCandidates() []NodeInfo {
	nodes := slices.Clone(r.o.Nodes())
	member := map[NodeID]bool{}
	names := map[string]bool{}
	for _, n := range nodes {
		member[n.ID] = true
		names[n.Name] = true
	}
	add := func(id NodeID) {
		if member[id] {
			return
		}
		member[id] = true
		name := r.formerName(id)
		if names[name] {
			name = ""
		}
		nodes = append(nodes, NodeInfo{ID: id, Name: name})
	}
	for _, v := range r.List() {
		for _, l := range v.Listeners {
			for _, b := range l.Backends {
				add(b.Node)
			}
		}
	}
	if r.o.FormerNodes != nil {
		for _, n := range r.o.FormerNodes() {
			add(n.ID)
		}
	}
	return nodes
}

// formerName is the name FormerNodes gives id, or "".
func (r *Registry) formerName(id NodeID) string {
	if r.o.FormerNodes == nil {
		return ""
	}
	for _, n := range r.o.FormerNodes() {
		if n.ID == id {
			return n.Name
		}
	}
	return ""
}

// NodeName returns the name of node id: a member's current name, or the
// name FormerNodes knew for a departed node; member reports whether id is
// a member.
func (r *Registry) NodeName(id NodeID) (name string, member bool) {
	for _, n := range r.o.Nodes() {
		if n.ID == id {
			return n.Name, true
		}
	}
	return r.formerName(id), false
}

// ResolveBackend parses "NODE:PORT", NODE being a node selector. The
// backend stores the node's identity, so a renamed node remains a backend.
func (r *Registry) ResolveBackend(sel string) (Backend, error) {
	i := strings.LastIndexByte(sel, ':')
	if i <= 0 {
		return Backend{}, fmt.Errorf("%w: backend %q: want NODE:PORT", ErrInvalid, sel)
	}
	port, err := parsePort(sel[i+1:])
	if err != nil {
		return Backend{}, fmt.Errorf("%w: backend %q: %v", ErrInvalid, sel, err)
	}
	n, err := r.ResolveNode(sel[:i])
	if err != nil {
		return Backend{}, err
	}
	return Backend{Node: n.ID, Port: port}, nil
}

func (r *Registry) isMember(id NodeID) bool {
	for _, n := range r.o.Nodes() {
		if n.ID == id {
			return true
		}
	}
	return false
}

// Create makes a new, empty service with a fresh creator-bound id
// (crdt.CreatedID of this node's key and creation counter) and an address
// reservation that avoids every node address and known VIP.
func (r *Registry) Create(ctx context.Context, name string) (ServiceView, error) {
	r.mu.Lock()
	defer r.unlock()
	for _, v := range r.List() {
		if v.Name == name {
			return ServiceView{}, fmt.Errorf("%w: service %q in network %s (id %s)", ErrExists, name, r.o.Network, v.ID)
		}
	}
	for _, n := range r.o.Nodes() {
		if n.Name == name {
			return ServiceView{}, fmt.Errorf("%w: %q is a node's name in network %s", ErrExists, name, r.o.Network)
		}
	}
	if n := len(r.List()); n >= r.o.Limits.ActiveServices {
		return ServiceView{}, &LimitError{Limit: "ActiveServices", Max: r.o.Limits.ActiveServices, Have: n + 1, Where: "network " + r.o.Network}
	}
	taken := map[netip.Addr]bool{}
	for _, n := range r.o.Nodes() {
		taken[n.Addr] = true
	}
	for _, v := range r.List() {
		taken[v.Addr] = true
	}
	// The id is bound to this node's key and creation counter
	// (crdt.Replica.Create): known only once the counter is reserved, so
	// the service is validated and its address allocated inside.
	var svc Service
	cid, _, err := r.o.Replica.Create(ctx, func(id crdt.ServiceID) ([]crdt.Edit, error) {
		svc = Service{ID: ServiceID(id), Name: name, Network: r.o.Network}
		if err := svc.Validate(r.o.Limits, r.isMember); err != nil {
			return nil, err
		}
		addr, err := Allocate(svc.ID, r.o.Prefix, func(a netip.Addr) bool { return taken[a] })
		if err != nil {
			return nil, err
		}
		a4 := addr.As4()
		return []crdt.Edit{{Key: keyName, Value: []byte(name)}, {Key: keyAddr, Value: a4[:]}}, nil
	})
	if err != nil {
		return ServiceView{}, mapCrdtErr(err, Service{Name: name, Network: r.o.Network}, "", "")
	}
	svc.ID = ServiceID(cid)
	r.changed([]ServiceID{svc.ID})
	v, _ := r.ByID(svc.ID)
	return v, nil
}

// Save replaces a whole service with draft, atomically, if the service is
// still at revision shown (the revision the editor read with it). It
// validates the whole draft first. A stale draft fails with a ConflictError
// carrying the current revision, and nothing is written.
func (r *Registry) Save(ctx context.Context, draft Service, shown Revision) (ServiceView, error) {
	r.mu.Lock()
	defer r.unlock()
	return r.saveLocked(ctx, draft, shown)
}

// +checklocks:r.mu
func (r *Registry) saveLocked(ctx context.Context, draft Service, shown Revision) (ServiceView, error) {
	base, err := parseRevision(shown)
	if err != nil {
		return ServiceView{}, err
	}
	draft = draft.Clone()
	draft.Network = r.o.Network
	cur, held := r.ByID(draft.ID)
	if !held {
		if info, ok := r.o.Replica.Service(crdt.ServiceID(draft.ID)); ok && info.Deleted {
			return ServiceView{}, fmt.Errorf("%w: %s", ErrDeleted, draft.ID)
		}
		return ServiceView{}, fmt.Errorf("%w: service %s in network %s", ErrNotFound, draft.ID, r.o.Network)
	}
	if cur.Revision != shown {
		return ServiceView{}, &ConflictError{Service: draft.ID, Shown: shown, Current: cur.Revision, Resource: cur.Name}
	}
	// A backend must be on a member, unless the held service has it
	// already: a departed node's backends stay until someone removes
	// them, and never block other edits of the service.
	// The same listener means the same port and generation (0 in the
	// draft: the held one, see below).
	type heldBackend struct {
		k   PortKey
		gen uint64
		b   Backend
	}
	heldBs := map[heldBackend]bool{}
	gens := map[PortKey]uint64{}
	for _, l := range cur.Listeners {
		gens[l.Key()] = l.Generation
		for _, b := range l.Backends {
			heldBs[heldBackend{l.Key(), l.Generation, b}] = true
		}
	}
	draftGen := map[PortKey]uint64{}
	for _, l := range draft.Listeners {
		g := l.Generation
		if g == 0 {
			g = gens[l.Key()]
		}
		draftGen[l.Key()] = g
	}
	known := func(k PortKey, b Backend) bool {
		return r.isMember(b.Node) || heldBs[heldBackend{k, draftGen[k], b}]
	}
	if err := draft.validate(r.o.Limits, known); err != nil {
		return ServiceView{}, err
	}
	for _, v := range r.List() {
		if v.ID != draft.ID && v.Name == draft.Name {
			return ServiceView{}, fmt.Errorf("%w: service %q in network %s (id %s)", ErrExists, draft.Name, r.o.Network, v.ID)
		}
	}
	others := []Service{draft}
	for _, v := range r.List() {
		if v.ID != draft.ID && v.Routable {
			others = append(others, v.Service)
		}
	}
	if err := ValidateNetwork(others, r.o.Limits); err != nil {
		return ServiceView{}, err
	}
	fields := r.o.Replica.Fields(crdt.ServiceID(draft.ID))
	d, _ := decodeService(r.o.Network, draft.ID, fields)
	// Carry generations the editor did not set: a listener of the draft
	// with generation 0 that exists is the same listener.
	for i := range draft.Listeners {
		l := &draft.Listeners[i]
		if l.Generation == 0 {
			if c, ok := d.svc.Listener(l.Key()); ok {
				l.Generation = c.Generation
			}
		}
	}
	edits, err := diffEdits(d, true, draft)
	if err != nil {
		return ServiceView{}, err
	}
	if len(edits) == 0 {
		return cur, nil
	}
	if _, err := r.o.Replica.Edit(ctx, crdt.ServiceID(draft.ID), base, edits...); err != nil {
		return ServiceView{}, mapCrdtErr(err, draft, shown, cur.Revision)
	}
	r.changed([]ServiceID{draft.ID})
	v, _ := r.ByID(draft.ID)
	return v, nil
}

// mapCrdtErr turns crdt's errors into vip's, keeping the cause.
func mapCrdtErr(err error, s Service, shown, current Revision) error {
	switch {
	case errors.Is(err, crdt.ErrStaleRevision):
		return &ConflictError{Service: s.ID, Shown: shown, Current: current, Resource: s.Name}
	case errors.Is(err, crdt.ErrDeleted):
		return fmt.Errorf("%w: %w", ErrDeleted, err)
	case errors.Is(err, crdt.ErrFieldLimit), errors.Is(err, crdt.ErrServiceLimit),
		errors.Is(err, crdt.ErrTombstoneLimit), errors.Is(err, crdt.ErrSnapshotTooLarge):
		return fmt.Errorf("%w: %w", ErrLimit, err)
	}
	return err
}

// mutate applies fn to the current service selected by sel and saves the
// result at the revision it read, so the mutation is atomic: a concurrent
// change makes it retry on the new state (up to a few times), never apply
// to a state it did not read.
func (r *Registry) mutate(ctx context.Context, sel string, fn func(*Service) error) (ServiceView, error) {
	r.mu.Lock()
	defer r.unlock()
	var err error
	for range 4 {
		var cur ServiceView
		cur, err = r.Get(sel)
		if err != nil {
			return ServiceView{}, err
		}
		draft := cur.Service.Clone()
		if err = fn(&draft); err != nil {
			return ServiceView{}, err
		}
		var v ServiceView
		v, err = r.saveLocked(ctx, draft, cur.Revision)
		if !errors.Is(err, ErrConflict) {
			return v, err
		}
	}
	return ServiceView{}, err
}

// PortAdd adds a listener with its full initial backend set.
func (r *Registry) PortAdd(ctx context.Context, sel string, k PortKey, backends []Backend) (ServiceView, error) {
	return r.mutate(ctx, sel, func(s *Service) error {
		if _, ok := s.Listener(k); ok {
			return fmt.Errorf("%w: listener %s of %s", ErrExists, k, s.Name)
		}
		s.Listeners = append(s.Listeners, Listener{Proto: k.Proto, Port: k.Port, Backends: slices.Clone(backends)})
		return nil
	})
}

// BackendAdd adds a backend to a listener.
func (r *Registry) BackendAdd(ctx context.Context, sel string, k PortKey, b Backend) (ServiceView, error) {
	return r.mutate(ctx, sel, func(s *Service) error {
		l, ok := s.Listener(k)
		if !ok {
			return fmt.Errorf("%w: listener %s of %s", ErrNotFound, k, s.Name)
		}
		if slices.Contains(l.Backends, b) {
			return fmt.Errorf("%w: backend %s on %s of %s", ErrExists, b, k, s.Name)
		}
		l.Backends = append(l.Backends, b)
		return nil
	})
}

// BackendRemove removes a backend from a listener. Existing flow bindings
// to it continue until idle expiry.
func (r *Registry) BackendRemove(ctx context.Context, sel string, k PortKey, b Backend) (ServiceView, error) {
	return r.mutate(ctx, sel, func(s *Service) error {
		l, ok := s.Listener(k)
		if !ok {
			return fmt.Errorf("%w: listener %s of %s", ErrNotFound, k, s.Name)
		}
		i := slices.Index(l.Backends, b)
		if i < 0 {
			return fmt.Errorf("%w: backend %s on %s of %s", ErrNotFound, b, k, s.Name)
		}
		l.Backends = slices.Delete(l.Backends, i, i+1)
		l.Drain = slices.DeleteFunc(l.Drain, func(d Backend) bool { return d == b })
		return nil
	})
}

// BackendDrain drains a backend of a listener (drain true) or ends its
// drain (false): a draining backend takes no new bindings on any client,
// and its existing bindings go on until idle expiry. The flag is the
// backend field's value, so it costs no field (docs/backend-drain.md).
// Draining a draining backend, or undraining a serving one, changes
// nothing and succeeds.
func (r *Registry) BackendDrain(ctx context.Context, sel string, k PortKey, b Backend, drain bool) (ServiceView, error) {
	return r.mutate(ctx, sel, func(s *Service) error {
		l, ok := s.Listener(k)
		if !ok {
			return fmt.Errorf("%w: listener %s of %s", ErrNotFound, k, s.Name)
		}
		if !slices.Contains(l.Backends, b) {
			return fmt.Errorf("%w: backend %s on %s of %s", ErrNotFound, b, k, s.Name)
		}
		l.Drain = slices.DeleteFunc(l.Drain, func(d Backend) bool { return d == b })
		if drain {
			l.Drain = append(l.Drain, b)
		}
		return nil
	})
}

// PortSettings changes a listener's settings; nil fields are left alone.
type PortSettings struct {
	PortCheck   *bool
	Interval    *Duration
	Timeout     *Duration
	Failures    *int
	Successes   *int
	IdleTimeout *Duration
}

// PortSet changes a listener's check settings and idle timeout.
func (r *Registry) PortSet(ctx context.Context, sel string, k PortKey, p PortSettings) (ServiceView, error) {
	return r.mutate(ctx, sel, func(s *Service) error {
		l, ok := s.Listener(k)
		if !ok {
			return fmt.Errorf("%w: listener %s of %s", ErrNotFound, k, s.Name)
		}
		if p.PortCheck != nil {
			v := *p.PortCheck
			l.Check.PortCheck = &v
		}
		if p.Interval != nil {
			l.Check.Interval = *p.Interval
		}
		if p.Timeout != nil {
			l.Check.Timeout = *p.Timeout
		}
		if p.Failures != nil {
			l.Check.Failures = *p.Failures
		}
		if p.Successes != nil {
			l.Check.Successes = *p.Successes
		}
		if p.IdleTimeout != nil {
			l.IdleTimeout = *p.IdleTimeout
		}
		return nil
	})
}

// PortRemove removes a listener. Existing bindings drain until idle expiry;
// its backend fields never come back if the port is added again.
func (r *Registry) PortRemove(ctx context.Context, sel string, k PortKey) (ServiceView, error) {
	return r.mutate(ctx, sel, func(s *Service) error {
		i := slices.IndexFunc(s.Listeners, func(l Listener) bool { return l.Key() == k })
		if i < 0 {
			return fmt.Errorf("%w: listener %s of %s", ErrNotFound, k, s.Name)
		}
		s.Listeners = slices.Delete(s.Listeners, i, i+1)
		return nil
	})
}

// Remove deletes a service with a permanent signed tombstone. shown, when
// not empty, must be the current revision (a GUI's delete of a draft).
func (r *Registry) Remove(ctx context.Context, sel string, shown Revision) error {
	r.mu.Lock()
	defer r.unlock()
	cur, err := r.Get(sel)
	if err != nil {
		return err
	}
	base := crdt.AnyRevision
	if shown != "" {
		if shown != cur.Revision {
			return &ConflictError{Service: cur.ID, Shown: shown, Current: cur.Revision, Resource: cur.Name}
		}
		if base, err = parseRevision(shown); err != nil {
			return err
		}
	}
	if _, err := r.o.Replica.Delete(ctx, crdt.ServiceID(cur.ID), base); err != nil {
		return mapCrdtErr(err, cur.Service, shown, cur.Revision)
	}
	r.changed([]ServiceID{cur.ID})
	return nil
}

// changed records local changes committed under r.mu: the derived state is
// rebuilt at once (the rest of the mutation reads it), and OnChange hears
// of them from unlock, after r.mu is released.
//
// +checklocks:r.mu
func (r *Registry) changed(ids []ServiceID) {
	r.Refresh()
	r.pending = append(r.pending, ids...)
}

// unlock releases r.mu, then calls OnChange with the local changes made
// under it. OnChange thus never runs under a Registry lock: it may call
// any method, mutations included. Two mutations' calls may reach OnChange
// in either order; each is made after its own commit, and OnChange carries
// no state, so a receiver that reads the Registry (Engine.Apply) always
// ends on the newest.
//
// +checklocksrelease:r.mu
func (r *Registry) unlock() {
	ids := r.pending
	r.pending = nil
	r.mu.Unlock()
	if r.o.OnChange != nil && len(ids) > 0 {
		r.o.OnChange(ids, true)
	}
}

// Merged tells the Registry that merges into its replica changed ids: it
// rebuilds the derived state and calls OnChange with local false, on the
// caller's goroutine, with no Registry lock held.
func (r *Registry) Merged(ids []ServiceID) {
	r.Refresh()
	if r.o.OnChange != nil && len(ids) > 0 {
		r.o.OnChange(ids, false)
	}
}

// Replica returns the crdt replica the Registry stores in.
func (r *Registry) Replica() *crdt.Replica { return r.o.Replica }

// Nodes returns the network's members as RegistryOptions.Nodes reports them.
func (r *Registry) Nodes() []NodeInfo { return r.o.Nodes() }

// Lookup resolves a name of the network's domain (the label only, such as
// "api" of api.home) for DNS: node names first (they take precedence), then
// routable services whose name is not in conflict.
func (r *Registry) Lookup(name string) (netip.Addr, bool) {
	for _, n := range r.o.Nodes() {
		if n.Name == name && n.Addr.IsValid() {
			return n.Addr, true
		}
	}
	r.viewMu.RLock()
	defer r.viewMu.RUnlock()
	for _, v := range r.views {
		if v.Name == name && v.NameConflict == "" && v.Routable {
			return v.Addr, true
		}
	}
	return netip.Addr{}, false
}
