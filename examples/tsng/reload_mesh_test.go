package tsng

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/netstack"
	"github.com/vipkit/vipkit/vip"
)

// withoutPeer returns a copy of cfg whose network lists no peer named
// name.
func withoutPeer(t *testing.T, cfg *Config, name string) *Config {
	t.Helper()
	c := cloneConfig(t, cfg)
	var keep []PeerConfig
	for _, p := range c.Networks[0].Peers {
		if p.Name != name {
			keep = append(keep, p)
		}
	}
	c.Networks[0].Peers = keep
	return c
}

// serveLineEcho echoes every line of every connection on port.
func serveLineEcho(ctx context.Context, t *testing.T, h *netstack.Host, port uint16) {
	t.Helper()
	ln, err := h.ListenTCP(netip.AddrPortFrom(netip.IPv4Unspecified(), port))
	if err != nil {
		t.Fatal(err)
	}
	context.AfterFunc(ctx, func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					l, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(l)); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// flowWatch is one continuous flow's tally.
type flowWatch struct {
	mu sync.Mutex
	// +checklocks:mu
	sent int
	// +checklocks:mu
	answered int
	// +checklocks:mu
	maxGap time.Duration
	// +checklocks:mu
	err error
	// fromOther counts the answers that another backend than server1 gave.
	// +checklocks:mu
	fromOther int
}

func (f *flowWatch) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprintf("sent %d, answered %d, longest gap %v, %d answers not by server1, error %v", f.sent, f.answered, f.maxGap, f.fromOther, f.err)
}

