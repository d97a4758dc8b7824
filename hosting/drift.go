package hosting

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/vipkit/vipkit/hosting/ziti"
)

// DriftKind is one kind of difference between a share's Ziti objects and
// what the projection wants.
type DriftKind string

// The kinds of drift, in the order the reconciler repairs them.
const (
	// DriftMissing: the share's service, own host.v1 or bind policy is
	// gone. The repair removes what is left of the share by tag and
	// projects it again.
	DriftMissing DriftKind = "MISSING"
	// DriftTags: an object of the share lacks the deployment tag.
	DriftTags DriftKind = "TAGS"
	// DriftName: an object's name is not the one the share's name gives.
	DriftName DriftKind = "NAME"
	// DriftConfig: a host.v1 body differs from the one this build
	// writes, or the service's config list is not the share's host.v1.
	DriftConfig DriftKind = "CONFIG"
	// DriftStandbyMissing: the share has a passive and no standby config.
	DriftStandbyMissing DriftKind = "STANDBY_MISSING"
	// DriftOverrideMissing: a passive's identity does not see the standby
	// config for the share's service, so it binds at required.
	DriftOverrideMissing DriftKind = "OVERRIDE_MISSING"
	// DriftOverrideStray: an active's identity, or an identity that hosts
	// nothing of the share, holds an override for the share's service.
	// On an active it binds at default, below the other actives.
	DriftOverrideStray DriftKind = "OVERRIDE_STRAY"
	// DriftBindPolicy: the bind policy's identity roles or service roles
	// are not the share's hosts and service.
	DriftBindPolicy DriftKind = "BIND_POLICY"
	// DriftStandbyStray: the share has no passive and still has a standby
	// config.
	DriftStandbyStray DriftKind = "STANDBY_STRAY"
	// DriftOrphan: an object tagged with this deployment whose share is
	// not live. It is deleted once older than the grace period and not
	// named in the outbox.
	DriftOrphan DriftKind = "ORPHAN"
	// DriftBroken: a difference the reconciler cannot repair (a live
	// agent with no identity or several, two services or policies for one
	// share). It is reported, never written.
	DriftBroken DriftKind = "BROKEN"
)

// Reasons a drift is listed and not repaired (Drift.Held).
const (
	HeldDryRun    = "dry run"
	HeldRateLimit = "rate limit"
	HeldGrace     = "younger than the grace period"
	HeldOutbox    = "named in the outbox"
	HeldNoDeploy  = "no deployment id"
	HeldTracking  = "tracking limit"
)

// Drift is one difference the reconciler found.
type Drift struct {
	ShareID string    `json:"shareId"`
	Kind    DriftKind `json:"kind"`
	// Object is the Ziti object concerned: a config, service or policy
	// id, or for an override the identity id.
	Object  string `json:"object,omitempty"`
	AgentID string `json:"agentId,omitempty"`
	Detail  string `json:"detail"`
	// Repaired is set when the reconciler wrote the repair.
	Repaired bool `json:"repaired"`
	// Held says why a drift was left as it is (Held* constants); empty
	// when it was repaired or is DriftBroken.
	Held string `json:"held,omitempty"`
}

// driftRun collects the drifts of one share and makes (or, dry, skips) the
// writes that repair them.
type driftRun struct {
	share  string
	dry    bool
	out    []Drift
	writes int
}

// fix records a drift and, unless dry, runs its repair.
func (d *driftRun) fix(ctx context.Context, dr Drift, repair func(ctx context.Context) error) error {
	dr.ShareID = d.share
	if d.dry {
		dr.Held = HeldDryRun
		d.out = append(d.out, dr)
		return nil
	}
	if err := repair(ctx); err != nil {
		d.out = append(d.out, dr)
		return fmt.Errorf("hosting: repair %s of share %s: %w", dr.Kind, d.share, err)
	}
	dr.Repaired = true
	d.writes++
	d.out = append(d.out, dr)
	return nil
}

func (d *driftRun) broken(agent, detail string) {
	d.out = append(d.out, Drift{ShareID: d.share, Kind: DriftBroken, AgentID: agent, Detail: detail})
}

// withDeployment returns t with the deployment tag, and whether t lacked it.
func (p *Projection) withDeployment(t ziti.Tags) (ziti.Tags, bool) {
	if p.o.DeploymentID == "" {
		return t, false
	}
	if v, _ := t[TagDeployment].(string); v == p.o.DeploymentID {
		return t, false
	}
	out := maps.Clone(t)
	if out == nil {
		out = ziti.Tags{}
	}
	out[TagDeployment] = p.o.DeploymentID
	return out, true
}

// agentOfRole returns the agent of a bind-policy role "#agent | <id>".
func agentOfRole(role string) (string, bool) {
	return strings.CutPrefix(role, "#agent | ")
}

