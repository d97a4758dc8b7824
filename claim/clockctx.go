package claim

import (
	"context"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// withClockTimeout returns a child of parent that ends d after now on
// clock with context.DeadlineExceeded, as context.WithTimeout does on the
// real clock: a clock timer ends it. Contexts derived from it (an RPC
// stack's own) see the same error. It carries parent's Deadline, not one
// of its own: a Clock's readings need not be wall-clock time (BootClock
// counts from boot), so none can be handed to code that compares it with
// time.Now. The returned cancel stops the timer and must be called.
func withClockTimeout(parent context.Context, clock transport.Clock, d time.Duration) (context.Context, context.CancelFunc) {
	// inner holds the cause (context.Cause) and follows the parent; the
	// context's own done channel keeps the context package from taking
	// inner's Canceled for the error of contexts derived from it.
	inner, cancelInner := context.WithCancelCause(parent)
	c := &clockCtx{Context: inner, done: make(chan struct{}), cancel: cancelInner}
	context.AfterFunc(inner, func() { c.end(inner.Err()) })
	t := clock.AfterFunc(d, func() { c.end(context.DeadlineExceeded) })
	return c, func() {
		t.Stop()
		c.end(context.Canceled)
	}
}

// clockCtx is a context ended by its parent, by a Clock timer or by its
// cancel func, whichever comes first. Its Deadline and Value are inner's.
type clockCtx struct {
	context.Context // inner
	cancel          context.CancelCauseFunc
	done            chan struct{}
	mu              syncx.Mutex
	// +checklocks:mu
	err error
}

func (c *clockCtx) end(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.done)
	c.mu.Unlock()
	c.cancel(err)
}

// Done is closed when the context ends.
func (c *clockCtx) Done() <-chan struct{} { return c.done }

// Err is nil until the context ends; then context.DeadlineExceeded if the
// clock timer ended it, else the parent's error or context.Canceled.
func (c *clockCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
