//go:build linux

package tsng_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipkit/vipkit/examples/tsng"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/netns"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/vip"
	"github.com/vishvananda/netlink"
)

// The harness of TestE2ETUN: the three nodes (namespaces on one bridged
// LAN, configs, agents as processes), the applications on their kernel
// stacks, and the CLI and status helpers the scenario's phases use.

const (
	e2eNet     = "home"
	e2eOverlay = "100.80.0.0/24"
	wgPort     = 51820
	// metricsAddr is every agent's Prometheus listener, on the loopback of
	// its own namespace.
	metricsAddr = "127.0.0.1:9469"
	httpPort    = 80   // the VIP's TCP listener with two remote backends
	localPort   = 81   // the VIP's TCP listener with a local and a remote backend
	udpPort     = 5300 // the VIP's UDP listener
)

// e2eNode is one agent: its namespace, config, process and log.
type e2eNode struct {
	name    string
	host    *netns.Host
	addr    netip.Addr // overlay
	dir     string
	cfgPath string
	sock    string
	logPath string
	appTCP  uint16 // its HTTP server's port
	appUDP  uint16 // its UDP server's port

	// mu guards proc and logf.
	mu sync.Mutex
	// +checklocks:mu
	proc *netns.Process
	// +checklocks:mu
	logf *os.File
}

// e2eCluster is the scenario's world, made by newE2ECluster: three agents
// started, each in a namespace of its own on one bridged LAN, with the
// applications their VIP fronts and the client's resolver pointed at its
// agent's DNS.
type e2eCluster struct {
	ctx        context.Context // the scenario's budget
	bin        string          // the tsng binary built from ./cmd/tsng
	start      time.Time
	nodes      []*e2eNode // s1, s2, cl
	s1, s2, cl *e2eNode
	udpApps    map[string]*udpApp // by node name, on s1 and s2
}

// newE2ECluster builds the agent and sets the cluster up; everything it
// makes goes at t's cleanup, when the logs of the agents are also checked
// for data races, and logged if t failed.
func newE2ECluster(t *testing.T) *e2eCluster {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.NeedBinary(t, "ip")
	goBin := testenv.NeedBinary(t, "go")
	c := &e2eCluster{start: time.Now()}
	c.bin = buildAgent(t.Context(), t, goBin)
	c.step(t, "built %s", c.bin)
	// The scenario's budget (about 40 s on an idle machine, 2 min under
	// -race on a loaded one), apart from the build.
	ctx, cancel := context.WithTimeout(t.Context(), 150*time.Second)
	t.Cleanup(cancel)
	c.ctx = ctx

	// Three namespaces on one bridged LAN: the underlay.
	nodes := []*e2eNode{
		{name: "server1", appTCP: 8081, appUDP: 5301},
		{name: "server2", appTCP: 8082, appUDP: 5302},
		{name: "client", appTCP: 8083},
	}
	for i, n := range nodes {
		n.host = netns.NewHostT(t, n.name[:2]+strconv.Itoa(i))
		n.addr = netip.AddrFrom4([4]byte{100, 80, 0, byte(i + 1)})
		n.dir = t.TempDir()
		n.cfgPath = filepath.Join(n.dir, "tsng.json")
		n.sock = filepath.Join(n.dir, "tsng.sock")
		n.logPath = filepath.Join(n.dir, "agent.log")
	}
	c.nodes = nodes
	c.s1, c.s2, c.cl = nodes[0], nodes[1], nodes[2]
	_, ifs := netns.LANT(t, c.s1.host, c.s2.host, c.cl.host)
	writeConfigs(t, nodes, ifs)

	// The applications on the two backends, on the kernel stacks of their
	// namespaces: they answer with their node's name and the peer address
	// they saw.
	c.udpApps = map[string]*udpApp{}
	for _, n := range []*e2eNode{c.s1, c.s2} {
		serveHTTP(ctx, t, n)
		c.udpApps[n.name] = serveUDP(ctx, t, n)
	}
	serveHTTP(ctx, t, c.cl)

	// The agents. On failure, their logs (stderr) go to the test log.
	t.Cleanup(func() {
		for _, n := range nodes {
			n.stop()
		}
		for _, n := range nodes {
			if b, err := os.ReadFile(n.logPath); err == nil && bytes.Contains(b, []byte("WARNING: DATA RACE")) {
				t.Errorf("agent %s: the race detector reported a data race (its log follows)", n.name)
			}
		}
		if t.Failed() {
			for _, n := range nodes {
				logTail(t, n)
			}
		}
	})
	for _, n := range nodes {
		n.start(ctx, t, c.bin)
	}

	// The client's namespace resolves through its agent's DNS.
	useAgentDNS(t, c.cl)
	return c
}

