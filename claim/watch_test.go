package claim_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
)

// recv reads one Change, failing the test after 10 s of real time.
func recv(t *testing.T, ch <-chan claim.Change) (claim.Change, bool) {
	t.Helper()
	select {
	case c, ok := <-ch:
		return c, ok
	case <-time.After(10 * time.Second):
		t.Fatal("no change and no close within 10 s")
		return claim.Change{}, false
	}
}

// promotes moves the VIP between a and b n times by planned promotes.
func promotes(t *testing.T, e *env, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		who := []string{"b", "a"}[i%2]
		if _, err := e.m(who).Ctl().Promote(context.Background(), claim.PromoteOptions{}); err != nil {
			t.Fatalf("promote %d on %s: %v", i, who, err)
		}
		e.advance(3 * time.Second)
	}
}

// A reader that does not keep up loses changes from the end of its queue,
// never the order: each Change's Seq is Missed+1 past the one before, and
// the last one is the controller's view now.
func TestWatchOverflow(t *testing.T) {
	e := newEnv(t, true)
	e.bootstrap()
	a := e.m("a")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := a.Ctl().Watch(ctx, 2)
	first, _ := recv(t, ch)
	if st := a.Ctl().Status(); first.Role != claim.RoleHolder || !first.Carried || first.Epoch != st.Epoch || first.Holder != e.f.A.Addr {
		t.Fatalf("first change %+v, status %+v", first, st)
	}
	promotes(t, e, 6) // a loses and wins the VIP three times; nobody reads
	prev, missed := first, uint64(0)
	for {
		st := a.Ctl().Status()
		c, _ := recv(t, ch)
		if c.Seq != prev.Seq+c.Missed+1 {
			t.Fatalf("seq %d (missed %d) after %d", c.Seq, c.Missed, prev.Seq)
		}
		missed += c.Missed
		prev = c
		if c.Role == st.Role && c.Carried == st.Carried && c.Epoch == st.Epoch && c.Holder == st.Holder && c.Fenced == st.Fenced {
			break
		}
	}
	if missed == 0 || prev.Epoch != 7 || prev.Role != claim.RoleHolder {
		t.Fatalf("after the overflow: last %+v, %d missed in all; want epoch 7, held, some missed", prev, missed)
	}
	cancel()
	for {
		if _, ok := recv(t, ch); !ok {
			break
		}
	}
}

// A reader that keeps up sees every change; Close ends the watch after the
// final drop, and a watch begun after Close reports the last view and
// closes.
func TestWatchEveryChangeThenClose(t *testing.T) {
	e := newEnv(t, true)
	e.start("a")
	e.start("b")
	a := e.m("a")
	ch := a.Ctl().Watch(context.Background(), 0)
	got := make(chan []claim.Change, 1)
	go func() {
		var cs []claim.Change
		for c := range ch {
			cs = append(cs, c)
		}
		got <- cs
	}()
	e.advance(100 * time.Millisecond)
	if _, err := a.Ctl().Promote(context.Background(), claim.PromoteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.advance(3 * time.Second)
	promotes(t, e, 2)
	ctl := a.Ctl()
	e.stop("a")
	var cs []claim.Change
	select {
	case cs = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("watch not closed by Close")
	}
	var roles []string
	for i, c := range cs {
		if c.Missed != 0 || (i > 0 && c.Seq != cs[i-1].Seq+1) {
			t.Fatalf("change %d: %+v after %+v", i, c, cs[max(i-1, 0)])
		}
		roles = append(roles, c.Role.String())
	}
	last := cs[len(cs)-1]
	if last.Carried || last.Role != claim.RoleHolder || last.Epoch != 3 {
		t.Fatalf("last change %+v: want the holder at epoch 3, address dropped by Close", last)
	}
	t.Logf("roles %v", roles)
	after, ok := recv(t, ctl.Watch(context.Background(), 0))
	if !ok || after != (claim.Change{Seq: last.Seq, Role: last.Role, Epoch: last.Epoch, Holder: last.Holder}) {
		t.Fatalf("watch after close: %+v %v, want the last view", after, ok)
	}
}

// Seq wraps at math.MaxUint64 to 0, and Seq == prev.Seq+Missed+1 holds
// across the wrap, with and without a full queue.
func TestWatchSeqWraps(t *testing.T) {
	for _, queue := range []int{0, 1} {
		e := newEnv(t, true)
		e.start("a")
		e.start("b")
		a := e.m("a")
		claim.SetChangeSeq(a.Ctl(), math.MaxUint64-1)
		ctx, cancel := context.WithCancel(context.Background())
		ch := a.Ctl().Watch(ctx, queue)
		e.advance(100 * time.Millisecond)
		if _, err := a.Ctl().Promote(context.Background(), claim.PromoteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.advance(3 * time.Second)
		promotes(t, e, 2) // at least 3 changes: past max-1, max and the wrap
		prev, _ := recv(t, ch)
		if prev.Seq != math.MaxUint64-1 {
			t.Fatalf("queue %d: first seq %d, want max-1", queue, prev.Seq)
		}
		var seqs []uint64
		for {
			st := a.Ctl().Status()
			c, _ := recv(t, ch)
			if c.Seq != prev.Seq+c.Missed+1 {
				t.Fatalf("queue %d: seq %d (missed %d) after %d", queue, c.Seq, c.Missed, prev.Seq)
			}
			seqs = append(seqs, c.Seq)
			prev = c
			if c.Role == st.Role && c.Carried == st.Carried && c.Epoch == st.Epoch && c.Epoch == 3 {
				break
			}
		}
		if queue == 0 && (seqs[0] != math.MaxUint64 || seqs[1] != 0) {
			t.Fatalf("seqs %v: want max, then 0", seqs)
		}
		if prev.Seq > 100 {
			t.Fatalf("queue %d: seqs %v did not wrap", queue, seqs)
		}
		cancel()
	}
}
