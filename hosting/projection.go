package hosting

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strconv"
	"time"

	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/internal/syncx"
)

// Ziti is the part of the Edge Management API that the projection calls.
// *ziti.Client implements it against a real controller; hosting/zititest
// serves a fake controller for it. Every call takes a context. The
// projection calls it with none of its locks held.
type Ziti interface {
	ListConfigTypes(ctx context.Context, filter string) ([]ziti.ConfigType, error)
	CreateConfig(ctx context.Context, c ziti.ConfigCreate) (string, error)
	PatchConfig(ctx context.Context, id string, p ziti.ConfigPatch) error
	DeleteConfig(ctx context.Context, id string) error
	ListConfigs(ctx context.Context, filter string) ([]ziti.Config, error)
	CreateService(ctx context.Context, s ziti.ServiceCreate) (string, error)
	PatchService(ctx context.Context, id string, p ziti.ServicePatch) error
	DeleteService(ctx context.Context, id string) error
	ListServices(ctx context.Context, filter string) ([]ziti.Service, error)
	CreateServicePolicy(ctx context.Context, p ziti.ServicePolicyCreate) (string, error)
	PatchServicePolicy(ctx context.Context, id string, p ziti.ServicePolicyPatch) error
	DeleteServicePolicy(ctx context.Context, id string) error
	ListServicePolicies(ctx context.Context, filter string) ([]ziti.ServicePolicy, error)
	ListIdentities(ctx context.Context, filter string) ([]ziti.Identity, error)
	ListServiceConfigs(ctx context.Context, identityID string) ([]ziti.ServiceConfig, error)
	AssignServiceConfigs(ctx context.Context, identityID string, scs []ziti.ServiceConfig) error
	RemoveServiceConfigs(ctx context.Context, identityID string, scs []ziti.ServiceConfig) error
	ListTerminators(ctx context.Context, filter string) ([]ziti.Terminator, error)
}

var _ Ziti = (*ziti.Client)(nil)

// Tag keys and values on Ziti objects. Share objects never carry
// TagAgentID: a tag holds one value and the hosts are on the rows. Only an
// agent's identity carries it.
//
// The keys the projection filters on (TagFrontdoor, TagShare) are letters
// only, because the controller's filter language (ZitiQL) allows no dash
// or digit in an identifier. TagObject and TagAgentID are never filtered
// on: they are checked on the objects a filter returned.
const (
	TagFrontdoor   = "frontdoorId"           // the frontdoor id
	TagDeployment  = "frontdoorDeploymentId" // the deployment id (ProjectionOptions.DeploymentID)
	TagShare       = "frontdoorShareId"      // the share id
	TagObject      = "frontdoor-object"      // TagStandbyHost on the standby config
	TagStandbyHost = "standby-host"
	TagAgentID     = "agent-id" // on an agent's identity: the agent id
	HostConfigType = "host.v1"
)

// HealthCheck holds the timings of the port check in every host.v1. They
// have no default.
type HealthCheck struct {
	Interval time.Duration // between two checks; at least 1s
	Timeout  time.Duration // one check's wait for the target; at least 1s
	Failures int           // consecutive failures before "mark unhealthy"; at least 1
}

// Setting keys of the health check (application.yaml's
// io.netfoundry.frontdoor.share.health-check block).
const (
	SettingInterval = "io.netfoundry.frontdoor.share.health-check.interval"
	SettingTimeout  = "io.netfoundry.frontdoor.share.health-check.timeout"
	SettingFailures = "io.netfoundry.frontdoor.share.health-check.failures"
)

// SettingMaxHosts is the setting key of the cap on a share's hosts.
const SettingMaxHosts = "io.netfoundry.frontdoor.share.max-hosts"

// MaxHostsFromSettings reads SettingMaxHosts through get: absent means
// DefaultMaxHosts; a value that is not an integer of at least 1 is
// ErrSettings.
func MaxHostsFromSettings(get func(key string) (string, bool)) (int, error) {
	v, ok := get(SettingMaxHosts)
	if !ok {
		return DefaultMaxHosts, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %v", ErrSettings, SettingMaxHosts, err)
	}
	if n < 1 {
		return 0, fmt.Errorf("%w: %s is %d, under 1", ErrSettings, SettingMaxHosts, n)
	}
	return n, nil
}

