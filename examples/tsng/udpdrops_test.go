package tsng

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// socketInode is the inode of c's socket, as /proc/net/udp names it.
func socketInode(c *net.UDPConn) (string, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return "", err
	}
	var link string
	var lerr error
	if err := raw.Control(func(fd uintptr) {
		link, lerr = os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	}); err != nil {
		return "", err
	}
	if lerr != nil {
		return "", lerr
	}
	ino, ok := strings.CutPrefix(link, "socket:[")
	if !ok {
		return "", fmt.Errorf("fd is %q, not a socket", link)
	}
	return strings.TrimSuffix(ino, "]"), nil
}

// udpDrops is the number of datagrams the kernel dropped for the sockets
// conns (a full receive buffer), from the drops column of /proc/net/udp.
func udpDrops(conns ...*net.UDPConn) (uint64, error) {
	want := map[string]bool{}
	for _, c := range conns {
		ino, err := socketInode(c)
		if err != nil {
			return 0, err
		}
		want[ino] = true
	}
	f, err := os.Open("/proc/net/udp")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var total uint64
	found := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
		if len(fs) < 13 || !want[fs[9]] {
			continue
		}
		n, err := strconv.ParseUint(fs[12], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/net/udp drops %q: %v", fs[12], err)
		}
		total += n
		found++
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if found != len(want) {
		return 0, fmt.Errorf("/proc/net/udp lists %d of %d sockets", found, len(want))
	}
	return total, nil
}

// forceReadBuffer sets c's receive buffer to n bytes past net.core.rmem_max,
// which SetReadBuffer cannot; it needs CAP_NET_ADMIN, as the test process
// has. Without it the buffer is what SetReadBuffer gives.
func forceReadBuffer(c *net.UDPConn, n int) {
	if c.SetReadBuffer(n) != nil {
		return
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, n)
	})
}

// TestUDPDropsCounted: udpDrops sees the datagrams the kernel drops on a
// socket whose receive buffer is full, so the flood's tallies can tell a
// lost datagram from an unanswered query.
func TestUDPDropsCounted(t *testing.T) {
	rx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	rx.SetReadBuffer(4096)
	tx, err := net.DialUDP("udp4", nil, rx.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	d0, err := udpDrops(rx)
	if err != nil {
		t.Fatal(err)
	}
	const sent = 200
	for range sent {
		if _, err := tx.Write(make([]byte, 512)); err != nil {
			t.Fatal(err)
		}
	}
	d1, err := udpDrops(rx)
	if err != nil {
		t.Fatal(err)
	}
	if d1-d0 == 0 || d1-d0 >= sent {
		t.Fatalf("%d datagrams into a 4 KiB buffer nobody reads: %d dropped, want some but not all", sent, d1-d0)
	}
}
