package etcdkv_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/etcdkv"
	vtransport "github.com/vipkit/vipkit/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// guarded writes key=val with the importer's own clientv3 transaction,
// guarded by tok, and reports whether it committed.
func guarded(t *testing.T, tok claim.FenceToken, key, val string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := client.Txn(ctx).If(etcdkv.Cmps(tok)...).Then(clientv3.OpPut(key, val)).Commit()
	if err != nil {
		t.Fatalf("guarded txn: %v", err)
	}
	return r.Succeeded
}

// On a real etcd a write guarded by the token commits while this node
// holds the VIP and fails after a failover, and after a planned promote.
func TestFenceTokenOnEtcd(t *testing.T) {
	p := newEtcdPair(t)
	ctx := context.Background()
	a, b := p.m("a"), p.m("b")
	app := fmt.Sprintf("/app/%s/row", p.f.Mesh)
	p.start("a")
	p.start("b")
	eventually(t, 5*time.Second, "leases", func() bool { return a.Ctl().Status().Lease != 0 && b.Ctl().Status().Lease != 0 })
	if _, err := a.Ctl().Promote(ctx, claim.PromoteOptions{}); err != nil {
		t.Fatal(err)
	}
	tokA, err := a.Ctl().FenceToken()
	if err != nil {
		t.Fatal(err)
	}
	if !guarded(t, tokA, app, "a1") {
		t.Fatal("write guarded by the holder's token failed")
	}
	// Renewals keep the token valid.
	transportSleep(3 * tRenew)
	if !guarded(t, tokA, app, "a2") {
		t.Fatal("holder's token failed after renewals")
	}

	// Failover: a is cut off; b claims after a's lease expired.
	p.cut("a", true)
	eventually(t, tTTL+3*time.Second, "b carries", func() bool { return b.Carrier.Carried(p.f.VIP) })
	if guarded(t, tokA, app, "a3") {
		t.Fatal("write guarded by the old holder's token committed after the failover")
	}
	if _, err := a.Ctl().FenceToken(); !errors.Is(err, claim.ErrNoToken) {
		t.Fatalf("cut-off holder still hands out a token: %v", err)
	}
	tokB, err := b.Ctl().FenceToken()
	if err != nil || !guarded(t, tokB, app, "b1") {
		t.Fatalf("new holder's token %+v %v", tokB, err)
	}

	// Planned promote back to a: the holder key is replaced in place.
	p.cut("a", false)
	eventually(t, 5*time.Second, "healed a takes b's claim", func() bool { return a.Ctl().Status().Epoch == tokB.Epoch })
	keys := claim.KeysFor(p.f.Mesh, p.f.VIP)
	before, err := etcdkv.New(client).Get(ctx, keys.Holder, false)
	if err != nil || len(before.KVs) != 1 {
		t.Fatalf("holder key: %v", err)
	}
	if _, err := a.Ctl().Promote(ctx, claim.PromoteOptions{}); err != nil {
		t.Fatal(err)
	}
	after, err := etcdkv.New(client).Get(ctx, keys.Holder, false)
	if err != nil || len(after.KVs) != 1 {
		t.Fatalf("holder key: %v", err)
	}
	t.Logf("holder key create revision %d → %d across the planned promote", before.KVs[0].CreateRevision, after.KVs[0].CreateRevision)
	if guarded(t, tokB, app, "b2") {
		t.Fatal("write guarded by the old holder's token committed after a planned promote")
	}
	// The promote has claimed; the address is added once a's renewal is
	// fresh (a controller never carries on a stale lease), which on a
	// loaded machine may be several renewals after Promote returns: a busy
	// etcd answers a renewal late, and each late one is no renewal. The
	// wait allows a few lease lifetimes; what is asserted is the token.
	for end := time.Now().Add(3 * tTTL); ; transportSleep(10 * time.Millisecond) {
		_, err := a.Ctl().FenceToken()
		if err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("not within %v: a carries after the planned promote: token %v; status %+v", 3*tTTL, err, a.Ctl().Status())
		}
	}
	tokA2, err := a.Ctl().FenceToken()
	if err != nil || !guarded(t, tokA2, app, "a4") {
		t.Fatalf("token after the planned promote %+v %v", tokA2, err)
	}
	r, err := client.Get(ctx, app)
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "a4" {
		t.Fatalf("row: %v %v", r, err)
	}
}

func transportSleep(d time.Duration) { vtransport.Sleep(vtransport.RealClock{}, d, nil) }
