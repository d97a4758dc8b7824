//go:build !linux

package claim

import (
	"time"

	"github.com/vipkit/vipkit/transport"
)

// BootClock is transport.RealClock on systems without CLOCK_BOOTTIME. There
// the controller's fence is timed on Go's monotonic clock, which may stop
// during suspend; vipkit's controller is supported on Linux only.
type BootClock struct{}

// BootTimerSlice is unused off Linux.
const BootTimerSlice = 500 * time.Millisecond

// Now returns time.Now().
func (BootClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (BootClock) AfterFunc(d time.Duration, f func()) transport.Timer { return time.AfterFunc(d, f) }
