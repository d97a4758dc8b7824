package etcdkv_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/claimtest"
	"github.com/vipkit/vipkit/claim/etcdkv"
	"github.com/vipkit/vipkit/transport"
)

// Timings scaled down for a test cluster whose minimum lease TTL is 1 s:
// the same ratios as production (renew 2 s, drop 10 s, TTL 20 s).
const (
	tRenew = 400 * time.Millisecond
	tDrop  = 2 * time.Second
	tTTL   = 4 * time.Second
	tElect = 1 * time.Second
)

type etcdPair struct {
	t    *testing.T
	f    *claimtest.Fixture
	hist *claimtest.History
	ms   *claimtest.Members

	mu sync.Mutex
	// +checklocks:mu
	off map[netip.Addr]bool // members taken off etcd and off the channel
}

// newEtcdPair builds members a and b on the embedded etcd, in a mesh of
// their own so tests do not share keys, with the real Linux clock.
func newEtcdPair(t *testing.T) *etcdPair {
	needEtcd(t)
	f := claimtest.NewFixture()
	p := &etcdPair{t: t, f: f, hist: new(claimtest.History), ms: claimtest.NewMembers(t), off: map[netip.Addr]bool{}}
	// Every test has its own mesh name, so its own keys.
	f.Mesh = fmt.Sprintf("t%d", prefixSeq.Add(1))
	f.Pair = f.NewPair(f.VIP, f.A, f.B, f.A.Key, f.B.Key)
	clock := claim.BootClock{}
	for _, n := range []claimtest.Node{f.A, f.B} {
		m := &claimtest.Member{Name: n.Name, Node: n, KV: claimtest.NewCountingKV(etcdkv.New(client)),
			Carrier: claimtest.NewFakeCarrier(n.Name, clock, p.hist), Store: new(claim.MemStore)}
		m.Cfg = claim.Config{
			Policy: f.Policy(), Self: n.Addr, Key: n.Key, VIP: f.VIP, Pair: f.Pair,
			KV: m.KV, Carrier: m.Carrier, Store: m.Store, Clock: clock,
			Channel: p.channel(n.Addr), Peers: []netip.Addr{f.A.Addr, f.B.Addr},
			RenewInterval: tRenew, DropAfter: tDrop, LeaseTTL: tTTL, ElectionTimeout: tElect,
			CallTimeout: tRenew,
		}
		p.ms.Add(m)
	}
	return p
}

func (p *etcdPair) m(name string) *claimtest.Member { return p.ms.M(name) }

func (p *etcdPair) start(name string) *claim.Controller { return p.ms.Start(name) }

func (p *etcdPair) stop(name string) { p.ms.Stop(name) }

// cut takes a node off etcd and off the channel.
func (p *etcdPair) cut(name string, v bool) {
	m := p.m(name)
	m.KV.SetDown(v)
	p.mu.Lock()
	p.off[m.Node.Addr] = v
	p.mu.Unlock()
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(within)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("not within %v: %s", within, what)
		}
		transport.Sleep(transport.RealClock{}, 10*time.Millisecond, nil)
	}
}

var errDown = errors.New("test: peer unreachable")

// channel is the members' channel in process for node from: a cut or
// stopped member is unreachable.
func (p *etcdPair) channel(from netip.Addr) *claimtest.DirectChannel {
	return &claimtest.DirectChannel{From: from, Target: func(peer netip.Addr) (*claim.Controller, error) {
		p.mu.Lock()
		cut := p.off[peer] || p.off[from]
		p.mu.Unlock()
		ctl := p.ms.Running(peer)
		if ctl == nil || cut {
			return nil, errDown
		}
		return ctl, nil
	}}
}

