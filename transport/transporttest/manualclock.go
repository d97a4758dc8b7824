package transporttest

import (
	"container/heap"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// ManualClock is a transport.Clock whose time moves only when a test calls
// Advance, AdvanceTo or Step. Due callbacks run synchronously, in the
// goroutine that advances the clock, in deadline order; callbacks with the
// same deadline run in the order they were scheduled (or last reset). A run
// is therefore exactly reproducible.
//
// A callback may call any method of the clock, including scheduling timers
// that fall due within the same Advance; those run in the same Advance, in
// order. A callback never sees Now() later than its own deadline, and a
// timer never fires before its deadline.
//
// ManualClock is safe for concurrent use, but Advance calls must not overlap.
type ManualClock struct {
	// mu guards the time, the timers pending and their sequence numbers.
	mu syncx.Mutex
	// +checklocks:mu
	now time.Time
	// seq numbers timers in the order they were set, so that timers due
	// at the same instant fire in that order.
	// +checklocks:mu
	seq uint64
	// +checklocks:mu
	pending timerHeap
}

var _ transport.Clock = (*ManualClock)(nil)

// Epoch is the time a ManualClock made by NewManualClock starts at.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// NewManualClock returns a manual clock that reads Epoch.
func NewManualClock() *ManualClock { return NewManualClockAt(Epoch) }

// NewManualClockAt returns a manual clock that reads start.
func NewManualClockAt(start time.Time) *ManualClock { return &ManualClock{now: start} }

// Now returns the clock's current time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f at Now()+d. d ≤ 0 makes it due at once: it runs on
// the next Advance (even Advance(0)).
func (c *ManualClock) AfterFunc(d time.Duration, f func()) transport.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{c: c, f: f, index: -1}
	c.scheduleLocked(t, d)
	return t
}

// +checklocks:c.mu
func (c *ManualClock) scheduleLocked(t *manualTimer, d time.Duration) {
	if d < 0 {
		d = 0
	}
	c.seq++
	t.when = c.now.Add(d)
	t.seq = c.seq
	heap.Push(&c.pending, t)
}

// Advance moves time forward by d, running every callback that falls due, in
// order, with Now() set to each callback's deadline while it runs. It returns
// the number of callbacks run.
func (c *ManualClock) Advance(d time.Duration) int {
	c.mu.Lock()
	target := c.now.Add(d)
	c.mu.Unlock()
	return c.AdvanceTo(target)
}

// AdvanceTo moves time forward to t (never backwards), running due callbacks
// as Advance does.
func (c *ManualClock) AdvanceTo(t time.Time) int {
	n := 0
	for {
		c.mu.Lock()
		if len(c.pending) == 0 || c.pending[0].when.After(t) {
			if t.After(c.now) {
				c.now = t
			}
			c.mu.Unlock()
			return n
		}
		next := heap.Pop(&c.pending).(*manualTimer)
		if next.when.After(c.now) {
			c.now = next.when
		}
		f := next.f
		c.mu.Unlock()
		f()
		n++
	}
}

// Step advances to the earliest pending deadline and runs every callback due
// then. It reports false, and leaves time alone, when nothing is pending.
func (c *ManualClock) Step() bool {
	c.mu.Lock()
	if len(c.pending) == 0 {
		c.mu.Unlock()
		return false
	}
	when := c.pending[0].when
	c.mu.Unlock()
	c.AdvanceTo(when)
	return true
}

// Next returns the earliest pending deadline, and false when nothing is
// pending.
func (c *ManualClock) Next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		return time.Time{}, false
	}
	return c.pending[0].when, true
}

// Pending returns the number of timers waiting to fire.
func (c *ManualClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// manualTimer is one timer of a ManualClock. c.mu guards when, seq and
// index; they carry no checklocks annotation because the analyzer cannot
// tell that a timer's c is the clock whose lock is held, and the heap
// methods, which container/heap calls with it held, touch them too.
type manualTimer struct {
	c     *ManualClock
	f     func()
	when  time.Time
	seq   uint64
	index int // position in the heap; -1 when not pending
}

func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.index < 0 {
		return false
	}
	heap.Remove(&t.c.pending, t.index)
	return true
}

func (t *manualTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.index >= 0
	if was {
		heap.Remove(&t.c.pending, t.index)
	}
	t.c.scheduleLocked(t, d)
	return was
}

type timerHeap []*manualTimer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if !h[i].when.Equal(h[j].when) {
		return h[i].when.Before(h[j].when)
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *timerHeap) Push(x any) {
	t := x.(*manualTimer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	n := len(old)
	t := old[n-1]
	old[n-1] = nil
	t.index = -1
	*h = old[:n-1]
	return t
}