// TestMeshJoinLeaveUnderTraffic: three agents run (in-process, wireguard-go
// on netstack over loopback UDP) with a TCP stream and a UDP exchange from
// the client through VIPs to server1. A fourth node joins by a reload of
// every member's config; its backend becomes eligible at the client. Then
// server2 leaves by another reload; its backend shows as departed. Through
// both, the client's flows to server1 never break (every TCP line comes
// back on the one connection, the UDP exchange keeps its binding and
// answers), and the WireGuard session between the client and server1
// stays (no new handshake).
func TestMeshJoinLeaveUnderTraffic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	started := time.Now()
	names := []string{"server1", "server2", "client", "server4"}
	full, err := demoConfigs(t.TempDir(), names)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range full {
		c.Networks[0].ProbeFast = true
	}
	paths := make([]string, len(full))
	daemons := make([]*Daemon, len(full))
	for i := range 3 {
		var d *Daemon
		d, paths[i] = startReloadable(t, withoutPeer(t, full[i], "server4"), DaemonOptions{NoAPI: true})
		daemons[i] = d
	}
	rt := func(i int) *netRuntime { return daemons[i].Runtime("home") }
	host := func(i int) *netstack.Host { return rt(i).Host() }
	serveLineEcho(ctx, t, host(0), 6000)
	if err := serveUDPEcho(ctx, host(0), 5353, "server1"); err != nil {
		t.Fatal(err)
	}
	if err := serveTCP(ctx, host(1), 7443, "server2"); err != nil {
		t.Fatal(err)
	}
	reg := rt(0).Registry()
	for _, s := range []string{"stream", "api"} {
		if _, err := reg.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	be := func(s string) vip.Backend {
		b, err := reg.ResolveBackend(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, err := reg.PortAdd(ctx, "stream", vip.PortKey{Proto: vip.TCP, Port: 80}, []vip.Backend{be("server1:6000")}); err != nil {
		t.Fatal(err)
	}
	stream, err := reg.PortAdd(ctx, "stream", vip.PortKey{Proto: vip.UDP, Port: 53}, []vip.Backend{be("server1:5353")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.PortAdd(ctx, "api", vip.PortKey{Proto: vip.TCP, Port: 443}, []vip.Backend{be("server2:7443")}); err != nil {
		t.Fatal(err)
	}
	client := rt(2)
	pollUntil(t, 30*time.Second, "the client's TCP and UDP listeners to server1 eligible", func() (bool, string) {
		return nextBackend(client, "tcp/80") == "server1" && nextBackend(client, "udp/53") == "server1" && nextBackend(client, "tcp/443") == "server2",
			fmt.Sprintf("tcp/80 %q udp/53 %q tcp/443 %q", nextBackend(client, "tcp/80"), nextBackend(client, "udp/53"), nextBackend(client, "tcp/443"))
	})
	hs0 := handshakeWith(t, rt(0), "client")

	// The flows: a TCP connection that sends a line every 20 ms and reads
	// it back, and a UDP socket that does the same.
	var tcpFlow, udpFlow flowWatch
	fctx, stopFlows := context.WithCancel(ctx)
	var wg sync.WaitGroup
	conn, err := host(2).DialTCP(ctx, netip.AddrPortFrom(stream.Addr, 80))
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		defer conn.Close()
		r := bufio.NewReader(conn)
		last := time.Now()
		for i := 0; fctx.Err() == nil; i++ {
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			line := fmt.Sprintf("line %d\n", i)
			_, err := conn.Write([]byte(line))
			var got string
			if err == nil {
				got, err = r.ReadString('\n')
			}
			tcpFlow.mu.Lock()
			tcpFlow.sent++
			if err == nil && got != line {
				err = fmt.Errorf("line %d came back as %q", i, got)
			}
			if err != nil {
				tcpFlow.err = err
				tcpFlow.mu.Unlock()
				return
			}
			tcpFlow.answered++
			tcpFlow.maxGap = max(tcpFlow.maxGap, time.Since(last))
			last = time.Now()
			tcpFlow.mu.Unlock()
			time.Sleep(20 * time.Millisecond) // the flow's pace, not a wait for state
		}
	})
	uc, err := host(2).DialUDP(netip.AddrPort{}, netip.AddrPortFrom(stream.Addr, 53))
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		defer uc.Close()
		last := time.Now()
		buf := make([]byte, 1500)
		for i := 0; fctx.Err() == nil; i++ {
			msg := fmt.Sprintf("ping %d", i)
			uc.SetDeadline(time.Now().Add(500 * time.Millisecond))
			if _, err := uc.Write([]byte(msg)); err != nil {
				udpFlow.mu.Lock()
				udpFlow.err = err
				udpFlow.mu.Unlock()
				return
			}
			// Read until this ping's answer or the deadline; a late answer
			// to an earlier ping is skipped.
			for {
				n, err := uc.Read(buf)
				if err != nil {
					break
				}
				who, got, _ := strings.Cut(string(buf[:n]), ": ")
				if got != msg {
					continue
				}
				udpFlow.mu.Lock()
				udpFlow.answered++
				if who != "server1" {
					udpFlow.fromOther++
				}
				udpFlow.maxGap = max(udpFlow.maxGap, time.Since(last))
				last = time.Now()
				udpFlow.mu.Unlock()
				break
			}
			udpFlow.mu.Lock()
			udpFlow.sent++
			udpFlow.mu.Unlock()
			time.Sleep(20 * time.Millisecond) // the flow's pace
		}
	})
	answered := func(f *flowWatch) int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.answered
	}
	// Both flows run before the first reload.
	pollUntil(t, 20*time.Second, "both flows answered", func() (bool, string) {
		return answered(&tcpFlow) >= 10 && answered(&udpFlow) >= 10, tcpFlow.String() + "; " + udpFlow.String()
	})

	// server4 joins: every member's config lists it, and it starts.
	for i := range 3 {
		rewriteConfig(t, paths[i], full[i])
		res, err := daemons[i].Reload(ctx)
		if err != nil || len(res.Networks) != 1 || !equalReload(res.Networks[0], NetworkReload{Network: "home", Added: []string{"server4"}}) {
			t.Fatalf("%s: reload adding server4: %+v %v", names[i], res, err)
		}
	}
	daemons[3], paths[3] = startReloadable(t, full[3], DaemonOptions{NoAPI: true})
	if err := serveTCP(ctx, host(3), 7443, "server4"); err != nil {
		t.Fatal(err)
	}
	// The new node gets the configuration, and its backend, added from
	// server1, becomes eligible at the client.
	pollUntil(t, 30*time.Second, "server4 holding stream and api", func() (bool, string) {
		_, e1 := rt(3).Registry().Get("stream")
		_, e2 := rt(3).Registry().Get("api")
		return e1 == nil && e2 == nil, fmt.Sprint(e1, e2)
	})
	if _, err := reg.BackendAdd(ctx, "api", vip.PortKey{Proto: vip.TCP, Port: 443}, be("server4:7443")); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 30*time.Second, "server4's backend eligible at the client", func() (bool, string) {
		b, ok := backendAt(client, "tcp/443", "server4")
		return ok && b.Eligible, fmt.Sprintf("%+v", b)
	})

	// server2 leaves: every other member's config drops it, then it stops.
	for _, i := range []int{0, 2, 3} {
		rewriteConfig(t, paths[i], withoutPeer(t, full[i], "server2"))
		res, err := daemons[i].Reload(ctx)
		if err != nil || !equalReload(res.Networks[0], NetworkReload{Network: "home", Removed: []string{"server2"}}) {
			t.Fatalf("%s: reload removing server2: %+v %v", names[i], res, err)
		}
	}
	daemons[1].Close()
	for _, i := range []int{0, 2, 3} {
		pollUntil(t, 30*time.Second, names[i]+" showing server2's backend departed", func() (bool, string) {
			b, ok := backendAt(rt(i), "tcp/443", "server2")
			return ok && b.Departed && !b.Eligible, fmt.Sprintf("%+v", b)
		})
	}
	pollUntil(t, 30*time.Second, "the client sending api's new flows to server4", func() (bool, string) {
		return nextBackend(client, "tcp/443") == "server4", nextBackend(client, "tcp/443")
	})
	if who, err := ask(ctx, host(2), netip.AddrPortFrom(mustGet(t, client, "api").Addr, 443)); err != nil || who != "server4" {
		t.Fatalf("a new connection to api after server2 left: %q %v", who, err)
	}
	// The flows ran across both reloads.
	n0t, n0u := answered(&tcpFlow), answered(&udpFlow)
	pollUntil(t, 20*time.Second, "both flows answered after the reloads", func() (bool, string) {
		return answered(&tcpFlow) >= n0t+10 && answered(&udpFlow) >= n0u+10, tcpFlow.String() + "; " + udpFlow.String()
	})
	stopFlows()
	wg.Wait()
	t.Logf("TCP stream: %s", tcpFlow.String())
	t.Logf("UDP exchange: %s", udpFlow.String())
	tcpFlow.mu.Lock()
	if tcpFlow.err != nil && fctx.Err() == nil {
		t.Errorf("the TCP stream to server1 broke: %v", tcpFlow.err)
	}
	if tcpFlow.maxGap > 2*time.Second {
		t.Errorf("the TCP stream to server1 stalled for %v", tcpFlow.maxGap)
	}
	tcpFlow.mu.Unlock()
	udpFlow.mu.Lock()
	if udpFlow.err != nil || udpFlow.fromOther != 0 {
		t.Errorf("the UDP exchange: %v, %d answers not by server1", udpFlow.err, udpFlow.fromOther)
	}
	if udpFlow.maxGap > 2*time.Second || udpFlow.sent-udpFlow.answered > udpFlow.sent/20 {
		t.Errorf("the UDP exchange to server1 stalled for %v, %d of %d unanswered", udpFlow.maxGap, udpFlow.sent-udpFlow.answered, udpFlow.sent)
	}
	udpFlow.mu.Unlock()
	if l, ok := listenerAt(client, "udp/53"); !ok || l.Created != 1 {
		t.Errorf("the client's udp/53 made %d bindings, want the one the exchange kept", l.Created)
	}
	if l, ok := listenerAt(client, "tcp/80"); !ok || l.Created != 1 {
		t.Errorf("the client's tcp/80 made %d bindings, want the stream's", l.Created)
	}
	// The client's control channel keeps state only for members.
	if senders, pinned, inbound, pending := controlOf(client).peerState(); senders > 2 || pinned > 2 || inbound > 2 || pending > 2 {
		t.Errorf("the client's control channel keeps %d senders, %d pins, %d inbound and %d pending members; 2 are members", senders, pinned, inbound, pending)
	}
	if hs := handshakeWith(t, rt(0), "client"); !hs.Equal(hs0) && time.Since(started) < 110*time.Second {
		t.Errorf("server1 and the client made a new handshake (%v, before %v): their session did not survive the reloads", hs, hs0)
	}
}

