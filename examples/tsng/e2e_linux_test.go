//go:build linux

package tsng_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipkit/vipkit/examples/tsng"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/probe"
	"github.com/vipkit/vipkit/transport/netns"
)

// The end-to-end test of the agent on kernel TUNs: three `tsng daemon`
// processes, built from ./cmd/tsng, each in a network namespace of its own
// on a kernel TUN with wireguard-go, over a bridged veth underlay. The CLI
// (a process too) configures the VIP; clients in the client's namespace are
// this test binary re-executed with `ip netns exec`, so that they resolve
// names through /etc/netns/NAME/resolv.conf, that is, through the agent's
// DNS on its overlay address.
//
// The harness is in e2e_harness_linux_test.go, the clients in
// e2e_clients_linux_test.go.

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

// TestE2ETUN runs the scenario as one subtest per phase. The phases build
// on each other, in order: see phase.
func TestE2ETUN(t *testing.T) {
	c := newE2ECluster(t)
	ctx, bin, step := c.ctx, c.bin, c.step
	nodes, s1, s2, cl := c.nodes, c.s1, c.s2, c.cl
	var (
		created       tsng.ServiceDoc // the VIP, as the CLI on server1 made it
		victim, other *e2eNode        // the backend whose agent is killed, and the other
	)

	phase(t, "agents up", func(t *testing.T) {
		for _, n := range nodes {
			waitAgent(ctx, t, bin, n)
		}
		for _, n := range nodes {
			checkTUN(t, n)
		}
		step(t, "3 agents up on kernel TUNs")
	})

	// The CLI creates the VIP on server1.
	phase(t, "create", func(t *testing.T) {
		mustCLI(ctx, t, bin, s1, "vip", "create", e2eNet, "api")
		mustCLI(ctx, t, bin, s1, "vip", "port", "add", e2eNet, "api", fmt.Sprintf("tcp/%d", httpPort),
			"--backend", fmt.Sprintf("server1:%d", s1.appTCP), "--backend", fmt.Sprintf("server2:%d", s2.appTCP))
		mustCLI(ctx, t, bin, s1, "vip", "port", "add", e2eNet, "api", fmt.Sprintf("tcp/%d", localPort),
			"--backend", fmt.Sprintf("client:%d", cl.appTCP), "--backend", fmt.Sprintf("server1:%d", s1.appTCP))
		out := mustCLI(ctx, t, bin, s1, "vip", "port", "add", e2eNet, "api", fmt.Sprintf("udp/%d", udpPort),
			"--backend", fmt.Sprintf("server1:%d", s1.appUDP), "--backend", fmt.Sprintf("server2:%d", s2.appUDP), "--json")
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
		step(t, "CLI on server1 created api.%s at %v, revision %s", e2eNet, vipAddr, rev)
	})

	// Every agent gets the same revision over the control channel.
	phase(t, "revision everywhere", func(t *testing.T) {
		rev := created.Revision
		for _, n := range nodes[1:] {
			eventually(ctx, t, 20*time.Second, "revision "+string(rev)+" on "+n.name, func() (bool, string) {
				d, err := showVIP(ctx, bin, n)
				if err != nil {
					return false, err.Error()
				}
				return d.Revision == rev, "revision " + string(d.Revision)
			})
		}
		step(t, "revision %s on every agent", rev)
	})

	// The client measures both backends of both listeners before traffic.
	phase(t, "backends eligible", func(t *testing.T) {
		eventually(ctx, t, 20*time.Second, "every backend eligible at the client", func() (bool, string) {
			st, raw, err := statusVIP(ctx, bin, cl)
			if err != nil {
				return false, err.Error()
			}
			return allEligible(st, 3), raw
		})
		step(t, "client: both backends of tcp/%d, tcp/%d and udp/%d eligible", httpPort, localPort, udpPort)
	})

	// A local user on the client (another uid) floods server1's probe port
	// through the TUN. The client's engine drops it: server1 refuses none
	// of the client's probes and every backend stays eligible.
	phase(t, "local user's probe flood", func(t *testing.T) {
		probeCounts := func(n *e2eNode) (rejected, hostDropped float64) {
			m, err := scrapeMetrics(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			return metricValue(m, `tsng_probe_rejected_total{network="`+e2eNet+`"}`), metricValue(m, `tsng_probe_host_dropped_total{network="`+e2eNet+`"}`)
		}
		rej0, _ := probeCounts(s1)
		_, drop0 := probeCounts(cl)
		cmd := testenv.AsOtherUser(t, "TestLocalUserProbeFlood", "udp-flood", fmt.Sprintf("FLOOD_TARGET=%v:%d", s1.addr, probe.DefaultPort))
		var out bytes.Buffer // written until p.Wait returns
		p, err := cl.host.Start(ctx, cmd.Args, netns.ProcOptions{Env: cmd.Env[len(os.Environ()):], Dir: cmd.Dir, Output: &out})
		if err != nil {
			t.Fatal(err)
		}
		ineligible, samples := 0, 0
		done := make(chan error, 1)
		go func() { done <- p.Wait(ctx) }()
		var werr error
	flood:
		for {
			select {
			case werr = <-done:
				break flood
			case <-time.After(250 * time.Millisecond):
				st, _, err := statusVIP(ctx, bin, cl)
				samples++
				if err != nil || !allEligible(st, 3) {
					ineligible++
				}
			}
		}
		if werr != nil {
			t.Fatalf("flooder: %v\n%s", werr, out.String())
		}
		rej1, _ := probeCounts(s1)
		_, drop1 := probeCounts(cl)
		if rej1 != rej0 {
			t.Errorf("server1 refused %v probe packets during the flood, want 0", rej1-rej0)
		}
		if drop1 <= drop0 {
			t.Errorf("the client's engine dropped %v host packets to the probe port, want the flood's", drop1-drop0)
		}
		if ineligible > 0 {
			t.Errorf("a backend was ineligible at the client in %d of %d samples during the flood", ineligible, samples)
		}
		step(t, "local user's flood of server1's probe port: %s; %v dropped by the client's engine, none refused by server1", strings.TrimSpace(out.String()), drop1-drop0)
	})

	// HTTP by name, through the agent's DNS and the VIP.
	phase(t, "HTTP by name", func(t *testing.T) {
		vipAddr := created.Addr
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
		step(t, "HTTP http://api.%s/ → %v: %d replies (%s)", e2eNet, vipAddr, len(res.replies), res.summary())
	})

	// A local backend has zero path RTT, so the client's own backend wins
	// over a measured remote one; the request is injected into the same
	// kernel TUN with the VIP as source, and the reply reverse-translated.
	phase(t, "local backend", func(t *testing.T) {
		vipAddr := created.Addr
		local := runHTTPClient(ctx, t, cl, localPort, "-n", "3")
		if len(local.replies) != 3 || len(local.errors) != 0 {
			t.Fatalf("HTTP to the local backend through the VIP: want 3 replies, got %d (errors %q)", len(local.replies), local.errors)
		}
		for _, r := range local.replies {
			if r.node != cl.name || r.peer.Addr() != vipAddr {
				t.Fatalf("tcp/%d: want the local backend (%s), seeing the VIP %v as source; got %s seeing %v", localPort, cl.name, vipAddr, r.node, r.peer)
			}
		}
		step(t, "HTTP api.%s:%d → the client's own backend (hairpin through the TUN), source seen: the VIP", e2eNet, localPort)
	})

	// Bulk transfers both ways, through a remote and the local backend: the
	// kernel's segmentation offloads on the TUN meet the NAT's rewrites.
	phase(t, "bulk", func(t *testing.T) {
		for _, port := range []uint16{httpPort, localPort} {
			const size = 4 << 20
			res := runHTTPClient(ctx, t, cl, port, "-n", "1", "-big", strconv.Itoa(size), "-attempt", "60s")
			if len(res.replies) != 2 || len(res.errors) != 0 {
				t.Fatalf("%d bytes each way through api.%s:%d: %d transfers passed, errors %q", size, e2eNet, port, len(res.replies), res.errors)
			}
			step(t, "4 MiB down and up through api.%s:%d, intact (%s)", e2eNet, port, res.summary())
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
			step(t, "client counters tcp/%d: %d packets / %d bytes out, %d packets / %d bytes in", port, l.PacketsOut, l.BytesOut, l.PacketsIn, l.BytesIn)
		}
	})

	// UDP: a session answers, and fails over when the application on the
	// selected backend stops (ICMP port unreachable).
	phase(t, "UDP failover", func(t *testing.T) { testUDPFailover(t, c) })

	// Kill the agent of the backend the client selects for new connections
	// now; new connections go to the other one.
	phase(t, "agent killed", func(t *testing.T) {
		st, raw, err := statusVIP(ctx, bin, cl)
		if err != nil {
			t.Fatal(err)
		}
		victim, other = s1, s2
		switch next := nextBackend(st, fmt.Sprintf("tcp/%d", httpPort)); next {
		case "server1":
		case "server2":
			victim, other = s2, s1
		default:
			t.Fatalf("client status: tcp/%d selects %q, want server1 or server2\n%s", httpPort, next, raw)
		}
		killedAt := time.Now()
		victim.kill(t)
		step(t, "SIGKILLed the agent of %s", victim.name)
		// New connections until one reaches the other backend. Until the dead
		// one is excluded, a connection may still be bound to it (it keeps its
		// last RTT and may be the lower one) and fail.
		res := runHTTPClient(ctx, t, cl, httpPort, "-want", other.name, "-n", "1", "-deadline", (failoverBound + 10*time.Second).String(),
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
		step(t, "failover: a new connection reached %s %v after the kill (%d attempts failed meanwhile, bound %v)", other.name, moved.Round(time.Millisecond), len(res.errors), failoverBound)
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
		step(t, "client: %s's backend excluded (%s) %v after the kill", victim.name, reason, time.Since(killedAt).Round(time.Millisecond))
		res = runHTTPClient(ctx, t, cl, httpPort, "-n", "5")
		if len(res.replies) != 5 || len(res.errors) != 0 {
			t.Fatalf("after the exclusion: want 5 replies from %s, got %d (errors %q)", other.name, len(res.replies), res.errors)
		}
		for _, r := range res.replies {
			if r.node != other.name {
				t.Fatalf("after the exclusion a new connection reached %s", r.node)
			}
		}
		step(t, "after the exclusion: 5 of 5 new connections reached %s", other.name)
	})

	// Restart the killed agent on the same data directory: its saved
	// configuration is intact, and the client takes it back.
	phase(t, "agent restarted", func(t *testing.T) {
		rev, vipAddr := created.Revision, created.Addr
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
		step(t, "restarted %s: vip show gives the same revision %s", victim.name, d.Revision)
		eventually(ctx, t, 20*time.Second, victim.name+" eligible again at the client", func() (bool, string) {
			st, raw, err := statusVIP(ctx, bin, cl)
			if err != nil {
				return false, err.Error()
			}
			b := findBackend(st, fmt.Sprintf("tcp/%d", httpPort), victim.name)
			return b != nil && b.Eligible, raw
		})
		step(t, "client: %s eligible again", victim.name)
	})

	// Network down on the client: the TUN goes, saved configuration stays
	// readable, updates are refused with the network-down status; up
	// again, names resolve and connections go through.
	phase(t, "network down and up", func(t *testing.T) {
		rev, vipAddr := created.Revision, created.Addr
		mustCLI(ctx, t, bin, cl, "network", "down", e2eNet)
		if ifs, err := cl.host.Interfaces(); err != nil || slices.Contains(ifs, e2eTUN(cl)) {
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
		res := runHTTPClient(ctx, t, cl, httpPort, "-n", "2")
		if res.resolved != vipAddr.String() || len(res.replies) != 2 || len(res.errors) != 0 {
			t.Fatalf("after network up: resolved %q, %d replies, errors %q", res.resolved, len(res.replies), res.errors)
		}
		step(t, "client: network down (TUN removed, config readable, create refused with exit %d) and up again (%s)", tsng.ExitNetworkDown, res.summary())
	})

	// SIGTERM: every agent shuts down cleanly (TUN, wireguard-go, sockets,
	// store) and exits 0.
	phase(t, "SIGTERM", func(t *testing.T) {
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
		step(t, "SIGTERM: every agent exited 0")
	})
}

// phase runs one phase of the scenario as the subtest name of t, and
// keeps the meaning of one long test function: a phase that stops
// (t.Fatal) ends the scenario, since the phases after it build on what it
// does, while one that only reports errors (t.Error) lets the next ones
// run. A phase that -run leaves out, or that skips, skips the rest.
func phase(t *testing.T, name string, f func(t *testing.T)) {
	t.Helper()
	ran, finished := false, false
	ok := t.Run(name, func(t *testing.T) {
		ran = true
		f(t)
		finished = true
	})
	switch {
	case !ran:
		t.Skipf("phase %q is left out by -run; the phases after it need it", name)
	case finished:
	case ok:
		t.Skipf("phase %q skipped; the phases after it need it", name)
	default:
		t.FailNow()
	}
}

// testUDPFailover opens one UDP session (one source port) to the VIP by
// name, finds the selected backend, stops the application there and checks
// that the next datagram's ICMP port unreachable reaches the client with
// its NAT restored, and that the following datagrams go to the other
// backend.
func testUDPFailover(t *testing.T, c *e2eCluster) {
	t.Helper()
	ctx, bin, cl, apps := c.ctx, c.bin, c.cl, c.udpApps
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
	c.step(t, "UDP api.%s:%d answered by %s (session pinned)", e2eNet, udpPort, first)
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
	c.step(t, "UDP: ICMP port unreachable reached the client, next datagrams answered by %s (udp_failovers %d)", replies[0].node, fo)

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

// metricValue is the value of one series (name and labels, as the text
// format prints them) in a scrape, or 0 when it is absent.
func metricValue(scrape, series string) float64 {
	for _, line := range strings.Split(scrape, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}
