package wg

import (
	"bytes"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/transporttest"
)

func TestTUNFromPacketIO(t *testing.T) {
	io, host := transporttest.NewChanPair(transporttest.ChanPairOptions{MTU: 1300, BatchSize: 7})
	defer host.Close()
	td := TUNFromPacketIO(io)
	if ev := <-td.Events(); ev != tun.EventUp {
		t.Fatalf("first event %v, want EventUp", ev)
	}
	if m, _ := td.MTU(); m != 1300 || td.BatchSize() != 7 {
		t.Fatalf("MTU %d batch %d", m, td.BatchSize())
	}
	if n, _ := td.Name(); n != "vipkit" || td.File() != nil {
		t.Fatalf("Name %q File %v", n, td.File())
	}

	// Write honours the offset: the headroom in front is not sent.
	const off = 16
	pkt := []byte{0x45, 1, 2, 3, 4}
	buf := append(bytes.Repeat([]byte{0xee}, off), pkt...)
	if n, err := td.Write([][]byte{buf}, off); n != 1 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	got := make([]byte, 100)
	sizes := []int{0}
	if n, err := host.Read([][]byte{got}, sizes, 0); n != 1 || err != nil || !bytes.Equal(got[:sizes[0]], pkt) {
		t.Fatalf("host read %d %v %x", n, err, got[:sizes[0]])
	}
	// Read leaves the headroom untouched.
	host.Write([][]byte{pkt}, 0)
	rb := bytes.Repeat([]byte{0xaa}, 64)
	if n, err := td.Read([][]byte{rb}, sizes, off); n != 1 || err != nil || !bytes.Equal(rb[off:off+sizes[0]], pkt) || rb[off-1] != 0xaa {
		t.Fatalf("Read %d %v %x", n, err, rb)
	}

	// Close unblocks Read, closes Events and the PacketIO.
	errc := make(chan error, 1)
	go func() {
		_, err := td.Read([][]byte{rb}, sizes, off)
		errc <- err
	}()
	if err := td.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrClosed) || !errors.Is(err, transport.ErrClosed) || !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read after Close = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Read")
	}
	if _, ok := <-td.Events(); ok {
		t.Fatal("Events not closed")
	}
	if err := td.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := io.Write([][]byte{pkt}, 0); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("PacketIO not closed: %v", err)
	}
}

// fakeTUN is a tun.Device like a Linux TUN with offloads: Write needs at
// least 10 bytes of headroom.
type fakeTUN struct {
	// mu guards written and mtu.
	mu sync.Mutex
	// +checklocks:mu
	written [][]byte
	// +checklocks:mu
	mtu    int
	events chan tun.Event
	evq    chan tun.Event // what the test wants sent on events
	in     chan []byte
	closed chan struct{}
	once   sync.Once
}

func newFakeTUN() *fakeTUN {
	f := &fakeTUN{mtu: 1500, events: make(chan tun.Event), evq: make(chan tun.Event, 8), in: make(chan []byte, 8), closed: make(chan struct{})}
	f.evq <- tun.EventUp
	go func() { // like a kernel TUN's netlink listener: blocks on send, closes events at the end
		defer close(f.events)
		for {
			select {
			case e := <-f.evq:
				select {
				case f.events <- e:
				case <-f.closed:
					return
				}
			case <-f.closed:
				return
			}
		}
	}()
	return f
}

func (f *fakeTUN) File() *os.File { return nil }
func (f *fakeTUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	select {
	case p := <-f.in:
		sizes[0] = copy(bufs[0][offset:], p)
		return 1, nil
	case <-f.closed:
		return 0, os.ErrClosed
	}
}
func (f *fakeTUN) Write(bufs [][]byte, offset int) (int, error) {
	if offset < 10 {
		return 0, errors.New("fake tun: offset below the virtio header")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range bufs {
		f.written = append(f.written, bytes.Clone(b[offset:]))
	}
	return len(bufs), nil
}
func (f *fakeTUN) MTU() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mtu, nil
}
func (f *fakeTUN) Name() (string, error)    { return "tun7", nil }
func (f *fakeTUN) Events() <-chan tun.Event { return f.events }
func (f *fakeTUN) BatchSize() int           { return 3 }
func (f *fakeTUN) Close() error {
	f.once.Do(func() {
		close(f.closed)
	})
	return nil
}

