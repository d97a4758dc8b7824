package vip

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// countCarrier records what a Replicator sends, per member.
type countCarrier struct {
	mu sync.Mutex
	// +checklocks:mu
	frames map[NodeID]int
	// +checklocks:mu
	bytes map[NodeID]int
	// +checklocks:mu
	last map[NodeID][]byte
}

func newCountCarrier() *countCarrier {
	return &countCarrier{frames: map[NodeID]int{}, bytes: map[NodeID]int{}, last: map[NodeID][]byte{}}
}

func (c *countCarrier) Send(_ context.Context, to NodeID, frame []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frames[to]++
	c.bytes[to] += len(frame)
	c.last[to] = frame
	return nil
}

func (c *countCarrier) sent(to NodeID) (frames, bytes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames[to], c.bytes[to]
}

func (c *countCarrier) lastFrame(to NodeID) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last[to]
}

// fatService creates service name on reg and adds listeners and backends
// until its encoded snapshot is at least min bytes; it returns the
// snapshot's size.
func fatService(t testing.TB, tn *testNet, reg *Registry, name string, min int) (ServiceID, int) {
	t.Helper()
	ctx := context.Background()
	v, err := reg.Create(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for port := uint16(1); ; port++ {
		in, _ := reg.Replica().Service(crdt.ServiceID(v.ID))
		if in.SnapshotBytes >= min {
			return v.ID, in.SnapshotBytes
		}
		bs := make([]Backend, 4)
		for i := range bs {
			bs[i] = Backend{tn.nodes[i%len(tn.nodes)].ID, 1000*port + uint16(i)}
		}
		if _, err := reg.PortAdd(ctx, name, PortKey{UDP, port}, bs); err != nil {
			t.Fatalf("port %d at %d snapshot bytes: %v", port, in.SnapshotBytes, err)
		}
	}
}

// requestFrame is a request frame that names each of ids.
func requestFrame(ids ...ServiceID) []byte {
	f := []byte{frameMagic, frameVersion, frameRequest}
	f = binary.AppendUvarint(f, uint64(len(ids)))
	for _, id := range ids {
		f = append(f, id[:]...)
	}
	return f
}

// repeatedRequest is the largest request frame the control frame limit
// allows, naming id over and over: 3 + 2 + 4095 × 16 = 65,525 bytes.
func repeatedRequest(limit int, id ServiceID) []byte {
	n := (limit - frameHeader - 2) / 16
	ids := make([]ServiceID, n)
	for i := range ids {
		ids[i] = id
	}
	return requestFrame(ids...)
}

// allocPerCall returns the bytes allocated by one call of f, on average
// over runs calls.
func allocPerCall(runs int, f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(runs)
}

// TestRequestRepeatingOneIDIsAnsweredOnce plays the amplification: one
// request frame of the largest size, 65,525 bytes, repeating one service
// id 4,095 times. The receiver answers the id once: one snapshot frame,
// and it allocates no more than twice the request's own size.
func TestRequestRepeatingOneIDIsAnsweredOnce(t *testing.T) {
	tn := newTestNet(t, 2, 11)
	reg := tn.regs[0]
	id, size := fatService(t, tn, reg, "api", 8<<10)
	cc := newCountCarrier()
	rep, err := NewReplicator(ReplicatorOptions{Registry: reg, Carrier: cc, Peers: func() []NodeID { return nil },
		Clock: transporttest.NewManualClock()})
	if err != nil {
		t.Fatal(err)
	}
	from := tn.nodes[1].ID
	req := repeatedRequest(rep.FrameLimit(), id)
	if len(req) != 65525 || len(req) > rep.FrameLimit() {
		t.Fatalf("request is %d bytes (limit %d), want 65,525", len(req), rep.FrameLimit())
	}
	const runs = 4
	ctx := context.Background()
	alloc := allocPerCall(runs, func() {
		if err := rep.HandleFrame(ctx, from, req); err != nil {
			t.Error(err)
		}
	})
	frames, sent := cc.sent(from)
	t.Logf("one %d-byte request repeating one id (snapshot %d bytes): %d frames, %d bytes sent, %d bytes allocated per request (%.2fx the request)",
		len(req), size, frames/runs, sent/runs, alloc, float64(alloc)/float64(len(req)))
	if frames != runs || sent != runs*(size+frameHeader) {
		t.Errorf("%d requests were answered with %d frames, %d bytes; want one %d-byte frame each", runs, frames, sent, size+frameHeader)
	}
	if alloc > 2*uint64(len(req)) {
		t.Errorf("one request allocated %d bytes, over twice its own %d", alloc, len(req))
	}
}

// TestDigestRepeatingOneIDRequestsItOnce: a digest that lists one id the
// receiver lacks, over and over, is answered with a request naming it once.
func TestDigestRepeatingOneIDRequestsItOnce(t *testing.T) {
	tn := newTestNet(t, 2, 12)
	cc := newCountCarrier()
	rep, err := NewReplicator(ReplicatorOptions{Registry: tn.regs[0], Carrier: cc, Peers: func() []NodeID { return nil },
		Clock: transporttest.NewManualClock()})
	if err != nil {
		t.Fatal(err)
	}
	var id ServiceID
	copy(id[:], "not-held-service")
	n := (rep.FrameLimit() - frameHeader - 2) / 24
	f := []byte{frameMagic, frameVersion, frameDigest}
	f = binary.AppendUvarint(f, uint64(n))
	for range n {
		f = append(f, id[:]...)
		f = binary.BigEndian.AppendUint64(f, 7)
	}
	from := tn.nodes[1].ID
	if err := rep.HandleFrame(context.Background(), from, f); err != nil {
		t.Fatal(err)
	}
	if got, want := cc.lastFrame(from), requestFrame(id); !bytes.Equal(got, want) {
		t.Fatalf("a digest repeating one id %d times was answered with a %d-byte frame, want the %d-byte request naming it once", n, len(got), len(want))
	}
}

// BenchmarkRequestRepeatingOneID is the cost of answering the 65,525-byte
// request that repeats one id (an 8 KiB snapshot). The clock moves a
// second per request, so every one finds a full reply budget.
func BenchmarkRequestRepeatingOneID(b *testing.B) {
	tn := newTestNet(b, 2, 11)
	reg := tn.regs[0]
	id, _ := fatService(b, tn, reg, "api", 8<<10)
	clock := transporttest.NewManualClock()
	cc := newCountCarrier()
	rep, err := NewReplicator(ReplicatorOptions{Registry: reg, Carrier: cc, Peers: func() []NodeID { return nil }, Clock: clock})
	if err != nil {
		b.Fatal(err)
	}
	from := tn.nodes[1].ID
	req := repeatedRequest(rep.FrameLimit(), id)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(req)))
	b.ResetTimer()
	for range b.N {
		clock.Advance(time.Second)
		if err := rep.HandleFrame(ctx, from, req); err != nil {
			b.Fatal(err)
		}
	}
	frames, _ := cc.sent(from)
	b.ReportMetric(float64(frames)/float64(b.N), "frames/op")
}

