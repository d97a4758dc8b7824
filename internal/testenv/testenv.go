// Package testenv holds vipkit's test-environment rules, shared by every
// package's tests:
//
//   - a test that needs something this machine may lack (root, a system
//     binary such as initdb or chromium) calls Skip, which skips with the
//     reason, unless VIPKIT_REQUIRE_ALL=1 (set by CI), when it fails instead:
//     CI never passes by skipping;
//   - long runs (soak tests, 10,000 schedules) run only with VIPKIT_LONG=1;
//   - randomized tests take their seed from Seed, which is fixed by default,
//     can be set with VIPKIT_SEED, and is printed when the test fails.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"

	"go.uber.org/goleak"
)

// RequireAll reports whether VIPKIT_REQUIRE_ALL=1: every Skip is a failure.
func RequireAll() bool { return os.Getenv("VIPKIT_REQUIRE_ALL") == "1" }

// Long reports whether VIPKIT_LONG=1: long-running variants of tests run.
func Long() bool { return os.Getenv("VIPKIT_LONG") == "1" }

// Skip skips t with the reason, or fails it when RequireAll.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if RequireAll() {
		t.Fatalf("required by VIPKIT_REQUIRE_ALL=1 but unavailable: %s", msg)
	}
	t.Skip(msg)
}

// NeedRoot skips (or, under RequireAll, fails) t unless it runs as root.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root (network namespaces, TUN devices); run as root or under CI")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		Skip(t, "needs /dev/net/tun: %v", err)
	}
}

// NeedBinary returns the path of the named program, searching PATH and then
// extra directories (globs allowed, later matches first, so the newest
// versioned directory wins), and skips (or fails) t when it is absent.
func NeedBinary(t testing.TB, name string, extra ...string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, pat := range extra {
		matches, _ := filepath.Glob(pat)
		sort.Sort(sort.Reverse(sort.StringSlice(matches)))
		for _, dir := range matches {
			p := filepath.Join(dir, name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return p
			}
		}
	}
	Skip(t, "needs %s on PATH (the README's test command installs it)", name)
	return ""
}

// Seed returns the seed for a randomized test: VIPKIT_SEED when set,
// otherwise def. When the test fails the seed is logged so that the run can
// be repeated with VIPKIT_SEED.
func Seed(t testing.TB, def uint64) uint64 {
	t.Helper()
	seed := def
	if s := os.Getenv("VIPKIT_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			t.Fatalf("bad VIPKIT_SEED %q: %v", s, err)
		}
		seed = v
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed: %d (repeat with VIPKIT_SEED=%d)", seed, seed)
		}
	})
	return seed
}

// IdleHTTP are goleak options for the tests of HTTP clients: they ignore
// the goroutines of keep-alive connections (net/http's read and write
// loops, and a read they are blocked in), which outlive a test until the
// server or the transport closes them.
func IdleHTTP() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	}
}

// SkipIfLockOrder skips an allocation-counting test in the vipkit_lockorder
// build, whose checking mutexes allocate on every Lock (they record the
// caller's stack). It is a plain skip, not one VIPKIT_REQUIRE_ALL turns into
// a failure: the same test runs, and counts, in every other build.
func SkipIfLockOrder(t testing.TB) {
	t.Helper()
	if syncx.LockOrderChecked {
		t.Skip("allocations are not counted in the lock-order build: its mutexes allocate")
	}
}

// DeadlockTimeout is how long Within waits for a call that must not block.
const DeadlockTimeout = 5 * time.Second

// Within runs f and waits up to DeadlockTimeout for it to return. A call
// still running then is taken for a deadlock (a callback run under a lock
// it needs, a Close waiting for itself): Within prints every goroutine's
// stack and ends the test binary. It does not fail the test and go on,
// because the test's cleanups would then wait on the same locks and hang
// the run instead of reporting it.
func Within(t testing.TB, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	expired := make(chan struct{})
	timer := transport.RealClock{}.AfterFunc(DeadlockTimeout, func() { close(expired) })
	defer timer.Stop()
	select {
	case <-done:
	case <-expired:
		debug.SetTraceback("all")
		msg := fmt.Sprintf("%s: %s still running after %v: deadlock", t.Name(), what, DeadlockTimeout)
		// A panic on the test's goroutine would run the cleanups first.
		go func() { panic(msg) }()
		select {}
	}
}