func TestPacketIOFromTUN(t *testing.T) {
	f := newFakeTUN()
	p := PacketIOFromTUN(f)
	if p.MTU() != 1500 || p.BatchSize() != 3 || p.(interface{ Name() string }).Name() != "tun7" {
		t.Fatalf("MTU %d batch %d", p.MTU(), p.BatchSize())
	}
	// An MTU update is followed.
	f.mu.Lock()
	f.mtu = 1400
	f.mu.Unlock()
	f.evq <- tun.EventMTUUpdate
	waitUntil(t, 5*time.Second, "MTU update", func() bool { return p.MTU() == 1400 })

	// Offset 0 goes through the slow path with headroom; 16 straight.
	if n, err := p.Write([][]byte{{1, 2, 3}, {4}}, 0); n != 2 || err != nil {
		t.Fatalf("Write(offset 0) = %d, %v", n, err)
	}
	if n, err := p.Write([][]byte{append(make([]byte, 16), 5, 6)}, 16); n != 1 || err != nil {
		t.Fatalf("Write(offset 16) = %d, %v", n, err)
	}
	f.mu.Lock()
	want := [][]byte{{1, 2, 3}, {4}, {5, 6}}
	for i := range want {
		if !bytes.Equal(f.written[i], want[i]) {
			t.Fatalf("written %x, want %x", f.written, want)
		}
	}
	f.mu.Unlock()

	f.in <- []byte{9, 8}
	buf := make([]byte, 32)
	sizes := []int{0}
	if n, err := p.Read([][]byte{buf}, sizes, 4); n != 1 || err != nil || !bytes.Equal(buf[4:4+sizes[0]], []byte{9, 8}) {
		t.Fatalf("Read = %d %v", n, err)
	}
	if PacketIOFromTUN(TUNFromPacketIO(p)) != p {
		t.Fatal("PacketIOFromTUN(TUNFromPacketIO(p)) is not p")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Read([][]byte{buf}, sizes, 0); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Read after Close = %v", err)
	}
	p.Close()
}

// nopIO is a PacketIO that does nothing, to measure the adapters alone.
type nopIO struct{}

func (nopIO) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	sizes[0] = 20
	return 1, nil
}
func (nopIO) Write(bufs [][]byte, offset int) (int, error) { return len(bufs), nil }
func (nopIO) BatchSize() int                               { return 1 }
func (nopIO) MTU() int                                     { return 1420 }
func (nopIO) Close() error                                 { return nil }

func TestTUNAdapterAllocs(t *testing.T) {
	testenv.SkipIfLockOrder(t)
	td := TUNFromPacketIO(nopIO{})
	bufs := [][]byte{make([]byte, 100)}
	sizes := []int{0}
	if a := testing.AllocsPerRun(1000, func() {
		td.Read(bufs, sizes, 16)
		td.Write(bufs, 16)
	}); a != 0 {
		t.Fatalf("TUN adapter allocates %v per Read+Write", a)
	}
	f := newFakeTUN()
	p := PacketIOFromTUN(f)
	defer p.Close()
	f.mu.Lock()
	f.written = make([][]byte, 0, 10000)
	f.mu.Unlock()
	one := [][]byte{make([]byte, 40)}
	if a := testing.AllocsPerRun(100, func() { p.Write(one, 0) }); a > 1 { // the fake's own copy
		t.Fatalf("PacketIOFromTUN slow-path Write allocates %v", a)
	}
}

// pipeTUN is a fakeTUN that reads from a pipe, whose file is in the
// runtime's poller as a kernel TUN's is.
type pipeTUN struct {
	*fakeTUN
	r, w *os.File
}

func (p *pipeTUN) File() *os.File { return p.r }
func (p *pipeTUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n, err := p.r.Read(bufs[0][offset:])
	if err != nil {
		return 0, err
	}
	sizes[0] = n
	return 1, nil
}
func (p *pipeTUN) Close() error {
	p.fakeTUN.Close()
	p.w.Close()
	return p.r.Close()
}

// PacketIOFromTUN is a ReadInterrupter exactly when the TUN's file can take
// a deadline, and its interrupts keep the contract.
func TestPacketIOFromTUNInterrupt(t *testing.T) {
	plain := PacketIOFromTUN(newFakeTUN())
	defer plain.Close()
	if _, ok := plain.(transport.ReadInterrupter); ok {
		t.Fatal("a TUN without a file is a ReadInterrupter")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if r.SetReadDeadline(time.Time{}) != nil {
		t.Skip("pipes are not in the poller on this platform")
	}
	p := PacketIOFromTUN(&pipeTUN{fakeTUN: newFakeTUN(), r: r, w: w})
	transporttest.CheckReadInterrupter(t, p, func(t testing.TB) {
		if _, err := w.Write([]byte("pkt")); err != nil {
			t.Fatal(err)
		}
	})
}
