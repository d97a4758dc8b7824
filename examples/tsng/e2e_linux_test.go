//go:build linux

package tsng_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vipkit/vipkit/examples/tsng"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/netns"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/vip"
)

// The end-to-end test of the agent on kernel TUNs: three `tsng daemon`
// processes, built from ./cmd/tsng, each in a network namespace of its own
// on a kernel TUN with wireguard-go, over a bridged veth underlay. The CLI
// (a process too) configures the VIP; clients in the client's namespace are
// this test binary re-executed with `ip netns exec`, so that they resolve
// names through /etc/netns/NAME/resolv.conf, that is, through the agent's
// DNS on its overlay address.

// e2eChildEnv names the client to run in a re-executed test binary.
const e2eChildEnv = "TSNG_E2E_CHILD"

// init runs a client instead of the tests when the test binary was
// re-executed as one. (TestMain belongs to main_test.go; a client needs none
// of it.)
func init() {
	mode := os.Getenv(e2eChildEnv)
	if mode == "" {
		return
	}
	args := os.Args[1:]
	if i := slices.Index(args, "--"); i >= 0 {
		args = args[i+1:]
	}
	var err error
	switch mode {
	case "http":
		err = e2eHTTPClient(args, os.Stdout)
	case "udp":
		err = e2eUDPClient(args, os.Stdin, os.Stdout)
	default:
		err = fmt.Errorf("unknown client %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e client:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Spec defaults (tsunagi-vip.md, "Health"): one probe per second, expiring
// after 3 s, two consecutive misses exclude the peer. The last answered
// probe went out at most 1 s before the kill; the next two expire at most
// 1 s + 3 s and 2 s + 3 s after it, so the peer is excluded at most 5 s
// after the kill, plus one path poll (1 s). A connection attempt already
// bound to the dead backend retransmits its empty SYN after 1 s (and may be
// retargeted then) or times out after 2 s, and each attempt starts a
// client process. failoverBound allows all of that, with 3 s to spare.
const (
	probeExclusion = 2*time.Second + 3*time.Second + time.Second
	attemptTimeout = 2 * time.Second
	failoverBound  = probeExclusion + attemptTimeout + 3*time.Second
)

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

func TestE2ETUN(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedBinary(t, "ip")
	goBin := testenv.NeedBinary(t, "go")
	start := time.Now()
	step := func(format string, a ...any) {
		t.Logf("[%5.1fs] %s", time.Since(start).Seconds(), fmt.Sprintf(format, a...))
	}
	bin := buildAgent(t.Context(), t, goBin)
	step("built %s", bin)
	// The scenario's budget (about 40 s on an idle machine, 2 min under
	// -race on a loaded one), apart from the build.
	ctx, cancel := context.WithTimeout(t.Context(), 150*time.Second)
	defer cancel()

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
	s1, s2, cl := nodes[0], nodes[1], nodes[2]
	hosts := []*netns.Host{s1.host, s2.host, cl.host}
	_, ifs := netns.LANT(t, hosts...)
	writeConfigs(t, nodes, ifs)

	// The applications on the two backends, on the kernel stacks of their
	// namespaces: they answer with their node's name and the peer address
	// they saw.
	udpApps := map[string]*udpApp{}
	for _, n := range []*e2eNode{s1, s2} {
		serveHTTP(ctx, t, n)
		udpApps[n.name] = serveUDP(ctx, t, n)
	}
	serveHTTP(ctx, t, cl)

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
		n.start(ctx, t, bin)
	}
	for _, n := range nodes {
		waitAgent(ctx, t, bin, n)
	}
	for _, n := range nodes {
		checkTUN(t, n)
	}
	step("3 agents up on kernel TUNs")

	// The client's namespace resolves through its agent's DNS.
	useAgentDNS(t, cl)

	// The CLI creates the VIP on server1.
	mustCLI(ctx, t, bin, s1, "vip", "create", e2eNet, "api")
	mustCLI(ctx, t, bin, s1, "vip", "port", "add", e2eNet, "api", fmt.Sprintf("tcp/%d", httpPort),
		"--backend", fmt.Sprintf("server1:%d", s1.appTCP), "--backend", fmt.Sprintf("server2:%d", s2.appTCP))
	mustCLI(ctx, t, bin, s1, "vip", "port", "add", e2eNet, "api", fmt.Sprintf("tcp/%d", localPort),
		"--backend", fmt.Sprintf("client:%d", cl.appTCP), "--backend", fmt.Sprintf("server1:%d", s1.appTCP))
	out := mustCLI(ctx, t, bin, s1, "vip", "port", "add", e2eNet, "api", fmt.Sprintf("udp/%d", udpPort),
		"--backend", fmt.Sprintf("server1:%d", s1.appUDP), "--backend", fmt.Sprintf("server2:%d", s2.appUDP), "--json")
	var created tsng.ServiceDoc
	if err := json.Unmarshal([]byte(out), &created); err != nil {
		t.Fatalf("port add --json: %v\n%s", err, out)
	}
	if created.Revision == "" || !created.Addr.IsValid() || len(created.Listeners) != 3 {
		t.Fatalf("port add --json: want a revision, an address and 3 listeners, got %+v", created.ServiceView)
	}
	rev, vipAddr := created.Revision, created.Addr
	if !netip.MustParsePrefix(e2eOverlay).Contains(vipAddr) || slices.ContainsFunc(nodes, func(n *e2eNode) bool { return n.addr == vipAddr }) {
		t.Fatalf("VIP address %v: want a free address of %s", vipAddr, e2eOverlay)
	}
	step("CLI on server1 created api.%s at %v, revision %s", e2eNet, vipAddr, rev)

	// Every agent gets the same revision over the control channel.
	for _, n := range nodes[1:] {
		eventually(ctx, t, 20*time.Second, "revision "+string(rev)+" on "+n.name, func() (bool, string) {
			d, err := showVIP(ctx, bin, n)
			if err != nil {
				return false, err.Error()
			}
			return d.Revision == rev, "revision " + string(d.Revision)
		})
	}
	step("revision %s on every agent", rev)

	// The client measures both backends of both listeners before traffic.
	eventually(ctx, t, 20*time.Second, "every backend eligible at the client", func() (bool, string) {
		st, raw, err := statusVIP(ctx, bin, cl)
		if err != nil {
			return false, err.Error()
		}
		return allEligible(st, 3), raw
	})
	step("client: both backends of tcp/%d, tcp/%d and udp/%d eligible", httpPort, localPort, udpPort)

	// HTTP by name, through the agent's DNS and the VIP.
	res := runHTTPClient(ctx, t, cl, httpPort, "-n", "4")
	if len(res.replies) > 0 {
		t.Logf("last reply from %s", res.replies[len(res.replies)-1].node)
	}
	if res.resolved != vipAddr.String() {
		t.Fatalf("client resolved api.%s to %q, want the VIP %v", e2eNet, res.resolved, vipAddr)
	}
	if len(res.replies) != 4 || len(res.errors) != 0 {
		t.Fatalf("HTTP through the VIP: want 4 replies, got %d (errors %q)", len(res.replies), res.errors)
	}
	for _, r := range res.replies {
		if r.node != "server1" && r.node != "server2" {
			t.Fatalf("HTTP reply from %q", r.node)
		}
		// Remote backends see the client's ordinary overlay address.
		if r.peer.Addr() != cl.addr {
			t.Errorf("backend %s saw the client as %v, want its overlay address %v", r.node, r.peer, cl.addr)
		}
	}
	step("HTTP http://api.%s/ → %v: %d replies (%s)", e2eNet, vipAddr, len(res.replies), res.summary())

	// A local backend has zero path RTT, so the client's own backend wins
	// over a measured remote one; the request is injected into the same
	// kernel TUN with the VIP as source, and the reply reverse-translated.
	local := runHTTPClient(ctx, t, cl, localPort, "-n", "3")
	if len(local.replies) != 3 || len(local.errors) != 0 {
		t.Fatalf("HTTP to the local backend through the VIP: want 3 replies, got %d (errors %q)", len(local.replies), local.errors)
	}
	for _, r := range local.replies {
		if r.node != cl.name || r.peer.Addr() != vipAddr {
			t.Fatalf("tcp/%d: want the local backend (%s), seeing the VIP %v as source; got %s seeing %v", localPort, cl.name, vipAddr, r.node, r.peer)
		}
	}
	step("HTTP api.%s:%d → the client's own backend (hairpin through the TUN), source seen: the VIP", e2eNet, localPort)

	// Bulk transfers both ways, through a remote and the local backend: the
	// kernel's segmentation offloads on the TUN meet the NAT's rewrites.
	for _, port := range []uint16{httpPort, localPort} {
		const size = 4 << 20
		res := runHTTPClient(ctx, t, cl, port, "-n", "1", "-big", strconv.Itoa(size), "-attempt", "60s")
		if len(res.replies) != 2 || len(res.errors) != 0 {
			t.Fatalf("%d bytes each way through api.%s:%d: %d transfers passed, errors %q", size, e2eNet, port, len(res.replies), res.errors)
		}
		step("4 MiB down and up through api.%s:%d, intact (%s)", e2eNet, port, res.summary())
	}
	// The client's IP forwarding counters saw them (cumulative, both ways).
	st0, raw0, err := statusVIP(ctx, bin, cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, port := range []uint16{httpPort, localPort} {
		l := findListener(st0, fmt.Sprintf("tcp/%d", port))
		if l == nil || l.BytesOut < 4<<20 || l.BytesIn < 4<<20 {
			t.Fatalf("client status of tcp/%d: want ≥ 4 MiB counted each way, got %+v\n%s", port, l, raw0)
		}
		step("client counters tcp/%d: %d packets / %d bytes out, %d packets / %d bytes in", port, l.PacketsOut, l.BytesOut, l.PacketsIn, l.BytesIn)
	}

	// UDP: a session answers, and fails over when the application on the
	// selected backend stops (ICMP port unreachable).
	testUDPFailover(ctx, t, bin, cl, udpApps, step)

	// Kill the agent of the backend the client selects for new connections
	// now; new connections go to the other one.
	st, raw, err := statusVIP(ctx, bin, cl)
	if err != nil {
		t.Fatal(err)
	}
	victim, other := s1, s2
	switch next := nextBackend(st, fmt.Sprintf("tcp/%d", httpPort)); next {
	case "server1":
	case "server2":
		victim, other = s2, s1
	default:
		t.Fatalf("client status: tcp/%d selects %q, want server1 or server2\n%s", httpPort, next, raw)
	}
	killedAt := time.Now()
	victim.kill(t)
	step("SIGKILLed the agent of %s", victim.name)
	// New connections until one reaches the other backend. Until the dead
	// one is excluded, a connection may still be bound to it (it keeps its
	// last RTT and may be the lower one) and fail.
	res = runHTTPClient(ctx, t, cl, httpPort, "-want", other.name, "-n", "1", "-deadline", (failoverBound + 10*time.Second).String(),
		"-since", strconv.FormatInt(killedAt.UnixNano(), 10))
	if res.firstWant < 0 {
		t.Fatalf("no connection reached %s after %s's agent died: %d replies, errors %q", other.name, victim.name, len(res.replies), res.errors)
	}
	for _, r := range res.replies {
		if r.node == victim.name {
			t.Fatalf("a connection reached %s after its agent was killed", victim.name)
		}
	}
	moved := time.Duration(res.firstWantMillis) * time.Millisecond
	if moved > failoverBound {
		t.Errorf("failover took %v after the kill, want ≤ %v (spec defaults: probe exclusion %v, attempt %v, margin)", moved, failoverBound, probeExclusion, attemptTimeout)
	}
	step("failover: a new connection reached %s %v after the kill (%d attempts failed meanwhile, bound %v)", other.name, moved.Round(time.Millisecond), len(res.errors), failoverBound)
	// The client excludes the dead backend within the same bound from the
	// kill; from then on every new connection goes to the other one.
	reason := ""
	eventually(ctx, t, max(time.Until(killedAt.Add(failoverBound)), time.Second), victim.name+" excluded at the client", func() (bool, string) {
		st, raw, err := statusVIP(ctx, bin, cl)
		if err != nil {
			return false, err.Error()
		}
		b := findBackend(st, fmt.Sprintf("tcp/%d", httpPort), victim.name)
		if b == nil || b.Eligible {
			return false, raw
		}
		reason = b.Reason
		return true, ""
	})
	step("client: %s's backend excluded (%s) %v after the kill", victim.name, reason, time.Since(killedAt).Round(time.Millisecond))
	res = runHTTPClient(ctx, t, cl, httpPort, "-n", "5")
	if len(res.replies) != 5 || len(res.errors) != 0 {
		t.Fatalf("after the exclusion: want 5 replies from %s, got %d (errors %q)", other.name, len(res.replies), res.errors)
	}
	for _, r := range res.replies {
		if r.node != other.name {
			t.Fatalf("after the exclusion a new connection reached %s", r.node)
		}
	}
	step("after the exclusion: 5 of 5 new connections reached %s", other.name)

	// Restart the killed agent on the same data directory: its saved
	// configuration is intact, and the client takes it back.
	victim.start(ctx, t, bin)
	waitAgent(ctx, t, bin, victim)
	d, err := showVIP(ctx, bin, victim)
	if err != nil {
		t.Fatalf("vip show on the restarted %s: %v", victim.name, err)
	}
	if d.Revision != rev || d.ID != created.ID || d.Addr != vipAddr || !sameListeners(d.Listeners, created.Listeners) {
		t.Fatalf("restarted %s shows revision %s id %v at %v with %+v, want revision %s id %v at %v with %+v",
			victim.name, d.Revision, d.ID, d.Addr, d.Listeners, rev, created.ID, vipAddr, created.Listeners)
	}
	step("restarted %s: vip show gives the same revision %s", victim.name, d.Revision)
	eventually(ctx, t, 20*time.Second, victim.name+" eligible again at the client", func() (bool, string) {
		st, raw, err := statusVIP(ctx, bin, cl)
		if err != nil {
			return false, err.Error()
		}
		b := findBackend(st, fmt.Sprintf("tcp/%d", httpPort), victim.name)
		return b != nil && b.Eligible, raw
	})
	step("client: %s eligible again", victim.name)

	// Network down on the client: the TUN goes, saved configuration stays
	// readable, updates are refused with the network-down status; up
	// again, names resolve and connections go through.
	mustCLI(ctx, t, bin, cl, "network", "down", e2eNet)
	if ifs, err := cl.host.Interfaces(); err != nil || slices.Contains(ifs, "tsng-"+e2eNet) {
		t.Fatalf("after network down the client still has its TUN: %v %v", ifs, err)
	}
	if d, err := showVIP(ctx, bin, cl); err != nil || d.Revision != rev {
		t.Fatalf("vip show while the network is down: %v, revision %s, want %s", err, d.Revision, rev)
	}
	if _, errOut, code, err := cli(ctx, bin, cl, "vip", "create", e2eNet, "other"); err != nil || code != tsng.ExitNetworkDown {
		t.Fatalf("vip create while the network is down: exit %d %v, want %d\n%s", code, err, tsng.ExitNetworkDown, errOut)
	}
	mustCLI(ctx, t, bin, cl, "network", "up", e2eNet)
	eventually(ctx, t, 20*time.Second, "every backend eligible at the client after network up", func() (bool, string) {
		st, raw, err := statusVIP(ctx, bin, cl)
		if err != nil {
			return false, err.Error()
		}
		return allEligible(st, 3), raw
	})
	res = runHTTPClient(ctx, t, cl, httpPort, "-n", "2")
	if res.resolved != vipAddr.String() || len(res.replies) != 2 || len(res.errors) != 0 {
		t.Fatalf("after network up: resolved %q, %d replies, errors %q", res.resolved, len(res.replies), res.errors)
	}
	step("client: network down (TUN removed, config readable, create refused with exit %d) and up again (%s)", tsng.ExitNetworkDown, res.summary())

	// SIGTERM: every agent shuts down cleanly (TUN, wireguard-go, sockets,
	// store) and exits 0.
	for _, n := range nodes {
		n.mu.Lock()
		p := n.proc
		n.mu.Unlock()
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := p.Stop(sctx)
		cancel()
		if err != nil || p.ExitCode() != 0 {
			t.Errorf("agent %s on SIGTERM: %v (exit %d), want a clean exit within 15 s", n.name, err, p.ExitCode())
		}
	}
	step("SIGTERM: every agent exited 0")
}

// testUDPFailover opens one UDP session (one source port) to the VIP by
// name, finds the selected backend, stops the application there and checks
// that the next datagram's ICMP port unreachable reaches the client with
// its NAT restored, and that the following datagrams go to the other
// backend.
func testUDPFailover(ctx context.Context, t *testing.T, bin string, cl *e2eNode, apps map[string]*udpApp, step func(string, ...any)) {
	t.Helper()
	u := startUDPClient(ctx, t, cl, fmt.Sprintf("api.%s:%d", e2eNet, udpPort))
	var first string
	for i := range 8 {
		r := u.send(ctx, t, fmt.Sprintf("hello-%d", i))
		if r.kind == "reply" {
			first = r.node
			break
		}
	}
	if first == "" {
		t.Fatalf("no UDP reply through the VIP")
	}
	for i := range 3 {
		if r := u.send(ctx, t, fmt.Sprintf("again-%d", i)); r.kind != "reply" || r.node != first {
			t.Fatalf("UDP session pinned to %s: datagram %d got %+v", first, i, r)
		}
	}
	step("UDP api.%s:%d answered by %s (session pinned)", e2eNet, udpPort, first)
	apps[first].stop()
	r := u.send(ctx, t, "after-stop")
	if r.kind != "refused" {
		t.Fatalf("the first datagram after %s's UDP app stopped: want ICMP port unreachable (ECONNREFUSED) at the client, got %+v", first, r)
	}
	var replies []udpResult
	for i := range 3 {
		replies = append(replies, u.send(ctx, t, fmt.Sprintf("next-%d", i)))
	}
	for i, r := range replies {
		if r.kind != "reply" || r.node == first {
			t.Fatalf("datagram %d after the ICMP error: want a reply from the other backend, got %+v (all: %+v)", i, r, replies)
		}
	}
	st, raw, err := statusVIP(ctx, bin, cl)
	if err != nil {
		t.Fatal(err)
	}
	var fo uint64
	for _, s := range st.Services {
		for _, l := range s.Listeners {
			if l.Listener == fmt.Sprintf("udp/%d", udpPort) {
				fo = l.Failovers
			}
		}
	}
	if fo < 1 {
		t.Errorf("client status: udp/%d udp_failovers = %d, want ≥ 1\n%s", udpPort, fo, raw)
	}
	if b := findBackend(st, fmt.Sprintf("udp/%d", udpPort), first); b == nil || b.Eligible {
		t.Errorf("client status: want %s's udp backend excluded after the ICMP error, got %+v", first, b)
	}
	step("UDP: ICMP port unreachable reached the client, next datagrams answered by %s (udp_failovers %d)", replies[0].node, fo)

	// The agent's Prometheus metrics say the same.
	m, err := scrapeMetrics(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf(`tsng_listener_udp_failovers_total{listener="udp/%d",network="%s",vip="api"} %d`, udpPort, e2eNet, fo),
		fmt.Sprintf(`tsng_backend_eligible{backend="%s:%d",listener="udp/%d",network="%s",reason="icmp-unreachable",vip="api"} 0`, first, apps[first].port, udpPort, e2eNet),
	} {
		if !strings.Contains(m, "\n"+want+"\n") {
			t.Errorf("client metrics: no line %q in\n%s", want, m)
		}
	}
	u.close(t)
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
		nc := tsng.NetworkConfig{Name: e2eNet, Overlay: e2eOverlay, Mode: "tun",
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

// checkTUN checks the agent's kernel TUN in its namespace: up, MTU 1420,
// the overlay address with the overlay's prefix, and no IPv6 (the overlay
// carries IPv4 only).
func checkTUN(t *testing.T, n *e2eNode) {
	t.Helper()
	nl := n.host.Netlink()
	link, err := nl.LinkByName("tsng-" + e2eNet)
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

// maxBig bounds the bulk transfers (bytes).
const maxBig = 64 << 20

// e2ePattern returns n bytes in which a lost, duplicated or misplaced
// segment shows.
func e2ePattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) ^ byte(i>>9) ^ byte(i>>17)
	}
	return b
}

// bigExchange downloads and uploads size bytes through url (GET and POST
// /big on fresh connections) and checks both; it returns the backend that
// served each.
func bigExchange(hc *http.Client, url string, size int) ([2]string, error) {
	var who [2]string
	want := e2ePattern(size)
	resp, err := hc.Get(fmt.Sprintf("%sbig?n=%d", url, size))
	if err != nil {
		return who, err
	}
	got, err := io.ReadAll(io.LimitReader(resp.Body, maxBig+1))
	resp.Body.Close()
	if err != nil {
		return who, fmt.Errorf("download: %w", err)
	}
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, want) {
		return who, fmt.Errorf("download: status %s, %d bytes, want %d bytes of the pattern (first difference at %d)", resp.Status, len(got), size, firstDiff(got, want))
	}
	who[0] = resp.Header.Get("X-Backend")
	resp, err = hc.Post(url+"big", "application/octet-stream", bytes.NewReader(want))
	if err != nil {
		return who, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	resp.Body.Close()
	if err != nil {
		return who, fmt.Errorf("upload: %w", err)
	}
	sum := sha256.Sum256(want)
	if exp := fmt.Sprintf("%d %x\n", size, sum); resp.StatusCode != http.StatusOK || string(body) != exp {
		return who, fmt.Errorf("upload: status %s, backend got %q, want %q", resp.Status, body, exp)
	}
	who[1] = resp.Header.Get("X-Backend")
	return who, nil
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
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

// inNamespace is the argv that runs this test binary as client mode in n's
// namespace through `ip netns exec` (which mounts its resolv.conf).
func inNamespace(t *testing.T, n *e2eNode, args ...string) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"ip", "netns", "exec", n.host.Name(), exe, "-test.run=^$", "--"}, args...)
}

type httpReply struct {
	node string
	peer netip.AddrPort
}

type httpResult struct {
	resolved        string
	replies         []httpReply
	errors          []string
	firstWant       int // index in replies of the first reply from -want; -1
	firstWantMillis int64
}

func (r httpResult) summary() string {
	count := map[string]int{}
	for _, x := range r.replies {
		count[x.node]++
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(count)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, count[k]))
	}
	return strings.Join(parts, ", ")
}

