// Package kvtest is the contract suite of claim.KV: one test body that every
// implementation passes, run against the in-memory KV (package
// claim/memkv, on a manual clock) and a real etcd embedded in the test
// process (package claim/etcdkv).
//
//	func TestContract(t *testing.T) {
//		kvtest.Run(t, func(t *testing.T) kvtest.Harness { ... })
//	}
package kvtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
)

// Harness is what the suite needs from one implementation, fresh for each
// subtest.
type Harness struct {
	// KV is the store under test.
	KV claim.KV
	// Prefix is unique to the subtest; every key it writes starts with it.
	Prefix string
	// TTL is a short lease TTL the KV grants exactly (whole seconds).
	TTL time.Duration
	// Advance lets d pass: Advance on a manual clock, a real wait on a real
	// cluster. Tests use it to age leases, never to wait for a state.
	Advance func(d time.Duration)
	// Eventually advances time in small steps (or polls in real time) until
	// cond holds or within has passed, and returns cond's last value.
	Eventually func(within time.Duration, cond func() bool) bool
}

// Run runs every contract test against the KVs newHarness makes.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	tests := []struct {
		name string
		f    func(*testing.T, Harness)
	}{
		{"GetMissing", testGetMissing},
		{"PutRevisions", testPutRevisions},
		{"PrefixSorted", testPrefixSorted},
		{"CompareFailsRunsElse", testCompareFails},
		{"CompareMissingKeyIsZero", testCompareMissing},
		{"CompareValue", testCompareValue},
		{"ClaimTxn", testClaimTxn},
		{"Delete", testDelete},
		{"LeaseRevoke", testLeaseRevoke},
		{"LeaseExpiry", testLeaseExpiry},
		{"KeepAliveExtends", testKeepAlive},
		{"WatchFromRevision", testWatch},
		{"WatchLeaseDelete", testWatchLease},
		{"Limits", testLimits},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			tc.f(t, h)
		})
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func put(t *testing.T, kv claim.KV, key, val string, lease claim.LeaseID) int64 {
	t.Helper()
	r, err := kv.Txn(ctx(t), claim.Txn{Then: []claim.Op{claim.Put(key, []byte(val), lease)}})
	if err != nil || !r.Succeeded {
		t.Fatalf("put %s: %v %+v", key, err, r)
	}
	return r.Revision
}

func get(t *testing.T, kv claim.KV, key string) (claim.KeyValue, bool, int64) {
	t.Helper()
	r, err := kv.Get(ctx(t), key, false)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(r.KVs) == 0 {
		return claim.KeyValue{}, false, r.Revision
	}
	return r.KVs[0], true, r.Revision
}

func testGetMissing(t *testing.T, h Harness) {
	_, ok, rev := get(t, h.KV, h.Prefix+"missing")
	if ok || rev < 1 {
		t.Fatalf("missing key: found=%v rev=%d", ok, rev)
	}
}

func testPutRevisions(t *testing.T, h Harness) {
	k := h.Prefix + "a"
	r1 := put(t, h.KV, k, "one", 0)
	kv, ok, rev := get(t, h.KV, k)
	if !ok || string(kv.Value) != "one" || kv.CreateRevision != r1 || kv.ModRevision != r1 || kv.Version != 1 || rev < r1 {
		t.Fatalf("after first put (rev %d): %+v rev %d", r1, kv, rev)
	}
	r2 := put(t, h.KV, k, "two", 0)
	kv, _, _ = get(t, h.KV, k)
	if r2 <= r1 || kv.CreateRevision != r1 || kv.ModRevision != r2 || kv.Version != 2 || string(kv.Value) != "two" {
		t.Fatalf("after second put (rev %d): %+v", r2, kv)
	}
}

func testPrefixSorted(t *testing.T, h Harness) {
	for _, k := range []string{"c", "a", "b"} {
		put(t, h.KV, h.Prefix+"p/"+k, k, 0)
	}
	put(t, h.KV, h.Prefix+"q", "outside", 0)
	r, err := h.KV.Get(ctx(t), h.Prefix+"p/", true)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, kv := range r.KVs {
		got = append(got, string(kv.Value))
	}
	if fmt.Sprint(got) != "[a b c]" {
		t.Fatalf("prefix get = %v, want [a b c]", got)
	}
}

