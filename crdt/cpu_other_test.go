//go:build !unix

package crdt

import "time"

// cpuNow is 0 where getrusage is not available: the CPU-time figures of
// the benchmarks read 0 there and only wall time counts.
func cpuNow() time.Duration { return 0 }