// runHTTPClient runs the HTTP client in cl's namespace and parses its
// report.
func runHTTPClient(ctx context.Context, t *testing.T, cl *e2eNode, port uint16, args ...string) httpResult {
	t.Helper()
	argv := inNamespace(t, cl, append([]string{"-url", fmt.Sprintf("http://api.%s:%d/", e2eNet, port),
		"-attempt", attemptTimeout.String()}, args...)...)
	p, err := cl.host.Start(ctx, argv, netns.ProcOptions{Env: []string{e2eChildEnv + "=http"}})
	if err != nil {
		t.Fatal(err)
	}
	werr := p.Wait(ctx)
	out, _ := p.Output()
	if werr != nil {
		t.Fatalf("HTTP client: %v\n%s", werr, out)
	}
	res := httpResult{firstWant: -1}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 2 && f[0] == "resolved":
			res.resolved = f[1]
		case len(f) == 4 && f[0] == "reply":
			ap, err := netip.ParseAddrPort(f[3])
			if err != nil {
				t.Fatalf("HTTP client: bad reply line %q", sc.Text())
			}
			res.replies = append(res.replies, httpReply{node: f[2], peer: ap})
		case len(f) >= 2 && f[0] == "error":
			res.errors = append(res.errors, strings.Join(f[2:], " "))
		case len(f) == 3 && f[0] == "want":
			res.firstWant = len(res.replies) - 1
			res.firstWantMillis, _ = strconv.ParseInt(f[2], 10, 64)
		}
	}
	t.Logf("HTTP client output:\n%s", out)
	return res
}

