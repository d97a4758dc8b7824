package probe

import (
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// Driver runs a Prober on a transport.Clock: it calls Poll at every deadline
// the prober asks for (and at once after AddPeer) and hands each probe to
// the send function. It is the only goroutine-facing part of the prober.
type Driver struct {
	p     *Prober
	clock transport.Clock // +checklocksignore: set by Drive, read-only after
	send  func(Probe)     // +checklocksignore: set by Drive, read-only after
	dirty atomic.Bool
	// closed is set by Close; a wake-up racing with Close may still fire
	// run once, which then does nothing.
	closed atomic.Bool

	// timer is set by Drive before the prober can call wake, and not
	// changed after; a transport.Timer is safe for concurrent use.
	timer transport.Timer

	// mu serializes run and Close and guards buf.
	mu syncx.Mutex
	// buf is run's scratch list of probes.
	// +checklocks:mu
	buf []Probe
}

// Drive starts running p on clock (nil means the real clock) and returns the
// Driver; Close stops it. send is called with each probe from the clock's
// callback, one call at a time, with the Driver's own lock held (not the
// Prober's): that lock is what lets Close wait for a send in progress, so
// that send is never called after Close returns. The contract: send must
// not block (the engine queues the packet for its tunnel), must not call
// Close, and must not wait for anything that may be calling Close. It may
// call the Prober (AddPeer, HandleReply and the rest). A Prober has at
// most one Driver: a second Drive replaces the first one's wake-ups.
func (p *Prober) Drive(clock transport.Clock, send func(Probe)) *Driver {
	d := &Driver{p: p, clock: transport.Or(clock), send: send}
	d.mu.Lock()
	d.timer = d.clock.AfterFunc(0, d.run)
	d.mu.Unlock()
	p.mu.Lock()
	p.wake = d.wake
	p.mu.Unlock()
	return d
}

func (d *Driver) wake() {
	d.dirty.Store(true)
	if !d.closed.Load() {
		d.timer.Reset(0) // timer is set before wake is installed
	}
}

func (d *Driver) run() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return
	}
	d.dirty.Store(false)
	now := d.clock.Now()
	var next time.Time
	d.buf, next = d.p.Poll(now, d.buf[:0])
	for _, pr := range d.buf {
		d.send(pr)
	}
	clear(d.buf)
	switch {
	case d.dirty.Load():
		d.timer.Reset(0)
	case !next.IsZero():
		d.timer.Reset(next.Sub(now))
	}
}

// Close stops the driver. It waits for a running Poll-and-send to finish,
// so send is not called after Close returns. It is idempotent.
func (d *Driver) Close() error {
	d.mu.Lock()
	d.closed.Store(true)
	d.timer.Stop()
	d.mu.Unlock()
	d.p.mu.Lock()
	d.p.wake = nil
	d.p.mu.Unlock()
	return nil
}