// HealthCheckFromSettings reads the three settings through get (which
// reports whether a key is set). A missing value, a duration under one
// second or failures under 1 is ErrSettings.
func HealthCheckFromSettings(get func(key string) (string, bool)) (HealthCheck, error) {
	var h HealthCheck
	var errs []error
	dur := func(key string) time.Duration {
		v, ok := get(key)
		if !ok || v == "" {
			errs = append(errs, fmt.Errorf("%w: %s is missing", ErrSettings, key))
			return 0
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %v", ErrSettings, key, err))
			return 0
		}
		return d
	}
	h.Interval = dur(SettingInterval)
	h.Timeout = dur(SettingTimeout)
	if v, ok := get(SettingFailures); !ok || v == "" {
		errs = append(errs, fmt.Errorf("%w: %s is missing", ErrSettings, SettingFailures))
	} else if n, err := strconv.Atoi(v); err != nil {
		errs = append(errs, fmt.Errorf("%w: %s: %v", ErrSettings, SettingFailures, err))
	} else {
		h.Failures = n
	}
	if len(errs) > 0 {
		return HealthCheck{}, errors.Join(errs...)
	}
	return h, h.Validate()
}

// Validate checks the ranges: both durations at least one second, failures
// at least 1.
func (h HealthCheck) Validate() error {
	var errs []error
	if h.Interval < time.Second {
		errs = append(errs, fmt.Errorf("%w: interval %v is under 1s", ErrSettings, h.Interval))
	}
	if h.Timeout < time.Second {
		errs = append(errs, fmt.Errorf("%w: timeout %v is under 1s", ErrSettings, h.Timeout))
	}
	if h.Failures < 1 {
		errs = append(errs, fmt.Errorf("%w: failures %d is under 1", ErrSettings, h.Failures))
	}
	return errors.Join(errs...)
}

// ProjectionOptions configure a Projection.
type ProjectionOptions struct {
	FrontdoorID string      // required: this frontdoor's id, in names and tags
	HealthCheck HealthCheck // required: see HealthCheck.Validate
	// DeploymentID names this deployment (one database and its
	// replicas). Every object the projection writes carries it under
	// TagDeployment, and the reconciler deletes an orphan only when it
	// carries this id: objects without it, or with another deployment's,
	// are never deleted. Empty writes no such tag and turns the orphan
	// clean-up off.
	DeploymentID string
}

// Projection writes a share's hosts to Ziti: the share's host.v1 at
// precedence required, the standby host.v1 at default while the share has a
// passive, one override per passive (service → standby config), and the bind
// policy naming every host. Its writes follow the order in the package
// doc, so that a passive never binds at required. It is
// safe for concurrent use; writes for one share must be serialized by the
// caller (the store's lock does it).
type Projection struct {
	z Ziti
	o ProjectionOptions
	// mu guards ct. It is never held while Ziti is called.
	mu syncx.Mutex
	// ct is the host.v1 config type id, once found.
	// +checklocks:mu
	ct string
}

// NewProjection checks the options and returns a projection over z.
func NewProjection(z Ziti, o ProjectionOptions) (*Projection, error) {
	if z == nil {
		return nil, fmt.Errorf("%w: no Ziti client", ErrInvalidOptions)
	}
	if o.FrontdoorID == "" {
		return nil, fmt.Errorf("%w: no frontdoor id", ErrInvalidOptions)
	}
	if err := o.HealthCheck.Validate(); err != nil {
		return nil, err
	}
	return &Projection{z: z, o: o}, nil
}

// Names of a share's Ziti objects.
func (p *Projection) serviceName(s Share) string {
	return s.Name + " | " + p.o.FrontdoorID + " | " + s.ID
}
func (p *Projection) hostConfigName(s Share) string {
	return s.Name + " | host | " + p.o.FrontdoorID + " | " + s.ID
}

// StandbyConfigName is the name of the share's standby host.v1.
func (p *Projection) StandbyConfigName(s Share) string {
	return s.Name + " | standby | " + p.o.FrontdoorID + " | " + s.ID
}
func (p *Projection) bindPolicyName(s Share) string {
	return s.Name + " | bind | " + p.o.FrontdoorID + " | " + s.ID
}