// e2eHTTPClient makes new HTTP connections (no keep-alive) to -url, one at
// a time, and prints, one line each:
//
//	resolved ADDR          the name's address, from the namespace's resolver
//	reply MS NODE PEER     an answer, MS after -since
//	error MS ERROR         a failed attempt
//	want NODE MS           the first answer from -want
//
// Without -want it makes -n attempts; with -want, it tries until an answer
// comes from that node (or -deadline) and then makes -n-1 more attempts.
func e2eHTTPClient(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("http", flag.ContinueOnError)
	rawURL := fs.String("url", "", "URL")
	n := fs.Int("n", 1, "attempts (after the first answer from -want)")
	want := fs.String("want", "", "node to wait for")
	deadline := fs.Duration("deadline", 30*time.Second, "give up waiting for -want after")
	attempt := fs.Duration("attempt", 2*time.Second, "timeout of one attempt")
	since := fs.Int64("since", 0, "report times from this Unix time in ns (0: now)")
	big := fs.Int("big", 0, "instead, download and upload this many bytes per attempt (two replies)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	t0 := time.Now()
	if *since != 0 {
		t0 = time.Unix(0, *since)
	}
	ms := func() int64 { return time.Since(t0).Milliseconds() }
	ctx, cancel := context.WithTimeout(context.Background(), *deadline)
	defer cancel()
	host := strings.TrimSuffix(strings.TrimPrefix(*rawURL, "http://"), "/")
	name, _, err := net.SplitHostPort(host)
	if err != nil {
		return err
	}
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", name, err)
	}
	fmt.Fprintln(out, "resolved", strings.Join(addrs, ","))
	left := *n
	found := *want == ""
	for left > 0 {
		if ctx.Err() != nil {
			return fmt.Errorf("no answer from %s within %v", *want, *deadline)
		}
		tr := &http.Transport{DisableKeepAlives: true}
		hc := &http.Client{Transport: tr, Timeout: *attempt}
		if *big > 0 {
			who, err := bigExchange(hc, *rawURL, *big)
			tr.CloseIdleConnections()
			if err != nil {
				fmt.Fprintln(out, "error", ms(), strings.ReplaceAll(err.Error(), "\n", " "))
			} else {
				for _, w := range who {
					fmt.Fprintln(out, "reply", ms(), w)
				}
			}
			left--
			continue
		}
		resp, err := hc.Get(*rawURL)
		var body []byte
		if err == nil {
			body, err = io.ReadAll(io.LimitReader(resp.Body, 1024))
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %s", resp.Status)
			}
		}
		tr.CloseIdleConnections()
		if err != nil {
			fmt.Fprintln(out, "error", ms(), strings.ReplaceAll(err.Error(), "\n", " "))
			if found {
				left--
			}
			continue
		}
		f := strings.Fields(string(body))
		if len(f) != 2 {
			return fmt.Errorf("unexpected answer %q", body)
		}
		fmt.Fprintln(out, "reply", ms(), f[0], f[1])
		if !found && f[0] == *want {
			found = true
			fmt.Fprintln(out, "want", f[0], ms())
		}
		if found {
			left--
		}
	}
	return nil
}

