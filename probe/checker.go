package probe

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// Dialer opens TCP connections for connect checks. *net.Dialer satisfies it
// (over the overlay in production, since the overlay is routed by the host);
// a gVisor netstack host or a test fake can stand in.
//
// The Checker calls it from a goroutine of its own, with none of its locks
// held. Close cancels the contexts of the connects in flight and waits for
// them to return, so DialContext must give up when ctx ends and must not
// call the Checker's Close.
type Dialer interface {
	// DialContext connects to address ("ip:port") on network ("tcp"),
	// giving up when ctx ends (the checker's timeout); as net.Dialer's.
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

var _ Dialer = (*net.Dialer)(nil)

// CheckerConfig tunes a Checker. Zero fields take the defaults.
type CheckerConfig struct {
	Clock         transport.Clock // nil: the real clock
	Dialer        Dialer          // nil: a zero net.Dialer
	MaxChecks     int             // active shared checks; default 32 (docs/defaults.md)
	MaxConcurrent int             // connects in flight at once; default 32
	Tick          time.Duration   // the worker tick; default 250 ms
}

// Checker runs TCP connect checks off the packet path: a Scheduler serviced
// by a worker tick on the Clock, and one goroutine per connect in flight
// (never more than MaxConcurrent). A connect is bounded by its check's
// timeout, measured on the Clock; an accepted connection is closed at once
// without sending data, so a check proves only that the port accepts, and it
// may appear in the server's logs.
//
// A Checker is safe for concurrent use. Close stops it.
type Checker struct {
	sched *Scheduler

	clock  transport.Clock
	dialer Dialer
	tick   time.Duration // +checklocksignore: set by NewChecker, read-only after
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu serializes ticks and guards timer and buf; closed is atomic so
	// that it can be read without it.
	mu syncx.Mutex
	// +checklocks:mu
	timer  transport.Timer
	closed atomic.Bool
	// buf is the ticks' scratch list of checks to start.
	// +checklocks:mu
	buf []Start
}

// NewChecker returns a running Checker with no checks.
func NewChecker(cfg CheckerConfig) (*Checker, error) {
	if cfg.Tick < 0 {
		return nil, invalid("checker tick %v is negative", cfg.Tick)
	}
	if cfg.Tick == 0 {
		cfg.Tick = DefaultCheckTick
	}
	s, err := NewScheduler(SchedulerConfig{MaxChecks: cfg.MaxChecks, MaxConcurrent: cfg.MaxConcurrent})
	if err != nil {
		return nil, err
	}
	if cfg.Dialer == nil {
		cfg.Dialer = &net.Dialer{}
	}
	c := &Checker{sched: s, clock: transport.Or(cfg.Clock), dialer: cfg.Dialer, tick: cfg.Tick}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.mu.Lock()
	c.timer = c.clock.AfterFunc(c.tick, c.onTick)
	c.mu.Unlock()
	return c, nil
}

// Acquire subscribes to the check for key (see Scheduler.Acquire); the
// check is first due now and starts at the next tick. It fails with
// ErrClosed after Close.
func (c *Checker) Acquire(key CheckKey, cfg CheckConfig) (*Subscription, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	return c.sched.Acquire(key, cfg, c.clock.Now())
}

// Stats returns the scheduler's counters.
func (c *Checker) Stats() SchedulerStats { return c.sched.Stats() }

func (c *Checker) onTick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return
	}
	c.buf = c.sched.Tick(c.clock.Now(), c.buf[:0])
	for _, st := range c.buf {
		c.launch(st)
	}
	c.timer.Reset(c.tick)
}

// launch runs one connect in its own goroutine.
func (c *Checker) launch(st Start) {
	c.wg.Add(1)
	start := c.clock.Now()
	ctx, cancel := context.WithCancel(c.ctx)
	var timedOut atomic.Bool
	t := c.clock.AfterFunc(st.Timeout, func() {
		timedOut.Store(true)
		cancel()
	})
	go func() {
		defer c.wg.Done()
		defer cancel()
		conn, err := c.dialer.DialContext(ctx, "tcp", st.Key.Addr.String())
		t.Stop()
		elapsed := c.clock.Now().Sub(start)
		if conn != nil {
			conn.Close() // no data: the check proves acceptance only
		}
		switch {
		case err != nil && timedOut.Load():
			err = fmt.Errorf("%w: %v after %v", ErrCheckTimeout, st.Key.Addr, st.Timeout)
			elapsed = max(elapsed, st.Timeout)
		case err != nil:
			err = fmt.Errorf("probe: connect %v: %w", st.Key.Addr, err)
		case timedOut.Load():
			elapsed = max(elapsed, st.Timeout+1)
		}
		if c.closed.Load() {
			return // Close cancelled us: the result means nothing
		}
		next, _ := c.sched.Complete(st, Result{Err: err, Elapsed: elapsed}, c.clock.Now(), nil)
		for _, n := range next {
			c.launch(n)
		}
	}()
}

// Close stops the tick, cancels the connects in flight and waits for their
// goroutines. Subscriptions keep their last status. It is idempotent.
func (c *Checker) Close() error {
	c.mu.Lock()
	c.closed.Store(true)
	c.timer.Stop()
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	return nil
}
