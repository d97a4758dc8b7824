package probe

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/internal/syncx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// skipIfLockOrder skips an allocation test in the vipkit_lockorder build,
// whose checking mutexes allocate on every Lock (record of the stack).
func skipIfLockOrder(t *testing.T) {
	t.Helper()
	if syncx.LockOrderChecked {
		t.Skip("the lock-order build's mutexes allocate")
	}
}
