package keelvip

import (
	"time"

	"github.com/vipkit/vipkit/claim"
)

// bootNow reads CLOCK_BOOTTIME (claim.BootClock); this file's name
// contains "clock", where reading time directly is allowed.
func bootNow() time.Time { return claim.BootClock{}.Now() }

// wallNow reads the wall clock, for certificate validity (etcd TLS).
func wallNow() time.Time { return time.Now() }
