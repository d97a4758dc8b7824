//go:build unix

package pgstore_test

import (
	"syscall"
	"time"
)

// selfCPU is the CPU time (user and system) of this process so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
