//go:build unix

package flow

import (
	"syscall"
	"testing"
	"time"
)

// cpuTime returns the process's user+system CPU time. Benchmarks report
// CPU ns per op next to wall-clock ns/op: on a shared, oversubscribed
// machine the wall clock also counts the time the benchmark waited for a
// core, the CPU time does not.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuMeter measures CPU time across a benchmark's timed loop.
type cpuMeter struct{ start time.Duration }

func startCPU() cpuMeter { return cpuMeter{cpuTime()} }

func (m cpuMeter) report(b *testing.B, n int, unit string) float64 {
	v := float64(cpuTime()-m.start) / float64(n)
	b.ReportMetric(v, unit)
	return v
}
