//go:build unix

package crdt

import (
	"syscall"
	"time"
)

// cpuNow returns the process's CPU time (user + system, all threads). On a
// loaded machine it measures the work done, where wall time also counts
// the waits for a core.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
