package tunwrap_test

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

// TestAdoptedVIPRefusesEmptyPort: in an adopted wireguard-go program, a
// VIP port without a listener answers the client's SYN with a RST and
// its datagram with port unreachable, injected into the host through the
// Wrapper (FlowFilter's Emit toward the host).
func TestAdoptedVIPRefusesEmptyPort(t *testing.T) {
	cli := newNode(t, cliAddr, addVIPs)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	c, err := cli.net.DialContextTCPAddrPort(ctx, netip.AddrPortFrom(vipAddr, 444))
	if err == nil {
		c.Close()
		t.Fatal("dial to a port without a listener succeeded")
	}
	// wireguard-go's netstack returns gVisor's error text, not an errno.
	if took := time.Since(start); !refused(err) || took >= time.Second {
		t.Fatalf("dial failed after %v with %v, want connection refused at once", took, err)
	}

	u, err := cli.net.DialUDPAddrPort(netip.AddrPort{}, netip.AddrPortFrom(vipAddr, 54))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := u.Write([]byte("query")); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for {
		// gVisor returns the error from the next read; a read already
		// waiting is not woken by it.
		u.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		_, err = u.Read(make([]byte, 64))
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || time.Since(start) >= time.Second {
			break
		}
	}
	if !refused(err) {
		t.Fatalf("UDP read after %v: %v, want connection refused", time.Since(start), err)
	}
}

func refused(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Err != nil && oe.Err.Error() == (&tcpip.ErrConnectionRefused{}).String()
}
