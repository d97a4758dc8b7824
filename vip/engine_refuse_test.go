package vip

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// refuseBound is how soon a refused dial must fail: before gVisor's first
// SYN retransmission (its initial RTO is 1 s), so within the one round
// trip of the SYN and its RST, never by a timeout.
const refuseBound = time.Second

// TestEngineEmptyListenerRefuses: on the wireguard-go/netstack engine, a
// TCP dial to a listener without backends, or to a port of the VIP without
// a listener, fails with connection refused at once, and a UDP datagram to
// them gets port unreachable (a connected socket's next read fails with
// ECONNREFUSED). Each is counted as its drop reason in the status.
func TestEngineEmptyListenerRefuses(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t, clusterOptions{n: 2, prober: fastProber})
	ctx := context.Background()
	cn := c.nodes[0]
	if _, err := cn.reg.Create(ctx, "empty"); err != nil {
		t.Fatal(err)
	}
	if _, err := cn.reg.PortAdd(ctx, "empty", PortKey{TCP, 80}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cn.reg.PortAdd(ctx, "empty", PortKey{UDP, 53}, nil); err != nil {
		t.Fatal(err)
	}
	c.spread()
	vip, err := c.resolve(cn, "empty.home")
	if err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 10*time.Second, "the listeners applied", func() bool {
		_, ok1 := listenerOf(cn, "empty", "tcp/80")
		_, ok2 := listenerOf(cn, "empty", "udp/53")
		return ok1 && ok2
	})

	for _, port := range []uint16{80, 81} {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		conn, err := cn.host.DialTCP(dctx, netip.AddrPortFrom(vip, port))
		took := time.Since(start)
		cancel()
		if err == nil {
			conn.Close()
			t.Fatalf("tcp/%d: dial succeeded", port)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || took >= refuseBound {
			t.Fatalf("tcp/%d: dial failed after %v with %v, want ECONNREFUSED within %v", port, took, err, refuseBound)
		}
		t.Logf("tcp/%d: refused in %v", port, took)
	}

	for _, port := range []uint16{53, 54} {
		conn, err := cn.host.DialUDP(netip.AddrPortFrom(cn.info.Addr, 0), netip.AddrPortFrom(vip, port))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write([]byte("query")); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		// gVisor records the error on the connected socket and returns it
		// from the next read, but does not wake a read already waiting:
		// read in short slices until it arrives or the bound passes.
		for {
			_ = conn.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			_, err = conn.Read(make([]byte, 64))
			var ne interface{ Timeout() bool }
			if !errors.As(err, &ne) || !ne.Timeout() || time.Since(start) >= refuseBound {
				break
			}
		}
		took := time.Since(start)
		conn.Close()
		if !udpRefused(err) || took >= refuseBound {
			t.Fatalf("udp/%d: read failed after %v with %v, want ECONNREFUSED within %v", port, took, err, refuseBound)
		}
		t.Logf("udp/%d: unreachable in %v", port, took)
	}

	lt, _ := listenerOf(cn, "empty", "tcp/80")
	lu, _ := listenerOf(cn, "empty", "udp/53")
	if lt.Drops["refused"] != 1 || lu.Drops["port-unreachable"] != 1 {
		t.Errorf("listener drops: tcp %v, udp %v, want refused 1, port-unreachable 1", lt.Drops, lu.Drops)
	}
	// The ports without a listener count in the NAT's totals only.
	st := cn.engine().Status()
	if d := st.Flow.Drops; d["refused"] != 2 || d["port-unreachable"] != 2 || d["no-listener"] != 0 || d["no-backend"] != 0 {
		t.Errorf("flow drops %v, want refused 2, port-unreachable 2", d)
	}
	for _, s := range st.Services {
		if s.Name == "empty" && (s.Totals.Drops["refused"] != 1 || s.Totals.Drops["port-unreachable"] != 1) {
			t.Errorf("VIP totals drops %v", s.Totals.Drops)
		}
	}
}

// udpRefused reports whether a UDP read failed with connection refused:
// gVisor's gonet returns the endpoint's tcpip.ErrConnectionRefused as an
// error carrying its text, not as an errno.
func udpRefused(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Err != nil && oe.Err.Error() == (&tcpip.ErrConnectionRefused{}).String()
}

// TestEngineEmptyVIPRefuses: a service without any listener has a VIP
// that resolves; a dial to it is refused at once too.
func TestEngineEmptyVIPRefuses(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t, clusterOptions{n: 2, prober: fastProber})
	ctx := context.Background()
	cn := c.nodes[0]
	if _, err := cn.reg.Create(ctx, "bare"); err != nil {
		t.Fatal(err)
	}
	c.spread()
	vip, err := c.resolve(cn, "bare.home")
	if err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	conn, err := cn.host.DialTCP(dctx, netip.AddrPortFrom(vip, 80))
	took := time.Since(start)
	if err == nil {
		conn.Close()
		t.Fatal("dial succeeded")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) || took >= refuseBound {
		t.Fatalf("dial failed after %v with %v, want ECONNREFUSED within %v", took, err, refuseBound)
	}
}
