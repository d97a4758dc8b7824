package probe

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// eventually polls cond every few milliseconds until it holds or the real
// deadline passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// tcpEnv is where a connect-check test runs: the kernel's loopback or a
// gVisor netstack host pair. The same test bodies run on both.
type tcpEnv struct {
	dialer Dialer
	// listen opens a TCP listener on addr (port 0: any free port).
	listen func(t *testing.T, addr netip.AddrPort) net.Listener
	addr   netip.Addr // the address to listen on and check
}

func loopbackEnv() tcpEnv {
	return tcpEnv{
		dialer: &net.Dialer{},
		addr:   netip.MustParseAddr("127.0.0.1"),
		listen: func(t *testing.T, addr netip.AddrPort) net.Listener {
			t.Helper()
			ln, err := net.Listen("tcp", addr.String())
			if err != nil {
				t.Fatal(err)
			}
			return ln
		},
	}
}

func newRealChecker(t *testing.T, env tcpEnv) *Checker {
	t.Helper()
	c, err := NewChecker(CheckerConfig{Dialer: env.dialer, Tick: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// fastCheck keeps the default thresholds (2 failures, 1 success) with short
// timings so that the real-time tests stay quick.
var fastCheck = CheckConfig{Interval: 40 * time.Millisecond, Timeout: 2 * time.Second}

// testPortClosesAndReturns: a port that closes is excluded after exactly 2
// failed connects and passes again after 1 successful one.
func testPortClosesAndReturns(t *testing.T, env tcpEnv) {
	ln := env.listen(t, netip.AddrPortFrom(env.addr, 0))
	ap := netip.MustParseAddrPort(ln.Addr().String())
	go acceptAndDrain(ln)
	c := newRealChecker(t, env)
	sub, err := c.Acquire(CheckKey{Network: "home", Node: nodeID(2), Addr: ap}, fastCheck)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a successful connect", func() bool { return sub.Status().Successes >= 2 })

	ln.Close()
	// Watch every status: passing while fewer than 2 failures, excluded at 2.
	eventually(t, 10*time.Second, "exclusion", func() bool {
		st := sub.Status()
		if st.Failures > 0 && st.Passing != (st.Failures < 2) {
			t.Fatalf("after %d failures passing=%v", st.Failures, st.Passing)
		}
		return !st.Passing
	})
	st := sub.Status()
	if st.LastErr == nil || errors.Is(st.LastErr, ErrCheckTimeout) {
		t.Fatalf("a closed port is refused, not timed out: %+v", st)
	}

	ln2 := env.listen(t, ap)
	defer ln2.Close()
	go acceptAndDrain(ln2)
	eventually(t, 10*time.Second, "recovery", func() bool {
		st := sub.Status()
		if st.Passing && st.Successes == 0 {
			t.Fatalf("passing without a success: %+v", st)
		}
		return st.Passing
	})
	if st := sub.Status(); st.Successes < 1 || st.Failures != 0 {
		t.Fatalf("recovered: %+v", st)
	}
}

// acceptAndDrain accepts connections and reads each to EOF, checking that a
// connect check sends no data.
func acceptAndDrain(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			n, _ := io.Copy(io.Discard, conn)
			if n != 0 {
				panic("a connect check sent data")
			}
		}()
	}
}

// testSilentListenerPasses: a listener that accepts (or even never calls
// Accept) but never answers passes: the check proves acceptance only.
func testSilentListenerPasses(t *testing.T, env tcpEnv) {
	ln := env.listen(t, netip.AddrPortFrom(env.addr, 0))
	defer ln.Close()
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, conn) // never read, never write, never close
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	c := newRealChecker(t, env)
	sub, err := c.Acquire(CheckKey{Network: "home", Node: nodeID(2), Addr: netip.MustParseAddrPort(ln.Addr().String())}, fastCheck)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "3 successful connects", func() bool { return sub.Status().Successes >= 3 })
	if st := sub.Status(); !st.Passing || st.Failures != 0 || st.LastErr != nil {
		t.Fatalf("%+v", st)
	}
}

func TestCheckerLoopbackPortClosesAndReturns(t *testing.T) {
	testPortClosesAndReturns(t, loopbackEnv())
}

func TestCheckerLoopbackSilentListenerPasses(t *testing.T) {
	testSilentListenerPasses(t, loopbackEnv())
}