// budgetCount is how many members' reply budgets p tracks.
func (p *Replicator) budgetCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.budgets)
}

// TestReplyBudgetPerMember: a member that asks for everything, again and
// again (requests naming every service, digests naming none), gets no more
// than its budget of bytes per second, and gets that much; another member
// asking meanwhile is answered in full.
func TestReplyBudgetPerMember(t *testing.T) {
	tn := newTestNet(t, 3, 13)
	reg := tn.regs[0]
	var ids []ServiceID
	total, maxCost, minCost := 0, 0, math.MaxInt
	for i := range 8 {
		id, size := fatService(t, tn, reg, fmt.Sprintf("svc%d", i), 2<<10)
		ids = append(ids, id)
		total += size + frameHeader
		maxCost, minCost = max(maxCost, size+frameHeader), min(minCost, size+frameHeader)
	}
	const rate, burst = 16 << 10, 96 << 10
	clock := transporttest.NewManualClock()
	cc := newCountCarrier()
	rep, err := NewReplicator(ReplicatorOptions{Registry: reg, Carrier: cc, Peers: func() []NodeID { return nil },
		Clock: clock, ReplyRate: rate, ReplyBurst: burst})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	hostile, other := tn.nodes[1].ID, tn.nodes[2].ID
	all := requestFrame(ids...)
	nothing := []byte{frameMagic, frameVersion, frameDigest, 0}
	const step, seconds = 50 * time.Millisecond, 20
	perSecond := make([]int, seconds)
	refusals := 0
	steps := seconds * int(time.Second/step)
	for i := range steps {
		f := all
		if i%2 == 1 {
			f = nothing
		}
		_, before := cc.sent(hostile)
		err := rep.HandleFrame(ctx, hostile, f)
		switch {
		case errors.Is(err, ErrReplyBudget):
			refusals++
		case err != nil:
			t.Fatal(err)
		}
		_, after := cc.sent(hostile)
		perSecond[i*int(step)/int(time.Second)] += after - before
		if i == steps/2 {
			if err := rep.HandleFrame(ctx, other, all); err != nil {
				t.Fatalf("another member's request: %v", err)
			}
			if _, got := cc.sent(other); got != total {
				t.Fatalf("another member got %d bytes of %d", got, total)
			}
		}
		clock.Advance(step)
	}
	_, got := cc.sent(hostile)
	elapsed := time.Duration(steps-1) * step
	most := burst + int(elapsed.Seconds()*rate)
	t.Logf("a member asking for all %d bytes every %v for %v got %d bytes (budget %d + %d/s); per second: %v", total, step, elapsed, got, burst, rate, perSecond)
	if got > most || got < most-maxCost {
		t.Errorf("got %d bytes in %v, want at most the budget's %d and no less than %d", got, elapsed, most, most-maxCost)
	}
	for s, b := range perSecond[1:] {
		if b > rate+maxCost {
			t.Errorf("second %d: %d bytes, over the rate %d (+ one frame)", s+1, b, rate)
		}
	}
	st := rep.Stats()
	if refusals == 0 || st.BudgetRefused != uint64(refusals) || st.BudgetRefusedBytes < uint64(refusals*minCost) {
		t.Errorf("%d answers refused with ErrReplyBudget; stats count %d (%d bytes)", refusals, st.BudgetRefused, st.BudgetRefusedBytes)
	}
}

