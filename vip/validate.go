package vip

import (
	"fmt"
	"slices"
	"time"
)

// Limits bounds a network's VIP configuration. The zero value of a field
// means its default (DefaultLimits); every limit is enforced and reported
// with a LimitError, never applied silently.
type Limits struct {
	Listeners           int // listeners per service (16)
	BackendsPerListener int // backends per listener (32)
	ActiveTCPChecks     int // distinct (node, port) TCP connect checks per network (32)
	FlowReservations    int // NAT bindings and shadow ports, active and quarantined (4096)
	IncompleteDatagrams int // IPv4 datagrams being reassembled (64)
	ActiveServices      int // services that are not deleted (64)
	Tombstones          int // permanent deletion markers (1024)
	FieldsPerService    int // signed fields per active service (192)
}

// DefaultLimits returns the default limits (docs/defaults.md gives each
// with its reason).
func DefaultLimits() Limits {
	return Limits{
		Listeners:           16,
		BackendsPerListener: 32,
		ActiveTCPChecks:     32,
		FlowReservations:    4096,
		IncompleteDatagrams: 64,
		ActiveServices:      64,
		Tombstones:          1024,
		FieldsPerService:    192,
	}
}

// WithDefaults returns l with zero fields set to their defaults.
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits()
	set := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	set(&l.Listeners, d.Listeners)
	set(&l.BackendsPerListener, d.BackendsPerListener)
	set(&l.ActiveTCPChecks, d.ActiveTCPChecks)
	set(&l.FlowReservations, d.FlowReservations)
	set(&l.IncompleteDatagrams, d.IncompleteDatagrams)
	set(&l.ActiveServices, d.ActiveServices)
	set(&l.Tombstones, d.Tombstones)
	set(&l.FieldsPerService, d.FieldsPerService)
	return l
}

// Bounds on check settings and timeouts. The worker tick is 250 ms, so a
// shorter interval could not be honoured.
const (
	MinCheckInterval = 250 * time.Millisecond
	MaxCheckInterval = time.Hour
	MinCheckTimeout  = 10 * time.Millisecond
	MaxCheckCount    = 100 // failures or successes
	MinIdleTimeout   = time.Second
	MaxIdleTimeout   = 7 * 24 * time.Hour
	MaxNameLength    = 63 // a DNS label
)

// ValidName reports whether s is usable as a service, node or network name:
// a DNS label of lowercase letters, digits and inner hyphens, 1 to 63 bytes.
func ValidName(s string) error {
	if len(s) == 0 {
		return fmt.Errorf("empty name")
	}
	if len(s) > MaxNameLength {
		return fmt.Errorf("name %q is %d bytes; at most %d", s, len(s), MaxNameLength)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' && i > 0 && i < len(s)-1:
		default:
			return fmt.Errorf("name %q: want lowercase letters, digits and inner hyphens (a DNS label)", s)
		}
	}
	return nil
}

// Validate checks every field of s and the per-service limits, and returns a
// ValidationError naming every bad field, or a LimitError. knownNode, when
// not nil, reports whether a backend's node identity is a member of the
// network. Empty services and listeners are valid.
func (s *Service) Validate(lim Limits, knownNode func(NodeID) bool) error {
	var known func(PortKey, Backend) bool
	if knownNode != nil {
		known = func(_ PortKey, b Backend) bool { return knownNode(b.Node) }
	}
	return s.validate(lim, known)
}

