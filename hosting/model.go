package hosting

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/vipkit/vipkit/internal/jsonx"
)

// Role is a host's role on a share.
type Role string

// The two roles. An active carries the share's traffic at terminator
// precedence required; a passive carries it only when no active is bound,
// at precedence default.
const (
	Active  Role = "ACTIVE"
	Passive Role = "PASSIVE"
)

// Kind is a share's type.
type Kind string

// The share kinds that have hosts.
const (
	KindTCP   Kind = "tcp"
	KindIPsec Kind = "ipsec"
	KindHTTP  Kind = "http"
)

// Valid reports whether k is one of the known kinds.
func (k Kind) Valid() bool { return k == KindTCP || k == KindIPsec || k == KindHTTP }

// MaxShareNameLength is the longest share name, in characters, so that every
// name derived from it (the longest is "<name> | intercept | <frontdoorId> |
// <shareId>") fits the controller's limits.
const MaxShareNameLength = 164

// DefaultMaxHosts is the default cap on a share's hosts, active and passive
// together.
const DefaultMaxHosts = 8

// Share is a share and its hosts. Shares are soft-deleted: a deleted share
// still reads back, with the hosts it had.
type Share struct {
	ID            string    `json:"id"` // a UUID
	AccountID     string    `json:"accountId"`
	Name          string    `json:"name"`
	Kind          Kind      `json:"kind"`
	TargetAddress string    `json:"targetAddress"` // host name or IP literal, IPv6 without brackets
	TargetPort    uint16    `json:"targetPort"`
	Hosts         Hosts     `json:"-"`
	CreatedAt     time.Time `json:"createdAt"`
	UpdatedAt     time.Time `json:"updatedAt"`
	DeletedAt     time.Time `json:"deletedAt,omitzero"` // zero while live
	// The audit principals: who created, last updated and deleted the
	// share (PrincipalOf the request's context).
	CreatedBy string `json:"createdBy,omitempty"`
	UpdatedBy string `json:"updatedBy,omitempty"`
	DeletedBy string `json:"deletedBy,omitempty"`
}

// Live reports whether s is not deleted.
func (s Share) Live() bool { return s.DeletedAt.IsZero() }

// Clone returns a deep copy of s.
func (s Share) Clone() Share {
	s.Hosts = s.Hosts.Clone()
	return s
}

// Hosts are a share's hosts, as two sorted sets of agent ids. The zero value
// has no host. A Hosts value is not shared: methods return new values.
type Hosts struct {
	Active  []string `json:"activeAgentIds"`
	Passive []string `json:"passiveAgentIds"`
}

// NewHosts returns the hosts with the given ids, sorted, duplicates removed.
// It does not check that the lists are disjoint: Validate does.
func NewHosts(active, passive []string) Hosts {
	return Hosts{Active: normalize(active), Passive: normalize(passive)}
}

func normalize(ids []string) []string {
	out := slices.Clone(ids)
	slices.Sort(out)
	out = slices.Compact(out)
	if out == nil {
		out = []string{}
	}
	return out
}

// Clone returns a deep copy of h.
func (h Hosts) Clone() Hosts { return NewHosts(h.Active, h.Passive) }

// Len is the number of hosts in both roles.
func (h Hosts) Len() int { return len(h.Active) + len(h.Passive) }

// Empty reports whether h has no host.
func (h Hosts) Empty() bool { return h.Len() == 0 }

// RoleOf returns the role of agent and whether it is a host.
func (h Hosts) RoleOf(agent string) (Role, bool) {
	if _, ok := slices.BinarySearch(h.Active, agent); ok {
		return Active, true
	}
	if _, ok := slices.BinarySearch(h.Passive, agent); ok {
		return Passive, true
	}
	return "", false
}

// All returns every host id, sorted.
func (h Hosts) All() []string {
	return normalize(append(slices.Clone(h.Active), h.Passive...))
}

// Equal reports whether h and o hold the same hosts in the same roles.
func (h Hosts) Equal(o Hosts) bool {
	return slices.Equal(normalize(h.Active), normalize(o.Active)) && slices.Equal(normalize(h.Passive), normalize(o.Passive))
}

// Without returns the hosts with agent removed. When no active remains and
// passives do, every passive is promoted to active (promoted is true): Ziti
// already routes to all of them, so the model then matches the traffic.
func (h Hosts) Without(agent string) (out Hosts, promoted bool) {
	del := func(ids []string) []string {
		return slices.DeleteFunc(slices.Clone(ids), func(s string) bool { return s == agent })
	}
	out = NewHosts(del(h.Active), del(h.Passive))
	if len(out.Active) == 0 && len(out.Passive) > 0 {
		return Hosts{Active: out.Passive, Passive: []string{}}, true
	}
	return out, false
}