// handshakeWith returns when n's WireGuard device last completed a
// handshake with the member named peer.
func handshakeWith(t *testing.T, n *netRuntime, peer string) time.Time {
	t.Helper()
	for _, p := range n.ms().peers {
		if p.Name == peer {
			st, err := devOf(n).PeerStats(p.WireGuardKey)
			if err != nil {
				t.Fatal(err)
			}
			return st.LastHandshake
		}
	}
	t.Fatalf("%s is no peer", peer)
	return time.Time{}
}

// listenerAt returns n's status of listener ("tcp/443").
func listenerAt(n *netRuntime, listener string) (vip.ListenerStatus, bool) {
	eng := n.Engine()
	if eng == nil {
		return vip.ListenerStatus{}, false
	}
	for _, s := range eng.Status().Services {
		for _, l := range s.Listeners {
			if l.Listener == listener {
				return l, true
			}
		}
	}
	return vip.ListenerStatus{}, false
}

// backendAt returns n's status of listener's backend on the node named
// node.
func backendAt(n *netRuntime, listener, node string) (vip.BackendStatus, bool) {
	l, ok := listenerAt(n, listener)
	if !ok {
		return vip.BackendStatus{}, false
	}
	for _, b := range l.Backends {
		if b.NodeName == node {
			return b, true
		}
	}
	return vip.BackendStatus{}, false
}

// mustGet returns n's view of service name.
func mustGet(t *testing.T, n *netRuntime, name string) vip.ServiceView {
	t.Helper()
	v, err := n.Registry().Get(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// controlOf returns n's control channel (nil while the network is down).
func controlOf(n *netRuntime) *Control {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.control
}