func (p *Projection) tags(s Share) ziti.Tags {
	t := ziti.Tags{TagFrontdoor: p.o.FrontdoorID, TagShare: s.ID}
	if p.o.DeploymentID != "" {
		t[TagDeployment] = p.o.DeploymentID
	}
	return t
}

func (p *Projection) standbyTags(s Share) ziti.Tags {
	t := p.tags(s)
	t[TagObject] = TagStandbyHost
	return t
}

// AgentAttribute is the role attribute of an agent's identity.
func AgentAttribute(agent string) string { return "agent | " + agent }

// AgentRole is the bind policy's identity role of an agent:
// "#agent | <id>".
func AgentRole(agent string) string { return "#" + AgentAttribute(agent) }

// PortCheckAddress is the address of the port check: host:port, with an
// IPv6 literal in brackets.
func PortCheckAddress(addr string, port uint16) string {
	return net.JoinHostPort(addr, strconv.Itoa(int(port)))
}

// HostConfigData is the body of a host.v1 at precedence (required for the
// share's own config, default for the standby one).
func (p *Projection) HostConfigData(s Share, precedence string) map[string]any {
	h := p.o.HealthCheck
	d := map[string]any{
		"protocol": "tcp",
		"address":  s.TargetAddress,
		"port":     int(s.TargetPort),
		"listenOptions": map[string]any{
			"precedence": precedence,
		},
		"portChecks": []any{map[string]any{
			"address":  PortCheckAddress(s.TargetAddress, s.TargetPort),
			"interval": h.Interval.String(),
			"timeout":  h.Timeout.String(),
			"actions": []any{
				map[string]any{"trigger": "fail", "consecutiveEvents": h.Failures, "action": "mark unhealthy"},
				map[string]any{"trigger": "pass", "action": "mark healthy"},
			},
		}},
	}
	return normJSON(d)
}

// normJSON round-trips v through JSON so that it compares equal to what the
// controller answers.
func normJSON(v map[string]any) map[string]any {
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out map[string]any
	if json.Unmarshal(b, &out) != nil {
		return v
	}
	return out
}

// hostConfigType returns the id of the host.v1 config type, asking Ziti
// the first time. Ziti is the caller's and is called with no lock held (it
// may call the projection); lookups that race all ask, and the first
// answer is kept: the controller gives every one the same id.
func (p *Projection) hostConfigType(ctx context.Context) (string, error) {
	p.mu.Lock()
	ct := p.ct
	p.mu.Unlock()
	if ct != "" {
		return ct, nil
	}
	cts, err := p.z.ListConfigTypes(ctx, ziti.Eq("name", HostConfigType))
	if err != nil {
		return "", err
	}
	for _, c := range cts {
		if c.Name == HostConfigType {
			p.mu.Lock()
			if p.ct == "" {
				p.ct = c.ID
			}
			ct = p.ct
			p.mu.Unlock()
			return ct, nil
		}
	}
	return "", fmt.Errorf("%w: config type %s not found", ErrZitiState, HostConfigType)
}

// Problem says why a host cannot be projected, or what Ziti lacks for it
// (HostStatus.Problem). The empty Problem is none.
type Problem string

// The problems of a host.
const (
	// ProblemNoIdentity: the agent is live but has no Ziti identity (none
	// carries its agent-id tag). A passive then gets no override and is
	// kept off the bind policy.
	ProblemNoIdentity Problem = "NO_IDENTITY"
	// ProblemManyIdentities: more than one identity carries the agent's
	// agent-id tag, so its override cannot be placed.
	ProblemManyIdentities Problem = "MANY_IDENTITIES"
	// ProblemNoOverride: a passive's identity does not hold the override
	// that points the share's service at the standby config.
	ProblemNoOverride Problem = "NO_OVERRIDE"
	// ProblemNotOnBindPolicy: the share's bind policy does not name the
	// host, so it cannot bind.
	ProblemNotOnBindPolicy Problem = "NOT_ON_BIND_POLICY"
)

