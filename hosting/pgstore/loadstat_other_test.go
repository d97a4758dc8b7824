//go:build !unix

package pgstore_test

import "time"

// selfCPU reports zero where getrusage is missing.
func selfCPU() time.Duration { return 0 }
