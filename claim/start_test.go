package claim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
)

func TestStartErrors(t *testing.T) {
	e := newEnv(t, true)
	a := e.m("a")
	ctl, err := claim.NewController(a.Cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Start(); err != nil {
		t.Fatalf("first start: %v", err)
	}
	if err := ctl.Start(); !errors.Is(err, claim.ErrStarted) {
		t.Fatalf("second start: %v, want ErrStarted", err)
	}
	ctl.Close()
	if err := ctl.Start(); !errors.Is(err, claim.ErrClosed) {
		t.Fatalf("start after close: %v, want ErrClosed", err)
	}
}

// Without a KV, a node whose state says it holds carries at Start; a
// carrier that fails there is Start's error, and nothing is left running,
// so Start can be called again once the carrier works.
func TestStartNoKVCarryFails(t *testing.T) {
	e := newEnv(t, false)
	e.bootstrap()
	a := e.m("a")
	e.stop("a")
	fail := errors.New("test: netlink down")
	a.Carrier.SetFail(fail)
	ctl, err := claim.NewController(a.Cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	if err := ctl.Start(); !errors.Is(err, fail) {
		t.Fatalf("start with a failing carrier: %v", err)
	}
	e.advance(time.Second)
	if a.Carrier.Carried(e.f.VIP) {
		t.Fatal("carried although the carrier failed")
	}
	a.Carrier.SetFail(nil)
	if err := ctl.Start(); err != nil {
		t.Fatalf("start once the carrier works: %v", err)
	}
	if !a.Carrier.Carried(e.f.VIP) {
		t.Fatal("held VIP not carried after start")
	}
}

// A new pair has no holder until a promote: neither member claims by
// itself from an empty counter, with or without a KV.
func TestFirstHolderOnlyByPromote(t *testing.T) {
	for _, withKV := range []bool{true, false} {
		e := newEnv(t, withKV)
		e.start("a")
		e.start("b")
		e.start("c")
		e.advance(2 * time.Minute)
		if cs := e.carriers(); len(cs) != 0 {
			t.Fatalf("kv %v: carriers %v before any promote", withKV, cs)
		}
		for _, n := range []string{"a", "b"} {
			if st := e.m(n).Ctl().Status(); st.Role != claim.RoleReplica || st.Epoch != 0 {
				t.Fatalf("kv %v: %s before any promote: %+v", withKV, n, st)
			}
		}
		res, err := e.m("b").Ctl().Promote(context.Background(), claim.PromoteOptions{})
		if err != nil || res.Claim.Epoch != 1 {
			t.Fatalf("kv %v: first promote: %+v %v", withKV, res, err)
		}
		e.advance(3 * time.Second)
		if cs := e.carriers(); len(cs) != 1 || cs[0] != "b" {
			t.Fatalf("kv %v: carriers %v after the first promote", withKV, cs)
		}
	}
}
