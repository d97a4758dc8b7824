package transport

import "time"

// Clock is the source of time for vipkit's state machines. A nil Clock in
// a vipkit options struct means RealClock unless the field's doc names
// another default: claim's Controller (claim.Config.Clock) takes
// claim.BootClock, CLOCK_BOOTTIME on Linux, because the age of a lease
// renewal must count the time the machine was suspended, which Go's
// monotonic clock does not. Or applies the RealClock default.
//
// Implementations are safe for concurrent use.
type Clock interface {
	// Now returns the current time. Durations between two readings are
	// meaningful; the absolute value need not be wall-clock time.
	Now() time.Time

	// AfterFunc calls f in its own goroutine (RealClock) or from the goroutine
	// that advances time (a manual clock) once d has elapsed, and returns a
	// Timer that can stop or reset the call. d ≤ 0 fires as soon as possible.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call. Its methods behave like those of
// *time.Timer created by time.AfterFunc.
type Timer interface {
	// Stop prevents the call from firing. It reports whether it stopped a
	// pending call; false means the call already fired or was stopped.
	Stop() bool

	// Reset schedules the call d from now, whether or not it had fired or
	// been stopped, and reports whether the timer had been pending.
	Reset(d time.Duration) bool
}

// RealClock reads the system's clock (Go's monotonic clock) and schedules
// with time.AfterFunc. Its zero value is ready to use.
type RealClock struct{}

var _ Clock = RealClock{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (RealClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Or returns c, or RealClock when c is nil. Options structs whose nil Clock
// means the real clock use it.
func Or(c Clock) Clock {
	if c == nil {
		return RealClock{}
	}
	return c
}

// Sleep blocks until d has elapsed on c, or ctx-like cancellation through
// done is signalled. It returns false when done closed first. It exists so
// that code which must wait in real time (daemons, tests over the real clock)
// still goes through a Clock.
func Sleep(c Clock, d time.Duration, done <-chan struct{}) bool {
	ch := make(chan struct{})
	t := Or(c).AfterFunc(d, func() { close(ch) })
	select {
	case <-ch:
		return true
	case <-done:
		t.Stop()
		return false
	}
}
