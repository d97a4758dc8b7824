package vip

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// NodeID is a node's identity on a network: its Ed25519 public key, the key
// that signs its configuration fields. Names are labels; identities are what
// a backend refers to, so a renamed node remains a backend.
type NodeID [32]byte

// String returns the identity in lowercase hex.
func (id NodeID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether id is the zero identity.
func (id NodeID) IsZero() bool { return id == NodeID{} }

// ParseNodeID parses 64 hex digits.
func ParseNodeID(s string) (NodeID, error) {
	var id NodeID
	if err := parseHexID(s, id[:]); err != nil {
		return NodeID{}, fmt.Errorf("vip: node id %q: %w", s, err)
	}
	return id, nil
}

// MarshalText implements encoding.TextMarshaler.
func (id NodeID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (id *NodeID) UnmarshalText(b []byte) error {
	v, err := ParseNodeID(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}

// ServiceID is a service's permanent, random identity. Deleting a service
// leaves a tombstone for its id forever; recreating the service gives it a
// fresh id.
type ServiceID [16]byte

// String returns the id in lowercase hex.
func (id ServiceID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether id is the zero id.
func (id ServiceID) IsZero() bool { return id == ServiceID{} }

// ParseServiceID parses 32 hex digits.
func ParseServiceID(s string) (ServiceID, error) {
	var id ServiceID
	if err := parseHexID(s, id[:]); err != nil {
		return ServiceID{}, fmt.Errorf("vip: service id %q: %w", s, err)
	}
	return id, nil
}

// MarshalText implements encoding.TextMarshaler.
func (id ServiceID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (id *ServiceID) UnmarshalText(b []byte) error {
	v, err := ParseServiceID(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}

func parseHexID(s string, dst []byte) error {
	if len(s) != 2*len(dst) {
		return fmt.Errorf("want %d hex digits, have %d", 2*len(dst), len(s))
	}
	if _, err := hex.Decode(dst, []byte(s)); err != nil {
		return fmt.Errorf("not hex: %w", err)
	}
	return nil
}

// Proto is a listener's transport protocol.
type Proto uint8

// Protocols.
const (
	TCP Proto = 6
	UDP Proto = 17
)

// String returns "tcp" or "udp".
func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	}
	return "proto(" + strconv.Itoa(int(p)) + ")"
}

// ParseProto parses "tcp" or "udp".
func ParseProto(s string) (Proto, error) {
	switch strings.ToLower(s) {
	case "tcp":
		return TCP, nil
	case "udp":
		return UDP, nil
	}
	return 0, fmt.Errorf("%w: protocol %q: want tcp or udp", ErrInvalid, s)
}

// MarshalText implements encoding.TextMarshaler.
func (p Proto) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (p *Proto) UnmarshalText(b []byte) error {
	v, err := ParseProto(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// PortKey names a listener: protocol and port, written "tcp/443".
type PortKey struct {
	Proto Proto
	Port  uint16
}

// String returns "tcp/443".
func (k PortKey) String() string { return k.Proto.String() + "/" + strconv.Itoa(int(k.Port)) }

// ParsePortKey parses "tcp/443" or "udp/53".
func ParsePortKey(s string) (PortKey, error) {
	p, port, ok := strings.Cut(s, "/")
	if !ok {
		return PortKey{}, fmt.Errorf("%w: listener %q: want PROTO/PORT such as tcp/443", ErrInvalid, s)
	}
	proto, err := ParseProto(p)
	if err != nil {
		return PortKey{}, err
	}
	n, err := parsePort(port)
	if err != nil {
		return PortKey{}, fmt.Errorf("%w: listener %q: %v", ErrInvalid, s, err)
	}
	return PortKey{proto, n}, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("port %q: want 1-65535", s)
	}
	return uint16(n), nil
}

// Service is a named virtual service of one network: a name such as "api"
// (reached as api.<network>) with independent listeners. Its address is an
// internal reservation, allocated from the overlay range (see Allocate).
type Service struct {
	ID        ServiceID  `json:"id"`
	Name      string     `json:"name"`
	Network   string     `json:"network"`
	Listeners []Listener `json:"listeners"`
}

// Listener maps one protocol and port of the VIP to a set of backends.
//
// Generation distinguishes incarnations of the same port: removing a listener
// and adding its port again gives a higher generation, so backend fields of
// the removed listener never reappear. Removing a backend, or another
// listener of the service (which raises the service's port floor), moves a
// listener to a new generation too. Editors carry it through unchanged;
// mutations assign it.
type Listener struct {
	Proto      Proto     `json:"proto"`
	Port       uint16    `json:"port"`
	Generation uint64    `json:"generation"`
	Backends   []Backend `json:"backends"`
	// Drain lists the backends of Backends that are draining: no client
	// makes new bindings to them, existing ones go on until idle expiry
	// (docs/backend-drain.md). Absent means none. An entry that names no
	// backend of the listener means nothing and is not saved: removing a
	// backend ends its drain.
	Drain []Backend `json:"drain,omitempty"`
	Check Check     `json:"check"`
	// IdleTimeout is how long a flow binding of this listener survives
	// without traffic; 0 means the protocol's default (7200 s for TCP,
	// 120 s for UDP).
	IdleTimeout Duration `json:"idle_timeout"`
}

// Key returns the listener's PortKey.
func (l Listener) Key() PortKey { return PortKey{l.Proto, l.Port} }

// Draining reports whether backend b of the listener is draining.
func (l Listener) Draining(b Backend) bool { return slices.Contains(l.Drain, b) }

// EffectiveIdleTimeout returns IdleTimeout or the protocol's default.
func (l Listener) EffectiveIdleTimeout() time.Duration {
	if l.IdleTimeout > 0 {
		return time.Duration(l.IdleTimeout)
	}
	if l.Proto == UDP {
		return DefaultUDPIdle
	}
	return DefaultTCPIdle
}

// Backend is one target of a listener: a node identity and the application
// port on that node's overlay address.
type Backend struct {
	Node NodeID `json:"node"`
	Port uint16 `json:"port"`
}

// String returns "<node id prefix>:<port>".
func (b Backend) String() string { return b.Node.String()[:12] + ":" + strconv.Itoa(int(b.Port)) }

// Check holds a TCP listener's connect-check settings. Zero fields take the
// defaults (DefaultCheck); PortCheck is a tri-state so that an explicit "off"
// survives.
type Check struct {
	// PortCheck turns TCP connect checks on or off; nil means on (the
	// default). Disabling port checks keeps the data-plane probes.
	PortCheck *bool    `json:"port_check,omitempty"`
	Interval  Duration `json:"interval,omitempty"`
	Timeout   Duration `json:"timeout,omitempty"`
	Failures  int      `json:"failures,omitempty"`
	Successes int      `json:"successes,omitempty"`
}

// Effective returns c with every zero field replaced by its default.
func (c Check) Effective() Check {
	d := DefaultCheck()
	if c.PortCheck != nil {
		on := *c.PortCheck
		d.PortCheck = &on
	}
	if c.Interval > 0 {
		d.Interval = c.Interval
	}
	if c.Timeout > 0 {
		d.Timeout = c.Timeout
	}
	if c.Failures > 0 {
		d.Failures = c.Failures
	}
	if c.Successes > 0 {
		d.Successes = c.Successes
	}
	return d
}

// Enabled reports whether connect checks are on.
func (c Check) Enabled() bool { return c.PortCheck == nil || *c.PortCheck }

// Default idle timeouts of a listener's bindings (docs/defaults.md).
const (
	DefaultTCPIdle = 7200 * time.Second
	DefaultUDPIdle = 120 * time.Second
)

// DefaultCheck returns the connect check's defaults: on, 3 s interval, 2 s
// timeout, 2 failures to exclude, 1 success to recover (docs/defaults.md).
func DefaultCheck() Check {
	on := true
	return Check{PortCheck: &on, Interval: Duration(3 * time.Second), Timeout: Duration(2 * time.Second), Failures: 2, Successes: 1}
}

// Duration is a time.Duration that reads and writes JSON as a Go duration
// string ("3s", "7200s") and also reads a plain number of seconds.
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%w: duration %q: %v", ErrInvalid, s, err)
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("%w: duration %s: want a string such as \"3s\" or a number of seconds", ErrInvalid, b)
	}
	*d = Duration(secs * float64(time.Second))
	return nil
}

// Clone returns a deep copy of s.
func (s Service) Clone() Service {
	c := s
	c.Listeners = make([]Listener, len(s.Listeners))
	for i, l := range s.Listeners {
		l.Backends = append([]Backend(nil), l.Backends...)
		l.Drain = slices.Clone(l.Drain)
		if l.Check.PortCheck != nil {
			on := *l.Check.PortCheck
			l.Check.PortCheck = &on
		}
		c.Listeners[i] = l
	}
	return c
}

// Listener returns the listener for k and whether it exists.
func (s *Service) Listener(k PortKey) (*Listener, bool) {
	for i := range s.Listeners {
		if s.Listeners[i].Key() == k {
			return &s.Listeners[i], true
		}
	}
	return nil, false
}