// validate is Validate with a membership rule per listener and backend:
// known, when not nil, reports whether the backend may be on the listener.
func (s *Service) validate(lim Limits, known func(PortKey, Backend) bool) error {
	lim = lim.WithDefaults()
	ve := &ValidationError{}
	if s.ID.IsZero() {
		ve.add("id", "missing service id")
	}
	if err := ValidName(s.Name); err != nil {
		ve.add("name", "%v", err)
	}
	if err := ValidName(s.Network); err != nil {
		ve.add("network", "%v", err)
	}
	if len(s.Listeners) > lim.Listeners {
		return &LimitError{Limit: "Listeners", Max: lim.Listeners, Have: len(s.Listeners), Where: "service " + s.Name}
	}
	seen := map[PortKey]bool{}
	for i, l := range s.Listeners {
		path := fmt.Sprintf("listeners[%d]", i)
		if l.Proto != TCP && l.Proto != UDP {
			ve.add(path+".proto", "protocol %d: want tcp or udp", l.Proto)
		} else {
			path = fmt.Sprintf("listeners[%s]", l.Key())
		}
		if l.Port == 0 {
			ve.add(path+".port", "port 0: want 1-65535")
		}
		if seen[l.Key()] {
			ve.add(path, "duplicate listener %s", l.Key())
		}
		seen[l.Key()] = true
		if len(l.Backends) > lim.BackendsPerListener {
			return &LimitError{Limit: "BackendsPerListener", Max: lim.BackendsPerListener, Have: len(l.Backends), Where: fmt.Sprintf("listener %s of %s", l.Key(), s.Name)}
		}
		bseen := map[Backend]bool{}
		for j, b := range l.Backends {
			bp := fmt.Sprintf("%s.backends[%d]", path, j)
			if b.Node.IsZero() {
				ve.add(bp+".node", "missing node identity")
			} else if known != nil && !known(l.Key(), b) {
				ve.add(bp+".node", "node %s is not a member of network %s", b.Node, s.Network)
			}
			if b.Port == 0 {
				ve.add(bp+".port", "port 0: want 1-65535")
			}
			if bseen[b] {
				ve.add(bp, "duplicate backend %s", b)
			}
			bseen[b] = true
		}
		validateCheck(ve, path, l)
	}
	return ve.err()
}

func validateCheck(ve *ValidationError, path string, l Listener) {
	c := l.Check
	if l.Proto == UDP && c.PortCheck != nil && *c.PortCheck {
		ve.add(path+".check.port_check", "UDP listeners have no connect checks (UDP uses path probes and ICMP port errors)")
	}
	if c.Interval != 0 && (time.Duration(c.Interval) < MinCheckInterval || time.Duration(c.Interval) > MaxCheckInterval) {
		ve.add(path+".check.interval", "%v: want %v to %v", time.Duration(c.Interval), MinCheckInterval, MaxCheckInterval)
	}
	if c.Timeout != 0 && time.Duration(c.Timeout) < MinCheckTimeout {
		ve.add(path+".check.timeout", "%v: want at least %v", time.Duration(c.Timeout), MinCheckTimeout)
	}
	if c.Interval < 0 || c.Timeout < 0 {
		ve.add(path+".check", "negative duration")
	}
	eff := c.Effective()
	if eff.Timeout > eff.Interval {
		ve.add(path+".check.timeout", "timeout %v is longer than the interval %v", time.Duration(eff.Timeout), time.Duration(eff.Interval))
	}
	if c.Failures < 0 || c.Failures > MaxCheckCount {
		ve.add(path+".check.failures", "%d: want 1-%d", c.Failures, MaxCheckCount)
	}
	if c.Successes < 0 || c.Successes > MaxCheckCount {
		ve.add(path+".check.successes", "%d: want 1-%d", c.Successes, MaxCheckCount)
	}
	if l.IdleTimeout != 0 && (time.Duration(l.IdleTimeout) < MinIdleTimeout || time.Duration(l.IdleTimeout) > MaxIdleTimeout) {
		ve.add(path+".idle_timeout", "%v: want %v to %v", time.Duration(l.IdleTimeout), MinIdleTimeout, MaxIdleTimeout)
	}
}

// CheckKey identifies a shared TCP connect check: checks are shared for the
// same network, node, address and port.
type CheckKey struct {
	Node NodeID
	Port uint16
}

// ActiveChecks returns the distinct TCP connect checks that services need,
// sorted, so that the ActiveTCPChecks limit can be enforced per network.
func ActiveChecks(services []Service) []CheckKey {
	set := map[CheckKey]bool{}
	for _, s := range services {
		for _, l := range s.Listeners {
			if l.Proto != TCP || !l.Check.Enabled() {
				continue
			}
			for _, b := range l.Backends {
				set[CheckKey(b)] = true
			}
		}
	}
	keys := make([]CheckKey, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b CheckKey) int {
		if c := slices.Compare(a.Node[:], b.Node[:]); c != 0 {
			return c
		}
		return int(a.Port) - int(b.Port)
	})
	return keys
}

// ValidateNetwork checks the network-wide limits over a set of services:
// the active-service count and the shared TCP checks.
func ValidateNetwork(services []Service, lim Limits) error {
	lim = lim.WithDefaults()
	if len(services) > lim.ActiveServices {
		return &LimitError{Limit: "ActiveServices", Max: lim.ActiveServices, Have: len(services), Where: "network"}
	}
	if n := len(ActiveChecks(services)); n > lim.ActiveTCPChecks {
		return &LimitError{Limit: "ActiveTCPChecks", Max: lim.ActiveTCPChecks, Have: n, Where: "network"}
	}
	return nil
}
