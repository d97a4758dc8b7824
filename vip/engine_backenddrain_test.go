package vip

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// serveEcho runs a TCP server on nd's port that greets every connection
// with "<node name>\n" and then echoes what it reads.
func serveEcho(t testing.TB, nd *cnode, port uint16) {
	t.Helper()
	serveTCP(t, nd, port, func(conn net.Conn) {
		fmt.Fprintf(conn, "%s\n", nd.name)
		_, _ = io.Copy(conn, conn)
	})
}

// dialEcho opens a TCP flow from nd to addr and returns the greeting and
// a reader over the connection.
func dialEcho(t *testing.T, nd *cnode, addr netip.AddrPort) (string, net.Conn, *bufio.Reader) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := nd.host.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		t.Fatalf("%s: dial %s: %v", nd.name, addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	rd := bufio.NewReader(conn)
	line, err := rd.ReadString('\n')
	if err != nil {
		t.Fatalf("%s: greeting from %s: %v", nd.name, addr, err)
	}
	return strings.TrimSpace(line), conn, rd
}

// echo checks that an existing TCP flow still carries data both ways.
func echo(t *testing.T, conn net.Conn, rd *bufio.Reader, msg string) {
	t.Helper()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte(msg + "\n")); err != nil {
		t.Fatalf("existing flow: write: %v", err)
	}
	got, err := rd.ReadString('\n')
	if err != nil || strings.TrimSpace(got) != msg {
		t.Fatalf("existing flow: echo %q, %v; want %q", got, err, msg)
	}
}

