package wg

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// TUNFromPacketIO returns a tun.Device that moves packets through p, so that
// a wireguard-go device can run on any PacketIO: its TUN side reads what the
// host sends and writes what arrives from peers.
//
// The device reports tun.EventUp once, at creation; MTU and BatchSize are
// p's. Read and Write pass the caller's offset headroom through unchanged
// (wireguard-go writes its 16-byte message header there). Close closes p,
// which unblocks a pending Read, and then closes the Events channel; it is
// idempotent. After p is closed, Read and Write return an error that matches
// both os.ErrClosed (which wireguard-go checks) and transport.ErrClosed.
func TUNFromPacketIO(p transport.PacketIO) tun.Device {
	return newTUNAdapter(p, true)
}

// tunAdapter is a tun.Device over a PacketIO.
type tunAdapter struct {
	io        transport.PacketIO
	events    chan tun.Event
	wmu       syncx.Mutex // serializes Write (see Write)
	closeOnce sync.Once
	closeErr  error
}

var _ tun.Device = (*tunAdapter)(nil)

func newTUNAdapter(p transport.PacketIO, up bool) *tunAdapter {
	t := &tunAdapter{io: p, events: make(chan tun.Event, 1)}
	if up {
		t.events <- tun.EventUp
	}
	return t
}

// File implements tun.Device; there is no file descriptor.
func (t *tunAdapter) File() *os.File { return nil }

// Read implements tun.Device.
func (t *tunAdapter) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n, err := t.io.Read(bufs, sizes, offset)
	if err != nil {
		err = closedErr(err)
	}
	return n, err
}

// Write implements tun.Device. wireguard-go calls it from one receive
// goroutine per peer at once, while a PacketIO takes one Write at a time
// (its contract), so calls are serialized here.
func (t *tunAdapter) Write(bufs [][]byte, offset int) (int, error) {
	t.wmu.Lock()
	n, err := t.io.Write(bufs, offset)
	t.wmu.Unlock()
	if err != nil {
		err = closedErr(err)
	}
	return n, err
}

// MTU implements tun.Device.
func (t *tunAdapter) MTU() (int, error) { return t.io.MTU(), nil }

// Name implements tun.Device. A PacketIO with a Name() string method gives
// its name; otherwise it is "vipkit".
func (t *tunAdapter) Name() (string, error) {
	if n, ok := t.io.(interface{ Name() string }); ok {
		return n.Name(), nil
	}
	return "vipkit", nil
}

// Events implements tun.Device.
func (t *tunAdapter) Events() <-chan tun.Event { return t.events }

// BatchSize implements tun.Device.
func (t *tunAdapter) BatchSize() int { return t.io.BatchSize() }

// Close implements tun.Device.
func (t *tunAdapter) Close() error {
	t.closeOnce.Do(func() {
		t.closeErr = t.io.Close()
		close(t.events)
	})
	return t.closeErr
}

// errClosedTUN matches os.ErrClosed, net.ErrClosed and transport.ErrClosed.
var errClosedTUN = fmt.Errorf("wg: tun: %w: %w", os.ErrClosed, transport.ErrClosed)

func closedErr(err error) error {
	if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) {
		return errClosedTUN
	}
	return err
}

// PacketIOFromTUN returns t as a transport.PacketIO, so that a kernel TUN
// (tun.CreateTUN) can stand wherever a PacketIO does. MTU reports the TUN's
// MTU, following its EventMTUUpdate events (1420 if t cannot tell);
// BatchSize is t's. A tun.Device made by TUNFromPacketIO is unwrapped to its
// PacketIO.
//
// A goroutine consumes t's events (a kernel TUN blocks its netlink listener
// when nobody reads them); it ends when t closes its events channel, which
// Close waits for. Write accepts any offset: a Linux TUN with offloads needs
// headroom in front of each packet for its virtio header, so packets written
// with less than 16 bytes of offset are copied into a buffer that has it
// (the slow path; wireguard-go always leaves 16). Read and Write may be
// called concurrently with each other; Close closes t and is idempotent.
//
// When t's File is in the Go runtime's poller (a kernel TUN from
// tun.CreateTUN is), the PacketIO is also a transport.ReadInterrupter:
// InterruptRead sets a read deadline in the past, which wakes a blocked
// Read, and that Read clears it and returns transport.ErrInterrupted. The
// vip engine uses this to read the TUN straight into wireguard-go's
// buffers. Nothing else may set deadlines on t's File.
func PacketIOFromTUN(t tun.Device) transport.PacketIO {
	if a, ok := t.(*tunAdapter); ok {
		return a.io
	}
	p := &tunIO{t: t, drained: make(chan struct{})}
	p.mtu.Store(defaultMTU)
	if m, err := t.MTU(); err == nil && m > 0 {
		p.mtu.Store(int64(m))
	}
	// SetReadDeadline fails (os.ErrNoDeadline) for a file outside the
	// poller: a blocking descriptor, or none.
	if f := t.File(); f != nil && f.SetReadDeadline(time.Time{}) == nil {
		p.file = f
	}
	go p.drain()
	if p.file != nil {
		return &interruptibleTUNIO{p}
	}
	return p
}

