//go:build linux

package netns

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
	"golang.org/x/sys/unix"
)

// eventually polls cond every 10 ms until it holds or the deadline passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// threadNS returns the inode of the calling thread's network namespace.
func threadNS(t testing.TB) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func listNS(t testing.TB) []string {
	t.Helper()
	names, err := List()
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestHostLifecycle(t *testing.T) {
	before := listNS(t)
	h := NewHostT(t, "life")
	if !strings.HasPrefix(h.Name(), fmt.Sprintf("vk-%d-", os.Getpid())) || !strings.HasSuffix(h.Name(), "-life") {
		t.Errorf("name %q: want vk-<pid>-<n>-life", h.Name())
	}
	if !slices.Contains(listNS(t), h.Name()) {
		t.Fatalf("%s not under %s", h.Name(), RunDir)
	}
	if _, err := NewHost(context.Background(), h.Name()); !errors.Is(err, ErrExists) {
		t.Errorf("NewHost(existing name) = %v, want ErrExists", err)
	}

	// The bind mount is what `ip netns exec` uses.
	ip := testenv.NeedBinary(t, "ip")
	out, err := exec.Command(ip, "netns", "exec", h.Name(), ip, "-o", "link", "show").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns exec: %v: %s", err, out)
	}
	if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 1 || !strings.Contains(lines[0], "lo:") || !strings.Contains(lines[0], ",UP") {
		t.Errorf("ip netns exec %s ip link: want only lo, up; got\n%s", h.Name(), out)
	}
	ifs, err := h.Interfaces()
	if err != nil || !slices.Equal(ifs, []string{"lo"}) {
		t.Errorf("Interfaces() = %v, %v; want [lo]", ifs, err)
	}

	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if got := listNS(t); !isSubset(got, before) {
		t.Errorf("namespaces after Close: %v, before: %v", got, before)
	}
	if err := h.Do(func() error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("Do after Close = %v, want ErrClosed", err)
	}
	if _, err := h.CreateTUN("t0", 1420); !errors.Is(err, ErrClosed) {
		t.Errorf("CreateTUN after Close = %v, want ErrClosed", err)
	}
	if err := h.AddAddr("lo", netip.MustParsePrefix("198.18.255.1/32")); !errors.Is(err, ErrClosed) {
		t.Errorf("AddAddr after Close = %v, want ErrClosed", err)
	}
}

// isSubset reports whether every name in a is in b (other tests' namespaces
// may come and go in b meanwhile, but none of ours may linger).
func isSubset(a, b []string) bool {
	for _, n := range a {
		if strings.HasPrefix(n, fmt.Sprintf("vk-%d-", os.Getpid())) && !slices.Contains(b, n) {
			return false
		}
	}
	return true
}

// TestDoIsolatesThreads runs Do from many goroutines while other goroutines
// keep checking that their own threads never leave the root namespace.
func TestDoIsolatesThreads(t *testing.T) {
	a := NewHostT(t, "do-a")
	b := NewHostT(t, "do-b")
	root := threadNS(t)
	if root == a.Inode() || a.Inode() == b.Inode() {
		t.Fatalf("inodes: root %d a %d b %d", root, a.Inode(), b.Inode())
	}

	stop := make(chan struct{})
	var watchers sync.WaitGroup
	var leaked sync.Once
	var leakErr error
	for range 4 {
		watchers.Add(1)
		go func() {
			defer watchers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				var st unix.Stat_t
				if err := unix.Stat("/proc/thread-self/ns/net", &st); err == nil && st.Ino != root {
					leaked.Do(func() { leakErr = fmt.Errorf("a plain goroutine ran in namespace %d", st.Ino) })
				}
				runtime.Gosched()
			}
		}()
	}
	var workers sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		h := a
		if i%2 == 1 {
			h = b
		}
		workers.Add(1)
		go func() {
			defer workers.Done()
			errs <- h.Do(func() error {
				var st unix.Stat_t
				if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
					return err
				}
				if st.Ino != h.Inode() {
					return fmt.Errorf("Do ran in namespace %d, want %d", st.Ino, h.Inode())
				}
				return nil
			})
		}()
	}
	workers.Wait()
	close(stop)
	watchers.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if leakErr != nil {
		t.Error(leakErr)
	}
	if got := threadNS(t); got != root {
		t.Errorf("test goroutine's thread is in %d, want %d", got, root)
	}
	wantErr := errors.New("from f")
	if err := a.Do(func() error { return wantErr }); !errors.Is(err, wantErr) {
		t.Errorf("Do returned %v, want f's error", err)
	}
}

