package vip

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func nid(b byte) NodeID            { var n NodeID; n[0] = b; n[31] = 1; return n }
func sid(b byte) ServiceID         { var s ServiceID; s[0] = b; s[15] = 1; return s }
func boolp(v bool) *bool           { return &v }
func dur(d time.Duration) Duration { return Duration(d) }

func okService() Service {
	return Service{ID: sid(1), Name: "api", Network: "home", Listeners: []Listener{
		{Proto: TCP, Port: 443, Generation: 1, Backends: []Backend{{nid(1), 6443}, {nid(2), 7443}}},
		{Proto: UDP, Port: 53, Generation: 1, Backends: []Backend{{nid(1), 5353}}},
	}}
}

func TestValidateAcceptsGoodAndEmpty(t *testing.T) {
	s := okService()
	if err := s.Validate(Limits{}, nil); err != nil {
		t.Fatal(err)
	}
	empty := Service{ID: sid(2), Name: "empty", Network: "home"}
	if err := empty.Validate(Limits{}, nil); err != nil {
		t.Fatalf("empty VIP: %v", err)
	}
	empty.Listeners = []Listener{{Proto: TCP, Port: 80}}
	if err := empty.Validate(Limits{}, nil); err != nil {
		t.Fatalf("empty listener: %v", err)
	}
}

func TestValidateEveryField(t *testing.T) {
	known := func(n NodeID) bool { return n != nid(9) }
	cases := []struct {
		name string
		mod  func(*Service)
		want string // a substring of the specific message, with its path
	}{
		{"zero id", func(s *Service) { s.ID = ServiceID{} }, "id: missing service id"},
		{"empty name", func(s *Service) { s.Name = "" }, "name: empty name"},
		{"upper name", func(s *Service) { s.Name = "API" }, `name: name "API": want lowercase`},
		{"long name", func(s *Service) { s.Name = strings.Repeat("a", 64) }, "at most 63"},
		{"hyphen edge", func(s *Service) { s.Name = "-api" }, "inner hyphens"},
		{"bad network", func(s *Service) { s.Network = "home.lan" }, "network: name"},
		{"bad proto", func(s *Service) { s.Listeners[0].Proto = 1 }, "listeners[0].proto: protocol 1"},
		{"port 0", func(s *Service) { s.Listeners[0].Port = 0 }, "listeners[tcp/0].port: port 0"},
		{"dup listener", func(s *Service) { s.Listeners[1] = s.Listeners[0] }, "duplicate listener tcp/443"},
		{"zero node", func(s *Service) { s.Listeners[0].Backends[0].Node = NodeID{} }, "listeners[tcp/443].backends[0].node: missing node identity"},
		{"unknown node", func(s *Service) { s.Listeners[0].Backends[0].Node = nid(9) }, "is not a member of network home"},
		{"backend port 0", func(s *Service) { s.Listeners[0].Backends[1].Port = 0 }, "backends[1].port: port 0"},
		{"dup backend", func(s *Service) { s.Listeners[0].Backends[1] = s.Listeners[0].Backends[0] }, "duplicate backend"},
		{"udp port check", func(s *Service) { s.Listeners[1].Check.PortCheck = boolp(true) }, "UDP listeners have no connect checks"},
		{"interval short", func(s *Service) { s.Listeners[0].Check.Interval = dur(100 * time.Millisecond) }, "check.interval: 100ms"},
		{"timeout tiny", func(s *Service) { s.Listeners[0].Check.Timeout = dur(time.Millisecond) }, "check.timeout: 1ms"},
		{"timeout > interval", func(s *Service) { s.Listeners[0].Check.Timeout = dur(5 * time.Second) }, "longer than the interval"},
		{"failures", func(s *Service) { s.Listeners[0].Check.Failures = 101 }, "check.failures: 101"},
		{"successes", func(s *Service) { s.Listeners[0].Check.Successes = -1 }, "check.successes: -1"},
		{"idle", func(s *Service) { s.Listeners[0].IdleTimeout = dur(time.Millisecond) }, "idle_timeout: 1ms"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := okService().Clone()
			c.mod(&s)
			err := s.Validate(Limits{}, known)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %q, want it to say %q", err, c.want)
			}
		})
	}
}

