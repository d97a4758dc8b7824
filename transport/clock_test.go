package transport_test

import (
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/transporttest"
)

func TestOrDefaultsToRealClock(t *testing.T) {
	if _, ok := transport.Or(nil).(transport.RealClock); !ok {
		t.Fatal("Or(nil) is not RealClock")
	}
	m := transporttest.NewManualClock()
	if transport.Or(m) != transport.Clock(m) {
		t.Fatal("Or(m) did not return m")
	}
}

func TestSleepOnManualClock(t *testing.T) {
	m := transporttest.NewManualClock()
	woke := make(chan bool, 1)
	go func() { woke <- transport.Sleep(m, time.Minute, nil) }()
	// Wait (with a deadline) until the sleeper's timer is registered.
	deadline := time.Now().Add(5 * time.Second)
	for m.Pending() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("Sleep never scheduled its timer")
		}
		time.Sleep(time.Millisecond)
	}
	m.Advance(time.Minute)
	if !<-woke {
		t.Fatal("Sleep reported cancellation")
	}
	done := make(chan struct{})
	close(done)
	if transport.Sleep(m, time.Hour, done) {
		t.Fatal("Sleep with a closed done channel reported a full sleep")
	}
	if m.Pending() != 0 {
		t.Fatal("cancelled Sleep left its timer pending")
	}
}

func TestRealClockAfterFuncStop(t *testing.T) {
	var c transport.RealClock
	tm := c.AfterFunc(time.Hour, func() { t.Error("fired") })
	if !tm.Stop() {
		t.Fatal("Stop of a pending real timer returned false")
	}
	before := c.Now()
	if c.Now().Before(before) {
		t.Fatal("real clock went backwards")
	}
}
