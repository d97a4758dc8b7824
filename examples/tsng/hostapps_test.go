package tsng

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/proxy"

	"github.com/vipkit/vipkit/internal/socks5"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/netstack"
	"github.com/vipkit/vipkit/vip"
)

// hostApps is three agents in netstack mode over loopback UDP: server1
// and server2 run an HTTP server on 8080 and a UDP echo on 5353, and the
// client offers the SOCKS5 and HTTP proxies and its local API.
type hostApps struct {
	t        *testing.T
	cfgs     []*Config
	ctx      context.Context
	daemons  []*Daemon
	client   *Daemon
	socks    string
	httpProx string
	socket   string
}

func newHostApps(t *testing.T) *hostApps {
	dir := socketDir(t, "tsnghost")
	names := []string{"server1", "server2", "client"}
	cfgs, err := demoConfigs(dir, names)
	if err != nil {
		t.Fatal(err)
	}
	h := &hostApps{t: t, cfgs: cfgs, daemons: make([]*Daemon, 3), socket: filepath.Join(dir, "client.sock")}
	for _, c := range cfgs {
		c.UI = "off"
		c.Networks[0].ProbeFast = true
		c.Networks[0].DNSPort = 53
	}
	h.socks, h.httpProx = freeTCP(t), freeTCP(t)
	cfgs[2].Socket = h.socket
	cfgs[2].Networks[0].SOCKS5, cfgs[2].Networks[0].HTTPProxy = h.socks, h.httpProx
	t.Cleanup(func() {
		for _, d := range h.daemons {
			if d != nil {
				d.Close()
			}
		}
	})
	for i, c := range cfgs {
		if h.daemons[i], err = NewDaemon(context.Background(), c, DaemonOptions{NoAPI: i != 2}); err != nil {
			t.Fatal(err)
		}
	}
	h.client = h.daemons[2]
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h.ctx = ctx
	for i := range 2 {
		h.serveApps(i)
	}
	reg := h.daemons[0].Runtime("home").Registry()
	if _, err := reg.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	var tcpB, udpB []vip.Backend
	for _, n := range names[:2] {
		b, _ := reg.ResolveBackend(n + ":8080")
		tcpB = append(tcpB, b)
		b, _ = reg.ResolveBackend(n + ":5353")
		udpB = append(udpB, b)
	}
	if _, err := reg.PortAdd(ctx, "api", vip.PortKey{Proto: vip.TCP, Port: 80}, tcpB); err != nil {
		t.Fatal(err)
	}
	v, err := reg.PortAdd(ctx, "api", vip.PortKey{Proto: vip.UDP, Port: 53}, udpB)
	if err != nil {
		t.Fatal(err)
	}
	cn := h.client.Runtime("home")
	waitFor(t, func() bool { cv, err := cn.Registry().Get("api"); return err == nil && cv.Revision == v.Revision })
	waitFor(t, func() bool { return nextBackend(cn, "tcp/80") != "" && nextBackend(cn, "udp/53") != "" })
	return h
}

// serveApps starts server i's HTTP server and UDP echo.
func (h *hostApps) serveApps(i int) {
	host := h.daemons[i].Runtime("home").Host()
	name := h.cfgs[i].Networks[0].Node.Name
	serveHTTPName(h.t, h.ctx, host, 8080, name)
	if err := serveUDPEcho(h.ctx, host, 5353, name); err != nil {
		h.t.Fatal(err)
	}
}

// stop takes server i off the mesh.
func (h *hostApps) stop(i int) {
	h.daemons[i].Close()
	h.daemons[i] = nil
}

// restart brings server i back and waits until the client sees both of
// its backends eligible again.
func (h *hostApps) restart(i int) {
	d, err := NewDaemon(context.Background(), h.cfgs[i], DaemonOptions{NoAPI: true})
	if err != nil {
		h.t.Fatal(err)
	}
	h.daemons[i] = d
	h.serveApps(i)
	name := h.cfgs[i].Networks[0].Node.Name
	waitFor(h.t, func() bool {
		n := 0
		for _, s := range h.client.Runtime("home").Engine().Status().Services {
			for _, l := range s.Listeners {
				for _, b := range l.Backends {
					if b.NodeName == name && b.Eligible {
						n++
					}
				}
			}
		}
		return n == 2
	})
}

