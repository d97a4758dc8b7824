package etcdkv

import (
	"context"
	"fmt"
	"time"

	"github.com/vipkit/vipkit/claim"
)

// QuorumKV wraps the claim.KV of an etcd cluster so that a lease renewal
// counts only when a quorum confirms it: KeepAliveOnce is followed by one
// linearizable read of Key (etcd's ReadIndex, one heartbeat round from
// the leader to a quorum), and fails with that read's error when the read
// fails.
//
// etcd's leader answers LeaseKeepAlive from its own lessor, without
// asking the other members, for as long as it believes it leads. A holder
// whose local member is the leader and is cut off from the majority would
// go on "renewing" until that leader steps down (one election timeout),
// and so carry the VIP that much past its release time. With the quorum
// read, its renewals fail from the cut on, whichever member leads. The
// cost is one more round trip per renewal.
//
// Wrap the KV of a node that carries a VIP on the strength of its
// renewals; a node that only observes needs no wrapper. Every other
// method is the wrapped KV's. Safe for concurrent use when the wrapped KV
// is.
type QuorumKV struct {
	claim.KV
	// Key is read to confirm the quorum: any key, such as the VIP's epoch
	// counter (claim.KeysFor(...).Epoch).
	Key string
}

var _ claim.KV = (*QuorumKV)(nil)

// KeepAliveOnce implements claim.KV: the renewal, then the quorum read.
func (q *QuorumKV) KeepAliveOnce(ctx context.Context, id claim.LeaseID) (time.Duration, error) {
	ttl, err := q.KV.KeepAliveOnce(ctx, id)
	if err != nil {
		return ttl, err
	}
	if _, err := q.KV.Get(ctx, q.Key, false); err != nil {
		return 0, fmt.Errorf("etcdkv: renewal not confirmed by a quorum: %w", err)
	}
	return ttl, nil
}