// udpResult is one datagram's outcome at the UDP client.
type udpResult struct {
	kind string // reply, refused, timeout, error
	node string
	text string
}

// udpClient drives the UDP client in the client's namespace over its
// stdin and stdout.
type udpClient struct {
	p     *netns.Process
	in    *io.PipeWriter
	lines chan string
}

func startUDPClient(ctx context.Context, t *testing.T, cl *e2eNode, addr string) *udpClient {
	t.Helper()
	pr, pw := io.Pipe()
	u := &udpClient{in: pw, lines: make(chan string, 256)}
	lw := &lineWriter{f: func(s string) {
		select {
		case u.lines <- s:
		default:
		}
	}}
	p, err := cl.host.Start(ctx, inNamespace(t, cl, "-addr", addr), netns.ProcOptions{Env: []string{e2eChildEnv + "=udp"}, Stdin: pr, Output: lw})
	if err != nil {
		t.Fatal(err)
	}
	u.p = p
	t.Cleanup(func() {
		pw.Close()
		_ = p.Kill()
	})
	if l := u.next(ctx, t); !strings.HasPrefix(l, "ready ") {
		t.Fatalf("UDP client: %q", l)
	}
	return u
}

func (u *udpClient) next(ctx context.Context, t *testing.T) string {
	t.Helper()
	select {
	case l := <-u.lines:
		return l
	case <-u.p.Done():
		out, _ := u.p.Output()
		t.Fatalf("UDP client exited: %v\n%s", u.p.ExitCode(), out)
	case <-time.After(10 * time.Second):
		t.Fatalf("UDP client: no answer")
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	return ""
}

func (u *udpClient) send(ctx context.Context, t *testing.T, msg string) udpResult {
	t.Helper()
	if _, err := fmt.Fprintf(u.in, "send %s\n", msg); err != nil {
		t.Fatalf("UDP client: %v", err)
	}
	l := u.next(ctx, t)
	t.Logf("UDP %s → %s", msg, l)
	f := strings.Fields(l)
	switch {
	case len(f) == 4 && f[0] == "reply" && f[3] == msg:
		return udpResult{kind: "reply", node: f[1], text: l}
	case len(f) >= 1 && (f[0] == "refused" || f[0] == "timeout"):
		return udpResult{kind: f[0], text: l}
	}
	return udpResult{kind: "error", text: l}
}

func (u *udpClient) close(t *testing.T) {
	u.in.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := u.p.Wait(ctx); err != nil {
		out, _ := u.p.Output()
		t.Errorf("UDP client: %v\n%s", err, out)
	}
}

// lineWriter calls f with each whole line written to it.
type lineWriter struct {
	// mu guards buf, a partial line, and serialises the calls to f.
	mu sync.Mutex
	// +checklocks:mu
	buf []byte
	// +checklocks:mu
	f func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.f(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}

// e2eUDPClient resolves -addr, connects one UDP socket to it (one source
// port: one session), prints "ready LOCAL REMOTE", and for each "send MSG"
// line on in sends MSG and prints what came back within 1.5 s:
//
//	reply NODE PEER MSG   the backend's answer
//	refused               ECONNREFUSED: an ICMP port unreachable arrived
//	timeout               nothing
func e2eUDPClient(args []string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("udp", flag.ContinueOnError)
	addr := fs.String("addr", "", "HOST:PORT")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp4", *addr)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintln(out, "ready", c.LocalAddr(), c.RemoteAddr())
	sc := bufio.NewScanner(in)
	buf := make([]byte, 2048)
	for sc.Scan() {
		msg, ok := strings.CutPrefix(sc.Text(), "send ")
		if !ok {
			return fmt.Errorf("bad command %q", sc.Text())
		}
		if _, err := c.Write([]byte(msg)); err != nil {
			if errors.Is(err, syscall.ECONNREFUSED) {
				fmt.Fprintln(out, "refused on send")
				continue
			}
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
		k, err := c.Read(buf)
		switch {
		case err == nil:
			fmt.Fprintln(out, "reply", string(buf[:k]))
		case errors.Is(err, syscall.ECONNREFUSED):
			fmt.Fprintln(out, "refused")
		case errors.Is(err, os.ErrDeadlineExceeded):
			fmt.Fprintln(out, "timeout")
		default:
			fmt.Fprintln(out, "error", err)
		}
	}
	return sc.Err()
}