// Method is how an update applies: a create or PUT replaces, a PATCH merges.
type Method int

// The update methods.
const (
	// Put replaces both lists: an absent or null list is empty, so a PUT
	// without activeAgentIds is judged by the first validation rule (at
	// least one active), in the update and in the dry run alike. Create
	// uses it too.
	Put Method = iota
	// Patch merges: a present list replaces that list, an absent list leaves
	// it alone, and null on passiveAgentIds clears it.
	Patch
)

// List is an optional, nullable list of agent ids in an update. Its zero
// value is an absent list. JSON null decodes to a present list with Null set.
type List struct {
	Present bool
	Null    bool
	IDs     []string
}

// Of returns a present list of ids.
func Of(ids ...string) List { return List{Present: true, IDs: ids} }

// Null is a present list whose value is JSON null.
var Null = List{Present: true, Null: true}

// UnmarshalJSON decodes null or an array of strings. A field that is absent
// in the JSON object never calls it and so stays absent.
func (l *List) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*l = Null
		return nil
	}
	var ids []string
	if err := json.Unmarshal(b, &ids); err != nil {
		return fmt.Errorf("%w: agent ids must be a list of strings: %v", ErrBadUpdate, err)
	}
	for _, id := range ids {
		if id == "" || !utf8.ValidString(id) || len(id) > maxAgentIDLength {
			return fmt.Errorf("%w: bad agent id %q", ErrBadUpdate, id)
		}
	}
	*l = List{Present: true, IDs: ids}
	return nil
}

// MarshalJSON encodes null or the array.
func (l List) MarshalJSON() ([]byte, error) {
	if !l.Present || l.Null {
		return []byte("null"), nil
	}
	if l.IDs == nil {
		return []byte("[]"), nil
	}
	return json.Marshal(l.IDs)
}

// IsZero reports an absent list (for omitzero).
func (l List) IsZero() bool { return !l.Present }

const maxAgentIDLength = 128

// Update is a create, PUT or PATCH of a share: its hosts and the share
// fields it may change. Nil fields are absent.
type Update struct {
	Method        Method  `json:"-"`
	Name          *string `json:"name,omitempty"`
	TargetAddress *string `json:"targetAddress,omitempty"`
	TargetPort    *uint16 `json:"targetPort,omitempty"`
	Active        List    `json:"activeAgentIds,omitzero"`
	Passive       List    `json:"passiveAgentIds,omitzero"`
}

// DecodeUpdate decodes a JSON update body for method. Unknown fields and
// trailing data are refused, with ErrBadUpdate.
func DecodeUpdate(b []byte, m Method) (Update, error) {
	var u Update
	if err := jsonx.Decode(b, &u); err != nil {
		if errorsIsBadUpdate(err) {
			return Update{}, err
		}
		return Update{}, fmt.Errorf("%w: %v", ErrBadUpdate, err)
	}
	u.Method = m
	return u, nil
}

// Apply merges u into h and returns the new hosts. With Put, an absent or
// null list is empty: what is wrong with the result (no active) is
// Validate's job, so the dry run reports it too. Only an unknown method is
// ErrBadUpdate.
func (h Hosts) Apply(u Update) (Hosts, error) {
	act, pas := h.Active, h.Passive
	switch u.Method {
	case Put:
		act, pas = u.Active.IDs, u.Passive.IDs
	case Patch:
		if u.Active.Present {
			act = u.Active.IDs // null here leaves none: rule 1 reports it
		}
		if u.Passive.Present {
			pas = u.Passive.IDs
		}
	default:
		return Hosts{}, fmt.Errorf("%w: unknown method %d", ErrBadUpdate, u.Method)
	}
	return NewHosts(act, pas), nil
}

// ApplyTo returns s with u merged in: hosts and the fields u sets.
func (u Update) ApplyTo(s Share) (Share, error) {
	h, err := s.Hosts.Apply(u)
	if err != nil {
		return Share{}, err
	}
	out := s.Clone()
	out.Hosts = h
	if u.Name != nil {
		out.Name = *u.Name
	}
	if u.TargetAddress != nil {
		out.TargetAddress = *u.TargetAddress
	}
	if u.TargetPort != nil {
		out.TargetPort = *u.TargetPort
	}
	return out, nil
}