func freeTCP(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// serveHTTPName answers every request with the server's name.
func serveHTTPName(t *testing.T, ctx context.Context, h *netstack.Host, port uint16, name string) {
	ln, err := h.ListenTCP(netip.AddrPortFrom(netip.IPv4Unspecified(), port))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, name) })}
	go srv.Serve(ln)
	context.AfterFunc(ctx, func() { srv.Close() })
}

// get fetches url with hc and returns the body (the backend's name).
func get(hc *http.Client, url string) (string, error) {
	resp, err := hc.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("%s: %s", resp.Status, b)
	}
	return string(b), err
}

// viaSOCKS is an HTTP GET of http://api.home/ through the SOCKS5 proxy,
// the name resolved by the agent (socks5h).
func (h *hostApps) viaSOCKS() (string, error) {
	d, err := proxy.SOCKS5("tcp", h.socks, nil, &net.Dialer{Timeout: 3 * time.Second})
	if err != nil {
		return "", err
	}
	tr := &http.Transport{DialContext: d.(proxy.ContextDialer).DialContext, DisableKeepAlives: true}
	return get(&http.Client{Transport: tr, Timeout: 3 * time.Second}, "http://api.home/")
}

// viaCONNECT tunnels to api.home:80 with HTTP CONNECT and sends a GET.
func (h *hostApps) viaCONNECT() (string, error) {
	c, err := net.DialTimeout("tcp", h.httpProx, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprint(c, "CONNECT api.home:80 HTTP/1.1\r\nHost: api.home:80\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return "", err
	}
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("CONNECT: %s", resp.Status)
	}
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: api.home\r\nConnection: close\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// viaHTTPProxy sends an absolute-form GET through the HTTP proxy.
func (h *hostApps) viaHTTPProxy() (string, error) {
	u, _ := url.Parse("http://" + h.httpProx)
	tr := &http.Transport{Proxy: http.ProxyURL(u), DisableKeepAlives: true}
	return get(&http.Client{Transport: tr, Timeout: 3 * time.Second}, "http://api.home/")
}

// viaAssociate sends a datagram to api.home:53 through UDP ASSOCIATE.
func (h *hostApps) viaAssociate(msg string) (string, error) {
	c, err := net.DialTimeout("tcp", h.socks, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	c.Write([]byte{5, 1, 0})
	br := bufio.NewReader(c)
	var m [2]byte
	if _, err := io.ReadFull(br, m[:]); err != nil {
		return "", err
	}
	c.Write(socks5.AppendAddr([]byte{5, 3, 0}, socks5.Addr{IP: netip.IPv4Unspecified()}))
	var rep [3]byte
	if _, err := io.ReadFull(br, rep[:]); err != nil || rep[1] != 0 {
		return "", fmt.Errorf("UDP ASSOCIATE: reply % x %v", rep, err)
	}
	// The bound address: ATYP 1, 4 bytes, port.
	var bnd [7]byte
	if _, err := io.ReadFull(br, bnd[:]); err != nil {
		return "", err
	}
	relay := netip.AddrPortFrom(netip.AddrFrom4([4]byte(bnd[1:5])), uint16(bnd[5])<<8|uint16(bnd[6]))
	u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return "", err
	}
	defer u.Close()
	u.SetDeadline(time.Now().Add(2 * time.Second))
	u.WriteToUDPAddrPort(socks5.AppendDatagram(nil, socks5.Addr{Name: "api.home", Port: 53}, []byte(msg)), relay)
	buf := make([]byte, 1500)
	n, _, err := u.ReadFromUDPAddrPort(buf)
	if err != nil {
		return "", err
	}
	_, payload, err := socks5.ParseDatagram(buf[:n])
	return string(payload), err
}

// forward runs `tsng vip forward` against the client agent until the
// test ends and returns the local address it printed.
func (h *hostApps) forward(listener string) string {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"--socket", h.socket, "vip", "forward", "home", "api", listener}, &Env{Stdout: pw, Stderr: pw, Getenv: func(string) string { return "" }})
		pw.Close()
	}()
	h.t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			h.t.Errorf("vip forward %s: exit %d", listener, code)
		}
	})
	line, err := bufio.NewReader(pr).ReadString('\n')
	go io.Copy(io.Discard, pr)
	if err != nil || !strings.HasPrefix(line, "forwarding ") {
		h.t.Fatalf("vip forward %s: %q %v", listener, line, err)
	}
	return strings.Fields(line)[1]
}