// interruptibleTUNIO is a tunIO whose TUN file is in the runtime's poller.
type interruptibleTUNIO struct{ *tunIO }

var _ transport.ReadInterrupter = (*interruptibleTUNIO)(nil)

// pastDeadline is a deadline that has always passed.
var pastDeadline = time.Unix(1, 0)

// InterruptRead implements transport.ReadInterrupter.
func (p *interruptibleTUNIO) InterruptRead() {
	// After Close the file reports os.ErrClosed, which is all there is to
	// report: a Read then fails with ErrClosed anyway.
	_ = p.file.SetReadDeadline(pastDeadline)
}

// tunWriteHeadroom is the offset that PacketIOFromTUN's Write guarantees to
// the TUN: wireguard-go's MessageTransportHeaderSize, more than the virtio
// header (10 bytes) a Linux TUN with offloads writes in front of a packet.
const tunWriteHeadroom = 16

// defaultMTU is wireguard-go's default, used when a TUN cannot tell its MTU.
const defaultMTU = 1420

// tunIO is a PacketIO over a tun.Device.
type tunIO struct {
	t         tun.Device
	file      *os.File // t's file if it is in the poller (interruptibleTUNIO), else nil
	mtu       atomic.Int64
	closed    atomic.Bool // set by Close before it closes t
	drained   chan struct{}
	closeOnce sync.Once
	closeErr  error

	// wmu serializes Write and guards scratch.
	wmu syncx.Mutex
	// scratch holds the slow path's copies with headroom, reused.
	// +checklocks:wmu
	scratch [][]byte
}

var _ transport.PacketIO = (*tunIO)(nil)

func (p *tunIO) drain() {
	defer close(p.drained)
	for ev := range p.t.Events() {
		if ev&tun.EventMTUUpdate != 0 {
			if m, err := p.t.MTU(); err == nil && m > 0 {
				p.mtu.Store(int64(m))
			}
		}
	}
}

// Read implements transport.PacketIO.
func (p *tunIO) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n, err := p.t.Read(bufs, sizes, offset)
	if err == nil {
		return n, nil
	}
	// A kernel TUN's Read after Close may report its netlink listener's
	// end instead of the closed file; the contract is ErrClosed.
	if p.closed.Load() || errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) {
		return n, transport.ErrClosed
	}
	if p.file != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		// InterruptRead's deadline: clear it, so that the next Read
		// blocks again. An interrupt made since is absorbed here, which
		// the ReadInterrupter contract allows.
		if cerr := p.file.SetReadDeadline(time.Time{}); cerr != nil && errors.Is(cerr, os.ErrClosed) {
			return n, transport.ErrClosed
		}
		return n, transport.ErrInterrupted
	}
	return n, err
}

// Write implements transport.PacketIO.
func (p *tunIO) Write(bufs [][]byte, offset int) (int, error) {
	if offset >= tunWriteHeadroom {
		return p.write(bufs, offset)
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if cap(p.scratch) < len(bufs) {
		p.scratch = make([][]byte, len(bufs))
	}
	s := p.scratch[:len(bufs)]
	for i, b := range bufs {
		need := tunWriteHeadroom + len(b) - offset
		if cap(s[i]) < need {
			s[i] = make([]byte, need)
		}
		s[i] = s[i][:need]
		copy(s[i][tunWriteHeadroom:], b[offset:])
	}
	return p.write(s, tunWriteHeadroom)
}

func (p *tunIO) write(bufs [][]byte, offset int) (int, error) {
	n, err := p.t.Write(bufs, offset)
	if err != nil && (errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed)) {
		return n, transport.ErrClosed
	}
	return n, err
}

// BatchSize implements transport.PacketIO.
func (p *tunIO) BatchSize() int { return p.t.BatchSize() }

// MTU implements transport.PacketIO.
func (p *tunIO) MTU() int { return int(p.mtu.Load()) }

// Name returns the TUN's name, or "" if it has none.
func (p *tunIO) Name() string {
	n, _ := p.t.Name()
	return n
}

// TUN returns the wrapped device.
func (p *tunIO) TUN() tun.Device { return p.t }

// Close implements transport.PacketIO.
func (p *tunIO) Close() error {
	p.closeOnce.Do(func() {
		p.closed.Store(true)
		p.closeErr = p.t.Close()
		<-p.drained
	})
	return p.closeErr
}
