// Package etcdkv is the claim.KV of a real etcd cluster, over etcd's
// clientv3. Each method is exactly one RPC; errors are mapped to claim's
// sentinels (claim.ErrLeaseNotFound, claim.ErrCompacted, claim.ErrTooManyOps,
// claim.ErrTooLarge, claim.ErrInvalidTTL), and everything else is returned
// wrapped, meaning "outcome unknown".
//
//	cli, _ := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
//	kv := etcdkv.New(cli)
//	ctl, _ := claim.NewController(claim.Config{KV: kv, ...})
//
// Cmps turns a claim.FenceToken into clientv3 compares, for an importer
// that guards its own transactions on the same etcd with the VIP's
// holder key.
//
// Only importers that talk to etcd pay for this package: claim itself does
// not import etcd.
package etcdkv

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/vipkit/vipkit/claim"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// KV is a claim.KV over a clientv3.Client. It does not own the client:
// closing the client is the caller's business. Safe for concurrent use.
type KV struct {
	c *clientv3.Client
}

var _ claim.KV = (*KV)(nil)

// New returns a KV over c.
func New(c *clientv3.Client) *KV { return &KV{c: c} }

func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return fmt.Errorf("%w: %v", claim.ErrLeaseNotFound, err)
	case errors.Is(err, rpctypes.ErrCompacted), errors.Is(err, rpctypes.ErrFutureRev):
		return fmt.Errorf("%w: %v", claim.ErrCompacted, err)
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return fmt.Errorf("%w: %v", claim.ErrTooManyOps, err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge):
		return fmt.Errorf("%w: %v", claim.ErrTooLarge, err)
	case errors.Is(err, rpctypes.ErrLeaseTTLTooLarge):
		return fmt.Errorf("%w: %v", claim.ErrInvalidTTL, err)
	}
	return fmt.Errorf("etcdkv: %w", err)
}

func fromKV(kv *mvccpb.KeyValue) claim.KeyValue {
	return claim.KeyValue{
		Key: string(kv.Key), Value: kv.Value,
		CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision,
		Version: kv.Version, Lease: claim.LeaseID(kv.Lease),
	}
}

func fromRange(r *clientv3.GetResponse) claim.GetResponse {
	g := claim.GetResponse{Revision: r.Header.Revision}
	for _, kv := range r.Kvs {
		g.KVs = append(g.KVs, fromKV(kv))
	}
	return g
}

// Get implements claim.KV.
func (k *KV) Get(ctx context.Context, key string, prefix bool) (claim.GetResponse, error) {
	var opts []clientv3.OpOption
	if prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	r, err := k.c.Get(ctx, key, opts...)
	if err != nil {
		return claim.GetResponse{}, mapErr(err)
	}
	return fromRange(r), nil
}

func toOps(ops []claim.Op) []clientv3.Op {
	out := make([]clientv3.Op, 0, len(ops))
	for _, o := range ops {
		switch o.Kind {
		case claim.OpPut:
			var opts []clientv3.OpOption
			if o.Lease != 0 {
				opts = append(opts, clientv3.WithLease(clientv3.LeaseID(o.Lease)))
			}
			out = append(out, clientv3.OpPut(o.Key, string(o.Value), opts...))
		case claim.OpDelete:
			var opts []clientv3.OpOption
			if o.Prefix {
				opts = append(opts, clientv3.WithPrefix())
			}
			out = append(out, clientv3.OpDelete(o.Key, opts...))
		case claim.OpGet:
			var opts []clientv3.OpOption
			if o.Prefix {
				opts = append(opts, clientv3.WithPrefix())
			}
			out = append(out, clientv3.OpGet(o.Key, opts...))
		}
	}
	return out
}

// Txn implements claim.KV. It is validated before it is sent.
func (k *KV) Txn(ctx context.Context, t claim.Txn) (claim.TxnResponse, error) {
	if err := t.Validate(); err != nil {
		return claim.TxnResponse{}, err
	}
	cmps := make([]clientv3.Cmp, 0, len(t.If))
	for _, c := range t.If {
		switch c.Target {
		case claim.ModRevision:
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(c.Key), "=", c.Revision))
		case claim.CreateRevision:
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(c.Key), "=", c.Revision))
		case claim.Value:
			cmps = append(cmps, clientv3.Compare(clientv3.Value(c.Key), "=", string(c.Value)))
		}
	}
	r, err := k.c.Txn(ctx).If(cmps...).Then(toOps(t.Then)...).Else(toOps(t.Else)...).Commit()
	if err != nil {
		return claim.TxnResponse{}, mapErr(err)
	}
	out := claim.TxnResponse{Succeeded: r.Succeeded, Revision: r.Header.Revision}
	for _, op := range r.Responses {
		if rr := op.GetResponseRange(); rr != nil {
			g := claim.GetResponse{Revision: r.Header.Revision}
			for _, kv := range rr.Kvs {
				g.KVs = append(g.KVs, fromKV(kv))
			}
			out.Gets = append(out.Gets, g)
		}
	}
	return out, nil
}

