package claim

import (
	"context"
	"errors"
	"time"

	"github.com/vipkit/vipkit/transport"
)

// withClockTimeout returns a child of parent that ends d after now on
// clock: a clock timer cancels it, and its Err is then
// context.DeadlineExceeded, as for context.WithTimeout. It carries no
// Deadline: a Clock's readings need not be wall-clock time (BootClock
// counts from boot), so none can be handed to code that compares it with
// time.Now. The returned cancel stops the timer and must be called.
func withClockTimeout(parent context.Context, clock transport.Clock, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	t := clock.AfterFunc(d, func() { cancel(errClockTimeout) })
	return clockCtx{ctx}, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

// errClockTimeout is the cause of a context ended by its clock timer.
var errClockTimeout = errors.New("claim: call timed out on the controller's clock")

type clockCtx struct{ context.Context }

// Err reports context.DeadlineExceeded when the clock timer ended the
// context, like a context.WithTimeout would.
func (c clockCtx) Err() error {
	err := c.Context.Err()
	if err != nil && context.Cause(c.Context) == errClockTimeout {
		return context.DeadlineExceeded
	}
	return err
}
