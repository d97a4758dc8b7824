//go:build linux

package claim_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	"golang.org/x/sys/unix"
)

func TestBootClockReadsBoottime(t *testing.T) {
	var c claim.BootClock
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	before := time.Duration(ts.Nano())
	now := c.Now()
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	after := time.Duration(ts.Nano())
	got := time.Duration(now.UnixNano())
	if got < before || got > after {
		t.Fatalf("BootClock.Now = %v, CLOCK_BOOTTIME between %v and %v", got, before, after)
	}
	if c.Now().Before(now) {
		t.Fatal("BootClock went backwards")
	}
}

func TestBootClockTimers(t *testing.T) {
	var c claim.BootClock
	fired := make(chan time.Time, 1)
	start := c.Now()
	c.AfterFunc(30*time.Millisecond, func() { fired <- c.Now() })
	select {
	case at := <-fired:
		if at.Sub(start) < 30*time.Millisecond {
			t.Fatalf("fired after %v, before its 30 ms", at.Sub(start))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("timer did not fire")
	}
	// Stop prevents the call; Reset re-arms it.
	var n atomic.Int32
	done := make(chan struct{})
	tm := c.AfterFunc(20*time.Millisecond, func() { n.Add(1); close(done) })
	if !tm.Stop() {
		t.Fatal("Stop of a pending timer reported false")
	}
	if tm.Stop() {
		t.Fatal("second Stop reported true")
	}
	if tm.Reset(10 * time.Millisecond) {
		t.Fatal("Reset of a stopped timer reported pending")
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("reset timer did not fire")
	}
	if n.Load() != 1 {
		t.Fatalf("fired %d times", n.Load())
	}
	// A deadline beyond one slice fires after several re-arms.
	long := make(chan struct{})
	s2 := c.Now()
	c.AfterFunc(claim.BootTimerSlice+50*time.Millisecond, func() { close(long) })
	select {
	case <-long:
		if d := c.Now().Sub(s2); d < claim.BootTimerSlice+50*time.Millisecond {
			t.Fatalf("long timer fired after %v", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("long timer did not fire")
	}
}
