package keelvip

import (
	"context"
	"fmt"
	"time"

	"github.com/vipkit/vipkit/claim"
)

// QuorumKV wraps the claim.KV of an etcd cluster so that a lease renewal
// counts only when the majority confirms it: KeepAliveOnce is followed by
// one linearizable read (etcd's ReadIndex, one heartbeat round to a
// quorum), and fails when that read fails.
//
// Why: etcd's leader answers LeaseKeepAlive from its own lessor, without
// asking the others, for as long as it believes it leads. A holder whose
// local member is the leader and is cut off from the majority would keep
// "renewing" until that leader steps down (one election timeout, 5 s
// here), and drop the VIP about 15 s after the cut instead of 10. With
// the quorum read, its renewals fail from the cut on, so it drops within
// the release time (10 s) whichever member leads. The cost is one more
// round trip per renewal. Safe for concurrent use.
type QuorumKV struct {
	claim.KV
	// Key is read to confirm the quorum (any key: the VIP's counter).
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
		return 0, fmt.Errorf("keelvip: renewal not confirmed by a quorum: %w", err)
	}
	return ttl, nil
}
