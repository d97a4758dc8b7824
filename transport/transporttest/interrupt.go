package transporttest

import (
	"errors"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport"
)

// CheckReadInterrupter runs the transport.ReadInterrupter contract against
// p, which must be open, idle (nothing queued for Read) and a
// ReadInterrupter; send must make one packet available to p's Read. It
// checks that an interrupt made before a Read is kept for it, that
// interrupts coalesce, that the Read returning ErrInterrupted clears the
// flag (the next Read blocks until send's packet and returns it), that an
// interrupt wakes a Read already blocked, and that InterruptRead after Close
// is harmless. It closes p.
func CheckReadInterrupter(t testing.TB, p transport.PacketIO, send func(testing.TB)) {
	t.Helper()
	defer p.Close()
	ri, ok := p.(transport.ReadInterrupter)
	if !ok {
		t.Fatalf("%T is not a transport.ReadInterrupter", p)
	}
	bs := p.BatchSize()
	bufs, sizes := make([][]byte, bs), make([]int, bs)
	for i := range bufs {
		bufs[i] = make([]byte, 16+65535)
	}
	type result struct {
		n   int
		err error
	}
	read := func() <-chan result {
		rc := make(chan result, 1)
		go func() {
			n, err := p.Read(bufs, sizes, 16)
			rc <- result{n, err}
		}()
		return rc
	}
	wait := func(rc <-chan result, what string) result {
		t.Helper()
		select {
		case r := <-rc:
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("Read did not return %s within 10 s", what)
			return result{}
		}
	}
	interrupted := func(r result, what string) {
		t.Helper()
		if r.n != 0 || !errors.Is(r.err, transport.ErrInterrupted) {
			t.Fatalf("%s: Read = %d, %v; want 0, ErrInterrupted", what, r.n, r.err)
		}
	}

	ri.InterruptRead()
	ri.InterruptRead()
	interrupted(wait(read(), "after InterruptRead"), "interrupted before the Read")

	// The two interrupts were one, and the Read cleared it.
	rc := read()
	select {
	case r := <-rc:
		t.Fatalf("the Read after an interrupted one returned at once: %d, %v", r.n, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	send(t)
	if r := wait(rc, "the packet sent"); r.err != nil || r.n < 1 {
		t.Fatalf("Read after send = %d, %v; want the packet", r.n, r.err)
	}

	rc = read()
	// Either order of this interrupt and the Read's start is within the
	// contract; the pause makes the Read usually block first.
	time.Sleep(20 * time.Millisecond)
	ri.InterruptRead()
	// Packets that arrived since (a kernel TUN that is up sends some of
	// its own) may come first; the interrupt stays for a later Read.
	for r := wait(rc, "after InterruptRead"); ; r = wait(read(), "after InterruptRead") {
		if r.err == nil && r.n > 0 {
			continue
		}
		interrupted(r, "interrupted while blocked")
		break
	}

	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ri.InterruptRead()
	if _, err := p.Read(bufs, sizes, 16); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Read after Close = %v, want ErrClosed", err)
	}
}
