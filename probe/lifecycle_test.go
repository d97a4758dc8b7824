package probe

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// TestDriverRealClock runs the driver in real time: probes flow at the
// configured interval, and none is sent after Close returns.
func TestDriverRealClock(t *testing.T) {
	p := newProber(t, ProberConfig{Interval: 5 * time.Millisecond, Timeout: 20 * time.Millisecond})
	var sent, closed atomic.Int64
	d := p.Drive(transport.RealClock{}, func(Probe) {
		if closed.Load() != 0 {
			t.Error("probe sent after Close")
		}
		sent.Add(1)
	})
	_ = p.AddPeer(nodeID(1), time.Now())
	_ = p.AddPeer(nodeID(2), time.Now())
	eventually(t, 10*time.Second, "10 probes", func() bool { return sent.Load() >= 10 })
	d.Close()
	closed.Store(1)
	d.Close()
	n := sent.Load()
	// AddPeer after Close must not wake the stopped driver.
	_ = p.AddPeer(nodeID(3), time.Now())
	if got := p.Stats().Sent; got != uint64(n) {
		t.Fatalf("stats say %d sent, send saw %d", got, n)
	}
}

// blockingDialer never connects; it returns when its context ends.
type blockingDialer struct{ dials atomic.Int64 }

func (d *blockingDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	d.dials.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestCheckerCloseCancelsInFlight: Close cancels connects in flight and
// waits for their goroutines (goleak checks that none is left).
func TestCheckerCloseCancelsInFlight(t *testing.T) {
	d := &blockingDialer{}
	c, err := NewChecker(CheckerConfig{Dialer: d, Tick: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if _, err := c.Acquire(checkKey(i), CheckConfig{Timeout: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, "4 dials in flight", func() bool { return d.dials.Load() == 4 })
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	if st := c.Stats(); st.InFlight != 4 || st.Failed != 0 {
		t.Fatalf("results after Close must not be recorded: %+v", st)
	}
}

// acceptDialer "connects" at once (a net.Pipe) and counts its dials.
type acceptDialer struct{ dials atomic.Int64 }

func (d *acceptDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	d.dials.Add(1)
	c1, c2 := net.Pipe()
	c2.Close()
	return c1, nil
}

// TestCheckerReleaseStopsChecking: a target shared by two listeners is one
// check; after the last Release no more connects are made to it.
func TestCheckerReleaseStopsChecking(t *testing.T) {
	clock := transporttest.NewManualClock()
	d := &acceptDialer{}
	c, err := NewChecker(CheckerConfig{Clock: clock, Dialer: d})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := checkKey(1)
	a, _ := c.Acquire(key, CheckConfig{})
	b, _ := c.Acquire(key, CheckConfig{Interval: time.Second})
	for i := 0; i < 40; i++ { // 10 s of ticks
		clock.Advance(DefaultCheckTick)
		eventually(t, 10*time.Second, "the connect to complete", func() bool { return c.Stats().InFlight == 0 })
	}
	// Shared at the shorter interval: a connect at 0.25 s, then every 1 s.
	if st := c.Stats(); st.Checks != 1 || st.Subscriptions != 2 || st.Started != 10 || d.dials.Load() != 10 {
		t.Fatalf("stats %+v, %d dials", st, d.dials.Load())
	}
	if a.Status().Successes != 10 || b.Status().Successes != 10 {
		t.Fatalf("statuses %+v %+v", a.Status(), b.Status())
	}
	a.Release()
	b.Release()
	clock.Advance(time.Minute)
	if st := c.Stats(); st.Started != 10 || st.Checks != 0 {
		t.Fatalf("connects after the last Release: %+v", st)
	}
	if _, err := c.Acquire(key, CheckConfig{Failures: -1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("bad config: %v", err)
	}
}

// FuzzHandleReply: no byte string other than the responder's reply to an
// outstanding probe produces a sample.
func FuzzHandleReply(f *testing.F) {
	for _, tc := range messageTable {
		f.Add(tc.in)
	}
	p := newProber(f, ProberConfig{})
	_ = p.AddPeer(nodeID(1), t0)
	pr := poll(p, t0)[0]
	f.Add(reply(f, pr))
	f.Fuzz(func(t *testing.T, b []byte) {
		p := newProber(t, ProberConfig{})
		_ = p.AddPeer(nodeID(1), t0)
		pr := poll(p, t0)[0]
		want := reply(t, pr)
		err := p.HandleReply(nodeID(1), b, at(time.Millisecond))
		if (err == nil) != (string(b) == string(want)) {
			t.Fatalf("HandleReply(%x) = %v", b, err)
		}
	})
}
