package claim

import "fmt"

// FenceToken is this node's hold on the VIP in the form etcd can check:
// the holder key with the ModRevision and value of the put that made this
// node its holder. An importer that must not write once the VIP has moved
// (its own database rows, its own etcd keys) puts Compares (or, with
// clientv3, etcdkv.Cmps) into the If of each of its own transactions on
// the same etcd. Such a transaction commits only while the holder key is
// still that put: it fails once the key changed hands, by a failover, a
// planned promote or the lease's expiry.
//
// The token compares the holder key's ModRevision and value, never its
// CreateRevision. A planned promote replaces the holder key in place (see
// Controller.Promote): the key then keeps the old holder's
// CreateRevision, so a compare on it would survive the move, while every
// put gives the key a new ModRevision. Renewals of the lease do not change
// the key, so the token stays the same for as long as the node holds.
//
// # The token and the local carry
//
// The token is what etcd can check; the carry is the node's own view, and
// it ends first. A holder that stops renewing drops the address DropAfter
// (10 s) after the send of its last answered renewal. etcd expires the
// lease no sooner than LeaseTTL (20 s) after it received that renewal
// (later if etcd's leader changes meanwhile, which refreshes every lease),
// and only then can the holder key change hands or vanish. So the local
// carry ends at least LeaseTTL − DropAfter (10 s) before the token fails,
// and a transaction the token guards may still commit in that window. In
// a planned promote the holder drops the address before it answers the
// release, one round trip before the claimant replaces the key.
//
// In either window nobody carries the VIP, and etcd orders every
// transaction the token guarded before the put that makes the next
// holder (whose own token exists only from that put on): no write of the
// old holder lands after one of the new. An importer that wants its
// writes to stop with the address as well stops at the Change from Watch
// whose Carried is false; that is advisory, the token is the guarantee.
type FenceToken struct {
	Key         string // the holder key, /keel/<mesh>/vip/<vip>/holder
	ModRevision int64  // the holder key's ModRevision when this node's claim was put
	Value       []byte // the claim put there (its encoding)
	Epoch       uint64 // the claim's epoch
}

// Compares returns the compares that hold exactly while the holder key is
// the token's put: its ModRevision and its value.
func (t FenceToken) Compares() []Compare {
	return []Compare{
		{Key: t.Key, Target: ModRevision, Revision: t.ModRevision},
		{Key: t.Key, Target: Value, Value: t.Value},
	}
}

// FenceToken returns the token of this node's hold on the VIP. It is
// available while this node carries the VIP with a KV (the holder key
// confirmed to be its own claim on its own lease); otherwise the error is
// ErrNoToken. A token obtained earlier is never withdrawn locally: etcd
// refuses it once the holder key changes.
func (c *Controller) FenceToken() (FenceToken, error) {
	c.mu.Lock()
	defer c.unlock()
	switch {
	case c.cfg.KV == nil:
		return FenceToken{}, fmt.Errorf("%w: no KV", ErrNoToken)
	case c.st.Role(c.cfg.Self) != RoleHolder || !c.carried:
		return FenceToken{}, fmt.Errorf("%w: this node does not carry %v", ErrNoToken, c.cfg.VIP)
	case c.token.Key == "" || c.token.Epoch != c.st.Held.Epoch:
		return FenceToken{}, fmt.Errorf("%w: holder key not confirmed", ErrNoToken)
	}
	t := c.token
	t.Value = append([]byte(nil), t.Value...)
	return t, nil
}