// identity finds the identity of an agent by its agent-id tag. It returns
// ProblemNoIdentity when none carries it and ProblemManyIdentities when
// several do; err is only a failed call. The filter selects the
// identities with the agent's role attribute (the one the bind policy
// names), as ZitiQL cannot name the dashed tag key; the tag then decides.
func (p *Projection) identity(ctx context.Context, agent string) (string, Problem, error) {
	found, err := p.identities(ctx, agent)
	switch {
	case err != nil:
		return "", "", err
	case len(found) == 0:
		return "", ProblemNoIdentity, nil
	case len(found) == 1:
		return found[0], "", nil
	}
	return "", ProblemManyIdentities, nil
}

// identities returns every identity that carries agent's agent-id tag.
func (p *Projection) identities(ctx context.Context, agent string) ([]string, error) {
	ids, err := p.z.ListIdentities(ctx, ziti.AnyOfEq("roleAttributes", AgentAttribute(agent)))
	if err != nil {
		return nil, err
	}
	var found []string
	for _, id := range ids {
		if v, _ := id.Tags[TagAgentID].(string); v == agent {
			found = append(found, id.ID)
		}
	}
	return found, nil
}

// problemError is the error of a host problem where a write cannot go on
// without that host.
func problemError(agent string, pr Problem) error {
	if pr == ProblemManyIdentities {
		return fmt.Errorf("%w: agent %s has more than one identity", ErrZitiState, agent)
	}
	return fmt.Errorf("%w: agent %s", ErrNoIdentity, agent)
}

// objects are a share's objects in Ziti, found by tag.
type objects struct {
	service     string
	serviceName string
	svc         ziti.Service
	hostConfig  *ziti.Config
	standby     *ziti.Config
	policy      *ziti.ServicePolicy
}

func isStandby(c ziti.Config) bool {
	v, _ := c.Tags[TagObject].(string)
	return v == TagStandbyHost
}

// find reads a share's objects: its services, configs and policies, with
// the three lists sent at once.
func (p *Projection) find(ctx context.Context, s Share) (objects, error) {
	var o objects
	byShare := ziti.And(ziti.Eq("tags."+TagShare, s.ID), ziti.Eq("tags."+TagFrontdoor, p.o.FrontdoorID))
	var svcs []ziti.Service
	var cfgs []ziti.Config
	var pols []ziti.ServicePolicy
	var ct string
	err := concurrently(
		func() (err error) { svcs, err = p.z.ListServices(ctx, byShare); return err },
		func() (err error) {
			if ct, err = p.hostConfigType(ctx); err != nil {
				return err
			}
			cfgs, err = p.z.ListConfigs(ctx, byShare)
			return err
		},
		func() (err error) { pols, err = p.z.ListServicePolicies(ctx, byShare); return err },
	)
	if err != nil {
		return o, err
	}
	if len(svcs) > 1 {
		return o, fmt.Errorf("%w: share %s has %d services", ErrZitiState, s.ID, len(svcs))
	}
	if len(svcs) == 1 {
		o.service, o.serviceName, o.svc = svcs[0].ID, svcs[0].Name, svcs[0]
	}
	for i := range cfgs {
		c := cfgs[i]
		if c.ConfigTypeID != ct {
			continue
		}
		slot := &o.hostConfig
		if isStandby(c) {
			slot = &o.standby
		}
		if *slot != nil {
			return o, fmt.Errorf("%w: share %s has two host.v1 configs of one kind", ErrZitiState, s.ID)
		}
		*slot = &c
	}
	for i := range pols {
		if pols[i].Type != ziti.PolicyBind {
			continue
		}
		if o.policy != nil {
			return o, fmt.Errorf("%w: share %s has two bind policies", ErrZitiState, s.ID)
		}
		o.policy = &pols[i]
	}
	return o, nil
}

// errCompensation marks the failure of a clean-up that undoes Ziti
// writes: Ziti may then hold objects the store does not.
var errCompensation = errors.New("hosting: Ziti clean-up failed")