// TestDoPanicAndGoexit checks that a panic in f reaches Do's caller and that
// runtime.Goexit in f (what t.Fatal does) ends the caller's goroutine, both
// after the thread is restored.
func TestDoPanicAndGoexit(t *testing.T) {
	h := NewHostT(t, "do-panic")
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want boom", v)
			}
		}()
		_ = h.Do(func() error { panic("boom") })
		t.Error("Do returned after f panicked")
	}()
	done := make(chan bool, 1)
	go func() {
		returned := false
		defer func() { done <- returned }()
		_ = h.Do(func() error { runtime.Goexit(); return nil })
		returned = true
	}()
	if <-done {
		t.Error("Do returned after f called runtime.Goexit")
	}
	if err := threadsHome(); err != nil {
		t.Error(err)
	}
	if err := h.Do(func() error { return nil }); err != nil {
		t.Errorf("Do after a panic: %v", err)
	}
}

// echoTCP listens on addr inside h and echoes one connection.
func echoTCP(t *testing.T, h *Host, addr netip.Addr) netip.AddrPort {
	t.Helper()
	ln, err := h.Listen(context.Background(), "tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	done := echoOnce(ln, 0)
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	return netip.MustParseAddrPort(ln.Addr().String())
}

// echoOnce echoes the first connection that ln accepts, for d at most when
// d > 0. The channel it returns is closed when that is over, or when ln
// closes first.
func echoOnce(ln net.Listener, d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if d > 0 {
			_ = c.SetDeadline(time.Now().Add(d))
		}
		_, _ = io.Copy(c, c)
	}()
	return done
}

// dialEcho dials to from inside h, sends msg and checks the echo.
func dialEcho(h *Host, to netip.AddrPort, msg []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := h.Dial(ctx, "tcp", to.String())
	if err != nil {
		return fmt.Errorf("dial %v from %s: %w", to, h, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("echo from %v to %s: %w", to, h, err)
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("echo from %v to %s differs", to, h)
	}
	return nil
}

func TestConnect(t *testing.T) {
	a := NewHostT(t, "veth-a")
	b := NewHostT(t, "veth-b")
	l := ConnectT(t, a, b, LinkOptions{MTU: 1400})
	if !LinkPrefix4.Contains(l.A.Addr4()) || !LinkPrefix4.Contains(l.B.Addr4()) || !LinkPrefix6.Contains(l.B.Addr6()) {
		t.Fatalf("addresses outside the plan: %v %v", l.A.Addrs, l.B.Addrs)
	}
	if mtu, err := a.Netlink().LinkByName(l.A.Name); err != nil || mtu.Attrs().MTU != 1400 {
		t.Errorf("MTU of %s: %v %v", l.A.Name, mtu, err)
	}
	for _, to := range []netip.Addr{l.B.Addr4(), l.B.Addr6()} {
		srv := echoTCP(t, b, to)
		if err := dialEcho(a, srv, []byte("hello over veth "+to.String())); err != nil {
			t.Error(err)
		}
	}
	// Nothing of the link shows in the machine's own namespace.
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, ad := range addrs {
		if p, err := netip.ParsePrefix(ad.String()); err == nil && (LinkPrefix4.Contains(p.Addr()) || LinkPrefix6.Contains(p.Addr())) {
			t.Errorf("root namespace has %v", p)
		}
	}

	// Closing one host deletes the pair: the peer end disappears from b.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	ifs, err := b.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(ifs, l.B.Name) {
		t.Errorf("%s still in %s after its peer's host closed: %v", l.B.Name, b, ifs)
	}
	if err := l.Close(); err != nil {
		t.Errorf("Link.Close after host close: %v", err)
	}
}