// TestEngineBackendDrain: three agents on wireguard-go and netstack, a
// VIP with tcp/443 and udp/53 on a and b. Draining a (a signed edit made
// on c, replicated to all) stops every client, a itself included (its
// local backend has RTT 0 and would win), from making new TCP or UDP
// bindings to a; the flows bound to a before go on; status reports the
// drain; undraining restores a for new flows.
func TestEngineBackendDrain(t *testing.T) {
	checkLeaks(t)
	c := newManualCluster(t, clusterOptions{})
	ctx := context.Background()
	cn, a, b := c.nodes[nC], c.nodes[nA], c.nodes[nB]
	for _, nd := range []*cnode{a, b} {
		serveEcho(t, nd, 7000)
		serveUDPName(t, nd, 5353)
	}
	tcp, udp := PortKey{TCP, 443}, PortKey{UDP, 53}
	if _, err := cn.reg.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	if _, err := cn.reg.PortAdd(ctx, "api", tcp, []Backend{{a.info.ID, 7000}, {b.info.ID, 7000}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cn.reg.PortAdd(ctx, "api", udp, []Backend{{a.info.ID, 5353}, {b.info.ID, 5353}}); err != nil {
		t.Fatal(err)
	}
	c.spread()
	clients := []*cnode{a, cn}
	for _, nd := range clients {
		c.run(3*time.Second, nd, a, b)
	}
	vip, err := c.resolve(cn, "api.home")
	if err != nil {
		t.Fatal(err)
	}
	tcpAddr, udpAddr := netip.AddrPortFrom(vip, 443), netip.AddrPortFrom(vip, 53)

	// Existing flows of a's own client go to a (local, RTT 0).
	who, oldTCP, oldRd := dialEcho(t, a, tcpAddr)
	if who != "a" {
		t.Fatalf("a's client: TCP flow to %s, want a (local)", who)
	}
	oldUDP, err := a.host.DialUDP(netip.AddrPortFrom(a.info.Addr, 0), udpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer oldUDP.Close()
	if got := ask(t, oldUDP, "q0"); got != "a:q0" {
		t.Fatalf("a's client: UDP reply %q, want a:q0", got)
	}

	// Drain a on both listeners, from c; replicate.
	ab := func(port uint16) Backend { return Backend{a.info.ID, port} }
	if _, err := cn.reg.BackendDrain(ctx, "api", tcp, ab(7000), true); err != nil {
		t.Fatal(err)
	}
	if _, err := cn.reg.BackendDrain(ctx, "api", udp, ab(5353), true); err != nil {
		t.Fatal(err)
	}
	c.spread()
	for _, nd := range c.nodes {
		v, _ := nd.reg.Get("api")
		if l, _ := v.Listener(tcp); !l.Draining(ab(7000)) {
			t.Fatalf("%s: the drain did not replicate: %+v", nd.name, l)
		}
	}
	for _, nd := range clients {
		c.run(time.Second, nd, a, b)
		for _, key := range []string{"tcp/443", "udp/53"} {
			if got := c.next(nd, "api", key); got != "b" {
				t.Fatalf("%s: next %s = %q with a draining, want b", nd.name, key, got)
			}
			l, _ := listenerOf(nd, "api", key)
			for _, bs := range l.Backends {
				if bs.Node == a.info.ID && (!bs.Drain || bs.Eligible || bs.Reason != "drained" || bs.PathReason == "") {
					t.Fatalf("%s: %s status of a: %+v, want drain, drained, not eligible, with its path reason", nd.name, key, bs)
				}
			}
		}
		for i := range 3 {
			if who, _, _ := dialEcho(t, nd, tcpAddr); who != "b" {
				t.Fatalf("%s: new TCP flow %d to %s with a draining, want b", nd.name, i, who)
			}
			conn, err := nd.host.DialUDP(netip.AddrPortFrom(nd.info.Addr, 0), udpAddr)
			if err != nil {
				t.Fatal(err)
			}
			if got := ask(t, conn, "new"); got != "b:new" {
				t.Fatalf("%s: new UDP flow %d: reply %q with a draining, want b:new", nd.name, i, got)
			}
			conn.Close()
		}
	}
	// The flows bound to a before the drain go on, past several probe
	// rounds.
	for i := range 5 {
		c.run(time.Second, a, b)
		echo(t, oldTCP, oldRd, fmt.Sprintf("still-%d", i))
		if got := ask(t, oldUDP, "q"); got != "a:q" {
			t.Fatalf("%d s into the drain: existing UDP flow reply %q, want a:q", i+1, got)
		}
	}
	if l, _ := listenerOf(a, "api", "udp/53"); l.Failovers != 0 {
		t.Fatalf("udp failovers = %d; a draining binding must not move", l.Failovers)
	}

	// Undrain, from b this time.
	if _, err := b.reg.BackendDrain(ctx, "api", tcp, ab(7000), false); err != nil {
		t.Fatal(err)
	}
	if _, err := b.reg.BackendDrain(ctx, "api", udp, ab(5353), false); err != nil {
		t.Fatal(err)
	}
	c.spread()
	c.run(time.Second, a, b)
	if who, _, _ := dialEcho(t, a, tcpAddr); who != "a" {
		t.Fatalf("after undrain: a's new TCP flow to %s, want a", who)
	}
	conn, err := a.host.DialUDP(netip.AddrPortFrom(a.info.Addr, 0), udpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := ask(t, conn, "back"); got != "a:back" {
		t.Fatalf("after undrain: a's new UDP flow: reply %q, want a:back", got)
	}
}

// TestEngineAllDrainedTakesNoNewFlows: a listener whose backends all drain
// drops a new flow (no-backend; it is not refused as an empty listener
// is), while a flow bound before the drain goes on (docs/backend-drain.md).
func TestEngineAllDrainedTakesNoNewFlows(t *testing.T) {
	checkLeaks(t)
	u := newUnitEngine(t, 5)
	ctx := context.Background()
	k := PortKey{TCP, 443}
	vip := netip.AddrPortFrom(u.svc.Addr, 443)
	old := netip.AddrPortFrom(u.self.Addr, 40000)
	b := newBatch(4, 2048)
	if n := u.hostBatch(b, ipv4Packet(6, old, vip, tcpSYN, nil)); n != 1 {
		t.Fatalf("SYN before the drain: %d packets for the overlay, want 1", n)
	}
	if _, err := u.reg.BackendDrain(ctx, "api", k, Backend{u.peer.ID, 8443}, true); err != nil {
		t.Fatal(err)
	}
	noBackend := func() uint64 {
		l := u.e.Status().Services[0].Listeners[0]
		return l.Drops["no-backend"]
	}
	before := noBackend()
	if n := u.hostBatch(b, ipv4Packet(6, netip.AddrPortFrom(u.self.Addr, 40001), vip, tcpSYN, nil)); n != 0 {
		t.Fatalf("a new flow with every backend draining: %d packets for the overlay, want 0", n)
	}
	if got := noBackend(); got != before+1 {
		t.Fatalf("no-backend drops %d → %d, want one more", before, got)
	}
	if n := u.hostBatch(b, ipv4Packet(6, old, vip, tcpACK, []byte("go on"))); n != 1 {
		t.Fatal("the flow bound before the drain stopped")
	}
	if l := u.e.Status().Services[0].Listeners[0]; l.Next != nil {
		t.Fatalf("next = %+v with every backend draining", l.Next)
	}
}