func (p *etcdPair) counter(t *testing.T) (*claim.Claim, int64) {
	t.Helper()
	keys := claim.KeysFor(p.f.Mesh, p.f.VIP)
	r, err := etcdkv.New(client).Get(context.Background(), keys.Epoch, false)
	if err != nil || len(r.KVs) != 1 {
		t.Fatalf("counter: %v %d", err, len(r.KVs))
	}
	c, err := claim.ParseClaim(r.KVs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return c, r.KVs[0].ModRevision
}

func TestControllerOnEtcd(t *testing.T) {
	p := newEtcdPair(t)
	ctx := context.Background()
	a, b := p.m("a"), p.m("b")
	p.start("a")
	p.start("b")
	eventually(t, 5*time.Second, "both leases granted", func() bool {
		return a.Ctl().Status().Lease != 0 && b.Ctl().Status().Lease != 0
	})
	// Claim: a promote bootstraps epoch 1.
	res, err := a.Ctl().Promote(ctx, claim.PromoteOptions{})
	if err != nil || res.Claim.Epoch != 1 || !a.Carrier.Carried(p.f.VIP) {
		t.Fatalf("claim on etcd: %+v %v", res, err)
	}
	eventually(t, 5*time.Second, "b follows a", func() bool { return b.Carrier.RoutedTo(p.f.VIP) == p.f.A.Addr })

	// Renew: a steady holder makes exactly one round trip per renewal. A
	// window in which a did not carry throughout says nothing about a
	// steady holder: on a loaded machine a's renewals can stall past the
	// lease's TTL, and b then rightly takes the VIP (a then renews its new
	// lease and reads the keys each step, as a follower does). Such a
	// window is logged, a is promoted back, and the window measured again,
	// at most three times.
	transport.Sleep(transport.RealClock{}, 3*tRenew, nil) // let the watch's wake-ups settle
	for try := 1; ; try++ {
		st0, before := a.Ctl().Stats(), a.KV.Counts()
		carried0 := a.Ctl().Status().Carried
		transport.Sleep(transport.RealClock{}, 10*tRenew, nil)
		d, st1 := a.KV.Counts().Sub(before), a.Ctl().Stats()
		renewals := st1.Renewals - st0.Renewals
		if !carried0 || !a.Ctl().Status().Carried || st1.Drops != st0.Drops || st1.Fences != st0.Fences {
			if try == 3 {
				t.Fatalf("no steady window in 3: stats %+v → %+v, status %+v", st0, st1, a.Ctl().Status())
			}
			t.Logf("window %d not steady (carried %v, drops %d→%d, fences %d→%d, status %+v); promoting a again", try, carried0, st0.Drops, st1.Drops, st0.Fences, st1.Fences, a.Ctl().Status())
			if !a.Ctl().Status().Carried {
				if _, err := a.Ctl().Promote(ctx, claim.PromoteOptions{}); err != nil {
					t.Logf("promote a again: %v", err)
				}
			}
			eventually(t, 10*time.Second, "a carries again", func() bool { return a.Ctl().Status().Carried })
			eventually(t, 5*time.Second, "b follows a again", func() bool { return b.Carrier.RoutedTo(p.f.VIP) == p.f.A.Addr })
			transport.Sleep(transport.RealClock{}, 3*tRenew, nil)
			continue
		}
		// A renewal in flight at either end of the window is counted by
		// the KV when sent and by the controller when answered: allow one.
		diff := int64(d.KeepAlive) - int64(renewals)
		if renewals < 5 || diff < -1 || diff > 1 || d.Total()-d.Watch != d.KeepAlive {
			t.Fatalf("steady holder over %v: %d renewals, calls %+v, stats %+v; want exactly one round trip per renewal", 10*tRenew, renewals, d, st1)
		}
		t.Logf("holder: %d renewals, %d round trips", renewals, d.Total()-d.Watch)
		break
	}
	held, epochRev := p.counter(t) // epoch 1, or later if a was promoted back

	// Expire and fail over: a dies; its lease expires; b claims with one
	// read and one transaction, its lease granted ahead.
	bBefore := b.KV.Counts()
	stopped := time.Now()
	p.stop("a")
	eventually(t, tTTL+3*time.Second, "b carries after a's lease expired", func() bool { return b.Carrier.Carried(p.f.VIP) })
	took := time.Since(stopped)
	bd := b.KV.Counts().Sub(bBefore)
	if bd.Txn != 1 || bd.Grant != 0 {
		t.Fatalf("failover calls %+v: want one transaction and no grant", bd)
	}
	if took < tTTL-tRenew {
		t.Fatalf("b carried %v after a stopped, before a's %v lease could expire", took, tTTL)
	}
	c, rev := p.counter(t)
	if c.Epoch != held.Epoch+1 || c.Holder != p.f.B.Addr {
		t.Fatalf("counter after failover: %v, want epoch %d held by b", c, held.Epoch+1)
	}

	// A stale claim: a claimant that read the counter before the failover
	// loses the compare, and the counter is unchanged.
	stale := p.f.Claim(p.f.A, c.Epoch)
	keys := claim.KeysFor(p.f.Mesh, p.f.VIP)
	r, err := a.KV.Txn(ctx, claim.Txn{
		If: []claim.Compare{{Key: keys.Epoch, Target: claim.ModRevision, Revision: epochRev},
			{Key: keys.Holder, Target: claim.CreateRevision}},
		Then: []claim.Op{claim.Put(keys.Epoch, stale.Encode(), 0), claim.Put(keys.Holder, stale.Encode(), 0)},
	})
	if err != nil || r.Succeeded {
		t.Fatalf("stale claim transaction: %+v %v", r, err)
	}
	c2, rev2 := p.counter(t)
	if !c2.Equal(c) || rev2 != rev {
		t.Fatalf("counter changed by a stale claim: %v@%d → %v@%d", c, rev, c2, rev2)
	}
	// The same stale claim on the members' channel is refused.
	if err := b.Ctl().HandleClaim(ctx, p.f.A.Addr, stale); !errors.Is(err, claim.ErrStale) {
		t.Fatalf("stale claim on the channel: %v", err)
	}
	// The restarted old holder takes the newer claim, is fenced, and
	// never carries.
	p.start("a")
	eventually(t, 5*time.Second, "restarted a takes b's epoch", func() bool { return a.Ctl().Status().Epoch == c.Epoch })
	transport.Sleep(transport.RealClock{}, 2*tDrop, nil)
	if a.Carrier.Carried(p.f.VIP) {
		t.Fatal("restarted old holder carries")
	}
}

func TestPartitionedHolderOnEtcd(t *testing.T) {
	p := newEtcdPair(t)
	ctx := context.Background()
	a, b := p.m("a"), p.m("b")
	p.start("a")
	p.start("b")
	eventually(t, 5*time.Second, "leases", func() bool { return a.Ctl().Status().Lease != 0 && b.Ctl().Status().Lease != 0 })
	if _, err := a.Ctl().Promote(ctx, claim.PromoteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "b takes epoch 1", func() bool { return b.Ctl().Status().Epoch == 1 })
	var mu sync.Mutex
	var order []string
	p.hist.OnEvent(func(ev claimtest.Event) {
		if ev.Kind != claimtest.Route {
			mu.Lock()
			order = append(order, ev.Node+" "+ev.Kind.String())
			mu.Unlock()
		}
	})
	cutAt := time.Now()
	p.cut("a", true)
	eventually(t, tTTL, "a drops", func() bool { return !a.Carrier.Carried(p.f.VIP) })
	// Exactly DropAfter after the last answered renewal on the manual clock
	// (see claim's tests); here in real time, allow scheduling slack but
	// require the drop well before the lease can expire.
	if d := time.Since(cutAt); d >= tTTL-tRenew {
		t.Fatalf("cut-off holder dropped %v after the cut, not before its lease could expire", d)
	}
	eventually(t, tTTL+3*time.Second, "b carries", func() bool { return b.Carrier.Carried(p.f.VIP) })
	mu.Lock()
	got := fmt.Sprint(order)
	mu.Unlock()
	if got != "[a drop b carry]" {
		t.Fatalf("order %s", got)
	}
	if !a.Ctl().Status().Fenced {
		t.Fatal("a not fenced")
	}
	p.cut("a", false)
	eventually(t, 5*time.Second, "healed a takes epoch 2", func() bool { return a.Ctl().Status().Epoch == 2 })
	if st := a.Ctl().Status(); !st.Fenced || a.Carrier.Carried(p.f.VIP) {
		t.Fatalf("healed old primary: %+v", st)
	}
}

func TestPromoteOldPrimaryGoneOnEtcd(t *testing.T) {
	p := newEtcdPair(t)
	ctx := context.Background()
	a, b := p.m("a"), p.m("b")
	// b runs no controller loop of its own here: its promote alone acts.
	p.start("a")
	eventually(t, 5*time.Second, "lease", func() bool { return a.Ctl().Status().Lease != 0 })
	if _, err := a.Ctl().Promote(ctx, claim.PromoteOptions{}); err != nil {
		t.Fatal(err)
	}
	ctlB, err := claim.NewController(b.Cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.ms.Put("b", ctlB)
	// a is frozen off the network: the release gets no answer.
	p.cut("a", true)
	if _, err := ctlB.Promote(ctx, claim.PromoteOptions{}); !errors.Is(err, claim.ErrHolderUnreachable) {
		t.Fatalf("promote with the holder unreachable: %v", err)
	}
	start := time.Now()
	res, err := ctlB.Promote(ctx, claim.PromoteOptions{OldPrimaryGone: true})
	if err != nil || res.Claim.Epoch != 2 || !b.Carrier.Carried(p.f.VIP) {
		t.Fatalf("promote with the old primary gone: %+v %v", res, err)
	}
	if waited := time.Since(start); waited < tDrop {
		t.Fatalf("promote did not wait for the lease (%v)", waited)
	}
	if n := b.KV.Counts().Revoke; n != 0 {
		t.Fatalf("promote revoked %d leases", n)
	}
}

// BenchmarkEtcdRoundTrips measures a renewal and a claim against the
// embedded etcd and reports the round trips each takes.
func BenchmarkEtcdRoundTrips(b *testing.B) {
	needEtcd(b)
	ctx := context.Background()
	kv := claimtest.NewCountingKV(etcdkv.New(client))
	id, _, err := kv.Grant(ctx, 30*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer kv.Revoke(ctx, id)
	b.Run("renew", func(b *testing.B) {
		b.ReportAllocs()
		before := kv.Counts()
		for b.Loop() {
			if _, err := kv.KeepAliveOnce(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(kv.Counts().Sub(before).Total())/float64(b.N), "roundtrips/op")
	})
	b.Run("claim", func(b *testing.B) {
		f := claimtest.NewFixture()
		f.Mesh = fmt.Sprintf("bench%d", prefixSeq.Add(1))
		f.Pair = f.NewPair(f.VIP, f.A, f.B, f.A.Key, f.B.Key)
		keys := claim.KeysFor(f.Mesh, f.VIP)
		b.ReportAllocs()
		before := kv.Counts()
		var epoch uint64
		for b.Loop() {
			g, err := kv.Get(ctx, keys.Prefix, true)
			if err != nil {
				b.Fatal(err)
			}
			var rev int64
			for _, x := range g.KVs {
				if x.Key == keys.Epoch {
					rev = x.ModRevision
				}
			}
			epoch++
			c := f.Claim(f.A, epoch)
			r, err := kv.Txn(ctx, claim.Txn{
				If:   []claim.Compare{{Key: keys.Epoch, Target: claim.ModRevision, Revision: rev}},
				Then: []claim.Op{claim.Put(keys.Epoch, c.Encode(), 0), claim.Put(keys.Holder, c.Encode(), id)},
			})
			if err != nil || !r.Succeeded {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(kv.Counts().Sub(before).Total())/float64(b.N), "roundtrips/op")
	})
}