func TestLAN(t *testing.T) {
	hosts := []*Host{NewHostT(t, "lan-1"), NewHostT(t, "lan-2"), NewHostT(t, "lan-3")}
	sw, ifs := LANT(t, hosts...)
	for i, f := range ifs {
		if !sw.Prefix4().Contains(f.Addr4()) || !sw.Prefix6().Contains(f.Addr6()) {
			t.Fatalf("host %d: %v outside %v/%v", i, f.Addrs, sw.Prefix4(), sw.Prefix6())
		}
	}
	for i, from := range hosts {
		for j := range hosts {
			if i == j {
				continue
			}
			for _, to := range []netip.Addr{ifs[j].Addr4(), ifs[j].Addr6()} {
				srv := echoTCP(t, hosts[j], to)
				if err := dialEcho(from, srv, fmt.Appendf(nil, "%d→%d", i, j)); err != nil {
					t.Error(err)
				}
			}
		}
	}

	// Cut host 3 off: 1 and 2 still talk, 3 reaches nobody; after Heal it
	// does again.
	if err := sw.Cut(hosts[2]); err != nil {
		t.Fatal(err)
	}
	if err := dialEcho(hosts[0], echoTCP(t, hosts[1], ifs[1].Addr4()), []byte("1→2 during cut")); err != nil {
		t.Error(err)
	}
	if err := dialEchoWithin(hosts[2], echoTCP(t, hosts[0], ifs[0].Addr4()), 300*time.Millisecond); err == nil {
		t.Error("cut host reached host 1")
	}
	if err := dialEchoWithin(hosts[1], echoTCP(t, hosts[2], ifs[2].Addr6()), 300*time.Millisecond); err == nil {
		t.Error("host 2 reached the cut host")
	}
	if err := sw.Heal(hosts[2]); err != nil {
		t.Fatal(err)
	}
	if err := dialEcho(hosts[2], echoTCP(t, hosts[0], ifs[0].Addr4()), []byte("3→1 healed")); err != nil {
		t.Error(err)
	}
	if err := sw.Cut(NewHostT(t, "lan-stranger")); !errors.Is(err, ErrNotAttached) {
		t.Errorf("Cut(unattached) = %v, want ErrNotAttached", err)
	}

	// UDP, host 1 to host 3 over IPv6, with ListenPacket in both.
	ctx := context.Background()
	srv, err := hosts[2].ListenPacket(ctx, "udp", netip.AddrPortFrom(ifs[2].Addr6(), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli, err := hosts[0].ListenPacket(ctx, "udp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.WriteTo([]byte("datagram"), srv.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	_ = srv.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, from, err := srv.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "datagram" {
		t.Fatalf("UDP over the LAN: %q, %v", buf[:n], err)
	}
	if got := netip.MustParseAddrPort(from.String()).Addr(); got != ifs[0].Addr6() {
		t.Errorf("datagram came from %v, want %v", got, ifs[0].Addr6())
	}
}

func TestSocketsNeedLiterals(t *testing.T) {
	h := NewHostT(t, "literal")
	ctx := context.Background()
	if _, err := h.Dial(ctx, "tcp", "localhost:80"); !errors.Is(err, ErrNotLiteral) {
		t.Errorf("Dial(localhost) = %v, want ErrNotLiteral", err)
	}
	if _, err := h.Listen(ctx, "tcp", "example.test:0"); !errors.Is(err, ErrNotLiteral) {
		t.Errorf("Listen(name) = %v, want ErrNotLiteral", err)
	}
	if _, err := h.ListenPacket(ctx, "udp", "no-port"); err == nil {
		t.Error("ListenPacket without a port accepted")
	}
	// Loopback inside the host works.
	ln, err := h.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := h.Dial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if raw, err := h.ListenPacket(ctx, "ip4:icmp", "127.0.0.1"); err != nil {
		t.Errorf("raw ICMP socket: %v", err)
	} else {
		raw.Close()
	}
}

// dialEchoWithin is dialEcho of one byte with a deadline of d for the
// whole exchange.
func dialEchoWithin(h *Host, to netip.AddrPort, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c, err := h.Dial(ctx, "tcp", to.String())
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("x")); err != nil {
		return err
	}
	_, err = io.ReadFull(c, make([]byte, 1))
	return err
}

// readyOutput waits until p has printed "ready" and returns its output.
func readyOutput(t *testing.T, p *Process) string {
	t.Helper()
	var out []byte
	eventually(t, 10*time.Second, "child prints ready", func() bool {
		select {
		case <-p.Done():
			t.Fatalf("child exited early: %v", p.Wait(context.Background()))
		default:
		}
		out, _ = p.Output()
		return bytes.Contains(out, []byte("\nready\n"))
	})
	return string(out)
}

func field(out, key string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+"="); ok {
			return v
		}
	}
	return ""
}

