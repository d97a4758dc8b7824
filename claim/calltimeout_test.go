package claim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// hangingKV is a KV whose Get hangs until its context ends.
type hangingKV struct {
	claim.KV
	entered chan struct{}
}

// Get hangs, as an RPC stack does, on a context of its own derived from
// the call's: the timeout's error must reach it too.
func (k *hangingKV) Get(ctx context.Context, key string, prefix bool) (claim.GetResponse, error) {
	k.entered <- struct{}{}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	<-ctx.Done()
	return claim.GetResponse{}, ctx.Err()
}

// CallTimeout is time on the controller's Clock: on a manual clock a hung
// KV call ends when the clock reaches it, not after CallTimeout of real
// time.
func TestCallTimeoutOnTheClock(t *testing.T) {
	e := newEnv(t, true)
	a := e.m("a")
	kv := &hangingKV{KV: e.mkv, entered: make(chan struct{}, 1)}
	a.Cfg.KV, a.Cfg.CallTimeout = kv, time.Hour
	ctl, err := claim.NewController(a.Cfg) // not started: only the promote calls
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	done := make(chan error, 1)
	go func() {
		_, err := ctl.Promote(context.Background(), claim.PromoteOptions{})
		done <- err
	}()
	select {
	case <-kv.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("promote never read the keys")
	}
	e.clock.Advance(time.Hour)
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("promote after its call timed out: %v, want context.DeadlineExceeded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the hung call did not end when the clock passed CallTimeout")
	}
}

// The context of a call reports the timeout as context.DeadlineExceeded,
// to itself, to contexts derived from it and as its cause, and ends with
// its parent.
func TestCallContextErrors(t *testing.T) {
	clock := transporttest.NewManualClock()
	ctx, cancel := claim.WithClockTimeout(context.Background(), clock, time.Second)
	defer cancel()
	child, cancelChild := context.WithCancel(ctx)
	defer cancelChild()
	if ctx.Err() != nil {
		t.Fatal("ended before its time")
	}
	if _, ok := ctx.Deadline(); ok {
		t.Fatal("a deadline on the real clock")
	}
	clock.Advance(time.Second)
	<-child.Done()
	if ctx.Err() != context.DeadlineExceeded || child.Err() != context.DeadlineExceeded ||
		context.Cause(ctx) != context.DeadlineExceeded || context.Cause(child) != context.DeadlineExceeded {
		t.Fatalf("after the timeout: %v %v causes %v %v", ctx.Err(), child.Err(), context.Cause(ctx), context.Cause(child))
	}

	parent, cancelParent := context.WithCancel(context.Background())
	ctx2, cancel2 := claim.WithClockTimeout(parent, clock, time.Second)
	defer cancel2()
	cancelParent()
	<-ctx2.Done()
	if ctx2.Err() != context.Canceled {
		t.Fatalf("after the parent's cancel: %v", ctx2.Err())
	}
	before := clock.Pending()
	ctx3, cancel3 := claim.WithClockTimeout(context.Background(), clock, time.Second)
	cancel3()
	if ctx3.Err() != context.Canceled || clock.Pending() != before {
		t.Fatalf("after cancel: %v, %d timers pending, %d before", ctx3.Err(), clock.Pending(), before)
	}
}