func TestCheckerClose(t *testing.T) {
	c, err := NewChecker(CheckerConfig{Tick: -1})
	if !errors.Is(err, ErrInvalidConfig) || c != nil {
		t.Fatalf("negative tick: %v", err)
	}
	c, err = NewChecker(CheckerConfig{Clock: transporttest.NewManualClock()})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	c.Close()
	if _, err := c.Acquire(checkKey(1), CheckConfig{}); !errors.Is(err, ErrClosed) || !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
}

// clockDialer is a fake Dialer for the manual clock whose targets never
// answer: each dial blocks until the checker's timeout (a timer on the
// manual clock) cancels it. It records when each address was dialed and
// how many dials were in flight at once.
type clockDialer struct {
	clock *transporttest.ManualClock // +checklocksignore: read-only

	// mu guards every field below.
	mu sync.Mutex
	// +checklocks:mu
	waiting map[*context.Context]struct{}
	// +checklocks:mu
	maxLive int
	// +checklocks:mu
	starts map[netip.AddrPort][]time.Time
	// +checklocks:mu
	calls int
}

func (d *clockDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	ap := netip.MustParseAddrPort(address)
	d.mu.Lock()
	d.waiting[&ctx] = struct{}{}
	d.maxLive = max(d.maxLive, len(d.waiting))
	d.starts[ap] = append(d.starts[ap], d.clock.Now())
	d.calls++
	d.mu.Unlock()
	<-ctx.Done()
	d.mu.Lock()
	delete(d.waiting, &ctx)
	d.mu.Unlock()
	return nil, ctx.Err()
}

// settled reports whether every connect the checker has in flight is
// blocked in the dialer with a live context: nothing is left to happen
// until the clock moves.
func (d *clockDialer) settled(c *Checker) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for ctx := range d.waiting {
		if (*ctx).Err() != nil {
			return false
		}
	}
	return len(d.waiting) == c.Stats().InFlight
}

// TestCheckerScheduling10000 runs the Checker itself (goroutines, the
// worker tick and per-connect timeouts on a manual clock) with the check
// limit raised to 10,000 and 32 slots, against targets that all time out:
// never more than 32 connects in flight, and every check starts within
// ceil(N/32) × timeout + one tick of falling due (N = 10,000 due).
func TestCheckerScheduling10000(t *testing.T) {
	const n, slots = 10000, 32
	clock := transporttest.NewManualClock()
	d := &clockDialer{clock: clock, waiting: map[*context.Context]struct{}{}, starts: map[netip.AddrPort][]time.Time{}}
	c, err := NewChecker(CheckerConfig{Clock: clock, Dialer: d, MaxChecks: n, MaxConcurrent: slots})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys := make([]CheckKey, n)
	for i := range keys {
		keys[i] = checkKey(i)
		if _, err := c.Acquire(keys[i], CheckConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Acquire(checkKey(n), CheckConfig{}); !errors.Is(err, ErrCheckLimit) {
		t.Fatalf("check %d: %v", n+1, err)
	}
	bound := time.Duration((n+slots-1)/slots)*DefaultCheckTimeout + DefaultCheckTick
	end := t0.Add(bound + 10*time.Second)
	for clock.Now().Before(end) {
		clock.Step()
		deadline := time.Now().Add(30 * time.Second)
		for !d.settled(c) {
			if time.Now().After(deadline) {
				t.Fatalf("checker did not settle at %v", clock.Now().Sub(t0))
			}
			runtime.Gosched()
		}
	}
	if d.maxLive > slots || c.Stats().MaxInFlight > slots {
		t.Fatalf("%d dials in flight (stats %d), limit %d", d.maxLive, c.Stats().MaxInFlight, slots)
	}
	var longest time.Duration
	for _, k := range keys {
		starts := d.starts[k.Addr]
		if len(starts) == 0 {
			t.Fatalf("%v never checked within %v", k.Addr, end.Sub(t0))
		}
		// Due at Acquire (t0), then Interval after each start.
		due := t0
		for _, s := range starts {
			if w := s.Sub(due); w > bound || w < 0 {
				t.Fatalf("%v started %v after falling due, bound %v", k.Addr, w, bound)
			} else {
				longest = max(longest, w)
			}
			due = s.Add(DefaultCheckInterval)
		}
	}
	st := c.Stats()
	if st.Passed != 0 || st.Failed < uint64(n) {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("%d dials, longest wait %v, bound %v", d.calls, longest, bound)
}
