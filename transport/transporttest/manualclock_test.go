package transporttest_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/transporttest"
)

func TestManualClockFiresInOrderAndNeverEarly(t *testing.T) {
	c := transporttest.NewManualClock()
	start := c.Now()
	var got []string
	var firedAt []time.Duration
	add := func(name string, d time.Duration) {
		c.AfterFunc(d, func() {
			got = append(got, name)
			firedAt = append(firedAt, c.Now().Sub(start))
		})
	}
	add("c", 30*time.Millisecond)
	add("a", 10*time.Millisecond)
	add("b1", 20*time.Millisecond)
	add("b2", 20*time.Millisecond) // same deadline: scheduling order
	add("z", -5*time.Millisecond)  // negative: due at once

	if n := c.Advance(9 * time.Millisecond); n != 1 || len(got) != 1 || got[0] != "z" {
		t.Fatalf("after 9ms: ran %d, got %v; want only z", n, got)
	}
	c.Advance(11 * time.Millisecond) // now 20ms
	c.Advance(100 * time.Millisecond)
	want := []string{"z", "a", "b1", "b2", "c"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	wantAt := []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond}
	if fmt.Sprint(firedAt) != fmt.Sprint(wantAt) {
		t.Fatalf("fired at %v, want %v (never early, Now = deadline)", firedAt, wantAt)
	}
	if d := c.Now().Sub(start); d != 120*time.Millisecond {
		t.Fatalf("now = start+%v, want 120ms", d)
	}
}

func TestManualClockCallbackSchedulesWithinSameAdvance(t *testing.T) {
	c := transporttest.NewManualClock()
	var ticks []time.Duration
	start := c.Now()
	var tick func()
	tick = func() {
		ticks = append(ticks, c.Now().Sub(start))
		if len(ticks) < 5 {
			c.AfterFunc(time.Second, tick)
		}
	}
	c.AfterFunc(time.Second, tick)
	c.Advance(10 * time.Second)
	if len(ticks) != 5 || ticks[4] != 5*time.Second {
		t.Fatalf("ticks %v, want 1s..5s", ticks)
	}
	if c.Pending() != 0 {
		t.Fatalf("pending %d, want 0", c.Pending())
	}
}

// TestManualClockTimerSemantics checks Stop and Reset against the contract
// of *time.Timer made by time.AfterFunc.
func TestManualClockTimerSemantics(t *testing.T) {
	c := transporttest.NewManualClock()
	fired := 0
	tm := c.AfterFunc(time.Second, func() { fired++ })

	if !tm.Stop() {
		t.Fatal("Stop of a pending timer returned false")
	}
	if tm.Stop() {
		t.Fatal("second Stop returned true")
	}
	c.Advance(2 * time.Second)
	if fired != 0 {
		t.Fatal("stopped timer fired")
	}
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a stopped timer returned true")
	}
	c.Advance(999 * time.Millisecond)
	if fired != 0 {
		t.Fatal("fired early after Reset")
	}
	c.Advance(time.Millisecond)
	if fired != 1 {
		t.Fatalf("fired %d, want 1", fired)
	}
	if tm.Stop() {
		t.Fatal("Stop after firing returned true")
	}
	// Reset of a fired timer schedules it again.
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a fired timer returned true")
	}
	// Reset of a pending timer moves it and returns true.
	if !tm.Reset(3 * time.Second) {
		t.Fatal("Reset of a pending timer returned false")
	}
	c.Advance(2 * time.Second)
	if fired != 1 {
		t.Fatal("timer fired at its old deadline after Reset")
	}
	c.Advance(time.Second)
	if fired != 2 {
		t.Fatalf("fired %d, want 2", fired)
	}
}

func TestManualClockStepAndNext(t *testing.T) {
	c := transporttest.NewManualClock()
	if c.Step() {
		t.Fatal("Step with nothing pending returned true")
	}
	start := c.Now()
	ran := false
	c.AfterFunc(time.Hour, func() { ran = true })
	if when, ok := c.Next(); !ok || when.Sub(start) != time.Hour {
		t.Fatalf("Next = %v %v", when, ok)
	}
	if !c.Step() || !ran || c.Now().Sub(start) != time.Hour {
		t.Fatalf("Step did not run the hour timer: ran=%v now=%v", ran, c.Now().Sub(start))
	}
}

func ExampleManualClock() {
	c := transporttest.NewManualClock()
	c.AfterFunc(2*time.Second, func() { fmt.Println("two") })
	c.AfterFunc(time.Second, func() { fmt.Println("one") })
	c.Advance(5 * time.Second)
	// Output:
	// one
	// two
}
