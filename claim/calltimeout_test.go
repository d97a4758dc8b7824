package claim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
)

// hangingKV is a KV whose Get hangs until its context ends.
type hangingKV struct {
	claim.KV
	entered chan struct{}
}

func (k *hangingKV) Get(ctx context.Context, key string, prefix bool) (claim.GetResponse, error) {
	k.entered <- struct{}{}
	<-ctx.Done()
	return claim.GetResponse{}, ctx.Err()
}

// CallTimeout is time on the controller's Clock: on a manual clock a hung
// KV call ends when the clock reaches it, not after CallTimeout of real
// time.
func TestCallTimeoutOnTheClock(t *testing.T) {
	e := newEnv(t, true)
	a := e.m("a")
	kv := &hangingKV{KV: e.kv, entered: make(chan struct{}, 1)}
	a.cfg.KV, a.cfg.CallTimeout = kv, time.Hour
	ctl, err := claim.NewController(a.cfg) // not started: only the promote calls
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
