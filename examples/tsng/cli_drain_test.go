package tsng

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/netstack"
)

// drainServers runs, on the agent's netstack host, TCP servers that greet
// with their port and then echo, and UDP servers that answer
// "<port>:<datagram>", on each port.
func drainServers(t *testing.T, h *netstack.Host, addr netip.Addr, ports ...uint16) {
	t.Helper()
	for _, port := range ports {
		ln, err := h.ListenTCP(netip.AddrPortFrom(addr, port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { c.Close() })
				go func() {
					fmt.Fprintf(c, "%d\n", port)
					_, _ = io.Copy(c, c)
				}()
			}
		}()
		pc, err := h.ListenUDP(netip.AddrPortFrom(addr, port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 1500)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo(append([]byte(fmt.Sprintf("%d:", port)), buf[:n]...), from)
			}
		}()
	}
}

// TestCLIBackendDrain runs `vip backend drain` and `undrain` against a
// real agent (netstack mode) whose listeners each have two local backends:
// the drained one takes no new TCP or UDP flow, the flows it had go on,
// show, status and --json report the drain, and undrain restores it.
func TestCLIBackendDrain(t *testing.T) {
	d, f := uiDaemon(t)
	f.must("vip", "create", "home", "api")
	f.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443", "--backend", "server1:6444")
	f.must("vip", "port", "add", "home", "api", "udp/53", "--backend", "server1:6443", "--backend", "server1:6444")
	rt := d.Runtime("home")
	h := rt.Host()
	self := netip.MustParseAddr("100.80.0.1")
	drainServers(t, h, self, 6443, 6444)
	v, err := rt.Registry().Get("api")
	if err != nil {
		t.Fatal(err)
	}
	tcpAddr, udpAddr := netip.AddrPortFrom(v.Addr, 443), netip.AddrPortFrom(v.Addr, 53)
	dialTCP := func() (string, net.Conn, *bufio.Reader) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := h.DialContext(ctx, "tcp", tcpAddr.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		rd := bufio.NewReader(c)
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(line), c, rd
	}
	askUDP := func(c net.Conn, q string) string {
		t.Helper()
		for range 50 {
			if _, err := c.Write([]byte(q)); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			buf := make([]byte, 256)
			if n, err := c.Read(buf); err == nil {
				return string(buf[:n])
			}
		}
		t.Fatalf("no UDP reply to %q", q)
		return ""
	}
	newUDP := func() net.Conn {
		t.Helper()
		c, err := h.DialUDP(netip.AddrPortFrom(self, 0), udpAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// Equal local backends: the tie breaks by port, to 6443.
	who, oldTCP, oldRd := dialTCP()
	if who != "6443" {
		t.Fatalf("first TCP flow went to %s, want 6443", who)
	}
	oldUDP := newUDP()
	if got := askUDP(oldUDP, "q0"); got != "6443:q0" {
		t.Fatalf("first UDP flow: %q", got)
	}

	f.must("vip", "backend", "drain", "home", "api", "tcp/443", "server1:6443")
	f.must("vip", "backend", "drain", "home", "api", "udp/53", "server1:6443")
	if out := f.must("vip", "show", "home", "api"); strings.Count(out, "server1:6443  (drain)") != 2 || strings.Contains(out, "6444  (drain)") {
		t.Fatalf("show does not mark the drained backends:\n%s", out)
	}
	var doc ServiceDoc
	if err := json.Unmarshal([]byte(f.must("vip", "show", "home", "api", "--json")), &doc); err != nil {
		t.Fatal(err)
	}
	for _, l := range doc.Listeners {
		if len(l.Drain) != 1 || l.Drain[0].Port != 6443 {
			t.Fatalf("show --json: %s drain %+v", l.Key(), l.Drain)
		}
	}
	out := f.must("vip", "status", "home", "api")
	if strings.Count(out, "drained") != 2 {
		t.Fatalf("status does not show the drain:\n%s", out)
	}
	if js := f.must("vip", "status", "home", "api", "--json"); strings.Count(js, `"drain":true`) != 2 {
		t.Fatalf("status --json: want two backends with \"drain\":true:\n%s", js)
	}
	for i := range 3 {
		if who, _, _ := dialTCP(); who != "6444" {
			t.Fatalf("new TCP flow %d with 6443 drained went to %s", i, who)
		}
		if got := askUDP(newUDP(), "new"); got != "6444:new" {
			t.Fatalf("new UDP flow %d with 6443 drained: %q", i, got)
		}
	}
	// The flows bound before the drain go on.
	_ = oldTCP.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := oldTCP.Write([]byte("still\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := oldRd.ReadString('\n'); err != nil || line != "still\n" {
		t.Fatalf("existing TCP flow: %q, %v", line, err)
	}
	if got := askUDP(oldUDP, "q1"); got != "6443:q1" {
		t.Fatalf("existing UDP flow after the drain: %q", got)
	}
	// Draining twice is no error; a backend the listener lacks is.
	f.must("vip", "backend", "drain", "home", "api", "tcp/443", "server1:6443")
	if code, _, errs := f.run(nil, "vip", "backend", "drain", "home", "api", "tcp/443", "server1:7000"); code != ExitNotFound {
		t.Fatalf("draining a backend the listener lacks: exit %d %s", code, errs)
	}

	f.must("vip", "backend", "undrain", "home", "api", "tcp/443", "server1:6443")
	f.must("vip", "backend", "undrain", "home", "api", "udp/53", "server1:6443")
	if out := f.must("vip", "show", "home", "api"); strings.Contains(out, "(drain)") {
		t.Fatalf("show after undrain:\n%s", out)
	}
	if who, _, _ := dialTCP(); who != "6443" {
		t.Fatalf("new TCP flow after undrain went to %s, want 6443", who)
	}
	if got := askUDP(newUDP(), "back"); got != "6443:back" {
		t.Fatalf("new UDP flow after undrain: %q", got)
	}
}