// Project creates a new share's objects: host.v1, service, the standby
// config when it has passives, each passive's override, then the bind
// policy. Identities are looked up first, so a failed lookup leaves nothing
// in Ziti; any later failure removes what was created (DeProject).
func (p *Projection) Project(ctx context.Context, s Share) (err error) {
	ct, err := p.hostConfigType(ctx)
	if err != nil {
		return err
	}
	idents, _, err := p.passiveIdentities(ctx, s.Hosts.Passive, nil, false)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			if derr := p.DeProject(context.WithoutCancel(ctx), s); derr != nil {
				err = errors.Join(err, fmt.Errorf("%w: %w", errCompensation, derr))
			}
		}
	}()
	hc, err := p.z.CreateConfig(ctx, ziti.ConfigCreate{Name: p.hostConfigName(s), ConfigTypeID: ct, Data: p.HostConfigData(s, ziti.PrecedenceRequired), Tags: p.tags(s)})
	if err != nil {
		return err
	}
	svc, err := p.z.CreateService(ctx, ziti.ServiceCreate{Name: p.serviceName(s), Configs: []string{hc}, EncryptionRequired: true, Tags: p.tags(s)})
	if err != nil {
		return err
	}
	o := objects{service: svc}
	roles, err := p.standbySide(ctx, s, &o, ct, idents, true)
	if err != nil {
		return err
	}
	roles = append(roles, agentRoles(s.Hosts.Active)...)
	slices.Sort(roles)
	_, err = p.z.CreateServicePolicy(ctx, ziti.ServicePolicyCreate{
		Name: p.bindPolicyName(s), Type: ziti.PolicyBind, Semantic: ziti.AnyOf,
		ServiceRoles: []string{"@" + svc}, IdentityRoles: roles, Tags: p.tags(s),
	})
	return err
}

func agentRoles(agents []string) []string {
	out := make([]string, 0, len(agents))
	for _, a := range agents {
		out = append(out, AgentRole(a))
	}
	return out
}

// passiveIdentities resolves the identities of passives. A deleted one
// (deleted[agent]) is skipped. A live one whose identity cannot be
// resolved fails with ErrNoIdentity (or ErrZitiState for several), unless
// skipBroken: then it is left out and listed in broken.
func (p *Projection) passiveIdentities(ctx context.Context, passives []string, deleted map[string]bool, skipBroken bool) (out map[string]string, broken []string, err error) {
	var live []string
	for _, a := range passives {
		if !deleted[a] {
			live = append(live, a)
		}
	}
	// The lookups go at once; the results are read in the passives' order.
	ids := make([]string, len(live))
	prs := make([]Problem, len(live))
	fns := make([]func() error, len(live))
	for i, a := range live {
		fns[i] = func() (err error) { ids[i], prs[i], err = p.identity(ctx, a); return err }
	}
	if err := concurrently(fns...); err != nil {
		return nil, nil, err
	}
	out = map[string]string{}
	for i, a := range live {
		if pr := prs[i]; pr != "" {
			if !skipBroken {
				return nil, nil, problemError(a, pr)
			}
			broken = append(broken, a)
			continue
		}
		out[a] = ids[i]
	}
	return out, broken, nil
}

// standbySide makes sure the standby config exists (created or healed) when
// s has passives, and that every passive with an identity holds its
// override. It returns the bind-policy roles of the passives that hold one.
func (p *Projection) standbySide(ctx context.Context, s Share, o *objects, ct string, idents map[string]string, fresh bool) ([]string, error) {
	if len(s.Hosts.Passive) == 0 {
		return nil, nil
	}
	want := p.HostConfigData(s, ziti.PrecedenceDefault)
	name := p.StandbyConfigName(s)
	if o.standby == nil {
		id, err := p.z.CreateConfig(ctx, ziti.ConfigCreate{Name: name, ConfigTypeID: ct, Data: want, Tags: p.standbyTags(s)})
		if err != nil {
			return nil, err
		}
		o.standby = &ziti.Config{ID: id, Name: name, ConfigTypeID: ct, Data: want, Tags: p.standbyTags(s)}
	} else if o.standby.Name != name || !reflect.DeepEqual(normJSON(o.standby.Data), want) {
		if err := p.z.PatchConfig(ctx, o.standby.ID, ziti.ConfigPatch{Name: &name, Data: want}); err != nil {
			return nil, err
		}
	}
	// The passives' override lists are read at once, then the missing
	// pairs assigned at once: each identity's writes are its own, and all
	// of them come after the standby config and before the bind policy.
	// A service created by this call (fresh) is named by no override yet,
	// so its lists are not read.
	pair := ziti.ServiceConfig{ServiceID: o.service, ConfigID: o.standby.ID}
	var roles, holders []string
	for _, a := range s.Hosts.Passive {
		if _, ok := idents[a]; ok {
			holders = append(holders, a) // not a deleted agent or a broken one
			roles = append(roles, AgentRole(a))
		}
	}
	missing := make([]bool, len(holders))
	if !fresh {
		fns := make([]func() error, len(holders))
		for i, a := range holders {
			fns[i] = func() error {
				have, err := p.z.ListServiceConfigs(ctx, idents[a])
				missing[i] = !slices.Contains(have, pair)
				return err
			}
		}
		if err := concurrently(fns...); err != nil {
			return nil, err
		}
	}
	var fns []func() error
	for i, a := range holders {
		if fresh || missing[i] {
			fns = append(fns, func() error { return p.z.AssignServiceConfigs(ctx, idents[a], []ziti.ServiceConfig{pair}) })
		}
	}
	if err := concurrently(fns...); err != nil {
		return nil, err
	}
	return roles, nil
}

