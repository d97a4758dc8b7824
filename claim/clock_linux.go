//go:build linux

package claim

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// BootClock is the transport.Clock the controller takes in production. It
// reads CLOCK_BOOTTIME, which keeps counting while the machine is
// suspended. Go's monotonic clock (CLOCK_MONOTONIC) stops during suspend, so
// a holder timed on it that wakes after a long sleep would see its last
// renewal as recent and keep carrying a VIP whose lease etcd expired long
// ago, while the replica already carries it. On CLOCK_BOOTTIME the renewal
// is as old as it really is, and the holder drops the VIP at once.
//
// Now's value is the time since boot, expressed as a time.Time from the Unix
// epoch: differences between readings are meaningful, the absolute value is
// not wall-clock time.
//
// AfterFunc runs on real Go timers, which also stop during suspend. It
// therefore re-arms in slices of at most BootTimerSlice and fires once
// CLOCK_BOOTTIME has reached the deadline, so a timer due during a suspend
// fires within one slice of the wake-up instead of after the suspended time
// again. The zero value is ready to use and safe for concurrent use.
type BootClock struct{}

// BootTimerSlice bounds how late after a resume a BootClock timer fires.
const BootTimerSlice = 500 * time.Millisecond

var _ transport.Clock = BootClock{}

// Now returns CLOCK_BOOTTIME as a time.Time.
func (BootClock) Now() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		// CLOCK_BOOTTIME exists since Linux 2.6.39; failing here means no
		// time source at all.
		panic("claim: clock_gettime(CLOCK_BOOTTIME): " + err.Error())
	}
	return time.Unix(ts.Unix())
}

// AfterFunc calls f in its own goroutine once d has elapsed on
// CLOCK_BOOTTIME.
func (c BootClock) AfterFunc(d time.Duration, f func()) transport.Timer {
	t := &bootTimer{c: c, f: f}
	t.Reset(d)
	return t
}

type bootTimer struct {
	c BootClock // +checklocksignore: set by AfterFunc, read-only after
	f func()
	// mu guards the deadline, the Go timer and its generation.
	mu syncx.Mutex
	// +checklocks:mu
	deadline time.Time
	// +checklocks:mu
	t *time.Timer
	// +checklocks:mu
	gen uint64
	// +checklocks:mu
	pending bool
}

// +checklocks:t.mu
func (t *bootTimer) armLocked() {
	wait := t.deadline.Sub(t.c.Now())
	if wait > BootTimerSlice {
		wait = BootTimerSlice
	}
	gen := t.gen
	t.t = time.AfterFunc(wait, func() { t.tick(gen) })
}

func (t *bootTimer) tick(gen uint64) {
	t.mu.Lock()
	if gen != t.gen || !t.pending {
		t.mu.Unlock()
		return
	}
	if t.c.Now().Before(t.deadline) {
		t.armLocked()
		t.mu.Unlock()
		return
	}
	t.pending = false
	t.mu.Unlock()
	t.f()
}

func (t *bootTimer) Stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.pending
	t.pending = false
	t.gen++
	if t.t != nil {
		t.t.Stop()
	}
	return was
}

func (t *bootTimer) Reset(d time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.pending
	if t.t != nil {
		t.t.Stop()
	}
	t.gen++
	t.pending = true
	t.deadline = t.c.Now().Add(d)
	t.armLocked()
	return was
}
