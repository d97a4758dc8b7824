package vip

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func testDNS(t testing.TB) *DNSServer {
	names := map[string]netip.Addr{"api": netip.MustParseAddr("100.80.0.10"), "server1": netip.MustParseAddr("100.80.0.1")}
	s, err := NewDNSServer(DNSOptions{Domain: "home", Lookup: func(n string) (netip.Addr, bool) { a, ok := names[n]; return a, ok }})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func query(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

func TestDNSAnswers(t *testing.T) {
	s := testDNS(t)
	cases := []struct {
		name   string
		qtype  uint16
		rcode  int
		answer string
	}{
		{"api.home.", dns.TypeA, dns.RcodeSuccess, "100.80.0.10"},
		{"API.Home.", dns.TypeA, dns.RcodeSuccess, "100.80.0.10"},
		{"server1.home.", dns.TypeA, dns.RcodeSuccess, "100.80.0.1"},
		{"api.home.", dns.TypeAAAA, dns.RcodeSuccess, ""}, // NODATA
		{"nope.home.", dns.TypeA, dns.RcodeNameError, ""},
		{"a.api.home.", dns.TypeA, dns.RcodeNameError, ""},
		{"home.", dns.TypeA, dns.RcodeSuccess, ""},
		{"example.com.", dns.TypeA, dns.RcodeRefused, ""},
	}
	for _, c := range cases {
		raw, _ := query(c.name, c.qtype).Pack()
		out, err := s.Answer(raw)
		if err != nil {
			t.Fatal(err)
		}
		m := new(dns.Msg)
		if err := m.Unpack(out); err != nil {
			t.Fatal(err)
		}
		if m.Rcode != c.rcode {
			t.Errorf("%s %d: rcode %d, want %d", c.name, c.qtype, m.Rcode, c.rcode)
			continue
		}
		if c.answer == "" {
			if len(m.Answer) != 0 {
				t.Errorf("%s: unexpected answer %v", c.name, m.Answer)
			}
			continue
		}
		a, ok := m.Answer[0].(*dns.A)
		if len(m.Answer) != 1 || !ok || a.A.String() != c.answer || a.Hdr.Ttl != 30 || !m.Authoritative {
			t.Errorf("%s: answer %v", c.name, m.Answer)
		}
	}
	if _, err := s.Answer([]byte{1, 2, 3}); err == nil {
		t.Fatal("garbage query parsed")
	}
}

// TestDNSServeUDP answers over a real UDP socket on loopback, and drops
// queries that Allow refuses.
func TestDNSServeUDP(t *testing.T) {
	s := testDNS(t)
	s.o.Allow = func(src netip.Addr) bool { return src.IsLoopback() }
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, pc) }()
	c := &dns.Client{Timeout: 5 * time.Second}
	var r *dns.Msg
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, _, err = c.Exchange(query("api.home.", dns.TypeA), pc.LocalAddr().String())
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || len(r.Answer) != 1 {
		t.Fatalf("exchange: %v %v", r, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

func FuzzDNSAnswer(f *testing.F) {
	for _, n := range []string{"api.home.", "x.home.", "home.", "example.com."} {
		raw, _ := query(n, dns.TypeA).Pack()
		f.Add(raw)
	}
	s := testDNS(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := s.Answer(b)
		if err == nil {
			m := new(dns.Msg)
			if err := m.Unpack(out); err != nil {
				t.Fatalf("our reply does not parse: %v", err)
			}
		}
	})
}
