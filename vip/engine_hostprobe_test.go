package vip

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/vipkit/vipkit/probe"
)

// TestEngineDropsHostProbes: the probe port belongs to the engines. A host
// process on node 0 (any local user, through a proxy or a TUN) that sends
// probe requests to node 1's probe port, directly or through a VIP
// listener whose backend port is the probe port, gets nothing through:
// node 0's engine drops and counts them, node 1 sees no probe packet it
// did not expect, and its reply budget for node 0 stays with node 0's own
// probes. Other ports of the same address pass.
func TestEngineDropsHostProbes(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t, clusterOptions{n: 2, prober: fastProber})
	ctx := context.Background()
	a, b := c.nodes[0], c.nodes[1]
	port := a.engine().ProbePort()
	if port != probe.DefaultPort {
		t.Fatalf("probe port %d, want the default %d", port, probe.DefaultPort)
	}

	// A VIP whose UDP listener maps to node 1's probe port.
	if _, err := a.reg.Create(ctx, "sneaky"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.reg.PortAdd(ctx, "sneaky", PortKey{UDP, 53}, []Backend{{b.info.ID, port}}); err != nil {
		t.Fatal(err)
	}
	c.spread()
	vipAddr, err := c.resolve(a, "sneaky.home")
	if err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 10*time.Second, "the listener applied", func() bool { _, ok := listenerOf(a, "sneaky", "udp/53"); return ok })

	// A receiver on node 1's host at another port: the control.
	other, err := b.host.ListenUDP(netip.AddrPortFrom(b.info.Addr, 9999))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	beforeA, beforeB := a.engine().Status().Probe, b.engine().Status().Probe
	const n = 200
	req := probe.Message{Type: probe.TypeRequest, Session: 1, Sequence: 1, Nonce: 42}.Bytes()
	for _, to := range []netip.AddrPort{netip.AddrPortFrom(b.info.Addr, port), netip.AddrPortFrom(vipAddr, 53)} {
		conn, err := a.host.DialUDP(netip.AddrPortFrom(a.info.Addr, 0), to)
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			if _, err := conn.Write(req[:]); err != nil {
				t.Fatal(err)
			}
		}
		conn.Close()
	}
	// The control datagram, sent after them on the same path, arrives:
	// had the probes passed, node 1 would have had them first.
	conn, err := a.host.DialUDP(netip.AddrPortFrom(a.info.Addr, 0), netip.AddrPortFrom(b.info.Addr, 9999))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("control")); err != nil {
		t.Fatal(err)
	}
	other.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	if k, _, err := other.ReadFrom(buf); err != nil || string(buf[:k]) != "control" {
		t.Fatalf("the datagram to another port: %q %v", buf[:k], err)
	}
	afterB := b.engine().Status().Probe
	if d := afterB.Rejected - beforeB.Rejected; d != 0 {
		t.Errorf("node 1 refused %d probe packets, want 0: the host's requests reached it", d)
	}
	if got := a.engine().Status().Probe.HostDropped - beforeA.HostDropped; got != 2*n {
		t.Errorf("HostDropped %d, want %d", got, 2*n)
	}
}
