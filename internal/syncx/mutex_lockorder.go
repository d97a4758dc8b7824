//go:build vipkit_lockorder

package syncx

import (
	"os"
	"time"

	"github.com/sasha-s/go-deadlock"
)

// Mutex is go-deadlock's Mutex: a sync.Mutex that records lock order.
type Mutex = deadlock.Mutex

// RWMutex is go-deadlock's RWMutex: a sync.RWMutex that records lock order.
type RWMutex = deadlock.RWMutex

// LockOrderChecked reports whether this build checks lock order.
const LockOrderChecked = true

func init() {
	// The order check is what this build is for. A lock awaited for two
	// minutes is a hang as well; the report (both stacks, every holder)
	// goes to standard error and the binary exits 2, as go test's own
	// timeout would, but sooner and with the holders named.
	deadlock.Opts.DeadlockTimeout = 2 * time.Minute
	deadlock.Opts.LogBuf = os.Stderr
}
