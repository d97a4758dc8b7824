package probe

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/transporttest"
)

// The defaults tests pin the checker's numbers by behaviour, with literal
// values: a test that used the Default constants would pass with any value
// of them.

// blockDialer's connects hang until their context ends.
type blockDialer struct{}

func (blockDialer) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func newDefaultChecker(t *testing.T, cfg CheckerConfig) (*Checker, *transporttest.ManualClock) {
	t.Helper()
	clock := transporttest.NewManualClock()
	cfg.Clock, cfg.Dialer = clock, blockDialer{}
	c, err := NewChecker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, clock
}

// TestDefaultCheckTick250ms: the worker tick is 250 ms: a check that falls
// due at once starts at the first tick, 250 ms after the checker started,
// and the next tick comes 250 ms later.
func TestDefaultCheckTick250ms(t *testing.T) {
	c, clock := newDefaultChecker(t, CheckerConfig{})
	if _, err := c.Acquire(checkKey(1), CheckConfig{}); err != nil {
		t.Fatal(err)
	}
	if next, _ := clock.Next(); !next.Equal(t0.Add(250 * time.Millisecond)) {
		t.Fatalf("first tick at %v, want 250ms", next.Sub(t0))
	}
	clock.Advance(250*time.Millisecond - 1)
	if st := c.Stats(); st.Started != 0 {
		t.Fatalf("%d connects started before the first tick", st.Started)
	}
	clock.Advance(1)
	if st := c.Stats(); st.Started != 1 {
		t.Fatalf("%d connects started at the first tick, want 1", st.Started)
	}
	if next, _ := clock.Next(); !next.Equal(t0.Add(500 * time.Millisecond)) {
		t.Fatalf("second tick at %v, want 500ms", next.Sub(t0))
	}
}

// TestDefaultMaxConcurrent32: at most 32 connects are in flight at once:
// of 40 due checks one tick starts 32, and the rest wait for a slot.
func TestDefaultMaxConcurrent32(t *testing.T) {
	c, clock := newDefaultChecker(t, CheckerConfig{MaxChecks: 40})
	for i := range 40 {
		if _, err := c.Acquire(checkKey(i), CheckConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(250 * time.Millisecond)
	if st := c.Stats(); st.Started != 32 || st.InFlight != 32 {
		t.Fatalf("one tick started %d connects (%d in flight), want 32", st.Started, st.InFlight)
	}
	clock.Advance(250 * time.Millisecond)
	if st := c.Stats(); st.Started != 32 || st.MaxInFlight != 32 {
		t.Fatalf("with every slot busy a tick started more: %+v", st)
	}
}

// TestDefaultMaxChecks32: 32 distinct checks are accepted; the 33rd is
// refused with ErrCheckLimit and counted.
func TestDefaultMaxChecks32(t *testing.T) {
	c, _ := newDefaultChecker(t, CheckerConfig{})
	for i := range 32 {
		if _, err := c.Acquire(checkKey(i), CheckConfig{}); err != nil {
			t.Fatalf("check %d of 32: %v", i+1, err)
		}
	}
	if _, err := c.Acquire(checkKey(32), CheckConfig{}); !errors.Is(err, ErrCheckLimit) {
		t.Fatalf("the 33rd check: %v, want ErrCheckLimit", err)
	}
	if st := c.Stats(); st.Refused != 1 || st.Checks != 32 {
		t.Fatalf("stats %+v", st)
	}
}
