package netstack

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// UDPConn is a UDP socket of a Host, returned by DialUDP, DialContext and
// ListenUDP. It is a *gonet.UDPConn (reads, addresses, Close) whose Write
// and WriteTo are replaced: gonet's WriteTo registers for "writable" only
// after its first attempt failed for a full send buffer and then waits
// without trying again, so when the last in-flight datagram is released in
// between, it waits forever. Under load through a Host (whose Read releases
// datagrams from another goroutine) that hang was seen within seconds.
//
// UDPConn is safe for concurrent use. Write deadlines are kept here as well
// as in the embedded conn and are timed with the Host's Options.Clock.
type UDPConn struct {
	*gonet.UDPConn
	ep    tcpip.Endpoint
	wq    *waiter.Queue
	clock transport.Clock

	// mu guards writeDeadline.
	mu syncx.Mutex
	// +checklocks:mu
	writeDeadline time.Time
}

var (
	_ net.Conn       = (*UDPConn)(nil)
	_ net.PacketConn = (*UDPConn)(nil)
)

func newUDPConn(wq *waiter.Queue, ep tcpip.Endpoint, clock transport.Clock) *UDPConn {
	return &UDPConn{UDPConn: gonet.NewUDPConn(wq, ep), ep: ep, wq: wq, clock: clock}
}

// SetDeadline implements net.Conn.
func (c *UDPConn) SetDeadline(t time.Time) error {
	c.setWriteDeadline(t)
	return c.UDPConn.SetDeadline(t)
}

// SetWriteDeadline implements net.Conn.
func (c *UDPConn) SetWriteDeadline(t time.Time) error {
	c.setWriteDeadline(t)
	return c.UDPConn.SetWriteDeadline(t)
}

func (c *UDPConn) setWriteDeadline(t time.Time) {
	c.mu.Lock()
	c.writeDeadline = t
	c.mu.Unlock()
}

// Write implements net.Conn: it sends b to the connected peer.
func (c *UDPConn) Write(b []byte) (int, error) { return c.WriteTo(b, nil) }

// WriteTo implements net.PacketConn: it sends b to addr (a *net.UDPAddr),
// or to the connected peer when addr is nil. It blocks while the socket's
// send buffer is full, until the write deadline.
func (c *UDPConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	var opts tcpip.WriteOptions
	if addr != nil {
		ua, ok := addr.(*net.UDPAddr)
		if !ok {
			return 0, c.opError(addr, fmt.Errorf("%w: %T is not a *net.UDPAddr", ErrInvalidAddress, addr))
		}
		ap := unmapAddrPort(ua.AddrPort())
		if !ap.Addr().IsValid() {
			return 0, c.opError(addr, fmt.Errorf("%w: %v", ErrInvalidAddress, addr))
		}
		fa := fullAddr(ap)
		opts.To = &fa
	}
	var (
		r       bytes.Reader
		ch      <-chan struct{}
		expired chan struct{}
	)
	for {
		if err := c.checkDeadline(); err != nil {
			return 0, c.opError(addr, err)
		}
		r.Reset(b)
		n, err := c.ep.Write(&r, opts)
		if _, ok := err.(*tcpip.ErrWouldBlock); !ok {
			if err != nil {
				return int(n), c.opError(addr, errnoOf(err))
			}
			return int(n), nil
		}
		if ch == nil {
			// Register, then try again before waiting: the buffer may
			// have drained in between.
			entry, notify := waiter.NewChannelEntry(waiter.WritableEvents)
			c.wq.EventRegister(&entry)
			defer c.wq.EventUnregister(&entry)
			ch = notify
			c.mu.Lock()
			dl := c.writeDeadline
			c.mu.Unlock()
			if !dl.IsZero() {
				expired = make(chan struct{})
				t := c.clock.AfterFunc(dl.Sub(c.clock.Now()), func() { close(expired) })
				defer t.Stop()
			}
			continue
		}
		select {
		case <-ch:
		case <-expired:
			return 0, c.opError(addr, os.ErrDeadlineExceeded)
		}
	}
}

// checkDeadline fails with os.ErrDeadlineExceeded once the write deadline
// has passed.
func (c *UDPConn) checkDeadline() error {
	c.mu.Lock()
	dl := c.writeDeadline
	c.mu.Unlock()
	if !dl.IsZero() && !c.clock.Now().Before(dl) {
		return os.ErrDeadlineExceeded
	}
	return nil
}

func (c *UDPConn) opError(addr net.Addr, err error) error {
	if addr == nil {
		addr = c.RemoteAddr()
	}
	return &net.OpError{Op: "write", Net: "udp", Source: c.LocalAddr(), Addr: addr, Err: err}
}
