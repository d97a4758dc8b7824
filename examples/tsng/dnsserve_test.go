package tsng

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/vipkit/vipkit/transport/netstack"
	"github.com/vipkit/vipkit/vip"
)

// testUpstream is a resolver on loopback (UDP and TCP on one port) that
// answers example.test with 192.0.2.7 and counts queries by protocol.
type testUpstream struct {
	addr     string
	udp, tcp atomic.Int64
}

func startUpstream(t *testing.T, h dns.Handler) *testUpstream {
	t.Helper()
	u := &testUpstream{}
	if h == nil {
		h = upstreamDNS(u)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	u.addr = ln.Addr().String()
	srvs, err := serveDNS(h, pc, ln)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srvs.Close() })
	return u
}

// upstreamDNS answers example.test with 192.0.2.7 (NXDOMAIN otherwise)
// and counts u's queries by protocol.
func upstreamDNS(u *testUpstream) dns.Handler {
	return dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
			u.tcp.Add(1)
		} else {
			u.udp.Add(1)
		}
		m := new(dns.Msg)
		m.SetReply(r)
		if strings.EqualFold(r.Question[0].Name, "example.test.") {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 7)})
		} else {
			m.SetRcode(r, dns.RcodeNameError)
		}
		w.WriteMsg(m)
	})
}

// ask sends one query to the agent's DNS from inside its netstack host.
func askOverlay(t *testing.T, h *netstack.Host, server netip.Addr, proto, name string) *dns.Msg {
	t.Helper()
	var c net.Conn
	var err error
	if proto == "tcp" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err = h.DialTCP(ctx, netip.AddrPortFrom(server, 53))
	} else {
		c, err = h.DialUDP(netip.AddrPort{}, netip.AddrPortFrom(server, 53))
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	co := &dns.Conn{Conn: c}
	q := new(dns.Msg)
	q.SetQuestion(name, dns.TypeA)
	if err := co.WriteMsg(q); err != nil {
		t.Fatal(err)
	}
	m, err := co.ReadMsg()
	if err != nil {
		t.Fatalf("%s %s: %v", proto, name, err)
	}
	return m
}

func aOf(m *dns.Msg) string {
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			return a.A.String()
		}
	}
	return dns.RcodeToString[m.Rcode]
}

// TestDNSOverTCPAndForwarding: the agent answers its names over UDP and
// TCP; other names are REFUSED by default and, with dns_upstreams,
// answered by the upstream over the query's own protocol.
func TestDNSOverTCPAndForwarding(t *testing.T) {
	up := startUpstream(t, nil)
	for _, forward := range []bool{false, true} {
		d, f := uiDaemonWith(t, func(c *Config) {
			c.Networks[0].DNSPort = 53
			if forward {
				c.Networks[0].DNSUpstreams = []string{up.addr}
			}
		})
		f.must("vip", "create", "home", "api")
		n := d.Runtime("home")
		v, _ := n.Registry().Get("api")
		self := n.self().Addr
		for _, proto := range []string{"udp", "tcp"} {
			if got := aOf(askOverlay(t, n.Host(), self, proto, "api.home.")); got != v.Addr.String() {
				t.Errorf("forward %v, %s api.home: %s, want %v", forward, proto, got, v.Addr)
			}
			got := aOf(askOverlay(t, n.Host(), self, proto, "example.test."))
			want := "REFUSED"
			if forward {
				want = "192.0.2.7"
			}
			if got != want {
				t.Errorf("forward %v, %s example.test: %s, want %s", forward, proto, got, want)
			}
		}
	}
	if up.udp.Load() != 1 || up.tcp.Load() != 1 {
		t.Errorf("upstream saw %d UDP and %d TCP queries, want 1 each", up.udp.Load(), up.tcp.Load())
	}
}

// TestDNSForwardingLoop: an upstream that sends queries back to the agent
// (here: the agent's own handler) is cut off after maxForwardDepth
// identical questions, and the client gets REFUSED at once.
func TestDNSForwardingLoop(t *testing.T) {
	own, err := vip.NewDNSServer(vip.DNSOptions{Domain: "home", Lookup: func(string) (netip.Addr, bool) { return netip.Addr{}, false }})
	if err != nil {
		t.Fatal(err)
	}
	var seen atomic.Int64
	var h *dnsHandler
	counting := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) { seen.Add(1); h.ServeDNS(w, r) })
	loop := startUpstream(t, counting) // the upstream is the agent itself
	ap := netip.MustParseAddrPort(loop.addr)
	h = newDNSHandler(own, vip.DNSOptions{Domain: "home"}, []netip.AddrPort{ap}, discardLogger())
	c := &dns.Client{Net: "tcp", Timeout: 10 * time.Second}
	q := new(dns.Msg)
	q.SetQuestion("example.test.", dns.TypeA)
	start := time.Now()
	m, _, err := c.Exchange(q, loop.addr)
	if err != nil {
		t.Fatal(err)
	}
	if m.Rcode != dns.RcodeRefused || time.Since(start) > 5*time.Second {
		t.Fatalf("looping query: %s after %v", dns.RcodeToString[m.Rcode], time.Since(start))
	}
	if n := seen.Load(); n != maxForwardDepth+1 {
		t.Fatalf("the loop went round %d times, want %d", n, maxForwardDepth+1)
	}
	if loops := h.Stats().Loops; loops != 1 {
		t.Fatalf("loops counted %d", loops)
	}
	// Upstreams inside the overlay are refused in the config.
	if _, err := parseUpstreams([]string{"100.80.0.1"}, netip.MustParsePrefix("100.80.0.0/24")); err == nil {
		t.Fatal("an upstream inside the overlay was accepted")
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// uiDaemonWith is uiDaemon with its config changed by mut first.
func uiDaemonWith(t *testing.T, mut func(*Config)) (*Daemon, *apiFixture) {
	dir := socketDir(t, "tsngdns")
	k1, _ := GenerateKeys()
	k2, _ := GenerateKeys()
	cfg := &Config{DataDir: filepath.Join(dir, "data"), Socket: filepath.Join(dir, "api.sock"), UI: "off",
		Networks: []NetworkConfig{{Name: "home", Overlay: "100.80.0.0/24", DNSPort: 5353,
			Node:  NodeConfig{Name: "server1", Address: "100.80.0.1", IdentityKey: k1.IdentityKey, WireGuardKey: k1.WireGuardKey},
			Peers: []PeerConfig{{Name: "server2", Address: "100.80.0.2", Identity: k2.Identity, WireGuardKey: k2.WireGuardPublicKey}}}}}
	if mut != nil {
		mut(cfg)
	}
	d, err := NewDaemon(context.Background(), cfg, DaemonOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, &apiFixture{t: t, socket: cfg.Socket}
}
