package transporttest

import (
	"sync"
	"sync/atomic"

	"github.com/vipkit/vipkit/transport"
)

// ChanIO is one end of an in-memory PacketIO pair made by NewChanPair: what
// one end writes, the other reads, in order. Packets are copied on Write, so
// the writer keeps its buffers.
//
// Read and Write are safe for concurrent use by any number of goroutines.
// Write never blocks: a packet that finds the peer's queue full is dropped and
// counted in Drops. Close closes both directions for this end; the peer's
// Read then still drains what was queued before returning ErrClosed.
type ChanIO struct {
	mtu, batch int
	in         chan []byte // packets for this end to Read
	peer       *ChanIO
	done       chan struct{}
	interrupt  chan struct{} // capacity 1: InterruptRead's sticky flag
	closeOnce  sync.Once
	drops      atomic.Uint64
	pool       *sync.Pool
}

var (
	_ transport.PacketIO        = (*ChanIO)(nil)
	_ transport.ReadInterrupter = (*ChanIO)(nil)
)

// ChanPairOptions sets up NewChanPair. The zero value gives MTU 1420, batch
// size 64 and a queue of 1024 packets in each direction.
type ChanPairOptions struct {
	MTU       int // largest packet; 0 means 1420
	BatchSize int // 0 means 64
	Queue     int // packets queued per direction; 0 means 1024
}

// NewChanPair returns two connected ChanIOs.
func NewChanPair(o ChanPairOptions) (*ChanIO, *ChanIO) {
	if o.MTU <= 0 {
		o.MTU = 1420
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 64
	}
	if o.Queue <= 0 {
		o.Queue = 1024
	}
	pool := &sync.Pool{New: func() any { b := make([]byte, 0, o.MTU); return &b }}
	a := &ChanIO{mtu: o.MTU, batch: o.BatchSize, in: make(chan []byte, o.Queue), done: make(chan struct{}), interrupt: make(chan struct{}, 1), pool: pool}
	b := &ChanIO{mtu: o.MTU, batch: o.BatchSize, in: make(chan []byte, o.Queue), done: make(chan struct{}), interrupt: make(chan struct{}, 1), pool: pool}
	a.peer, b.peer = b, a
	return a, b
}

// Read implements transport.PacketIO. It blocks for the first packet and then
// takes whatever else is queued, up to len(bufs). A pending InterruptRead
// ends the wait with transport.ErrInterrupted.
func (c *ChanIO) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	var first []byte
	select {
	case first = <-c.in:
	case <-c.interrupt:
		select {
		case <-c.done: // after Close, ErrClosed wins
			return 0, transport.ErrClosed
		default:
		}
		return 0, transport.ErrInterrupted
	case <-c.done:
		return 0, transport.ErrClosed
	case <-c.peer.done:
		select {
		case first = <-c.in:
		default:
			return 0, transport.ErrClosed
		}
	}
	n := 0
	pkt := first
	for {
		if len(pkt) <= len(bufs[n])-offset {
			sizes[n] = copy(bufs[n][offset:], pkt)
			n++
		} else {
			c.drops.Add(1)
		}
		c.release(pkt)
		if n == len(bufs) {
			return n, nil
		}
		select {
		case pkt = <-c.in:
			continue
		default:
		}
		if n > 0 {
			return n, nil
		}
		// Everything read so far was too big: block again.
		select {
		case pkt = <-c.in:
		case <-c.done:
			return 0, transport.ErrClosed
		}
	}
}

func (c *ChanIO) release(pkt []byte) {
	pkt = pkt[:0]
	c.pool.Put(&pkt)
}

// Write implements transport.PacketIO. Packets over the MTU are dropped and
// counted.
func (c *ChanIO) Write(bufs [][]byte, offset int) (int, error) {
	select {
	case <-c.done:
		return 0, transport.ErrClosed
	default:
	}
	for _, b := range bufs {
		p := b[offset:]
		if len(p) > c.mtu {
			c.drops.Add(1)
			continue
		}
		cp := *(c.pool.Get().(*[]byte))
		cp = append(cp[:0], p...)
		select {
		case c.peer.in <- cp:
		default:
			c.drops.Add(1)
			c.release(cp)
		}
	}
	return len(bufs), nil
}

// InterruptRead implements transport.ReadInterrupter.
func (c *ChanIO) InterruptRead() {
	select {
	case c.interrupt <- struct{}{}:
	default: // already pending: interrupts coalesce
	}
}

// BatchSize implements transport.PacketIO.
func (c *ChanIO) BatchSize() int { return c.batch }

// MTU implements transport.PacketIO.
func (c *ChanIO) MTU() int { return c.mtu }

// Close implements transport.PacketIO.
func (c *ChanIO) Close() error {
	c.closeOnce.Do(func() { close(c.done) })
	return nil
}

// Drops returns how many packets this end dropped: oversized on Write or
// Read, or refused by a full peer queue.
func (c *ChanIO) Drops() uint64 { return c.drops.Load() }
