package memkv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/kvtest"
	"github.com/vipkit/vipkit/claim/memkv"
	"github.com/vipkit/vipkit/transport/transporttest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func harness(t *testing.T) kvtest.Harness {
	clock := transporttest.NewManualClock()
	kv := memkv.New(memkv.Options{Clock: clock})
	t.Cleanup(func() { kv.Close() })
	return kvtest.Harness{
		KV: kv, Prefix: "/t/", TTL: time.Second,
		Advance: func(d time.Duration) { clock.Advance(d) },
		Eventually: func(within time.Duration, cond func() bool) bool {
			end := clock.Now().Add(within)
			for !cond() {
				if !clock.Now().Before(end) {
					return false
				}
				clock.Advance(100 * time.Millisecond)
			}
			return true
		},
	}
}

func TestContract(t *testing.T) { kvtest.Run(t, harness) }

func TestLeaseExpiresExactlyAtTTL(t *testing.T) {
	clock := transporttest.NewManualClock()
	kv := memkv.New(memkv.Options{Clock: clock})
	defer kv.Close()
	ctx := context.Background()
	id, ttl, err := kv.Grant(ctx, 20*time.Second)
	if err != nil || ttl != 20*time.Second {
		t.Fatal(err, ttl)
	}
	clock.Advance(19999 * time.Millisecond)
	if _, err := kv.TimeToLive(ctx, id); err != nil {
		t.Fatalf("lease gone before its TTL: %v", err)
	}
	clock.Advance(time.Millisecond)
	if _, err := kv.TimeToLive(ctx, id); !errors.Is(err, claim.ErrLeaseNotFound) {
		t.Fatalf("lease alive at its TTL: %v", err)
	}
}

func TestLeaderChangeRefreshesLeases(t *testing.T) {
	clock := transporttest.NewManualClock()
	kv := memkv.New(memkv.Options{Clock: clock})
	defer kv.Close()
	ctx := context.Background()
	id, _, _ := kv.Grant(ctx, 20*time.Second)
	clock.Advance(15 * time.Second)
	kv.LeaderChange(5 * time.Second)
	clock.Advance(24 * time.Second)
	if _, err := kv.TimeToLive(ctx, id); err != nil {
		t.Fatalf("lease expired before TTL+election after a leader change: %v", err)
	}
	clock.Advance(time.Second)
	if _, err := kv.TimeToLive(ctx, id); !errors.Is(err, claim.ErrLeaseNotFound) {
		t.Fatalf("lease alive past TTL+election: %v", err)
	}
}

func TestMinTTLAndRounding(t *testing.T) {
	kv := memkv.New(memkv.Options{Clock: transporttest.NewManualClock(), MinTTL: 8 * time.Second})
	defer kv.Close()
	_, ttl, err := kv.Grant(context.Background(), 1500*time.Millisecond)
	if err != nil || ttl != 8*time.Second {
		t.Fatalf("grant below the minimum: %v %v", ttl, err)
	}
	kv2 := memkv.New(memkv.Options{Clock: transporttest.NewManualClock()})
	defer kv2.Close()
	if _, ttl, _ := kv2.Grant(context.Background(), 1500*time.Millisecond); ttl != 2*time.Second {
		t.Fatalf("1.5 s rounds to %v, want 2s", ttl)
	}
}

func TestWatchCompacted(t *testing.T) {
	kv := memkv.New(memkv.Options{Clock: transporttest.NewManualClock(), History: 2})
	defer kv.Close()
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		kv.Txn(ctx, claim.Txn{Then: []claim.Op{claim.Put("/k", []byte{byte(i)}, 0)}})
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r, ok := <-kv.Watch(wctx, "/", 2)
	if !ok || !errors.Is(r.Err, claim.ErrCompacted) {
		t.Fatalf("watch from a compacted revision: %+v", r)
	}
}

func TestClosed(t *testing.T) {
	kv := memkv.New(memkv.Options{})
	kv.Close()
	if _, err := kv.Get(context.Background(), "/", true); !errors.Is(err, claim.ErrClosed) {
		t.Fatal(err)
	}
	if _, ok := <-kv.Watch(context.Background(), "/", 0); ok {
		t.Fatal("watch on a closed KV delivered")
	}
}
