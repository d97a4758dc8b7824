package hosting

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"unicode/utf8"
)

// Validation messages, pinned by the tests. Every agent failure (unknown,
// deleted, in another account) answers MsgAgentUnknown, so the API is not an
// oracle for agent ids elsewhere.
const (
	MsgNoActive     = "at least one active host is required"
	MsgOverlap      = "agent %s cannot be both active and passive"
	MsgTooMany      = "a share has at most %d hosts, got %d"
	MsgAgentUnknown = "agent %s does not exist"
	MsgName         = "name must have 1 to %d characters"
	MsgKind         = "kind must be tcp, ipsec or http"
	MsgTarget       = "targetAddress must be a host name or an IP address"
	MsgPort         = "targetPort must be between 1 and 65535"
)

// Violation is one broken rule: the field that names it and the message.
type Violation struct {
	Field   string `json:"field"` // activeAgentIds, passiveAgentIds, hosts, name, ...
	Message string `json:"message"`
}

// ValidationError lists the violations of a share. It matches ErrInvalid.
type ValidationError struct {
	Violations []Violation
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("hosting: invalid share:")
	for i, v := range e.Violations {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s: %s", v.Field, v.Message)
	}
	return b.String()
}

// Unwrap returns ErrInvalid.
func (e *ValidationError) Unwrap() error { return ErrInvalid }

// Agent is an agent as validation and the projection see it.
type Agent struct {
	ID        string
	AccountID string
	Deleted   bool
}

// AgentLookup finds agents by id. Missing ids are left out of the map.
type AgentLookup interface {
	Agents(ctx context.Context, ids []string) (map[string]Agent, error)
}

// Validator judges a merged share: its fields, then its hosts by the rules
// in order, stopping at the first host rule that fails:
//
//  1. at least one active;
//  2. the two lists do not overlap;
//  3. the total is at most MaxHosts;
//  4. every agent is live and in the share's account (one message for
//     every failure; every such agent is reported, on its list).
//
// The zero value uses DefaultMaxHosts. It is safe for concurrent use.
type Validator struct {
	MaxHosts int // 0 means DefaultMaxHosts
}

// Validate returns nil or a *ValidationError (matching ErrInvalid), or the
// lookup's error. The dry run calls it on a merged update without writing.
func (v Validator) Validate(ctx context.Context, s Share, agents AgentLookup) error {
	var vs []Violation
	if n := utf8.RuneCountInString(s.Name); n == 0 || n > MaxShareNameLength || !utf8.ValidString(s.Name) {
		vs = append(vs, Violation{"name", fmt.Sprintf(MsgName, MaxShareNameLength)})
	}
	if !s.Kind.Valid() {
		vs = append(vs, Violation{"kind", MsgKind})
	}
	if !validTarget(s.TargetAddress) {
		vs = append(vs, Violation{"targetAddress", MsgTarget})
	}
	if s.TargetPort == 0 {
		vs = append(vs, Violation{"targetPort", MsgPort})
	}
	hv, err := v.hostViolations(ctx, s, agents)
	if err != nil {
		return err
	}
	vs = append(vs, hv...)
	if len(vs) > 0 {
		return &ValidationError{Violations: vs}
	}
	return nil
}

func (v Validator) hostViolations(ctx context.Context, s Share, agents AgentLookup) ([]Violation, error) {
	h := s.Hosts
	if len(h.Active) == 0 {
		return []Violation{{"activeAgentIds", MsgNoActive}}, nil
	}
	var vs []Violation
	for _, p := range h.Passive {
		if _, ok := slices.BinarySearch(h.Active, p); ok {
			vs = append(vs, Violation{"passiveAgentIds", fmt.Sprintf(MsgOverlap, p)})
		}
	}
	if len(vs) > 0 {
		return vs, nil
	}
	max := v.MaxHosts
	if max <= 0 {
		max = DefaultMaxHosts
	}
	if h.Len() > max {
		return []Violation{{"hosts", fmt.Sprintf(MsgTooMany, max, h.Len())}}, nil
	}
	found, err := agents.Agents(ctx, h.All())
	if err != nil {
		return nil, err
	}
	check := func(field string, ids []string) {
		for _, id := range ids {
			a, ok := found[id]
			if !ok || a.Deleted || a.AccountID != s.AccountID {
				vs = append(vs, Violation{field, fmt.Sprintf(MsgAgentUnknown, id)})
			}
		}
	}
	check("activeAgentIds", h.Active)
	check("passiveAgentIds", h.Passive)
	return vs, nil
}

// validTarget accepts an IP literal (IPv6 without brackets) or a DNS name.
func validTarget(a string) bool {
	if a == "" || len(a) > 253 {
		return false
	}
	if net.ParseIP(a) != nil {
		return true
	}
	for _, label := range strings.Split(strings.TrimSuffix(a, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