func TestChildProcess(t *testing.T) {
	testenv.NeedBinary(t, "ip")
	testenv.NeedBinary(t, "sleep")
	a := NewHostT(t, "child-a")
	b := NewHostT(t, "child-b")
	l := ConnectT(t, a, b, LinkOptions{})

	p := StartChildT(t, a, "nsinfo")
	out := readyOutput(t, p)
	if want := fmt.Sprintf("net:[%d]", a.Inode()); field(out, "ns") != want {
		t.Errorf("child's namespace %q, want %q", field(out, "ns"), want)
	}
	if own, _ := os.Readlink("/proc/self/ns/net"); field(out, "ns") == own {
		t.Errorf("child shares the parent's namespace %s", own)
	}
	if !strings.Contains(out, l.A.Addr4().String()) {
		t.Errorf("child's ip addr lacks %v:\n%s", l.A.Addr4(), out)
	}
	parentAddrs, err := exec.Command("ip", "-o", "addr").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(parentAddrs), l.A.Addr4().String()) {
		t.Errorf("parent's ip addr shows the host's address %v", l.A.Addr4())
	}
	gc, err := strconv.Atoi(field(out, "grandchild"))
	if err != nil {
		t.Fatalf("grandchild pid: %v\n%s", err, out)
	}

	// A plain binary, through Start: `ip` sees b's interfaces, not a's.
	ipb, err := b.Start(context.Background(), []string{"ip", "-o", "addr"}, ProcOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ipb.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if o, _ := ipb.Output(); !strings.Contains(string(o), l.B.Addr4().String()) || strings.Contains(string(o), l.A.Addr4().String()) {
		t.Errorf("ip addr in %s:\n%s", b, o)
	}

	// Closing the host kills the child and its process group.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("child still running after its host closed")
	}
	if err := unix.Kill(p.Pid(), 0); !errors.Is(err, unix.ESRCH) {
		t.Errorf("child pid %d: kill(0) = %v, want ESRCH", p.Pid(), err)
	}
	eventually(t, 5*time.Second, "grandchild reaped", func() bool {
		// It was reparented to init (or a subreaper); it is gone once killed
		// and reaped, or a zombie until then.
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", gc))
		return err != nil || zombie(st)
	})
	if _, err := a.StartChild(context.Background(), "nsinfo", nil, ProcOptions{}); !errors.Is(err, ErrClosed) {
		t.Errorf("StartChild after Close = %v, want ErrClosed", err)
	}
	if _, err := b.StartChild(context.Background(), "no-such-child", nil, ProcOptions{}); !errors.Is(err, ErrUnknownChild) {
		t.Errorf("StartChild(unknown) = %v, want ErrUnknownChild", err)
	}
}

func zombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

