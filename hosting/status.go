package hosting

import (
	"context"
	"fmt"
	"slices"

	"github.com/vipkit/vipkit/hosting/ziti"
)

// State is a share's hosting state.
type State string

// The hosting states. MISCONFIGURED wins over the others.
const (
	Misconfigured State = "MISCONFIGURED" // a host is bound at a precedence its role does not ask for
	Healthy       State = "HEALTHY"       // every host is serving
	Degraded      State = "DEGRADED"      // an active is serving, and some host is not
	FailedOver    State = "FAILED_OVER"   // no active is serving, and a passive is
	Down          State = "DOWN"          // no host is serving
)

// HostStatus is one host in the hosting block.
type HostStatus struct {
	AgentID    string `json:"agentId"`
	Role       Role   `json:"role"`
	Bound      bool   `json:"bound"`
	Precedence string `json:"precedence,omitempty"` // absent when not bound
	// Problem, when set, says what Ziti lacks for this host (a broken
	// host: no identity, several identities, no override, not on the bind
	// policy). Such a host is not serving, so the state counts it so.
	Problem Problem `json:"problem,omitempty"`
}

// Hosting is the hosting block of a single read: what Ziti actually has.
type Hosting struct {
	State State        `json:"state"`
	Hosts []HostStatus `json:"hosts"`
}

// Condition is one cell of the precedence × role table.
type Condition int

// The cells of the table.
const (
	NotBound      Condition = iota // no terminator
	Serving                        // at the precedence of its role
	Failing                        // bound, health check failing (failed)
	WrongBaseline                  // bound at the other role's precedence
)

// Classify returns the cell of the table for a host in role whose
// terminators are at precs. A terminator at the wrong baseline wins, then
// one at the right one, then failed.
func Classify(role Role, precs []string) (Condition, string) {
	want, wrong := ziti.PrecedenceRequired, ziti.PrecedenceDefault
	if role == Passive {
		want, wrong = wrong, want
	}
	var c Condition
	var shown string
	for _, p := range precs {
		switch {
		case p == wrong:
			return WrongBaseline, p
		case p == want:
			c, shown = Serving, p
		case p == ziti.PrecedenceFailed && c != Serving:
			c, shown = Failing, p
		case c == NotBound:
			// an unknown precedence: bound, not serving
			c, shown = Failing, p
		}
	}
	return c, shown
}

// DeriveStatus computes the hosting block from the terminators of the
// share's service, matched to hosts by hostId through identityOf (agent id
// → Ziti identity id; agents without an identity are not bound).
func DeriveStatus(h Hosts, identityOf map[string]string, terms []ziti.Terminator) Hosting {
	byHost := map[string][]string{}
	for _, t := range terms {
		byHost[t.HostID] = append(byHost[t.HostID], t.Precedence)
	}
	out := Hosting{Hosts: []HostStatus{}}
	var mis, all, activeServing, passiveServing = false, true, false, false
	add := func(role Role, agents []string) {
		for _, a := range agents {
			var precs []string
			if id := identityOf[a]; id != "" {
				precs = byHost[id]
			}
			c, shown := Classify(role, precs)
			out.Hosts = append(out.Hosts, HostStatus{AgentID: a, Role: role, Bound: c != NotBound, Precedence: shown})
			switch c {
			case WrongBaseline:
				mis = true
				all = false
			case Serving:
				if role == Active {
					activeServing = true
				} else {
					passiveServing = true
				}
			default:
				all = false
			}
		}
	}
	add(Active, h.Active)
	add(Passive, h.Passive)
	switch {
	case mis:
		out.State = Misconfigured
	case all && h.Len() > 0:
		out.State = Healthy
	case activeServing:
		out.State = Degraded
	case passiveServing:
		out.State = FailedOver
	default:
		out.State = Down
	}
	return out
}

// Status asks Ziti for the share's terminators and derives its hosting
// block, with each host's Problem: its identity (one GET per host), its
// place on the bind policy, and a passive's override (one more GET per
// passive). An error means "not known": callers leave the block out.
func (p *Projection) Status(ctx context.Context, s Share) (*Hosting, error) {
	o, err := p.find(ctx, s)
	if err != nil {
		return nil, err
	}
	if o.service == "" {
		return nil, fmt.Errorf("%w: share %s has no service", ErrZitiState, s.ID)
	}
	terms, err := p.z.ListTerminators(ctx, ziti.Eq("service", o.service))
	if err != nil {
		return nil, err
	}
	idents := map[string]string{}
	problems := map[string]Problem{}
	for _, a := range s.Hosts.All() {
		id, pr, err := p.identity(ctx, a)
		if err != nil {
			return nil, err
		}
		idents[a] = id
		problems[a] = pr
	}
	onPolicy := map[string]bool{}
	if o.policy != nil {
		for _, r := range o.policy.IdentityRoles {
			onPolicy[r] = true
		}
	}
	for _, a := range s.Hosts.Passive {
		if problems[a] != "" {
			continue
		}
		if o.standby == nil {
			problems[a] = ProblemNoOverride
			continue
		}
		have, err := p.z.ListServiceConfigs(ctx, idents[a])
		if err != nil {
			return nil, err
		}
		if !slices.Contains(have, ziti.ServiceConfig{ServiceID: o.service, ConfigID: o.standby.ID}) {
			problems[a] = ProblemNoOverride
		}
	}
	for _, a := range s.Hosts.All() {
		if problems[a] == "" && !onPolicy[AgentRole(a)] {
			problems[a] = ProblemNotOnBindPolicy
		}
	}
	h := DeriveStatus(s.Hosts, idents, terms)
	for i := range h.Hosts {
		h.Hosts[i].Problem = problems[h.Hosts[i].AgentID]
	}
	return &h, nil
}
