package vip

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/probe"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// serveUDPName answers every datagram to nd's port with "<node name>:<the
// datagram>" until the test ends.
func serveUDPName(t testing.TB, nd *cnode, port uint16) {
	t.Helper()
	pc, err := nd.host.ListenUDP(netip.AddrPortFrom(nd.info.Addr, port))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { pc.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(append([]byte(nd.name+":"), buf[:n]...), from)
		}
	}()
}

// manualCluster is a cluster whose engines all run on one manual clock:
// probes, path ticks, binding expiry and quarantine move only with it,
// while wireguard-go and netstack carry the packets in real time.
type manualCluster struct {
	*cluster
	clock *transporttest.ManualClock
}

func newManualCluster(t *testing.T, o clusterOptions) *manualCluster {
	t.Helper()
	clock := transporttest.NewManualClock()
	inner := o.engine
	o.engine = func(eo *EngineOptions) {
		eo.Clock = clock
		if inner != nil {
			inner(eo)
		}
	}
	return &manualCluster{cluster: newCluster(t, o), clock: clock}
}

// settle runs what is due on the manual clock and waits, in real time,
// until nd's prober has an answer or an expiry for every probe it sent to
// a peer whose path is up (tracked peers in up), so that the manual clock
// never expires a probe the tunnel is still carrying.
func (c *manualCluster) settle(nd *cnode, up ...*cnode) {
	c.t.Helper()
	settled := func() bool {
		c.clock.Advance(0) // probes due at once (after a silence ended)
		now := c.clock.Now()
		for _, p := range up {
			h := nd.engine().Prober().Health(probe.NodeID(p.info.ID), now)
			if h.Tracked && h.Sent != h.Replies+h.Expired {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(10 * time.Second); !settled(); {
		if time.Now().After(deadline) {
			c.t.Fatal("timed out waiting for probe replies")
		}
		time.Sleep(time.Millisecond) // polling interval: a round trip through the tunnels
	}
}

// run advances the manual clock by d in steps of at most one probe
// interval, settling nd's probes to up after each step.
func (c *manualCluster) run(d time.Duration, nd *cnode, up ...*cnode) {
	c.t.Helper()
	end := c.clock.Now().Add(d)
	for c.clock.Now().Before(end) {
		next := c.clock.Now().Add(time.Second)
		if next.After(end) {
			next = end
		}
		c.clock.AdvanceTo(next)
		c.settle(nd, up...)
	}
}

// ask sends q on conn and returns the reply.
func ask(t *testing.T, conn net.Conn, q string) string {
	t.Helper()
	for try := 0; try < 50; try++ {
		if _, err := conn.Write([]byte(q)); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		buf := make([]byte, 256)
		n, err := conn.Read(buf)
		if err == nil {
			return string(buf[:n])
		}
	}
	t.Fatalf("no reply to %q", q)
	return ""
}

// bindingTo returns the active binding of listener l to a backend on node
// nd's address, if any.
func bindingTo(e *Engine, l flow.Listener, nd *cnode) (flow.BindingInfo, bool) {
	for _, b := range e.NAT().Bindings() {
		if b.Listener == l && b.Backend.Addr == nd.info.Addr && b.State == flow.Active {
			return b, true
		}
	}
	return flow.BindingInfo{}, false
}

// drainSetup: a and b serve udp/5353; dns.home udp/53 has the single
// backend a; the client c has a UDP flow bound to a; then a is replaced by
// b. It returns the client's connection and the listener.
func drainSetup(t *testing.T) (*manualCluster, net.Conn, flow.Listener) {
	c := newManualCluster(t, clusterOptions{})
	ctx := context.Background()
	cn, a, b := c.nodes[nC], c.nodes[nA], c.nodes[nB]
	serveUDPName(t, a, 5353)
	serveUDPName(t, b, 5353)
	if _, err := cn.reg.Create(ctx, "dns"); err != nil {
		t.Fatal(err)
	}
	if _, err := cn.reg.PortAdd(ctx, "dns", PortKey{UDP, 53}, []Backend{{a.info.ID, 5353}}); err != nil {
		t.Fatal(err)
	}
	c.spread()
	c.run(3*time.Second, cn, a)
	if !rttsKnown(cn, "dns", "udp/53") {
		l, _ := listenerOf(cn, "dns", "udp/53")
		t.Fatalf("a's path is not measured: %+v", l.Backends)
	}
	vip, err := c.resolve(cn, "dns.home")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := cn.host.DialUDP(netip.AddrPortFrom(cn.info.Addr, 0), netip.AddrPortFrom(vip, 53))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if got := ask(t, conn, "q0"); got != "a:q0" {
		t.Fatalf("before the removal: reply %q, want a:q0", got)
	}
	if _, err := cn.reg.BackendAdd(ctx, "dns", PortKey{UDP, 53}, Backend{b.info.ID, 5353}); err != nil {
		t.Fatal(err)
	}
	if _, err := cn.reg.BackendRemove(ctx, "dns", PortKey{UDP, 53}, Backend{a.info.ID, 5353}); err != nil {
		t.Fatal(err)
	}
	c.spread()
	return c, conn, flow.Listener{VIP: vip, Proto: flow.ProtoUDP, Port: 53}
}

// TestEngineUDPRemovedBackendDrainsUntilIdle: a UDP binding to a removed
// backend keeps that backend, while its path is healthy, until it has been
// idle for the listener's idle timeout (120 s); the engine keeps probing
// the backend's node while the binding drains, although the node serves no
// listener any more, and stops once it is gone. New flows go to b at once.
func TestEngineUDPRemovedBackendDrainsUntilIdle(t *testing.T) {
	checkLeaks(t)
	c, conn, fl := drainSetup(t)
	cn, a, b := c.nodes[nC], c.nodes[nA], c.nodes[nB]
	aID := probe.NodeID(a.info.ID)
	if got := c.next(cn, "dns", "udp/53"); got != "b" {
		t.Fatalf("next = %q after the change, want b", got)
	}
	for i := 1; i <= 5; i++ {
		c.run(time.Second, cn, a, b)
		if got := ask(t, conn, "q"); got != "a:q" {
			t.Fatalf("%d s after a was removed: reply %q, want a:q (the binding drains)", i, got)
		}
		if h := cn.engine().Prober().Health(aID, c.clock.Now()); !h.Tracked || !h.Eligible() {
			t.Fatalf("%d s after a was removed: a's probe health %+v, want probed and eligible", i, h)
		}
	}
	// A new flow goes to b.
	conn2, err := cn.host.DialUDP(netip.AddrPortFrom(cn.info.Addr, 0), netip.AddrPortFrom(fl.VIP, 53))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if got := ask(t, conn2, "new"); got != "b:new" {
		t.Fatalf("a new flow: reply %q, want b:new", got)
	}
	l, _ := listenerOf(cn, "dns", "udp/53")
	if l.Failovers != 0 {
		t.Errorf("udp failovers = %d; the draining binding must not move", l.Failovers)
	}
	// Idle expiry: the binding lasts until exactly 120 s after its last
	// datagram.
	bi, ok := bindingTo(cn.engine(), fl, a)
	if !ok {
		t.Fatal("no active binding to a")
	}
	if idle := bi.Expires.Sub(c.clock.Now()); idle != DefaultUDPIdle {
		t.Fatalf("binding expires in %v, want %v", idle, DefaultUDPIdle)
	}
	c.run(bi.Expires.Sub(c.clock.Now())-time.Millisecond, cn, a, b)
	cn.engine().NAT().Expire(c.clock.Now())
	if _, ok := bindingTo(cn.engine(), fl, a); !ok {
		t.Fatal("the binding to a expired before its idle timeout")
	}
	if h := cn.engine().Prober().Health(aID, c.clock.Now()); !h.Tracked {
		t.Fatal("a is no longer probed while its binding drains")
	}
	c.run(time.Millisecond, cn, a, b)
	cn.engine().NAT().Expire(c.clock.Now())
	if _, ok := bindingTo(cn.engine(), fl, a); ok {
		t.Fatal("the binding to a outlived its idle timeout")
	}
	if got := ask(t, conn, "after"); got != "b:after" {
		t.Fatalf("after idle expiry: reply %q, want b:after", got)
	}
	// With the binding gone the engine stops probing a, at the next path
	// tick.
	c.run(time.Second, cn, b)
	if h := cn.engine().Prober().Health(aID, c.clock.Now()); h.Tracked {
		t.Fatalf("a is still probed with no binding left: %+v", h)
	}
}

// TestEngineUDPRemovedBackendFailsOverWhenItsPathDies: the draining binding
// keeps its removed backend only while the backend's path is healthy; when
// its probes go unanswered it fails over to a configured backend.
func TestEngineUDPRemovedBackendFailsOverWhenItsPathDies(t *testing.T) {
	checkLeaks(t)
	c, conn, _ := drainSetup(t)
	cn, a, b := c.nodes[nC], c.nodes[nA], c.nodes[nB]
	c.run(time.Second, cn, a, b)
	if got := ask(t, conn, "q"); got != "a:q" {
		t.Fatalf("after a was removed: reply %q, want a:q (the binding drains)", got)
	}
	c.net.Isolate(a.bind.Node())
	// Two probes expire: a is excluded 3 s after the second was sent.
	c.run(5*time.Second, cn, b)
	if h := cn.engine().Prober().Health(probe.NodeID(a.info.ID), c.clock.Now()); h.Eligible() {
		t.Fatalf("a still eligible with its path cut: %+v", h)
	}
	if got := ask(t, conn, "moved"); !strings.HasPrefix(got, "b:") {
		t.Fatalf("after a's path died: reply %q, want b's", got)
	}
	if l, _ := listenerOf(cn, "dns", "udp/53"); l.Failovers != 1 {
		t.Errorf("udp failovers = %d, want 1", l.Failovers)
	}
}