// UpdateOptions tune Projection.UpdateWith.
type UpdateOptions struct {
	// Deleted names the hosts whose agents are deleted: they are skipped
	// on assign, and a missing identity on remove is expected.
	Deleted map[string]bool
	// SkipBroken makes a live passive whose identity cannot be resolved
	// (ProblemNoIdentity, ProblemManyIdentities) a broken host instead of
	// a failure: it gets no override, stays off the bind policy (without
	// its override it would bind at required), and the update goes on for
	// the other hosts. The cascades set it, so that one broken host does
	// not block another host's removal; API updates do not, and fail with
	// ErrNoIdentity. A passive leaving the share loses its override on
	// every identity that carries its tag, however many there are.
	SkipBroken bool
}

// Update is UpdateWith with only Deleted set: a passive that cannot be
// resolved fails it.
func (p *Projection) Update(ctx context.Context, prev, cur Share, deleted map[string]bool) error {
	_, err := p.UpdateWith(ctx, prev, cur, UpdateOptions{Deleted: deleted})
	return err
}

// UpdateWith moves Ziti from prev to cur, in the package doc's order, and
// returns the broken hosts it skipped (with o.SkipBroken), sorted. It is
// symmetric, so UpdateWith(ctx, cur, prev, o) is the compensation of a
// failed UpdateWith(ctx, prev, cur, o).
func (p *Projection) UpdateWith(ctx context.Context, prev, cur Share, o UpdateOptions) ([]string, error) {
	ct, err := p.hostConfigType(ctx)
	if err != nil {
		return nil, err
	}
	// Lookups first, all at once: a failed one leaves nothing changed.
	// Passives of prev that are not passives of cur are looked up with
	// every identity that carries their tag: an override is removed from
	// each, so none is left to name the standby config when it goes.
	var leavers []string
	for _, a := range prev.Hosts.Passive {
		if _, still := slices.BinarySearch(cur.Hosts.Passive, a); !still {
			leavers = append(leavers, a)
		}
	}
	var obj objects
	var idents map[string]string
	var broken []string
	leaverIDs := make([][]string, len(leavers))
	var ferr error
	fns := []func() error{
		func() error { obj, ferr = p.find(ctx, cur); return nil },
		func() (err error) {
			idents, broken, err = p.passiveIdentities(ctx, cur.Hosts.Passive, o.Deleted, o.SkipBroken)
			return err
		},
	}
	for i, a := range leavers {
		fns = append(fns, func() (err error) { leaverIDs[i], err = p.identities(ctx, a); return err })
	}
	err = concurrently(fns...)
	if ferr != nil {
		return nil, ferr
	}
	if obj.service == "" || obj.hostConfig == nil || obj.policy == nil {
		return nil, fmt.Errorf("%w: share %s is not projected", ErrZitiState, cur.ID)
	}
	if err != nil {
		return nil, err
	}
	leaving := map[string][]string{}
	for i, a := range leavers {
		if len(leaverIDs[i]) > 0 {
			leaving[a] = leaverIDs[i]
		}
	}
	slices.Sort(broken)
	return broken, p.write(ctx, cur, &obj, ct, idents, leaving)
}

