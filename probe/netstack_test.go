package probe

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/netstack"
)

// netstackEnv joins two gVisor netstack hosts, 10.0.0.1 (the checker's
// side) and 10.0.0.2 (the backend), with a copy loop standing in for the
// tunnel. Packets to any other address are dropped by the receiving stack.
func netstackEnv(t *testing.T) tcpEnv {
	t.Helper()
	newHost := func(addr string) *netstack.Host {
		h, err := netstack.New(netstack.Options{Addrs: []netip.Addr{netip.MustParseAddr(addr)}})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	a, b := newHost("10.0.0.1"), newHost("10.0.0.2")
	var wg sync.WaitGroup
	wg.Add(2)
	go copyPackets(&wg, a, b)
	go copyPackets(&wg, b, a)
	t.Cleanup(func() {
		a.Close()
		b.Close()
		wg.Wait()
	})
	return tcpEnv{
		dialer: a,
		addr:   netip.MustParseAddr("10.0.0.2"),
		listen: func(t *testing.T, addr netip.AddrPort) net.Listener {
			t.Helper()
			if addr.Port() == 0 {
				addr = netip.AddrPortFrom(addr.Addr(), 8443)
			}
			ln, err := b.ListenTCP(addr)
			if err != nil {
				t.Fatal(err)
			}
			return ln
		},
	}
}

func copyPackets(wg *sync.WaitGroup, from, to transport.PacketIO) {
	defer wg.Done()
	const off = 16
	bufs, sizes := make([][]byte, from.BatchSize()), make([]int, from.BatchSize())
	for i := range bufs {
		bufs[i] = make([]byte, off+from.MTU())
	}
	out := make([][]byte, len(bufs))
	for {
		n, err := from.Read(bufs, sizes, off)
		if err != nil {
			return
		}
		for i := range n {
			out[i] = bufs[i][:off+sizes[i]]
		}
		if _, err := to.Write(out[:n], off); err != nil {
			return
		}
	}
}

func TestCheckerNetstackPortClosesAndReturns(t *testing.T) {
	testPortClosesAndReturns(t, netstackEnv(t))
}

func TestCheckerNetstackSilentListenerPasses(t *testing.T) {
	testSilentListenerPasses(t, netstackEnv(t))
}

// TestCheckerNetstackTimeout: a SYN that is never answered (no host at the
// address) fails by the check's timeout, measured on the Clock, and two of
// them exclude the backend.
func TestCheckerNetstackTimeout(t *testing.T) {
	env := netstackEnv(t)
	c := newRealChecker(t, env)
	sub, err := c.Acquire(CheckKey{Network: "home", Node: nodeID(3), Addr: netip.MustParseAddrPort("10.0.0.9:443")},
		CheckConfig{Interval: 50 * time.Millisecond, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var st CheckStatus
	eventually(t, 10*time.Second, "exclusion by timeouts", func() bool { st = sub.Status(); return !st.Passing })
	if st.Failures != 2 || !errors.Is(st.LastErr, ErrCheckTimeout) || st.Elapsed < 200*time.Millisecond {
		t.Fatalf("%+v", st)
	}
}