func TestProcessExitAndContext(t *testing.T) {
	testenv.NeedBinary(t, "sh")
	h := NewHostT(t, "exit")
	p, err := h.Start(context.Background(), []string{"sh", "-c", "echo out; echo err >&2; exit 7"}, ProcOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ee *exec.ExitError
	if err := p.Wait(context.Background()); !errors.As(err, &ee) || p.ExitCode() != 7 {
		t.Errorf("Wait = %v, ExitCode %d; want exit status 7", err, p.ExitCode())
	}
	if out, trunc := p.Output(); string(out) != "out\nerr\n" || trunc {
		t.Errorf("Output = %q, %v", out, trunc)
	}

	ctx, cancel := context.WithCancel(context.Background())
	q, err := h.Start(ctx, []string{"sleep", "1000"}, ProcOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := q.Wait(context.Background()); err == nil || q.ExitCode() != -1 {
		t.Errorf("after cancel: Wait = %v, ExitCode %d; want killed", err, q.ExitCode())
	}

	r, err := h.Start(context.Background(), []string{"sleep", "1000"}, ProcOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(context.Background()); err == nil {
		t.Error("Stop: want the SIGTERM exit status")
	} else if ws := r.cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGTERM {
		t.Errorf("Stop: %v, want SIGTERM", err)
	}
	if err := r.Signal(unix.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("Signal after exit = %v", err)
	}
	if _, err := h.Start(context.Background(), []string{"/nonexistent/program"}, ProcOptions{}); err == nil {
		t.Error("Start(nonexistent) succeeded")
	}

	out, err := h.Run(context.Background(), "sh", "-c", "readlink /proc/self/ns/net; exit 3")
	if want := fmt.Sprintf("net:[%d]\n", h.Inode()); string(out) != want || !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Errorf("Run = %q, %v; want %q and exit status 3", out, err, want)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := h.Run(ctx, "sleep", "1000"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run past its deadline = %v, want DeadlineExceeded", err)
	}
}

// TestHelperFailingMidway is not a test by itself: TestCleanupAfterFailure
// runs it in a child process, where it builds hosts, a link and a child
// process and then fails in a subtest. In a normal run it returns at once.
func TestHelperFailingMidway(t *testing.T) {
	if os.Getenv("VIPKIT_NETNS_HELPER") != "fail-midway" {
		return
	}
	a := NewHostT(t, "fail-a")
	b := NewHostT(t, "fail-b")
	ConnectT(t, a, b, LinkOptions{})
	t.Run("sub", func(t *testing.T) {
		c := NewHostT(t, "fail-c")
		p := StartChildT(t, c, "nsinfo")
		readyOutput(t, p)
		fmt.Printf("STATE hosts=%s,%s,%s pid=%d\n", a.Name(), b.Name(), c.Name(), p.Pid())
		t.Fatal("deliberate failure midway")
	})
}

func TestCleanupAfterFailure(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedBinary(t, "ip")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHelperFailingMidway$", "-test.v")
	cmd.Env = append(os.Environ(), "VIPKIT_NETNS_HELPER=fail-midway")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !bytes.Contains(out, []byte("deliberate failure midway")) {
		t.Fatalf("helper should fail midway; err %v, output:\n%s", err, out)
	}
	var hosts string
	var pid int
	for line := range strings.Lines(string(out)) {
		if s, ok := strings.CutPrefix(strings.TrimSpace(line), "STATE "); ok {
			f := strings.Fields(s)
			if len(f) != 2 {
				t.Fatalf("state %q", s)
			}
			hosts = strings.TrimPrefix(f[0], "hosts=")
			pid, _ = strconv.Atoi(strings.TrimPrefix(f[1], "pid="))
		}
	}
	if hosts == "" || pid == 0 {
		t.Fatalf("no STATE line in helper output:\n%s", out)
	}
	if !bytes.Contains(out, []byte("netns: state of vk-")) || !bytes.Contains(out, []byte("ip neigh")) {
		t.Errorf("the failed test did not log its hosts' state:\n%s", out)
	}
	left := listNS(t)
	for _, n := range strings.Split(hosts, ",") {
		if slices.Contains(left, n) {
			t.Errorf("namespace %s left behind by the failed test", n)
		}
	}
	if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
		t.Errorf("child %d of the failed test: kill(0) = %v, want ESRCH", pid, err)
	}
}

func TestSweep(t *testing.T) {
	live := NewHostT(t, "sweep-live")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A process that makes a namespace and is killed before its cleanup.
	cmd := exec.Command(exe, "-test.run=^$", "--")
	cmd.Env = append(os.Environ(), childEnv+"=mkns")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	name := strings.TrimSpace(strings.TrimPrefix(line, "name="))
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err != nil || !strings.HasPrefix(line, "name=") {
		t.Fatalf("child: %q, %v", line, err)
	}
	if !slices.Contains(listNS(t), name) {
		t.Fatalf("killed child's namespace %s is not there to sweep", name)
	}
	removed, err := Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, name) || slices.Contains(listNS(t), name) {
		t.Errorf("Sweep removed %v; %s still listed: %v", removed, name, slices.Contains(listNS(t), name))
	}
	if slices.Contains(removed, live.Name()) || !slices.Contains(listNS(t), live.Name()) {
		t.Errorf("Sweep removed the live namespace %s", live.Name())
	}
	if err := live.Do(func() error { return nil }); err != nil {
		t.Errorf("live host after Sweep: %v", err)
	}
}

func TestCreateTUN(t *testing.T) {
	h := NewHostT(t, "tun")
	if _, err := h.CreateTUN("this-name-is-too-long", 1420); !errors.Is(err, ErrInvalidName) {
		t.Errorf("long name: %v", err)
	}
	if _, err := h.CreateTUN("t0", 100); err == nil {
		t.Error("MTU 100 accepted")
	}
	tn, err := h.CreateTUN("vktun0", 1380)
	if err != nil {
		t.Fatal(err)
	}
	if mtu, err := tn.MTU(); err != nil || mtu != 1380 {
		t.Errorf("MTU() = %d, %v; want 1380", mtu, err)
	}
	ifs, _ := h.Interfaces()
	if !slices.Contains(ifs, "vktun0") {
		t.Errorf("TUN not in %s: %v", h, ifs)
	}
	if root, err := net.InterfaceByName("vktun0"); err == nil {
		t.Errorf("TUN appeared in the root namespace: %v", root)
	}
	if err := h.SetMTU("vktun0", 1300); err != nil {
		t.Fatal(err)
	}
	if mtu, _ := tn.MTU(); mtu != 1300 {
		t.Errorf("MTU after SetMTU = %d, want 1300", mtu)
	}
	if err := tn.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "TUN gone after Close", func() bool {
		ifs, _ := h.Interfaces()
		return !slices.Contains(ifs, "vktun0")
	})
}

func TestSysctl(t *testing.T) {
	h := NewHostT(t, "sysctl")
	if err := h.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	var got []byte
	if err := h.Do(func() error {
		var err error
		got, err = os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != "1" {
		t.Errorf("ip_forward in %s = %q", h, got)
	}
	if err := h.Sysctl("kernel.hostname", "x"); err == nil {
		t.Error("non-net sysctl accepted")
	}
}
