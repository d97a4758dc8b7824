package tsng

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/netstack"
	"github.com/vipkit/vipkit/vip"
)

// serveHostHTTP runs an HTTP server on the host's loopback, answering
// every request with name; the returned func stops it.
func serveHostHTTP(t *testing.T, name string) (uint16, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) })}
	go srv.Serve(ln)
	stop := func() { srv.Close() }
	t.Cleanup(stop)
	return uint16(ln.Addr().(*net.TCPAddr).Port), stop
}

// serveHostUDPEcho answers every datagram on a host loopback port with
// "echo " and the datagram.
func serveHostUDPEcho(t *testing.T) uint16 {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(append([]byte("echo "), buf[:n]...), from)
		}
	}()
	return uint16(pc.LocalAddr().(*net.UDPAddr).Port)
}

// serveNetstackHTTP runs an HTTP server inside a node's netstack on port
// (as an application listening on the overlay address in tun mode).
func serveNetstackHTTP(t *testing.T, h *netstack.Host, port uint16, name string) {
	t.Helper()
	ln, err := h.ListenTCP(netip.AddrPortFrom(netip.IPv4Unspecified(), port))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// vipGet fetches http://addr/ through h's netstack with a fresh
// connection and a 3 s limit.
func vipGet(ctx context.Context, h *netstack.Host, addr netip.AddrPort) (string, error) {
	tr := &http.Transport{DialContext: h.DialContext, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 3 * time.Second}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr.String()+"/", nil)
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestNetstackBackendLoopback: an HTTP server on the host's loopback
// behind a netstack node (server1, which allows its port in
// backend_ports) is reached through a VIP from another node (client) with
// Go's HTTP client. When it stops, the VIP fails over to server2, whose
// application listens on the overlay address (as in tun mode). A second
// loopback server whose port server1 does not allow is refused through a
// VIP, and server1's status (the local API's JSON and `vip status`) shows
// that backend as not allowed.
func TestNetstackBackendLoopback(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	port, stopHTTP := serveHostHTTP(t, "server1-host")
	other, _ := serveHostHTTP(t, "server1-unlisted")
	udpPort := serveHostUDPEcho(t)
	cfgs, err := demoConfigs(t.TempDir(), []string{"server1", "server2", "client"})
	if err != nil {
		t.Fatal(err)
	}
	sock := socketDir(t, "nsback") + "/tsng.sock"
	cfgs[0].Socket = sock
	cfgs[0].Networks[0].BackendPorts = []string{fmt.Sprintf("tcp/%d", port), fmt.Sprintf("udp/%d", udpPort)}
	// The client serves a SOCKS5 proxy, for curl.
	curl := testenv.NeedBinary(t, "curl")
	cfgs[2].Networks[0].SOCKS5 = "127.0.0.1:0"
	var clientLog syncBuffer
	var ds []*Daemon
	var path1 string
	for i, c := range cfgs {
		c.Networks[0].ProbeFast = true
		o := DaemonOptions{NoAPI: i > 0}
		if i == 2 {
			o.Logger = slog.New(slog.NewJSONHandler(&clientLog, nil))
		}
		d, path := startReloadable(t, c, o)
		ds = append(ds, d)
		if i == 0 {
			path1 = path
		}
	}
	server1, server2, client := ds[0].Runtime("home"), ds[1].Runtime("home"), ds[2].Runtime("home")
	serveNetstackHTTP(t, server2.Host(), port, "server2-overlay")
	reg := server1.Registry()
	if _, err := reg.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	be := func(s string) vip.Backend {
		b, err := reg.ResolveBackend(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	v, err := reg.PortAdd(ctx, "api", vip.PortKey{Proto: vip.TCP, Port: 90}, []vip.Backend{be(fmt.Sprintf("server1:%d", port))})
	if err != nil {
		t.Fatal(err)
	}
	api90 := netip.AddrPortFrom(v.Addr, 90)
	var got string
	pollUntil(t, 30*time.Second, "GET through the VIP to server1's loopback", func() (bool, string) {
		got, err = vipGet(ctx, client.Host(), api90)
		return err == nil && got == "server1-host", fmt.Sprintf("%q, %v", got, err)
	})
	var socks string
	for _, line := range strings.Split(clientLog.String(), "\n") {
		var rec struct{ Msg, Address string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "SOCKS5 proxy listening" {
			socks = rec.Address
		}
	}
	if socks == "" {
		t.Fatal("the client logged no SOCKS5 address")
	}
	// curl through the client's SOCKS5 proxy, the VIP's name resolved by
	// the agent.
	curlGet := func() string {
		t.Helper()
		out, err := exec.CommandContext(ctx, curl, "-sS", "--max-time", "10", "--socks5-hostname", socks, "http://api.home:90/").CombinedOutput()
		if err != nil {
			t.Fatalf("curl --socks5-hostname %s http://api.home:90/: %v\n%s", socks, err, out)
		}
		return string(out)
	}
	if got := curlGet(); got != "server1-host" {
		t.Errorf("curl through the VIP: %q; want server1-host", got)
	}

	// UDP: datagrams to the VIP reach the loopback echo server and back.
	if _, err := reg.PortAdd(ctx, "api", vip.PortKey{Proto: vip.UDP, Port: 53}, []vip.Backend{be(fmt.Sprintf("server1:%d", udpPort))}); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 30*time.Second, "a UDP exchange through the VIP with server1's loopback", func() (bool, string) {
		got, err := udpAsk(ctx, client.Host(), netip.AddrPortFrom(v.Addr, 53), "ping")
		return err == nil && got == "echo ping", fmt.Sprintf("%q, %v", got, err)
	})
	if st := relayOf(server1).Stats(); st.UDPAccepted == 0 || st.UDPFlows == 0 {
		t.Errorf("relay stats %+v: want a UDP flow", st)
	}

	// Failover: server2 joins; server1's application stops.
	if _, err := reg.BackendAdd(ctx, "api", vip.PortKey{Proto: vip.TCP, Port: 90}, be(fmt.Sprintf("server2:%d", port))); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 30*time.Second, "server2's backend eligible at the client", func() (bool, string) {
		bs, _ := backendAt(client, "tcp/90", "server2")
		return bs.Eligible, fmt.Sprintf("%+v", bs)
	})
	stopHTTP()
	stopped := time.Now()
	pollUntil(t, 30*time.Second, "the client's server1 backend out of rotation", func() (bool, string) {
		bs, _ := backendAt(client, "tcp/90", "server1")
		return !bs.Eligible && bs.Reason == "check-failed", fmt.Sprintf("%+v", bs)
	})
	t.Logf("server1 out of rotation at the client %v after its application stopped", time.Since(stopped).Round(time.Millisecond))
	for range 3 {
		if got, err := vipGet(ctx, client.Host(), api90); err != nil || got != "server2-overlay" {
			t.Fatalf("GET after failover: %q, %v; want server2-overlay", got, err)
		}
	}
	if got := curlGet(); got != "server2-overlay" {
		t.Errorf("curl through the VIP after failover: %q; want server2-overlay", got)
	}

	// A port server1 does not allow: refused, and shown so at server1.
	// The finding's command: accepted (any member may name any port), with
	// a warning from the node that will not serve it.
	env := &Env{Getenv: func(k string) string {
		if k == "TSNG_SOCKET" {
			return sock
		}
		return ""
	}}
	var out, errb bytes.Buffer
	env.Stdout, env.Stderr = &out, &errb
	if code := Main(ctx, []string{"vip", "port", "add", "home", "api", "tcp/91", "--backend", fmt.Sprintf("server1:%d", other)}, env); code != 0 {
		t.Fatalf("vip port add: exit %d: %s", code, errb.String())
	}
	if want := fmt.Sprintf("warning: tcp/91 backend server1:%d is on this node, but networks[0] (home).backend_ports does not list tcp/%d", other, other); !strings.Contains(errb.String(), want) {
		t.Errorf("vip port add: stderr %q; want %q", errb.String(), want)
	}
	out.Reset()
	errb.Reset()
	pollUntil(t, 30*time.Second, "the client routes tcp/91", func() (bool, string) {
		l, ok := listenerAt(client, "tcp/91")
		return ok && l.Routed, fmt.Sprintf("%+v", l)
	})
	if got, err := vipGet(ctx, client.Host(), netip.AddrPortFrom(v.Addr, 91)); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("GET to a port server1 does not allow: %q, %v; want connection refused", got, err)
	}
	pollUntil(t, 30*time.Second, "server1's own status of its unlisted backend not-allowed", func() (bool, string) {
		st, _ := server1.status(mustGet(t, server1, "api").ID).(vip.ServiceStatus)
		for _, l := range st.Listeners {
			for _, b := range l.Backends {
				if l.Listener == "tcp/91" {
					return b.Reason == "not-allowed", fmt.Sprintf("%+v", b)
				}
			}
		}
		return false, "no tcp/91"
	})
	if code := Main(ctx, []string{"vip", "status", "home", "api", "--json"}, env); code != 0 {
		t.Fatalf("vip status --json: exit %d: %s", code, errb.String())
	}
	var sample struct {
		Status vip.ServiceStatus `json:"status"`
	}
	if err := json.Unmarshal(out.Bytes(), &sample); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, l := range sample.Status.Listeners {
		for _, b := range l.Backends {
			if l.Listener == "tcp/91" && b.NodeName == "server1" {
				found = true
				if b.Reason != "not-allowed" || b.Eligible || !strings.Contains(b.CheckError, "backend_ports") {
					t.Errorf("server1's status of its unlisted backend: %+v; want not-allowed", b)
				}
			}
		}
	}
	if !found {
		t.Fatalf("no tcp/91 backend on server1 in %s", out.String())
	}
	out.Reset()
	if code := Main(ctx, []string{"vip", "status", "home", "api"}, env); code != 0 {
		t.Fatalf("vip status: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), fmt.Sprintf("server1:%d  not-allowed", other)) {
		t.Errorf("vip status shows no not-allowed backend:\n%s", out.String())
	}
	if st := relayOf(server1).Stats(); st.TCPAccepted == 0 || st.NotAllowed == 0 {
		t.Errorf("relay stats %+v: want accepted and not-allowed counts", st)
	}
	mfs, err := ds[0].metricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "tsng_backend_relay_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					outcomes[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if outcomes["accepted_tcp"] == 0 || outcomes["accepted_udp"] == 0 || outcomes["not_allowed"] == 0 || outcomes["dial_failed"] == 0 {
		t.Errorf("tsng_backend_relay_total: %v; want accepted, not_allowed and dial_failed counts", outcomes)
	}

	// The editor shows the warning on the VIP's window, and says where
	// backends listen.
	bctx := browser(t)
	if err := chromedp.Do(bctx, uiSignIn(t, ds[0], "#/n/home/v/"+mustGet(t, server1, "api").ID.String()),
		waitJS(`document.querySelector("#backend-warnings") !== null`)); err != nil {
		t.Fatalf("the editor shows no backend warning: %v", err)
	}
	banner, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector("#backend-warnings").textContent + " | " + document.querySelector(".backend-hint").textContent`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(banner, fmt.Sprintf("does not list tcp/%d", other)) || !strings.Contains(banner, "127.0.0.1") {
		t.Errorf("the editor's warning and hint: %q", banner)
	}

	// config check warns of it, from the running agent and, without one,
	// from the stored state; the allowed backends draw no warning.
	for _, from := range []string{"the running agent", "the stored state"} {
		if from == "the stored state" {
			ds[0].Close()
		}
		out.Reset()
		errb.Reset()
		if code := Main(ctx, []string{"config", "check", path1}, env); code != 0 {
			t.Fatalf("config check: exit %d: %s%s", code, out.String(), errb.String())
		}
		want := fmt.Sprintf("VIP api tcp/91 has a backend on this node (server1:%d), known from %s", other, from)
		if !strings.Contains(errb.String(), want) || !strings.Contains(errb.String(), fmt.Sprintf("backend_ports does not list tcp/%d", other)) ||
			strings.Count(errb.String(), "warning:") != 1 {
			t.Errorf("config check, %s: stderr\n%s\nwant one warning: %s", from, errb.String(), want)
		}
	}
}

// relayOf returns n's backend relay (nil while the network is down).
func relayOf(n *netRuntime) *backendRelay {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.relay
}

// TestReloadBackendPorts: a reload applies a change of backend_ports to
// the running relay. A port added is served at once; a port removed is
// refused from then on, and a connection relayed to it is closed; the
// reload reports the ports in force, and a restart of the network keeps
// them.
func TestReloadBackendPorts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	port, _ := serveHostHTTP(t, "server1-host")
	cfgs, err := demoConfigs(t.TempDir(), []string{"server1", "client"})
	if err != nil {
		t.Fatal(err)
	}
	var ds []*Daemon
	var path string
	for i, c := range cfgs {
		c.Networks[0].ProbeFast = true
		d, p := startReloadable(t, c, DaemonOptions{NoAPI: true})
		ds = append(ds, d)
		if i == 0 {
			path = p
		}
	}
	server1, client := ds[0].Runtime("home"), ds[1].Runtime("home")
	reg := server1.Registry()
	if _, err := reg.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	b, err := reg.ResolveBackend(fmt.Sprintf("server1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	v, err := reg.PortAdd(ctx, "api", vip.PortKey{Proto: vip.TCP, Port: 90}, []vip.Backend{b})
	if err != nil {
		t.Fatal(err)
	}
	api90 := netip.AddrPortFrom(v.Addr, 90)
	pollUntil(t, 30*time.Second, "the client routes tcp/90", func() (bool, string) {
		l, ok := listenerAt(client, "tcp/90")
		return ok && l.Routed, fmt.Sprintf("%+v", l)
	})
	if got, err := vipGet(ctx, client.Host(), api90); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("GET before the port is allowed: %q, %v; want connection refused", got, err)
	}

	reload := func(ports []string) ReloadResult {
		t.Helper()
		c := cloneConfig(t, cfgs[0])
		c.Networks[0].BackendPorts = ports
		rewriteConfig(t, path, c)
		res, err := ds[0].Reload(ctx)
		if err != nil {
			t.Fatalf("reload with backend_ports %v: %v", ports, err)
		}
		if !res.Changed || len(res.Networks) != 1 || !res.Networks[0].BackendPortsChanged || !slices.Equal(res.Networks[0].BackendPorts, ports) {
			t.Fatalf("reload with backend_ports %v: %+v", ports, res)
		}
		return res
	}
	allow := []string{fmt.Sprintf("tcp/%d", port)}
	reload(allow)
	pollUntil(t, 30*time.Second, "GET through the VIP once the port is allowed", func() (bool, string) {
		got, err := vipGet(ctx, client.Host(), api90)
		return err == nil && got == "server1-host", fmt.Sprintf("%q, %v", got, err)
	})
	if st := relayOf(server1).Stats(); !slices.Equal(st.Allowed, allow) {
		t.Errorf("relay allows %v; want %v", st.Allowed, allow)
	}
	if w := server1.backendWarnings(mustGet(t, server1, "api").Service); len(w) != 0 {
		t.Errorf("warnings of an allowed backend: %q", w)
	}

	// A network restart keeps the reloaded ports.
	if err := ds[0].Down("home"); err != nil {
		t.Fatal(err)
	}
	if err := ds[0].Up(ctx, "home"); err != nil {
		t.Fatal(err)
	}
	if st := relayOf(server1).Stats(); !slices.Equal(st.Allowed, allow) {
		t.Errorf("relay after a restart of the network allows %v; want %v", st.Allowed, allow)
	}
	var held net.Conn
	pollUntil(t, 30*time.Second, "a connection through the VIP after the restart", func() (bool, string) {
		got, err := vipGet(ctx, client.Host(), api90)
		if err != nil || got != "server1-host" {
			return false, fmt.Sprintf("%q, %v", got, err)
		}
		// A connection held open: half a request, which the server waits on.
		held, err = client.Host().DialContext(ctx, "tcp", api90.String())
		if err == nil {
			_, err = io.WriteString(held, "GET / HTTP/1.1\r\n")
		}
		return err == nil, fmt.Sprint(err)
	})
	defer held.Close()
	pollUntil(t, 10*time.Second, "the held connection relayed", func() (bool, string) {
		st := relayOf(server1).Stats()
		return st.TCPActive == 1, fmt.Sprintf("%+v", st)
	})

	// The port removed: the held connection is closed, new ones refused.
	reload(nil)
	held.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := held.Read(make([]byte, 512)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the connection relayed to a removed port: read %d, %v; want it closed", n, err)
	}
	if got, err := vipGet(ctx, client.Host(), api90); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("GET after the port is removed: %q, %v; want connection refused", got, err)
	}
	// The relay closes the held connection's two sides first and counts
	// it gone when its goroutine has returned, a moment after the client
	// sees the close: wait for the count.
	pollUntil(t, 10*time.Second, "the held connection's relay ended", func() (bool, string) {
		st := relayOf(server1).Stats()
		return st.TCPActive == 0, fmt.Sprintf("%+v", st)
	})
	if st := relayOf(server1).Stats(); len(st.Allowed) != 0 || st.TCPActive != 0 {
		t.Errorf("relay after the port is removed: %+v", st)
	}
	if w := server1.backendWarnings(mustGet(t, server1, "api").Service); len(w) != 1 || !strings.Contains(w[0], fmt.Sprintf("does not list tcp/%d", port)) {
		t.Errorf("warnings of a removed backend port: %q", w)
	}
}

// TestBackendRelayRuntimeAgentPorts: the ports the agent takes at run
// time, when metrics, socks5 and http_proxy listen on port 0 and
// WireGuard's listen_port is 0, are the agent's own: the relay refuses
// them, and counts the refusals, even when backend_ports lists them (a
// reload may, as config validation cannot know them). A VIP backend on
// one of them is never the agent's metrics, proxy or WireGuard socket.
func TestBackendRelayRuntimeAgentPorts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfgs, err := demoConfigs(t.TempDir(), []string{"server1", "client"})
	if err != nil {
		t.Fatal(err)
	}
	s1 := cfgs[0]
	s1.Metrics = "127.0.0.1:0"
	s1.Networks[0].SOCKS5 = "127.0.0.1:0"
	s1.Networks[0].HTTPProxy = "127.0.0.1:0"
	s1.Networks[0].Node.ListenPort = 0
	// The client learns server1's endpoint from its handshakes.
	cfgs[1].Networks[0].Peers[0].Endpoint = ""
	var logs syncBuffer
	var ds []*Daemon
	var path string
	for i, c := range cfgs {
		c.Networks[0].ProbeFast = true
		o := DaemonOptions{NoAPI: true}
		if i == 0 {
			o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		}
		d, p := startReloadable(t, c, o)
		ds = append(ds, d)
		if i == 0 {
			path = p
		}
	}
	server1, client := ds[0].Runtime("home"), ds[1].Runtime("home")

	// The ports chosen at start.
	ports := map[string]vip.PortKey{}
	for _, line := range strings.Split(logs.String(), "\n") {
		var rec struct{ Msg, Address string }
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		if what, ok := map[string]string{"SOCKS5 proxy listening": "socks5", "HTTP proxy listening": "http_proxy"}[rec.Msg]; ok {
			ap := netip.MustParseAddrPort(rec.Address)
			ports[what] = vip.PortKey{Proto: vip.TCP, Port: ap.Port()}
		}
	}
	ports["metrics"] = vip.PortKey{Proto: vip.TCP, Port: netip.MustParseAddrPort(ds[0].MetricsAddr()).Port()}
	wcfg, err := devOf(server1).Config()
	if err != nil {
		t.Fatal(err)
	}
	ports["wireguard"] = vip.PortKey{Proto: vip.UDP, Port: wcfg.ListenPort}
	if len(ports) != 4 || wcfg.ListenPort == 0 {
		t.Fatalf("run-time ports %v; want socks5, http_proxy, metrics and wireguard", ports)
	}
	t.Logf("run-time ports: %v", ports)

	// backend_ports lists them all; validation cannot tell.
	c := cloneConfig(t, s1)
	for _, k := range ports {
		c.Networks[0].BackendPorts = append(c.Networks[0].BackendPorts, k.String())
	}
	slices.Sort(c.Networks[0].BackendPorts)
	rewriteConfig(t, path, c)
	if _, err := ds[0].Reload(ctx); err != nil {
		t.Fatal(err)
	}

	reg := server1.Registry()
	if _, err := reg.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	var v vip.ServiceView
	vipPort := map[string]uint16{}
	next := uint16(90)
	for what, k := range ports {
		b, err := reg.ResolveBackend(fmt.Sprintf("server1:%d", k.Port))
		if err != nil {
			t.Fatal(err)
		}
		vipPort[what] = next
		if v, err = reg.PortAdd(ctx, "api", vip.PortKey{Proto: k.Proto, Port: next}, []vip.Backend{b}); err != nil {
			t.Fatal(err)
		}
		next++
	}
	for what, k := range ports {
		l := vip.PortKey{Proto: k.Proto, Port: vipPort[what]}.String()
		pollUntil(t, 30*time.Second, "the client routes "+l, func() (bool, string) {
			ls, ok := listenerAt(client, l)
			return ok && ls.Routed, fmt.Sprintf("%+v", ls)
		})
	}
	before := relayOf(server1).Stats()
	for what, k := range ports {
		to := netip.AddrPortFrom(v.Addr, vipPort[what])
		if k.Proto == vip.TCP {
			if got, err := vipGet(ctx, client.Host(), to); err == nil || !strings.Contains(err.Error(), "connection refused") {
				t.Errorf("GET through the VIP to server1's %s port %v: %q, %v; want connection refused", what, k, got, err)
			}
			continue
		}
		// Datagrams to WireGuard's port: none is relayed.
		for range 3 {
			c, err := client.Host().DialUDP(netip.AddrPort{}, to)
			if err != nil {
				t.Fatal(err)
			}
			c.Write([]byte("not a handshake"))
			c.Close()
		}
	}
	pollUntil(t, 10*time.Second, "the refusals counted", func() (bool, string) {
		st := relayOf(server1).Stats()
		return st.NotAllowed >= before.NotAllowed+4, fmt.Sprintf("%+v (before %+v)", st, before)
	})
	if st := relayOf(server1).Stats(); st.TCPAccepted != before.TCPAccepted || st.UDPAccepted != before.UDPAccepted || st.UDPFlows != 0 {
		t.Errorf("relay stats %+v (before %+v): an agent port was relayed", st, before)
	}
	// A TCP backend fails its connect checks, and server1 says why; a UDP
	// backend has no connect check (the warning below says it).
	pollUntil(t, 30*time.Second, "server1's status of its TCP backends on agent ports", func() (bool, string) {
		st, _ := server1.status(mustGet(t, server1, "api").ID).(vip.ServiceStatus)
		var got []string
		for _, l := range st.Listeners {
			if !strings.HasPrefix(l.Listener, "tcp/") {
				continue
			}
			for _, b := range l.Backends {
				if b.Reason != reasonAgentPort {
					return false, fmt.Sprintf("%s %+v", l.Listener, b)
				}
				got = append(got, l.Listener)
			}
		}
		return len(got) == 3, fmt.Sprint(got)
	})
	w := server1.backendWarnings(mustGet(t, server1, "api").Service)
	for what, k := range ports {
		want := fmt.Sprintf("%s is a port of the agent itself (", k)
		if what != "metrics" {
			want += "networks home "
		}
		if what == "wireguard" {
			what = "node.listen_port (WireGuard)"
		}
		if !slices.ContainsFunc(w, func(s string) bool { return strings.Contains(s, want+what+")") }) {
			t.Errorf("warnings %q: none says %s is the agent's %s", w, k, what)
		}
	}
}