func testCompareFails(t *testing.T, h Harness) {
	k := h.Prefix + "k"
	r1 := put(t, h.KV, k, "v1", 0)
	put(t, h.KV, k, "v2", 0)
	_, _, before := get(t, h.KV, k)
	r, err := h.KV.Txn(ctx(t), claim.Txn{
		If:   []claim.Compare{{Key: k, Target: claim.ModRevision, Revision: r1}},
		Then: []claim.Op{claim.Put(k, []byte("stale"), 0)},
		Else: []claim.Op{claim.GetOp(k, false)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Succeeded || len(r.Gets) != 1 || len(r.Gets[0].KVs) != 1 || string(r.Gets[0].KVs[0].Value) != "v2" {
		t.Fatalf("stale compare: %+v", r)
	}
	kv, _, after := get(t, h.KV, k)
	if string(kv.Value) != "v2" || after != before {
		t.Fatalf("failed txn wrote: %q rev %d→%d", kv.Value, before, after)
	}
}

func testCompareMissing(t *testing.T, h Harness) {
	k := h.Prefix + "absent"
	for _, target := range []claim.CompareTarget{claim.ModRevision, claim.CreateRevision} {
		r, err := h.KV.Txn(ctx(t), claim.Txn{If: []claim.Compare{{Key: k, Target: target, Revision: 0}}})
		if err != nil || !r.Succeeded {
			t.Fatalf("target %d on missing key = 0: %v %+v", target, err, r)
		}
	}
	rev := put(t, h.KV, k, "x", 0)
	r, err := h.KV.Txn(ctx(t), claim.Txn{If: []claim.Compare{{Key: k, Target: claim.CreateRevision, Revision: 0}}})
	if err != nil || r.Succeeded {
		t.Fatalf("create revision 0 on present key held: %v %+v", err, r)
	}
	r, err = h.KV.Txn(ctx(t), claim.Txn{If: []claim.Compare{{Key: k, Target: claim.CreateRevision, Revision: rev}}})
	if err != nil || !r.Succeeded {
		t.Fatalf("create revision %d: %v %+v", rev, err, r)
	}
}

// testCompareValue: a Value compare holds on the key's exact value, never
// on a missing key (not even for an empty value), and the ModRevision and
// Value compares of one key combine.
func testCompareValue(t *testing.T, h Harness) {
	k := h.Prefix + "v"
	holds := func(cs ...claim.Compare) bool {
		t.Helper()
		r, err := h.KV.Txn(ctx(t), claim.Txn{If: cs})
		if err != nil {
			t.Fatal(err)
		}
		return r.Succeeded
	}
	if holds(claim.Compare{Key: k, Target: claim.Value}) || holds(claim.Compare{Key: k, Target: claim.Value, Value: []byte("x")}) {
		t.Fatal("value compare on a missing key held")
	}
	rev := put(t, h.KV, k, "x", 0)
	if !holds(claim.Compare{Key: k, Target: claim.Value, Value: []byte("x")}) {
		t.Fatal("value compare on the key's value failed")
	}
	if holds(claim.Compare{Key: k, Target: claim.Value, Value: []byte("y")}) || holds(claim.Compare{Key: k, Target: claim.Value, Value: []byte("xx")}) {
		t.Fatal("value compare on another value held")
	}
	both := []claim.Compare{{Key: k, Target: claim.ModRevision, Revision: rev}, {Key: k, Target: claim.Value, Value: []byte("x")}}
	if !holds(both...) {
		t.Fatal("mod revision and value compares of the current put failed")
	}
	put(t, h.KV, k, "x", 0) // the same value again: a new revision
	if holds(both...) {
		t.Fatal("compares of an earlier put held after the key was put again")
	}
}

// testClaimTxn runs the exact shape of a claim: the counter at the revision
// read, the holder key absent, both written, the holder on a lease; then a
// stale claim loses the compare and leaves the counter unchanged.
func testClaimTxn(t *testing.T, h Harness) {
	epoch, holder := h.Prefix+"epoch", h.Prefix+"holder"
	id, _, err := h.KV.Grant(ctx(t), h.TTL*10)
	if err != nil {
		t.Fatal(err)
	}
	claimTxn := func(readRev int64, val string) claim.TxnResponse {
		r, err := h.KV.Txn(ctx(t), claim.Txn{
			If: []claim.Compare{
				{Key: epoch, Target: claim.ModRevision, Revision: readRev},
				{Key: holder, Target: claim.CreateRevision, Revision: 0},
			},
			Then: []claim.Op{claim.Put(epoch, []byte(val), 0), claim.Put(holder, []byte(val), id)},
			Else: []claim.Op{claim.GetOp(h.Prefix, true)},
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := claimTxn(0, "e1")
	if !r.Succeeded {
		t.Fatalf("first claim failed: %+v", r)
	}
	kv, ok, _ := get(t, h.KV, holder)
	if !ok || kv.Lease != id || kv.ModRevision != r.Revision {
		t.Fatalf("holder key %+v, want lease %d rev %d", kv, id, r.Revision)
	}
	// A stale claimant read the counter before: its compare fails.
	r2 := claimTxn(0, "stale")
	if r2.Succeeded || len(r2.Gets) != 1 || len(r2.Gets[0].KVs) != 2 {
		t.Fatalf("stale claim: %+v", r2)
	}
	ep, _, _ := get(t, h.KV, epoch)
	if string(ep.Value) != "e1" || ep.ModRevision != r.Revision {
		t.Fatalf("counter changed by a stale claim: %+v", ep)
	}
	// With the counter current but the holder present, it still fails.
	if r3 := claimTxn(ep.ModRevision, "e2"); r3.Succeeded {
		t.Fatal("claim over a live holder key succeeded")
	}
	if err := h.KV.Revoke(ctx(t), id); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := get(t, h.KV, holder); ok {
		t.Fatal("holder key survived its lease's revoke")
	}
	id2, _, err := h.KV.Grant(ctx(t), h.TTL*10)
	if err != nil {
		t.Fatal(err)
	}
	id = id2
	if r4 := claimTxn(ep.ModRevision, "e2"); !r4.Succeeded {
		t.Fatalf("claim after the holder's lease ended failed: %+v", r4)
	}
	_ = h.KV.Revoke(ctx(t), id2)
}

func testDelete(t *testing.T, h Harness) {
	k := h.Prefix + "d"
	put(t, h.KV, k, "v", 0)
	r, err := h.KV.Txn(ctx(t), claim.Txn{Then: []claim.Op{claim.Delete(k)}})
	if err != nil || !r.Succeeded {
		t.Fatal(err)
	}
	if _, ok, _ := get(t, h.KV, k); ok {
		t.Fatal("deleted key still present")
	}
	// Recreated: a new create revision.
	rev := put(t, h.KV, k, "again", 0)
	if kv, _, _ := get(t, h.KV, k); kv.CreateRevision != rev || kv.Version != 1 {
		t.Fatalf("recreated key %+v", kv)
	}
}

func testLeaseRevoke(t *testing.T, h Harness) {
	id, ttl, err := h.KV.Grant(ctx(t), h.TTL)
	if err != nil || id == 0 || ttl < h.TTL {
		t.Fatalf("grant: %v id %d ttl %v", err, id, ttl)
	}
	left, err := h.KV.TimeToLive(ctx(t), id)
	if err != nil || left < 0 || left > ttl { // etcd floors to whole seconds
		t.Fatalf("ttl after grant: %v %v", left, err)
	}
	k := h.Prefix + "leased"
	put(t, h.KV, k, "v", id)
	if err := h.KV.Revoke(ctx(t), id); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := get(t, h.KV, k); ok {
		t.Fatal("key survived revoke")
	}
	if _, err := h.KV.KeepAliveOnce(ctx(t), id); !errors.Is(err, claim.ErrLeaseNotFound) {
		t.Fatalf("keepalive after revoke: %v", err)
	}
	if _, err := h.KV.TimeToLive(ctx(t), id); !errors.Is(err, claim.ErrLeaseNotFound) {
		t.Fatalf("ttl after revoke: %v", err)
	}
	if err := h.KV.Revoke(ctx(t), id); !errors.Is(err, claim.ErrLeaseNotFound) {
		t.Fatalf("second revoke: %v", err)
	}
	_, err = h.KV.Txn(ctx(t), claim.Txn{Then: []claim.Op{claim.Put(k, []byte("v"), id)}})
	if !errors.Is(err, claim.ErrLeaseNotFound) {
		t.Fatalf("put on a revoked lease: %v", err)
	}
	if _, ok, _ := get(t, h.KV, k); ok {
		t.Fatal("put on a revoked lease wrote")
	}
}

func testLeaseExpiry(t *testing.T, h Harness) {
	id, _, err := h.KV.Grant(ctx(t), h.TTL)
	if err != nil {
		t.Fatal(err)
	}
	k := h.Prefix + "expiring"
	put(t, h.KV, k, "v", id)
	gone := h.Eventually(h.TTL+3*time.Second, func() bool {
		_, ok, _ := get(t, h.KV, k)
		return !ok
	})
	if !gone {
		t.Fatal("leased key outlived its TTL by 3 s")
	}
	if _, err := h.KV.KeepAliveOnce(ctx(t), id); !errors.Is(err, claim.ErrLeaseNotFound) {
		t.Fatalf("keepalive of an expired lease: %v", err)
	}
}

func testKeepAlive(t *testing.T, h Harness) {
	id, ttl, err := h.KV.Grant(ctx(t), 2*h.TTL)
	if err != nil {
		t.Fatal(err)
	}
	k := h.Prefix + "kept"
	put(t, h.KV, k, "v", id)
	// Renew every half TTL for two TTLs: the key must survive.
	for i := 0; i < 4; i++ {
		h.Advance(ttl / 2)
		got, err := h.KV.KeepAliveOnce(ctx(t), id)
		if err != nil || got != ttl {
			t.Fatalf("keepalive %d: %v ttl %v", i, err, got)
		}
		if _, ok, _ := get(t, h.KV, k); !ok {
			t.Fatalf("renewed key gone after %d renewals", i)
		}
	}
	_ = h.KV.Revoke(ctx(t), id)
}

func collect(t *testing.T, ch <-chan claim.WatchResponse, n int) []claim.WatchEvent {
	t.Helper()
	var evs []claim.WatchEvent
	wait, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(evs) < n {
		select {
		case r, ok := <-ch:
			if !ok {
				t.Fatalf("watch closed after %d of %d events", len(evs), n)
			}
			if r.Err != nil {
				t.Fatalf("watch error: %v", r.Err)
			}
			evs = append(evs, r.Events...)
		case <-wait.Done():
			t.Fatalf("watch: %d of %d events after 10 s", len(evs), n)
		}
	}
	return evs
}

func testWatch(t *testing.T, h Harness) {
	p := h.Prefix + "w/"
	first := put(t, h.KV, p+"a", "1", 0)
	put(t, h.KV, p+"b", "2", 0)
	put(t, h.KV, h.Prefix+"other", "x", 0)
	if _, err := h.KV.Txn(ctx(t), claim.Txn{Then: []claim.Op{claim.Delete(p + "a")}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	ch := h.KV.Watch(wctx, p, first)
	evs := collect(t, ch, 3)
	want := []string{"put a 1", "put b 2", "delete a "}
	for i, e := range evs[:3] {
		kind := "put"
		if e.Type == claim.EventDelete {
			kind = "delete"
		}
		got := fmt.Sprintf("%s %s %s", kind, e.KV.Key[len(p):], e.KV.Value)
		if got != want[i] {
			t.Fatalf("event %d = %q, want %q", i, got, want[i])
		}
	}
	rev := put(t, h.KV, p+"c", "3", 0)
	live := collect(t, ch, 1)
	if live[0].KV.Key != p+"c" || live[0].KV.ModRevision != rev {
		t.Fatalf("live event %+v, want %s at %d", live[0], p+"c", rev)
	}
	cancel()
	wait, cancelWait := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelWait()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-wait.Done():
			t.Fatal("watch channel not closed 10 s after its context ended")
		}
	}
}

func testWatchLease(t *testing.T, h Harness) {
	p := h.Prefix + "wl/"
	id, _, err := h.KV.Grant(ctx(t), h.TTL*10)
	if err != nil {
		t.Fatal(err)
	}
	rev := put(t, h.KV, p+"holder", "h", id)
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := h.KV.Watch(wctx, p, rev)
	if err := h.KV.Revoke(ctx(t), id); err != nil {
		t.Fatal(err)
	}
	evs := collect(t, ch, 2)
	if evs[0].Type != claim.EventPut || evs[1].Type != claim.EventDelete || evs[1].KV.Key != p+"holder" {
		t.Fatalf("lease revoke events: %+v", evs)
	}
}

func testLimits(t *testing.T, h Harness) {
	ops := make([]claim.Op, claim.MaxTxnOps+1)
	for i := range ops {
		ops[i] = claim.Put(fmt.Sprintf("%sl/%d", h.Prefix, i), nil, 0)
	}
	if _, err := h.KV.Txn(ctx(t), claim.Txn{Then: ops}); !errors.Is(err, claim.ErrTooManyOps) {
		t.Fatalf("%d ops: %v", len(ops), err)
	}
	big := make([]byte, claim.MaxValueSize+1)
	if _, err := h.KV.Txn(ctx(t), claim.Txn{Then: []claim.Op{claim.Put(h.Prefix+"big", big, 0)}}); !errors.Is(err, claim.ErrTooLarge) {
		t.Fatalf("oversized value: %v", err)
	}
	for _, ttl := range []time.Duration{0, -time.Second} {
		if _, _, err := h.KV.Grant(ctx(t), ttl); !errors.Is(err, claim.ErrInvalidTTL) {
			t.Fatalf("grant %v: %v", ttl, err)
		}
	}
	if r, err := h.KV.Get(ctx(t), h.Prefix+"l/", true); err != nil || len(r.KVs) != 0 {
		t.Fatalf("refused txn wrote: %v %d", err, len(r.KVs))
	}
}