// step logs one step of the scenario, with the seconds since it started.
func (c *e2eCluster) step(t *testing.T, format string, a ...any) {
	t.Helper()
	t.Logf("[%5.1fs] %s", time.Since(c.start).Seconds(), fmt.Sprintf(format, a...))
}

// buildAgent builds ./cmd/tsng once into a temporary directory, with the
// race detector when the test has it.
func buildAgent(ctx context.Context, t *testing.T, goBin string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tsng")
	args := []string{"build", "-o", bin}
	if e2eRace {
		args = append(args, "-race")
	}
	args = append(args, "github.com/vipkit/vipkit/cmd/tsng")
	cmd := exec.CommandContext(ctx, goBin, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// writeConfigs writes every node's config file: network home on a kernel
// TUN, the other two as peers with their underlay endpoints.
func writeConfigs(t *testing.T, nodes []*e2eNode, ifs []netns.Iface) {
	t.Helper()
	seeds := make([][]byte, len(nodes))
	ids := make([]vip.NodeID, len(nodes))
	keys := make([]wg.Key, len(nodes))
	for i := range nodes {
		seeds[i] = make([]byte, ed25519.SeedSize)
		if _, err := rand.Read(seeds[i]); err != nil {
			t.Fatal(err)
		}
		copy(ids[i][:], ed25519.NewKeyFromSeed(seeds[i]).Public().(ed25519.PublicKey))
		keys[i] = wg.GeneratePrivateKey()
	}
	for i, n := range nodes {
		// Each agent's TUN has a name of its own: the namespaces share
		// /var/run/wireguard, where wg show's socket is named after it.
		nc := tsng.NetworkConfig{Name: e2eNet, Overlay: e2eOverlay, Mode: "tun", TUN: e2eTUN(n),
			Node: tsng.NodeConfig{Name: n.name, Address: n.addr.String(), IdentityKey: base64.StdEncoding.EncodeToString(seeds[i]),
				WireGuardKey: keys[i], ListenPort: wgPort}}
		for j, p := range nodes {
			if j != i {
				nc.Peers = append(nc.Peers, tsng.PeerConfig{Name: p.name, Address: p.addr.String(), Identity: base64.StdEncoding.EncodeToString(ids[j][:]),
					WireGuardKey: keys[j].PublicKey(), Endpoint: ifs[j].AddrPort4(wgPort).String()})
			}
		}
		cfg := tsng.Config{DataDir: filepath.Join(n.dir, "data"), Socket: n.sock, Metrics: metricsAddr, LogLevel: "debug", Networks: []tsng.NetworkConfig{nc}}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		b, err := json.MarshalIndent(cfg, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(n.cfgPath, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// start runs the agent in its namespace, its output appended to its log.
func (n *e2eNode) start(ctx context.Context, t *testing.T, bin string) {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.logf == nil {
		f, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		n.logf = f
	}
	fmt.Fprintf(n.logf, "=== tsng daemon --config %s (%s)\n", n.cfgPath, time.Now().Format(time.RFC3339Nano))
	// Not ctx: the agent lives until kill or cleanup, not until a step ends.
	p, err := n.host.Start(context.WithoutCancel(ctx), []string{bin, "daemon", "--config", n.cfgPath}, netns.ProcOptions{Output: n.logf})
	if err != nil {
		t.Fatalf("starting the agent of %s: %v", n.name, err)
	}
	n.proc = p
}

// kill SIGKILLs the agent and waits until it is reaped.
func (n *e2eNode) kill(t *testing.T) {
	t.Helper()
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL %s's agent: %v", n.name, err)
	}
	if err := p.Kill(); err != nil { // waits for the reaping
		t.Fatal(err)
	}
	if code := p.ExitCode(); code != -1 {
		t.Fatalf("%s's agent exited with %d, want death by signal", n.name, code)
	}
}

// stop kills the agent (if running) and closes its log.
func (n *e2eNode) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil {
		_ = n.proc.Kill()
	}
	if n.logf != nil {
		n.logf.Close()
		n.logf = nil
	}
}

// logTail logs the end of an agent's log (its stderr).
func logTail(t *testing.T, n *e2eNode) {
	b, err := os.ReadFile(n.logPath)
	if err != nil {
		t.Logf("agent %s: no log: %v", n.name, err)
		return
	}
	const max = 96 << 10
	if len(b) > max {
		b = append([]byte("…\n"), b[len(b)-max:]...)
	}
	t.Logf("agent %s (%s), stderr:\n%s", n.name, n.logPath, b)
}

// cli runs the tsng CLI as a process against n's agent and returns its
// stdout, stderr and exit status.
func cli(ctx context.Context, bin string, n *e2eNode, args ...string) (string, string, int, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, bin, append([]string{"--socket", n.sock}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return stdout.String(), stderr.String(), ee.ExitCode(), nil
	}
	if err != nil {
		return stdout.String(), stderr.String(), -1, err
	}
	return stdout.String(), stderr.String(), 0, nil
}

func mustCLI(ctx context.Context, t *testing.T, bin string, n *e2eNode, args ...string) string {
	t.Helper()
	out, errOut, code, err := cli(ctx, bin, n, args...)
	if err != nil || code != tsng.ExitOK {
		t.Fatalf("tsng %s (agent %s): exit %d, %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), n.name, code, err, out, errOut)
	}
	return out
}

// waitAgent waits until the agent answers on its socket with its network
// up; it fails at once if the agent exits.
func waitAgent(ctx context.Context, t *testing.T, bin string, n *e2eNode) {
	t.Helper()
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	eventually(ctx, t, 30*time.Second, "agent "+n.name+" up", func() (bool, string) {
		select {
		case <-p.Done():
			t.Fatalf("the agent of %s exited (status %d) while starting", n.name, p.ExitCode())
		default:
		}
		out, errOut, code, err := cli(ctx, bin, n, "network", "list", "--json")
		if err != nil || code != tsng.ExitOK {
			return false, fmt.Sprintf("exit %d %v %s", code, err, errOut)
		}
		var s tsng.NetworkSummary
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			return false, err.Error()
		}
		return s.Name == e2eNet && s.Up, out
	})
}

// e2eTUN is node n's TUN name.
func e2eTUN(n *e2eNode) string { return "tsng-" + n.name }

// checkTUN checks the agent's kernel TUN in its namespace: up, MTU 1420,
// the overlay address with the overlay's prefix, and no IPv6 (the overlay
// carries IPv4 only).
func checkTUN(t *testing.T, n *e2eNode) {
	t.Helper()
	nl := n.host.Netlink()
	link, err := nl.LinkByName(e2eTUN(n))
	if err != nil {
		t.Fatalf("%s: the agent's TUN: %v", n.name, err)
	}
	a := link.Attrs()
	if a.Flags&net.FlagUp == 0 || a.MTU != 1420 {
		t.Errorf("%s: TUN %s flags %v MTU %d, want up with MTU 1420", n.name, a.Name, a.Flags, a.MTU)
	}
	v4, err := nl.AddrList(link, netlink.FAMILY_V4)
	want := netip.PrefixFrom(n.addr, netip.MustParsePrefix(e2eOverlay).Bits()).String()
	if err != nil || len(v4) != 1 || v4[0].IPNet.String() != want {
		t.Errorf("%s: TUN IPv4 addresses %v (%v), want %s", n.name, v4, err, want)
	}
	if v6, err := nl.AddrList(link, netlink.FAMILY_V6); err != nil || len(v6) != 0 {
		t.Errorf("%s: TUN IPv6 addresses %v (%v), want none", n.name, v6, err)
	}
}

// eventually polls cond every 200 ms until it holds, failing t after d
// with cond's last note.
func eventually(ctx context.Context, t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, note := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: not within %v; last: %s", what, d, note)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// useAgentDNS points n's namespace resolver at its agent's DNS, with
// /etc/netns/NAME/resolv.conf, which `ip netns exec` bind-mounts over
// /etc/resolv.conf; the file (and directories this test made) go at cleanup.
func useAgentDNS(t *testing.T, n *e2eNode) {
	t.Helper()
	const base = "/etc/netns"
	_, err := os.Stat(base)
	madeBase := os.IsNotExist(err)
	dir := filepath.Join(base, n.host.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing %s: %v", dir, err)
		}
		if madeBase {
			_ = os.Remove(base) // only when empty: other tests may use it now
		}
	})
	conf := fmt.Sprintf("# tsng e2e test: the agent's DNS on its overlay address\nnameserver %v\noptions timeout:1 attempts:2\n", n.addr)
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
}

func showVIP(ctx context.Context, bin string, n *e2eNode) (tsng.ServiceDoc, error) {
	var d tsng.ServiceDoc
	out, errOut, code, err := cli(ctx, bin, n, "vip", "show", e2eNet, "api", "--json")
	if err != nil || code != tsng.ExitOK {
		return d, fmt.Errorf("vip show on %s: exit %d %v %s", n.name, code, err, errOut)
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		return d, fmt.Errorf("vip show --json on %s: %v\n%s", n.name, err, out)
	}
	return d, nil
}

// statusVIP returns n's observation of api (`vip status --json`, one
// sample) decoded, and as printed.
func statusVIP(ctx context.Context, bin string, n *e2eNode) (vip.Status, string, error) {
	out, errOut, code, err := cli(ctx, bin, n, "vip", "status", e2eNet, "api", "--json")
	if err != nil || code != tsng.ExitOK {
		return vip.Status{}, "", fmt.Errorf("vip status on %s: exit %d %v %s", n.name, code, err, errOut)
	}
	var s struct {
		Status *vip.ServiceStatus `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		return vip.Status{}, out, fmt.Errorf("vip status --json on %s: %v\n%s", n.name, err, out)
	}
	if s.Status == nil {
		return vip.Status{}, out, fmt.Errorf("vip status on %s: no observation\n%s", n.name, out)
	}
	return vip.Status{Services: []vip.ServiceStatus{*s.Status}}, out, nil
}

func allEligible(st vip.Status, listeners int) bool {
	n := 0
	for _, s := range st.Services {
		for _, l := range s.Listeners {
			n++
			if len(l.Backends) == 0 || l.Next == nil {
				return false
			}
			for _, b := range l.Backends {
				if !b.Eligible {
					return false
				}
			}
		}
	}
	return n == listeners
}

func findListener(st vip.Status, listener string) *vip.ListenerStatus {
	for _, s := range st.Services {
		for i := range s.Listeners {
			if s.Listeners[i].Listener == listener {
				return &s.Listeners[i]
			}
		}
	}
	return nil
}

// nextBackend returns the node a new flow of listener would be bound to.
func nextBackend(st vip.Status, listener string) string {
	for _, s := range st.Services {
		for _, l := range s.Listeners {
			if l.Listener == listener && l.Next != nil {
				return l.Next.NodeName
			}
		}
	}
	return ""
}

func findBackend(st vip.Status, listener, node string) *vip.BackendStatus {
	for _, s := range st.Services {
		for _, l := range s.Listeners {
			if l.Listener != listener {
				continue
			}
			for i := range l.Backends {
				if l.Backends[i].NodeName == node {
					return &l.Backends[i]
				}
			}
		}
	}
	return nil
}

func sameListeners(a, b []vip.Listener) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

// serveHTTP runs an HTTP server on n's kernel stack, port n.appTCP, that
// answers "NAME PEER".
func serveHTTP(ctx context.Context, t *testing.T, n *e2eNode) {
	t.Helper()
	ln, err := n.host.Listen(ctx, "tcp4", fmt.Sprintf("0.0.0.0:%d", n.appTCP))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s\n", n.name, r.RemoteAddr)
	})
	// GET /big?n=N sends N bytes of e2ePattern; POST /big answers with the
	// length and SHA-256 of what it received. Both name the backend in
	// X-Backend.
	mux.HandleFunc("GET /big", func(w http.ResponseWriter, r *http.Request) {
		size, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || size < 0 || size > maxBig {
			http.Error(w, "bad n", http.StatusBadRequest)
			return
		}
		w.Header().Set("X-Backend", n.name+" "+r.RemoteAddr)
		w.Header().Set("Content-Length", strconv.Itoa(size))
		_, _ = w.Write(e2ePattern(size))
	})
	mux.HandleFunc("POST /big", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		k, err := io.Copy(h, io.LimitReader(r.Body, maxBig+1))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("X-Backend", n.name+" "+r.RemoteAddr)
		fmt.Fprintf(w, "%d %x\n", k, h.Sum(nil))
	})
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: mux}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
}

// scrapeMetrics fetches n's agent's Prometheus metrics over the loopback
// of its namespace.
func scrapeMetrics(ctx context.Context, n *e2eNode) (string, error) {
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return n.host.Dial(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return "", fmt.Errorf("metrics of %s: %w", n.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("metrics of %s: %s %v", n.name, resp.Status, err)
	}
	return string(b), nil
}

// udpApp is a UDP server on a backend's kernel stack that answers
// "NAME PEER MSG".
type udpApp struct {
	port uint16
	pc   net.PacketConn
	done chan struct{}
	once sync.Once
}

func serveUDP(ctx context.Context, t *testing.T, n *e2eNode) *udpApp {
	t.Helper()
	pc, err := n.host.ListenPacket(ctx, "udp4", fmt.Sprintf("0.0.0.0:%d", n.appUDP))
	if err != nil {
		t.Fatal(err)
	}
	a := &udpApp{port: n.appUDP, pc: pc, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		buf := make([]byte, 2048)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(fmt.Appendf(nil, "%s %s %s", n.name, from, buf[:k]), from)
		}
	}()
	t.Cleanup(a.stop)
	return a
}

// stop closes the socket: the kernel answers later datagrams with ICMP
// port unreachable.
func (a *udpApp) stop() {
	a.once.Do(func() {
		a.pc.Close()
		<-a.done
	})
}
