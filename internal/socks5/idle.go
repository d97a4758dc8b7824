package socks5

import (
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// ErrIdle is what RelayIdle returns when it closed the connections
// because no byte flowed either way for its idle time.
var ErrIdle = errors.New("socks5: relay closed: no byte flowed either way for the idle time")

// RelayIdle is Relay with an idle rule: when no byte has flowed in either
// direction for idle, it closes both connections and returns ErrIdle. A
// relay that keeps carrying bytes lasts as long as its connections.
// clock (RealClock when nil) times the rule; with idle ≤ 0 there is none.
func RelayIdle(a, b net.Conn, idle time.Duration, clock transport.Clock) error {
	w := NewIdleWatch(idle, clock, func() {
		a.Close()
		b.Close()
	})
	err := relay(w.Conn(a), w.Conn(b))
	if w.Stop() {
		return ErrIdle
	}
	return err
}

// IdleWatch calls a function once, when nothing has reported activity to
// it (Touch, or bytes through a Conn it wrapped) for its idle time.
type IdleWatch struct {
	clock transport.Clock
	idle  time.Duration // +checklocksignore: set by NewIdleWatch, read-only after
	base  time.Time
	fire  func()
	// last is when activity was last reported, as clock time since base.
	last atomic.Int64
	// fired is closed once fire has returned.
	fired chan struct{}

	// mu guards the timer and whether the watch has ended.
	mu syncx.Mutex
	// +checklocks:mu
	timer transport.Timer
	// +checklocks:mu
	ended bool
	// +checklocks:mu
	didFire bool
}

// NewIdleWatch starts a watch that calls fire, on the clock's goroutine
// and with no lock held, once idle passes with no activity reported; with
// idle ≤ 0 it never calls it. clock is RealClock when nil.
func NewIdleWatch(idle time.Duration, clock transport.Clock, fire func()) *IdleWatch {
	c := transport.Or(clock)
	w := &IdleWatch{clock: c, idle: idle, base: c.Now(), fire: fire, fired: make(chan struct{})}
	if idle > 0 {
		w.mu.Lock()
		w.timer = c.AfterFunc(idle, w.check)
		w.mu.Unlock()
	}
	return w
}

// Touch reports activity now.
func (w *IdleWatch) Touch() { w.last.Store(int64(w.clock.Now().Sub(w.base))) }

func (w *IdleWatch) check() {
	w.mu.Lock()
	if w.ended {
		w.mu.Unlock()
		return
	}
	since := w.clock.Now().Sub(w.base) - time.Duration(w.last.Load())
	if since < w.idle {
		w.timer.Reset(w.idle - since)
		w.mu.Unlock()
		return
	}
	w.ended, w.didFire = true, true
	w.mu.Unlock()
	w.fire()
	close(w.fired)
}

// Stop ends the watch: fire is not called after Stop returns. It reports
// whether fire was called (Stop then waits for it to return).
func (w *IdleWatch) Stop() bool {
	w.mu.Lock()
	w.ended = true
	t, fired := w.timer, w.didFire
	w.mu.Unlock()
	if t != nil {
		t.Stop()
	}
	if fired {
		<-w.fired
	}
	return fired
}

// Conn returns c with every Read or Write that moves a byte reported as
// activity. It keeps c's CloseWrite, so a relay's half-close passes.
func (w *IdleWatch) Conn(c net.Conn) net.Conn { return &activeConn{Conn: c, w: w} }

// activeConn is a connection whose traffic keeps an IdleWatch from
// firing.
type activeConn struct {
	net.Conn
	w *IdleWatch
}

// Read implements net.Conn.
func (c *activeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.w.Touch()
	}
	return n, err
}

// Write implements net.Conn. It reports activity before it writes: the
// peer can read the bytes (and act on the time) the instant they are
// written, so a report made after the write could land later than the
// peer's next step and date the activity after it.
func (c *activeConn) Write(p []byte) (int, error) {
	if len(p) > 0 {
		c.w.Touch()
	}
	return c.Conn.Write(p)
}

// CloseWrite half-closes the connection, or closes it when it cannot be
// half-closed.
func (c *activeConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// maxDatagram is the largest UDP payload: 65,535 bytes less the IPv4 and
// UDP headers' least size is 65,507, and IPv6 allows 65,527.
const maxDatagram = 65535

// RelayDatagramsIdle is RelayIdle for two datagram connections (UDP): each
// datagram read from one is written whole to the other. A relay through
// io.Copy's 32 KiB buffer would cut a larger datagram short and lose the
// rest of it.
func RelayDatagramsIdle(a, b net.Conn, idle time.Duration, clock transport.Clock) error {
	w := NewIdleWatch(idle, clock, func() {
		a.Close()
		b.Close()
	})
	wa, wb := w.Conn(a), w.Conn(b)
	errc := make(chan error, 2)
	cp := func(dst, src net.Conn) {
		buf := make([]byte, maxDatagram)
		var err error
		for {
			var n int
			if n, err = src.Read(buf); err != nil {
				break
			}
			if _, err = dst.Write(buf[:n]); err != nil {
				break
			}
		}
		dst.Close()
		errc <- err
	}
	go cp(wa, wb)
	go cp(wb, wa)
	err := <-errc
	<-errc
	if w.Stop() {
		return ErrIdle
	}
	return err
}
