package claim

import (
	"context"
	"net/netip"

	"github.com/vipkit/vipkit/internal/syncx"
)

// DefaultWatchQueue is the queue length of a Watch given none.
const DefaultWatchQueue = 64

// Change is one change of a Controller's view of its VIP, as Watch
// reports it: the view after the change.
type Change struct {
	// Seq numbers the controller's changes: the n-th change since
	// NewController has Seq n. A Watch's first Change is the view when
	// it began, with the Seq of the last change before it (0: none).
	Seq uint64
	// Missed counts the changes a full queue dropped just before this
	// one: Seq is then Missed+1 past the Change received before it. A
	// Change is never dropped otherwise, and the newest is always kept.
	//
	// Both count in uint64 arithmetic, which wraps: after Seq
	// math.MaxUint64 comes Seq 0, and Seq == prev.Seq+Missed+1 holds
	// across the wrap. Compare Seqs by that sum, never by <.
	Missed uint64

	Role     Role       // this node's role
	Epoch    uint64     // of the newest claim taken (0: none)
	Holder   netip.Addr // of the newest claim taken
	Fenced   bool       // lost the VIP without releasing it (only Promote clears it), or unchecked (Status.Unchecked)
	Released bool       // released the VIP to the other member
	Carried  bool       // this node carries the address now
}

// view is what a Change reports, without its numbering.
type view struct {
	role                      Role
	epoch                     uint64
	holder                    netip.Addr
	fenced, released, carried bool
}

// +checklocks:c.mu
func (c *Controller) viewLocked() view {
	v := view{role: c.st.Role(c.cfg.Self), fenced: c.st.Fenced || c.st.Unchecked, released: c.st.Released, carried: c.carried}
	if c.st.Held != nil {
		v.epoch, v.holder = c.st.Held.Epoch, c.st.Held.Holder
	}
	return v
}

func (v view) change(seq uint64) Change {
	return Change{Seq: seq, Role: v.role, Epoch: v.epoch, Holder: v.holder,
		Fenced: v.fenced, Released: v.released, Carried: v.carried}
}

// Watch reports every change of role, epoch, holder, fence, release and
// carry on the returned channel, in order, starting with the view as it
// is now. The channel closes when ctx ends or after Close (once the
// changes queued before it, the final drop included, are read).
//
// Watch never blocks the controller: each watch has its own queue of up
// to queue changes (≤ 0: DefaultWatchQueue), filled as the controller
// changes and drained by the reader. A reader that falls behind by a full
// queue loses changes from the queue's end: the newest change replaces the
// last queued one and counts it in Missed, so the reader still sees the
// oldest queued changes in order, then the gap, then the latest view. The
// first Change, the view when Watch began, is kept apart from the queue
// and is never dropped or replaced, whatever the queue's length. The
// reader must read until the channel closes or end ctx.
func (c *Controller) Watch(ctx context.Context, queue int) <-chan Change {
	if queue <= 0 {
		queue = DefaultWatchQueue
	}
	out := make(chan Change)
	c.mu.Lock()
	// The first Change is held by the watch's goroutine, outside the queue,
	// so no later change can replace it: a full queue drops from its own
	// end, never the view the watch began with.
	first := c.published.change(c.seq)
	w := &watcher{max: queue, wake: make(chan struct{}, 1), done: c.watchEnded}
	if !c.watchEnded {
		if c.watchers == nil {
			c.watchers = map[*watcher]struct{}{}
		}
		c.watchers[w] = struct{}{}
	}
	c.mu.Unlock()
	go w.run(ctx, out, first, func() {
		c.mu.Lock()
		delete(c.watchers, w)
		c.mu.Unlock()
	})
	return out
}

// unlock publishes a change of the view, if any, unlocks c.mu and then
// hands the errors reported under it to OnError. Every unlock of c.mu goes
// through it, so no change escapes the watchers and no error is kept.
// +checklocksrelease:c.mu
func (c *Controller) unlock() {
	c.publishLocked()
	errs := c.errs
	c.errs = nil
	c.mu.Unlock()
	for _, err := range errs {
		c.report(err)
	}
}

// +checklocks:c.mu
func (c *Controller) publishLocked() {
	v := c.viewLocked()
	if v == c.published {
		return
	}
	c.published = v
	c.seq++
	ch := v.change(c.seq)
	for w := range c.watchers {
		w.push(ch)
	}
}

// finishWatchersLocked ends every watch after its queue is read (Close).
// +checklocks:c.mu
func (c *Controller) finishWatchersLocked() {
	for w := range c.watchers {
		w.finish()
	}
	c.watchers, c.watchEnded = nil, true
}

type watcher struct {
	max  int           // +checklocksignore: set at construction, read-only after
	wake chan struct{} // one pending wake-up

	// mu guards queue and done.
	mu syncx.Mutex
	// +checklocks:mu
	queue []Change
	// +checklocks:mu
	done bool // no more changes: close once the queue is read
}

func (w *watcher) push(ch Change) {
	w.mu.Lock()
	if len(w.queue) >= w.max {
		last := &w.queue[len(w.queue)-1]
		ch.Missed = last.Missed + 1
		*last = ch
	} else {
		w.queue = append(w.queue, ch)
	}
	w.mu.Unlock()
	w.signal()
}

func (w *watcher) finish() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
	w.signal()
}

func (w *watcher) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run sends first, then the queue's changes as they come, on out.
func (w *watcher) run(ctx context.Context, out chan<- Change, first Change, remove func()) {
	defer close(out)
	defer remove()
	select {
	case out <- first:
	case <-ctx.Done():
		return
	}
	for {
		w.mu.Lock()
		if len(w.queue) == 0 {
			done := w.done
			w.mu.Unlock()
			if done {
				return
			}
			select {
			case <-w.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		ch := w.queue[0]
		w.queue = append(w.queue[:0], w.queue[1:]...)
		w.mu.Unlock()
		select {
		case out <- ch:
		case <-ctx.Done():
			return
		}
	}
}