// TestReplyBudgetDefaults pins the default budget with literals: 4 MiB at
// once, then 1 MiB a second; and the options that cannot work are refused.
func TestReplyBudgetDefaults(t *testing.T) {
	tn := newTestNet(t, 2, 14)
	reg := tn.regs[0]
	id, size := fatService(t, tn, reg, "api", 8<<10)
	cost := size + frameHeader
	clock := transporttest.NewManualClock()
	cc := newCountCarrier()
	o := ReplicatorOptions{Registry: reg, Carrier: cc, Peers: func() []NodeID { return nil }, Clock: clock}
	rep, err := NewReplicator(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	from := tn.nodes[1].ID
	ask := func(n int) {
		for range n {
			if err := rep.HandleFrame(ctx, from, requestFrame(id)); err != nil && !errors.Is(err, ErrReplyBudget) {
				t.Fatal(err)
			}
		}
	}
	ask(1000)
	if frames, _ := cc.sent(from); frames != (4<<20)/cost {
		t.Fatalf("at once: %d frames of %d bytes, want the 4 MiB burst's %d", frames, cost, (4<<20)/cost)
	}
	clock.Advance(time.Second)
	ask(1000)
	if frames, _ := cc.sent(from); frames != (5<<20)/cost {
		t.Fatalf("after 1 s: %d frames of %d bytes, want %d (4 MiB + 1 MiB)", frames, cost, (5<<20)/cost)
	}
	if rep.maxBudgets != 4096 {
		t.Fatalf("tracks %d budgets, want 4096", rep.maxBudgets)
	}
	for _, bad := range []ReplicatorOptions{{ReplyRate: -1}, {ReplyBurst: rep.FrameLimit() - 1}} {
		bad.Registry, bad.Carrier, bad.Peers = o.Registry, o.Carrier, o.Peers
		if _, err := NewReplicator(bad); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("rate %d, burst %d: %v, want ErrInvalidOptions", bad.ReplyRate, bad.ReplyBurst, err)
		}
	}
	if _, err := NewReplicator(ReplicatorOptions{Registry: o.Registry, Carrier: o.Carrier, Peers: o.Peers, ReplyBurst: rep.FrameLimit()}); err != nil {
		t.Errorf("a burst of one frame: %v", err)
	}
}

// TestReplyBudgetsBoundedOnChurn: members come and go; the budgets tracked
// stay within the bound, a member that spent its budget is not forgotten
// to make room (so churn does not refill it), and once everyone's budget
// has refilled the next rotation forgets them all.
func TestReplyBudgetsBoundedOnChurn(t *testing.T) {
	tn := newTestNet(t, 2, 15)
	reg := tn.regs[0]
	v, err := reg.Create(context.Background(), "api")
	if err != nil {
		t.Fatal(err)
	}
	clock := transporttest.NewManualClock()
	cc := newCountCarrier()
	const rate = 1 << 10
	rep, err := NewReplicator(ReplicatorOptions{Registry: reg, Carrier: cc, Peers: func() []NodeID { return nil },
		Clock: clock, ReplyRate: rate, ReplyBurst: 65539})
	if err != nil {
		t.Fatal(err)
	}
	const bound = 64
	rep.maxBudgets = bound
	rep.Start()
	t.Cleanup(rep.Stop)
	ctx := context.Background()
	req := requestFrame(v.ID)
	hostile := tn.nodes[1].ID
	for spent := 0; rep.HandleFrame(ctx, hostile, req) == nil; spent++ {
		if spent > 65539 {
			t.Fatal("the budget never ran out")
		}
	}
	for i := range 10 * bound {
		var m NodeID
		binary.BigEndian.PutUint32(m[:], uint32(i))
		if err := rep.HandleFrame(ctx, m, req); err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
		if n := rep.budgetCount(); n > bound {
			t.Fatalf("after %d members: %d budgets tracked, bound %d", i+1, n, bound)
		}
	}
	if err := rep.HandleFrame(ctx, hostile, req); !errors.Is(err, ErrReplyBudget) {
		t.Fatalf("the member that spent its budget, after churn: %v", err)
	}
	if st := rep.Stats(); st.BudgetsDropped != 10*bound-(bound-1) {
		t.Errorf("%d budgets dropped, want %d", st.BudgetsDropped, 10*bound-(bound-1))
	}
	clock.Advance(65539*time.Second/rate + 2*DefaultRotation)
	if n := rep.budgetCount(); n != 0 {
		t.Fatalf("%d budgets tracked after every one refilled and a rotation ran", n)
	}
}