func TestValidateLimits(t *testing.T) {
	s := okService()
	lim := Limits{Listeners: 1}
	var le *LimitError
	if err := s.Validate(lim, nil); !errors.As(err, &le) || le.Limit != "Listeners" || le.Max != 1 || le.Have != 2 || !errors.Is(err, ErrLimit) {
		t.Fatalf("listener limit: %v", err)
	}
	s = okService()
	if err := s.Validate(Limits{BackendsPerListener: 1}, nil); !errors.As(err, &le) || le.Limit != "BackendsPerListener" {
		t.Fatalf("backend limit: %v", err)
	}
	// Defaults: 16 listeners, 32 backends.
	s = Service{ID: sid(1), Name: "big", Network: "home"}
	for p := range 17 {
		s.Listeners = append(s.Listeners, Listener{Proto: TCP, Port: uint16(1000 + p)})
	}
	if err := s.Validate(Limits{}, nil); !errors.As(err, &le) || le.Max != 16 {
		t.Fatalf("default listener limit: %v", err)
	}
	s.Listeners = s.Listeners[:1]
	for b := range 33 {
		s.Listeners[0].Backends = append(s.Listeners[0].Backends, Backend{nid(1), uint16(1 + b)})
	}
	if err := s.Validate(Limits{}, nil); !errors.As(err, &le) || le.Max != 32 {
		t.Fatalf("default backend limit: %v", err)
	}
	if !strings.Contains(le.Error(), "over the BackendsPerListener limit of 32") {
		t.Fatalf("message %q does not name the limit", le)
	}
}

func TestValidateNetworkLimits(t *testing.T) {
	var svcs []Service
	for i := range 33 {
		svcs = append(svcs, Service{ID: sid(byte(i + 1)), Name: "s", Network: "home", Listeners: []Listener{{Proto: TCP, Port: 80, Backends: []Backend{{nid(byte(i)), 80}}}}})
	}
	var le *LimitError
	if err := ValidateNetwork(svcs, Limits{}); !errors.As(err, &le) || le.Limit != "ActiveTCPChecks" || le.Have != 33 {
		t.Fatalf("check limit: %v", err)
	}
	// Shared checks count once; disabled checks and UDP do not count.
	svcs[32].Listeners[0].Backends[0] = svcs[0].Listeners[0].Backends[0]
	if err := ValidateNetwork(svcs, Limits{}); err != nil {
		t.Fatalf("shared check counted twice: %v", err)
	}
	svcs = append(svcs, Service{ID: sid(200), Listeners: []Listener{{Proto: TCP, Port: 1, Check: Check{PortCheck: boolp(false)}, Backends: []Backend{{nid(200), 1}}}}})
	if err := ValidateNetwork(svcs, Limits{}); err != nil {
		t.Fatalf("disabled check counted: %v", err)
	}
	if err := ValidateNetwork(svcs, Limits{ActiveServices: 10}); !errors.As(err, &le) || le.Limit != "ActiveServices" {
		t.Fatalf("service limit: %v", err)
	}
}

func TestCheckEffectiveDefaults(t *testing.T) {
	e := Check{}.Effective()
	if !e.Enabled() || time.Duration(e.Interval) != 3*time.Second || time.Duration(e.Timeout) != 2*time.Second || e.Failures != 2 || e.Successes != 1 {
		t.Fatalf("defaults %+v", e)
	}
	if (Check{PortCheck: boolp(false)}).Effective().Enabled() {
		t.Fatal("explicit off lost")
	}
	if (Listener{Proto: UDP}).EffectiveIdleTimeout() != 120*time.Second || (Listener{Proto: TCP}).EffectiveIdleTimeout() != 7200*time.Second {
		t.Fatal("idle defaults")
	}
}

func TestParsePortKey(t *testing.T) {
	k, err := ParsePortKey("tcp/443")
	if err != nil || k != (PortKey{TCP, 443}) || k.String() != "tcp/443" {
		t.Fatalf("%v %v", k, err)
	}
	for _, bad := range []string{"tcp", "sctp/1", "udp/0", "udp/70000", "tcp/x"} {
		if _, err := ParsePortKey(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