func udpTo(addr, msg string) (string, error) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	c.Write([]byte(msg))
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

// TestHostApplications: in netstack mode host applications reach api.home
// through SOCKS5 (by name, CONNECT and UDP ASSOCIATE), the HTTP proxy
// (CONNECT and absolute-form) and `vip forward` (TCP and UDP), each to a
// backend on another agent; for each path, the server that answered
// leaves the mesh and the path fails over to the other, which then
// comes back for the next path.
func TestHostApplications(t *testing.T) {
	h := newHostApps(t)
	fwdTCP, fwdUDP := h.forward("tcp/80"), h.forward("udp/53")
	plain := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 3 * time.Second}
	paths := []struct {
		name string
		do   func() (string, error)
	}{
		{"SOCKS5 CONNECT by name", h.viaSOCKS},
		{"HTTP CONNECT", h.viaCONNECT},
		{"HTTP proxy", h.viaHTTPProxy},
		{"SOCKS5 UDP ASSOCIATE", func() (string, error) { return h.viaAssociate("ping") }},
		{"vip forward tcp/80", func() (string, error) { return get(plain, "http://"+fwdTCP+"/") }},
		{"vip forward udp/53", func() (string, error) { return udpTo(fwdUDP, "ping") }},
	}
	index := map[string]int{"server1": 0, "server2": 1}
	until := func(what string, do func() (string, error), ok func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			got, err := do()
			if who := strings.SplitN(got, ":", 2)[0]; err == nil && ok(who) {
				return who
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: last answer %q %v", what, got, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, p := range paths {
		first := until(p.name, p.do, func(who string) bool { _, ok := index[who]; return ok })
		h.stop(index[first])
		second := until(p.name+" after "+first+" left", p.do, func(who string) bool { _, ok := index[who]; return ok && who != first })
		t.Logf("%s: answered by %s, then by %s when %s left", p.name, first, second, first)
		h.restart(index[first])
	}
}

// TestProxyRefusals: names outside the network and addresses outside the
// overlay are refused with SOCKS5's reasons; the proxies are loopback
// only and need netstack mode.
func TestProxyRefusals(t *testing.T) {
	h := newHostApps(t)
	d, err := proxy.SOCKS5("tcp", h.socks, nil, proxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ to, want string }{
		{"example.com:80", "host unreachable"},
		{"nosuch.home:80", "host unreachable"},
		{"192.0.2.1:80", "network unreachable"},
	} {
		if _, err := d.Dial("tcp", c.to); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("SOCKS5 to %s: %v, want %q", c.to, err, c.want)
		}
	}
	cfg := *h.client.cfg
	nc := cfg.Networks[0]
	for _, c := range []struct {
		mut  func(*NetworkConfig)
		want string
	}{
		{func(n *NetworkConfig) { n.SOCKS5 = "0.0.0.0:1080" }, "socks5"},
		{func(n *NetworkConfig) { n.HTTPProxy = "192.0.2.1:3128" }, "http_proxy"},
		{func(n *NetworkConfig) { n.Mode = "tun" }, "only in netstack mode"},
	} {
		n := nc
		c.mut(&n)
		cfg.Networks = []NetworkConfig{n}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("config: %v, want %q", err, c.want)
		}
	}
}

// TestCurlSOCKS5Hostname: curl, with the agent resolving the name.
func TestCurlSOCKS5Hostname(t *testing.T) {
	curl := testenv.NeedBinary(t, "curl")
	h := newHostApps(t)
	out, err := exec.Command(curl, "-sS", "--max-time", "5", "--socks5-hostname", h.socks, "http://api.home/").CombinedOutput()
	if err != nil || (string(out) != "server1" && string(out) != "server2") {
		t.Fatalf("curl --socks5-hostname: %q %v", out, err)
	}
	out, err = exec.Command(curl, "-sS", "--max-time", "5", "-p", "-x", "http://"+h.httpProx, "http://api.home/").CombinedOutput()
	if err != nil || (string(out) != "server1" && string(out) != "server2") {
		t.Fatalf("curl -p -x (HTTP CONNECT): %q %v", out, err)
	}
}