// reconcileInto compares one live share, locked by the caller, with its
// Ziti objects and repairs every difference (or, d.dry, only lists them),
// in the projection's write order: a passive gets its override before it
// goes on the bind policy, and the standby config goes after every
// override that names it. deleted names the hosts whose agents are
// deleted: they are skipped, as in an update.
func (p *Projection) reconcileInto(ctx context.Context, d *driftRun, s Share, deleted map[string]bool) error {
	ct, err := p.hostConfigType(ctx)
	if err != nil {
		return err
	}
	o, err := p.find(ctx, s)
	if errors.Is(err, ErrZitiState) {
		d.broken("", err.Error())
		return nil
	}
	if err != nil {
		return err
	}
	if o.service == "" || o.hostConfig == nil || o.policy == nil {
		return d.fix(ctx, Drift{Kind: DriftMissing, Object: o.service, Detail: fmt.Sprintf("service %t, host.v1 %t, bind policy %t: projected again",
			o.service != "", o.hostConfig != nil, o.policy != nil)}, func(ctx context.Context) error {
			if err := p.DeProject(ctx, s); err != nil {
				return err
			}
			return p.Project(ctx, s)
		})
	}
	// Identities first, as in an update: a lookup that fails writes
	// nothing.
	activeIDs := map[string][]string{}
	for _, a := range s.Hosts.Active {
		if deleted[a] {
			continue
		}
		ids, err := p.identities(ctx, a)
		if err != nil {
			return err
		}
		if len(ids) == 0 {
			d.broken(a, fmt.Sprintf("active %s: %s; it cannot bind", a, ProblemNoIdentity))
		}
		activeIDs[a] = ids
	}
	passiveID := map[string]string{}
	for _, a := range s.Hosts.Passive {
		if deleted[a] {
			continue
		}
		id, pr, err := p.identity(ctx, a)
		if err != nil {
			return err
		}
		if pr != "" {
			d.broken(a, fmt.Sprintf("passive %s: %s; kept off the bind policy", a, pr))
			continue
		}
		passiveID[a] = id
	}
	// Identities named on the policy that host nothing of the share: an
	// override they hold for the service is stray.
	others := map[string][]string{}
	for _, r := range o.policy.IdentityRoles {
		a, ok := agentOfRole(r)
		if !ok {
			continue
		}
		if _, isHost := s.Hosts.RoleOf(a); isHost {
			continue
		}
		ids, err := p.identities(ctx, a)
		if err != nil {
			return err
		}
		others[a] = ids
	}

	// Tags.
	tagged := func(kind, id string, t ziti.Tags, patch func(ctx context.Context, t ziti.Tags) error) error {
		nt, lacks := p.withDeployment(t)
		if !lacks {
			return nil
		}
		return d.fix(ctx, Drift{Kind: DriftTags, Object: id, Detail: kind + " lacks tag " + TagDeployment},
			func(ctx context.Context) error { return patch(ctx, nt) })
	}
	svc := o.svc
	if err := tagged("service", o.service, svc.Tags, func(ctx context.Context, t ziti.Tags) error {
		return p.z.PatchService(ctx, o.service, ziti.ServicePatch{Tags: t})
	}); err != nil {
		return err
	}
	for _, c := range []*ziti.Config{o.hostConfig, o.standby} {
		if c == nil {
			continue
		}
		id := c.ID
		if err := tagged("host.v1", id, c.Tags, func(ctx context.Context, t ziti.Tags) error {
			return p.z.PatchConfig(ctx, id, ziti.ConfigPatch{Tags: t})
		}); err != nil {
			return err
		}
	}
	if err := tagged("bind policy", o.policy.ID, o.policy.Tags, func(ctx context.Context, t ziti.Tags) error {
		return p.z.PatchServicePolicy(ctx, o.policy.ID, ziti.ServicePolicyPatch{Tags: t})
	}); err != nil {
		return err
	}

	// The service: name and configs.
	if name := p.serviceName(s); o.serviceName != name {
		if err := d.fix(ctx, Drift{Kind: DriftName, Object: o.service, Detail: fmt.Sprintf("service named %q, want %q", o.serviceName, name)},
			func(ctx context.Context) error {
				return p.z.PatchService(ctx, o.service, ziti.ServicePatch{Name: &name})
			}); err != nil {
			return err
		}
	}
	if want := []string{o.hostConfig.ID}; !slices.Equal(svc.Configs, want) {
		if err := d.fix(ctx, Drift{Kind: DriftConfig, Object: o.service, Detail: fmt.Sprintf("service configs %v, want %v", svc.Configs, want)},
			func(ctx context.Context) error {
				return p.z.PatchService(ctx, o.service, ziti.ServicePatch{Configs: &want})
			}); err != nil {
			return err
		}
	}
	// The share's own host.v1.
	if err := p.fixConfig(ctx, d, o.hostConfig, p.hostConfigName(s), p.HostConfigData(s, ziti.PrecedenceRequired)); err != nil {
		return err
	}
	// The standby config, while the share has a passive.
	if len(s.Hosts.Passive) > 0 {
		name, want := p.StandbyConfigName(s), p.HostConfigData(s, ziti.PrecedenceDefault)
		if o.standby == nil {
			if err := d.fix(ctx, Drift{Kind: DriftStandbyMissing, Detail: "the share has passives and no standby config"}, func(ctx context.Context) error {
				id, err := p.z.CreateConfig(ctx, ziti.ConfigCreate{Name: name, ConfigTypeID: ct, Data: want, Tags: p.standbyTags(s)})
				if err != nil {
					return err
				}
				o.standby = &ziti.Config{ID: id, Name: name, ConfigTypeID: ct, Data: want, Tags: p.standbyTags(s)}
				return nil
			}); err != nil {
				return err
			}
		} else if err := p.fixConfig(ctx, d, o.standby, name, want); err != nil {
			return err
		}
	}
	// Overrides: every passive holds one, then no active does.
	for _, a := range s.Hosts.Passive {
		ident, ok := passiveID[a]
		if !ok {
			continue
		}
		have := false
		if o.standby != nil {
			scs, err := p.z.ListServiceConfigs(ctx, ident)
			if err != nil {
				return err
			}
			have = slices.Contains(scs, ziti.ServiceConfig{ServiceID: o.service, ConfigID: o.standby.ID})
		}
		if have {
			continue
		}
		if err := d.fix(ctx, Drift{Kind: DriftOverrideMissing, Object: ident, AgentID: a, Detail: "passive " + a + " does not see the standby config"},
			func(ctx context.Context) error {
				return p.z.AssignServiceConfigs(ctx, ident, []ziti.ServiceConfig{{ServiceID: o.service, ConfigID: o.standby.ID}})
			}); err != nil {
			return err
		}
	}
	stray := func(who, a string, idents []string) error {
		for _, ident := range idents {
			scs, err := p.z.ListServiceConfigs(ctx, ident)
			if err != nil {
				return err
			}
			for _, sc := range scs {
				if sc.ServiceID != o.service {
					continue
				}
				if err := d.fix(ctx, Drift{Kind: DriftOverrideStray, Object: ident, AgentID: a, Detail: fmt.Sprintf("%s %s holds an override (config %s)", who, a, sc.ConfigID)},
					func(ctx context.Context) error {
						err := p.z.RemoveServiceConfigs(ctx, ident, []ziti.ServiceConfig{sc})
						if ziti.IsNotFound(err) {
							return nil
						}
						return err
					}); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, a := range s.Hosts.Active {
		if err := stray("active", a, activeIDs[a]); err != nil {
			return err
		}
	}
	// The bind policy: every active, and the passives that hold their
	// override (or get it above).
	roles := agentRoles(s.Hosts.Active)
	for a := range passiveID {
		roles = append(roles, AgentRole(a))
	}
	slices.Sort(roles)
	var patch ziti.ServicePolicyPatch
	var why []string
	if have := slices.Sorted(slices.Values(o.policy.IdentityRoles)); !slices.Equal(have, roles) {
		patch.IdentityRoles = &roles
		why = append(why, fmt.Sprintf("identity roles %v, want %v", have, roles))
	}
	if want := []string{"@" + o.service}; !slices.Equal(o.policy.ServiceRoles, want) {
		patch.ServiceRoles = &want
		why = append(why, fmt.Sprintf("service roles %v, want %v", o.policy.ServiceRoles, want))
	}
	if len(why) > 0 {
		if err := d.fix(ctx, Drift{Kind: DriftBindPolicy, Object: o.policy.ID, Detail: strings.Join(why, "; ")},
			func(ctx context.Context) error { return p.z.PatchServicePolicy(ctx, o.policy.ID, patch) }); err != nil {
			return err
		}
	}
	if name := p.bindPolicyName(s); o.policy.Name != name {
		if err := d.fix(ctx, Drift{Kind: DriftName, Object: o.policy.ID, Detail: fmt.Sprintf("bind policy named %q, want %q", o.policy.Name, name)},
			func(ctx context.Context) error {
				return p.z.PatchServicePolicy(ctx, o.policy.ID, ziti.ServicePolicyPatch{Name: &name})
			}); err != nil {
			return err
		}
	}
	// Identities that host nothing of the share, once off the policy.
	for _, a := range slices.Sorted(maps.Keys(others)) {
		if err := stray("non-host", a, others[a]); err != nil {
			return err
		}
	}
	// The standby config goes last, once no override names it.
	if len(s.Hosts.Passive) == 0 && o.standby != nil {
		id := o.standby.ID
		if err := d.fix(ctx, Drift{Kind: DriftStandbyStray, Object: id, Detail: "the share has no passive and a standby config"},
			func(ctx context.Context) error {
				if err := p.z.DeleteConfig(ctx, id); err != nil && !ziti.IsNotFound(err) {
					return err
				}
				return nil
			}); err != nil {
			return err
		}
	}
	return nil
}

// fixConfig heals a host.v1's name and body.
func (p *Projection) fixConfig(ctx context.Context, d *driftRun, c *ziti.Config, name string, want map[string]any) error {
	if c.Name != name {
		if err := d.fix(ctx, Drift{Kind: DriftName, Object: c.ID, Detail: fmt.Sprintf("host.v1 named %q, want %q", c.Name, name)},
			func(ctx context.Context) error { return p.z.PatchConfig(ctx, c.ID, ziti.ConfigPatch{Name: &name}) }); err != nil {
			return err
		}
	}
	if !reflect.DeepEqual(normJSON(c.Data), want) {
		return d.fix(ctx, Drift{Kind: DriftConfig, Object: c.ID, Detail: "host.v1 " + c.Name + " has another body"},
			func(ctx context.Context) error { return p.z.PatchConfig(ctx, c.ID, ziti.ConfigPatch{Data: want}) })
	}
	return nil
}

// deployed is the objects that carry this deployment's tag, by share id.
type deployed struct {
	services map[string][]ziti.Service
	configs  map[string][]ziti.Config
	policies map[string][]ziti.ServicePolicy
}

func (dp deployed) shares() []string {
	ids := map[string]bool{}
	for k := range dp.services {
		ids[k] = true
	}
	for k := range dp.configs {
		ids[k] = true
	}
	for k := range dp.policies {
		ids[k] = true
	}
	return slices.Sorted(maps.Keys(ids))
}

// deployedObjects lists every object tagged with this frontdoor and this
// deployment, by the share id of its tag.
func (p *Projection) deployedObjects(ctx context.Context) (deployed, error) {
	dp := deployed{services: map[string][]ziti.Service{}, configs: map[string][]ziti.Config{}, policies: map[string][]ziti.ServicePolicy{}}
	flt := ziti.And(ziti.Eq("tags."+TagDeployment, p.o.DeploymentID), ziti.Eq("tags."+TagFrontdoor, p.o.FrontdoorID))
	mine := func(t ziti.Tags) (string, bool) {
		dep, _ := t[TagDeployment].(string)
		fd, _ := t[TagFrontdoor].(string)
		sh, _ := t[TagShare].(string)
		return sh, dep == p.o.DeploymentID && fd == p.o.FrontdoorID && sh != ""
	}
	svcs, err := p.z.ListServices(ctx, flt)
	if err != nil {
		return dp, err
	}
	for _, s := range svcs {
		if sh, ok := mine(s.Tags); ok {
			dp.services[sh] = append(dp.services[sh], s)
		}
	}
	cfgs, err := p.z.ListConfigs(ctx, flt)
	if err != nil {
		return dp, err
	}
	for _, c := range cfgs {
		if sh, ok := mine(c.Tags); ok {
			dp.configs[sh] = append(dp.configs[sh], c)
		}
	}
	pols, err := p.z.ListServicePolicies(ctx, flt)
	if err != nil {
		return dp, err
	}
	for _, pol := range pols {
		if sh, ok := mine(pol.Tags); ok {
			dp.policies[sh] = append(dp.policies[sh], pol)
		}
	}
	return dp, nil
}

// orphanIDs returns the ids of a share's deployed objects, in delete
// order: policies, services (which take their overrides), configs.
func (dp deployed) orphanIDs(share string) []orphanObject {
	var out []orphanObject
	for _, x := range dp.policies[share] {
		out = append(out, orphanObject{id: x.ID, kind: "bind policy", name: x.Name})
	}
	for _, x := range dp.services[share] {
		out = append(out, orphanObject{id: x.ID, kind: "service", name: x.Name})
	}
	for _, x := range dp.configs[share] {
		out = append(out, orphanObject{id: x.ID, kind: "config", name: x.Name})
	}
	return out
}

type orphanObject struct {
	id, kind, name string
}

// deleteOrphan deletes one orphan object; one already gone is fine.
func (p *Projection) deleteOrphan(ctx context.Context, o orphanObject) error {
	var err error
	switch o.kind {
	case "bind policy":
		err = p.z.DeleteServicePolicy(ctx, o.id)
	case "service":
		err = p.z.DeleteService(ctx, o.id)
	default:
		err = p.z.DeleteConfig(ctx, o.id)
	}
	if ziti.IsNotFound(err) {
		return nil
	}
	return err
}