// write makes the writes of UpdateWith, once every lookup is done.
func (p *Projection) write(ctx context.Context, cur Share, o *objects, ct string, idents map[string]string, leaving map[string][]string) error {
	// A rename renames every object: the service here, both host.v1
	// configs and the bind policy below.
	if name := p.serviceName(cur); o.serviceName != name {
		if err := p.z.PatchService(ctx, o.service, ziti.ServicePatch{Name: &name}); err != nil {
			return err
		}
	}
	// Heal or patch the share's own host.v1, before the standby side.
	name, want := p.hostConfigName(cur), p.HostConfigData(cur, ziti.PrecedenceRequired)
	if o.hostConfig.Name != name || !reflect.DeepEqual(normJSON(o.hostConfig.Data), want) {
		if err := p.z.PatchConfig(ctx, o.hostConfig.ID, ziti.ConfigPatch{Name: &name, Data: want}); err != nil {
			return err
		}
	}
	// Standby config, then overrides.
	passRoles, err := p.standbySide(ctx, cur, o, ct, idents, false)
	if err != nil {
		return err
	}
	// Passive → active: remove the override; the host rebinds at required.
	removeOverride := func(a string, idents []string) error {
		if o.standby == nil {
			return nil // no standby config, so no override can name it
		}
		for _, ident := range idents {
			err := p.z.RemoveServiceConfigs(ctx, ident, []ziti.ServiceConfig{{ServiceID: o.service, ConfigID: o.standby.ID}})
			if err != nil && !ziti.IsNotFound(err) {
				return err
			}
		}
		return nil
	}
	var removed []string
	for _, a := range slices.Sorted(mapsKeys(leaving)) {
		if _, nowActive := slices.BinarySearch(cur.Hosts.Active, a); nowActive {
			if err := removeOverride(a, leaving[a]); err != nil {
				return err
			}
		} else {
			removed = append(removed, a)
		}
	}
	// Bind policy, by difference with the whole role set.
	roles := append(agentRoles(cur.Hosts.Active), passRoles...)
	slices.Sort(roles)
	have := slices.Sorted(slices.Values(o.policy.IdentityRoles))
	var patch ziti.ServicePolicyPatch
	if !slices.Equal(have, roles) {
		patch.IdentityRoles = &roles
	}
	if name := p.bindPolicyName(cur); o.policy.Name != name {
		patch.Name = &name
	}
	if patch.IdentityRoles != nil || patch.Name != nil {
		if err := p.z.PatchServicePolicy(ctx, o.policy.ID, patch); err != nil {
			return err
		}
	}
	// Passives that left: override after the policy.
	for _, a := range removed {
		if err := removeOverride(a, leaving[a]); err != nil {
			return err
		}
	}
	// The standby config goes last, once no passive remains.
	if len(cur.Hosts.Passive) == 0 && o.standby != nil {
		if err := p.z.DeleteConfig(ctx, o.standby.ID); err != nil && !ziti.IsNotFound(err) {
			return err
		}
	}
	return nil
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// DeProject removes a share's objects by tag: policies, then the service
// (which removes its overrides), then the configs. Objects already gone are
// fine.
func (p *Projection) DeProject(ctx context.Context, s Share) error {
	byShare := ziti.And(ziti.Eq("tags."+TagShare, s.ID), ziti.Eq("tags."+TagFrontdoor, p.o.FrontdoorID))
	pols, err := p.z.ListServicePolicies(ctx, byShare)
	if err != nil {
		return err
	}
	for _, pol := range pols {
		if err := p.z.DeleteServicePolicy(ctx, pol.ID); err != nil && !ziti.IsNotFound(err) {
			return err
		}
	}
	svcs, err := p.z.ListServices(ctx, byShare)
	if err != nil {
		return err
	}
	for _, svc := range svcs {
		if err := p.z.DeleteService(ctx, svc.ID); err != nil && !ziti.IsNotFound(err) {
			return err
		}
	}
	cfgs, err := p.z.ListConfigs(ctx, byShare)
	if err != nil {
		return err
	}
	for _, c := range cfgs {
		if err := p.z.DeleteConfig(ctx, c.ID); err != nil && !ziti.IsNotFound(err) {
			return err
		}
	}
	return nil
}
