package etcdkv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/etcdkv"
)

// isolatedLeader answers renewals from its own lessor but cannot confirm
// a quorum: what etcd's leader does for one election timeout after it is
// cut off.
type isolatedLeader struct {
	claim.KV
	quorum   bool
	renewals int
	reads    []string
}

var errNoQuorum = errors.New("etcdserver: request timed out")

func (k *isolatedLeader) KeepAliveOnce(ctx context.Context, id claim.LeaseID) (time.Duration, error) {
	k.renewals++
	return 20 * time.Second, nil
}

func (k *isolatedLeader) Get(ctx context.Context, key string, prefix bool) (claim.GetResponse, error) {
	k.reads = append(k.reads, key)
	if !k.quorum {
		return claim.GetResponse{}, errNoQuorum
	}
	return claim.GetResponse{Revision: 7}, nil
}

func TestQuorumKV(t *testing.T) {
	inner := &isolatedLeader{quorum: true}
	q := &etcdkv.QuorumKV{KV: inner, Key: "/keel/m/vip/fd00::1:100/epoch"}
	ctx := context.Background()
	if ttl, err := q.KeepAliveOnce(ctx, 1); err != nil || ttl != 20*time.Second {
		t.Fatalf("with a quorum: %v %v", ttl, err)
	}
	inner.quorum = false
	if _, err := q.KeepAliveOnce(ctx, 1); !errors.Is(err, errNoQuorum) {
		t.Fatalf("cut-off leader: %v, want the quorum read's error", err)
	}
	if inner.renewals != 2 || len(inner.reads) != 2 || inner.reads[0] != q.Key {
		t.Fatalf("renewals %d reads %v", inner.renewals, inner.reads)
	}
}

// A renewal whose lease is gone fails as the wrapped KV says, with no
// quorum read.
func TestQuorumKVRenewalFails(t *testing.T) {
	inner := &failingRenewal{}
	q := &etcdkv.QuorumKV{KV: inner, Key: "k"}
	if _, err := q.KeepAliveOnce(context.Background(), 1); !errors.Is(err, claim.ErrLeaseNotFound) {
		t.Fatalf("renewal of a lost lease: %v, want claim.ErrLeaseNotFound", err)
	}
	if inner.reads != 0 {
		t.Fatalf("%d quorum reads after a failed renewal, want 0", inner.reads)
	}
}

type failingRenewal struct {
	claim.KV
	reads int
}

func (k *failingRenewal) KeepAliveOnce(ctx context.Context, id claim.LeaseID) (time.Duration, error) {
	return 0, claim.ErrLeaseNotFound
}

func (k *failingRenewal) Get(ctx context.Context, key string, prefix bool) (claim.GetResponse, error) {
	k.reads++
	return claim.GetResponse{}, nil
}