// Cmps returns t's compares for a transaction of the importer's own
// clientv3 client: the holder key's ModRevision and value. Put them into
// the If of every transaction that must not commit once this node has lost
// the VIP:
//
//	tok, err := ctl.FenceToken()
//	...
//	r, err := cli.Txn(ctx).If(etcdkv.Cmps(tok)...).Then(clientv3.OpPut(k, v)).Commit()
//	// !r.Succeeded: the VIP has changed hands; nothing was written.
//
// See claim.FenceToken for what the token guarantees.
func Cmps(t claim.FenceToken) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(t.Key), "=", t.ModRevision),
		clientv3.Compare(clientv3.Value(t.Key), "=", string(t.Value)),
	}
}

// Grant implements claim.KV. The TTL is rounded up to whole seconds; etcd
// raises it to its minimum TTL if lower.
func (k *KV) Grant(ctx context.Context, ttl time.Duration) (claim.LeaseID, time.Duration, error) {
	if ttl <= 0 || ttl > 9_000_000_000*time.Second {
		return 0, 0, fmt.Errorf("%w: %v", claim.ErrInvalidTTL, ttl)
	}
	r, err := k.c.Grant(ctx, int64(math.Ceil(ttl.Seconds())))
	if err != nil {
		return 0, 0, mapErr(err)
	}
	return claim.LeaseID(r.ID), time.Duration(r.TTL) * time.Second, nil
}

// KeepAliveOnce implements claim.KV.
func (k *KV) KeepAliveOnce(ctx context.Context, id claim.LeaseID) (time.Duration, error) {
	r, err := k.c.KeepAliveOnce(ctx, clientv3.LeaseID(id))
	if err != nil {
		return 0, mapErr(err)
	}
	if r.TTL <= 0 {
		return 0, fmt.Errorf("%w: %d", claim.ErrLeaseNotFound, id)
	}
	return time.Duration(r.TTL) * time.Second, nil
}

// Revoke implements claim.KV.
func (k *KV) Revoke(ctx context.Context, id claim.LeaseID) error {
	_, err := k.c.Revoke(ctx, clientv3.LeaseID(id))
	return mapErr(err)
}

// TimeToLive implements claim.KV. etcd reports whole seconds.
func (k *KV) TimeToLive(ctx context.Context, id claim.LeaseID) (time.Duration, error) {
	r, err := k.c.TimeToLive(ctx, clientv3.LeaseID(id))
	if err != nil {
		return 0, mapErr(err)
	}
	if r.TTL < 0 {
		return 0, fmt.Errorf("%w: %d", claim.ErrLeaseNotFound, id)
	}
	return time.Duration(r.TTL) * time.Second, nil
}

// Watch implements claim.KV. clientv3 resumes a broken stream from the last
// revision it delivered, so a watch survives reconnects; a compacted start
// revision ends it with claim.ErrCompacted.
func (k *KV) Watch(ctx context.Context, prefix string, rev int64) <-chan claim.WatchResponse {
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	in := k.c.Watch(wctx, prefix, opts...)
	out := make(chan claim.WatchResponse)
	go func() {
		defer close(out)
		defer cancel()
		for r := range in {
			wr := claim.WatchResponse{Revision: r.Header.Revision}
			if err := r.Err(); err != nil {
				wr.Err = mapErr(err)
			}
			for _, e := range r.Events {
				ev := claim.WatchEvent{Type: claim.EventPut, KV: fromKV(e.Kv)}
				if e.Type == clientv3.EventTypeDelete {
					ev.Type = claim.EventDelete
				}
				wr.Events = append(wr.Events, ev)
			}
			if len(wr.Events) == 0 && wr.Err == nil {
				continue // progress notifications
			}
			select {
			case out <- wr:
			case <-ctx.Done():
				return
			}
			if wr.Err != nil {
				return
			}
		}
	}()
	return out
}
